#!/bin/sh
# Put SELDP_API (include/seldp/export.h) in front of every public function declaration of
# include/seldp/*.h and make each header that has one include export.h. Idempotent: run it
# again after adding declarations (or after a merge) and only the new ones change.
#
# A declaration is a line that starts at column 0 with a return type followed by a seldp_
# name and "(": "seldp_status seldp_comm_barrier(", "const char *seldp_last_error(void);".
# Run from the repository root: sh cmake/apply-export-macro.sh && clang-format -i include/seldp/*.h
set -eu
for h in include/seldp/*.h; do
    [ "$(basename "$h")" = export.h ] && continue
    sed -E -i '/^(typedef|#|SELDP_API|static|extern|struct|enum)/!s/^((const )?[a-z_0-9]+( \*| |\*)seldp_[a-z_0-9]+\()/SELDP_API \1/' "$h"
    if grep -q '^SELDP_API ' "$h" && ! grep -q '#include "seldp/export.h"' "$h"; then
        # among the header's project includes, or as their block after the include guard
        if grep -q '^#include "seldp/' "$h"; then
            sed -i '0,/^#include "seldp\//s//#include "seldp\/export.h"\n#include "seldp\//' "$h"
        else
            sed -i '0,/^#define SELDP_[A-Z_]*_H$/s//&\n\n#include "seldp\/export.h"/' "$h"
        fi
    fi
done

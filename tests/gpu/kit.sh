#!/usr/bin/env bash
# The dependency kit of a GPU run. A lent GPU machine starts bare: it has nvcc, CMake, ninja
# and a Python with PyTorch and the nvidia-nccl-cu13 wheel, but no OpenBLAS or cblas.h, no
# cmocka, no pkg-config, no NCCL development files, no MPI, and no network. This script,
# run on a networked Debian (12, amd64) machine, downloads the Debian packages the GPU build
# needs that such a machine lacks, and nothing more, into an ignored folder of the tree
# (.gpu-kit/ by default) that travels with the tree to the GPU machine, where
# tests/gpu/check.sh unpacks them into a private prefix (never into /).
#
#   OpenBLAS    libopenblas0-pthread (the library), libopenblas-pthread-dev (cblas.h, the
#               unversioned link), libgfortran5 and libquadmath0 (what libopenblas needs
#               beyond glibc and libgcc_s)
#   cmocka      libcmocka0, libcmocka-dev
#   pkg-config  pkgconf-bin (the program), libpkgconf3 (its library)
#
# NCCL is not in the kit: check.sh takes the machine's (a system install, or the wheel's
# include folder and libnccl.so.2). MPI is not either: its steps are NOT RUN without it.
# The binaries need glibc >= 2.34 (Ubuntu 22.04 has 2.35).
#
# Usage: tests/gpu/kit.sh [KIT_DIR]
# Writes KIT_DIR/*.deb and KIT_DIR/MANIFEST (package, version, architecture, bytes, sha256,
# file per line); replaces what the folder held. Exit status: 0 when every package was
# downloaded; 1 otherwise (try `apt-get update` first when apt-get cannot find a package).
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
kit=${1:-$repo/.gpu-kit}
arch=amd64
packages=(libopenblas0-pthread libopenblas-pthread-dev libgfortran5 libquadmath0
    libcmocka0 libcmocka-dev pkgconf-bin libpkgconf3)
# what a device run may carry in all (64 MiB) less room for the rest of the tree
max_bytes=$((40 << 20))

for tool in apt-get dpkg-deb sha256sum; do
    command -v "$tool" >/dev/null || {
        echo "kit.sh: $tool not found: run this on a Debian machine" >&2
        exit 1
    }
done

mkdir -p "$kit"
tmp=$(mktemp -d "$kit/.download.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
specs=()
for p in "${packages[@]}"; do
    specs+=("$p:$arch")
done
# apt-get download writes into the current folder; as root it warns that its sandbox user
# cannot write there, which is harmless
(cd "$tmp" && apt-get download -q "${specs[@]}") 2>&1 | grep -v "unsandboxed as root" || true
missing=()
for p in "${packages[@]}"; do
    compgen -G "$tmp/${p}_*_$arch.deb" >/dev/null || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "kit.sh: could not download: ${missing[*]} (run 'apt-get update' as root, then retry)" >&2
    exit 1
fi

total=0
: >"$tmp/MANIFEST"
for p in "${packages[@]}"; do
    f=$(cd "$tmp" && ls "${p}"_*_"$arch".deb)
    bytes=$(stat -c %s "$tmp/$f")
    total=$((total + bytes))
    printf '%s %s %s %s %s %s\n' "$p" "$(dpkg-deb -f "$tmp/$f" Version)" \
        "$(dpkg-deb -f "$tmp/$f" Architecture)" "$bytes" \
        "$(sha256sum "$tmp/$f" | cut -d' ' -f1)" "$f" >>"$tmp/MANIFEST"
done
if [ "$total" -gt "$max_bytes" ]; then
    echo "kit.sh: the kit is $((total >> 20)) MiB, more than the $((max_bytes >> 20)) MiB a" \
        "device run can carry beside the tree" >&2
    exit 1
fi

rm -f "$kit"/*.deb "$kit/MANIFEST"
mv "$tmp"/*.deb "$tmp/MANIFEST" "$kit/"
echo "kit: ${#packages[@]} packages, $((total >> 10)) KiB in $kit"
cat "$kit/MANIFEST"

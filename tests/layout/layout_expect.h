/* Shared by the layout tests: build a layout, and compare a kind's groups with a
 * hand-written list, rank for rank, printing both on a mismatch. */
#ifndef SELDP_TEST_LAYOUT_EXPECT_H
#define SELDP_TEST_LAYOUT_EXPECT_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "seldp/seldp.h"

static inline seldp_layout *layout_build(seldp_framework framework, int world, int tp, int pp,
                                         int cp, int ep, int etp, int experts, const char *order)
{
    seldp_layout_config cfg = SELDP_LAYOUT_CONFIG_INIT;
    cfg.framework = framework;
    cfg.world = world;
    cfg.tp = tp;
    cfg.pp = pp;
    cfg.cp = cp;
    cfg.ep = ep;
    cfg.etp = etp;
    cfg.experts = experts;
    cfg.order = order;
    seldp_layout *l = NULL;
    seldp_status st = seldp_layout_create(&cfg, &l);
    if (st != SELDP_OK)
        fail_msg("seldp_layout_create(%s, world %d, tp %d, pp %d, cp %d, ep %d, etp %d): %s: %s",
                 seldp_framework_name(framework), world, tp, pp, cp, ep, etp, seldp_status_name(st),
                 seldp_last_error());
    return l;
}

static inline void groups_text(const int *flat, int count, int size, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int g = 0; g < count && n + 16 < cap; g++) {
        n += (size_t)snprintf(buf + n, cap - n, "%s[", g ? " " : "");
        for (int i = 0; i < size && n + 16 < cap; i++)
            n += (size_t)snprintf(buf + n, cap - n, "%s%d", i ? "," : "", flat[g * size + i]);
        n += (size_t)snprintf(buf + n, cap - n, "]");
    }
}

/* The groups of `kind` must be exactly `count` groups of `size` listed in `flat` (each
 * ascending, groups ordered by their lowest rank). */
static inline void expect_groups(const seldp_layout *l, seldp_group_kind kind, int count, int size,
                                 const int *flat)
{
    int got[4096];
    int n = seldp_layout_group_count(l, kind);
    int s = n > 0 ? seldp_layout_group(l, kind, 0, NULL) : 0;
    for (int g = 0; g < n && g * s < 4096; g++) {
        const int *ranks = NULL;
        seldp_layout_group(l, kind, g, &ranks);
        memcpy(got + g * s, ranks, (size_t)s * sizeof *ranks);
    }
    bool same = n == count && s == size && memcmp(got, flat, (size_t)(n * s) * sizeof(int)) == 0;
    if (!same) {
        char want[4096], have[4096];
        groups_text(flat, count, size, want, sizeof want);
        groups_text(got, n, s, have, sizeof have);
        seldp_layout_config c = seldp_layout_get_config(l);
        fail_msg("%s groups of %s (world %d, tp %d, pp %d, cp %d, ep %d, etp %d):\n  expected "
                 "%s\n  got      %s",
                 seldp_group_kind_name(kind), seldp_framework_name(c.framework), c.world, c.tp,
                 c.pp, c.cp, c.ep, c.etp, want, have);
    }
}

#define EXPECT_GROUPS(l, kind, count, size, ...)                                                   \
    expect_groups((l), (kind), (count), (size), (const int[]){__VA_ARGS__})

#endif

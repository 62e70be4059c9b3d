/* --print-layout (text and --json) and --compare-groups (see layout_show.h): the layout and the
 * replica sets of a run that is never started. The sets come from sets.c's builders, so what is
 * printed is what a run of the same options reduces over, roots included. */
#include "sets.h"
#include "layout_show.h"

#include <stdlib.h>
#include <string.h>

#include "exit.h"
#include "compare.h"
#include "grid.h"
#include "layout_impl.h"
#include "run.h"
#include "rank.h"

/* The framework's word for the dense reduce group and for plain data parallelism when cp > 1
 * (Megatron's dp-cp and dp; torchtitan's dp_cp and dp). */
static const char *dense_word(const seldp_layout_config *c)
{
    if (c->cp <= 1)
        return "dp";
    return c->framework == SELDP_FRAMEWORK_TORCHTITAN ? "dp_cp" : "dp-cp";
}

/* "[0,4]@0": a set's ranks and its root. */
static void set_text(const hx_set *s, char *buf, size_t size)
{
    char ranks[256];
    hx_group g = {s->size, s->ranks, s->root};
    hx_group_str(&g, ranks, sizeof ranks);
    snprintf(buf, size, "%s@%d", ranks, s->root);
}

static int digits(int x)
{
    int n = 1;
    while (x >= 10) {
        x /= 10;
        n++;
    }
    return n;
}

/* One line of groups: the name, "count x size" (size 0: of several sizes), each group. */
static void groups_line(FILE *out, const char *name, int name_width, int count, int size,
                        int count_width, hx_buf *groups)
{
    if (size > 0)
        fprintf(out, "  %-*s %*d x %-2d %s\n", name_width, name, count_width, count, size,
                hx_buf_str(groups));
    else
        fprintf(out, "  %-*s %*d sets %s\n", name_width, name, count_width, count,
                hx_buf_str(groups));
}

static int compare_first(const void *a, const void *b)
{
    const int *x = *(const int *const *)a, *y = *(const int *const *)b;
    return (x[0] > y[0]) - (x[0] < y[0]);
}

/* Plain data parallelism when cp > 1: the ranks of a dense group with one CP position (all of
 * one size), ordered by their lowest rank as every kind's groups are. */
static void plain_dp_line(const seldp_layout *g, int count_width, FILE *out)
{
    hx_buf b = {0};
    seldp_layout_config c = seldp_layout_get_config(g);
    int n_dense = seldp_layout_group_count(g, SELDP_GROUP_DP);
    int size = seldp_layout_group(g, SELDP_GROUP_DP, 0, NULL) / c.cp, count = n_dense * c.cp;
    int *ranks = hx_calloc((size_t)c.world, sizeof *ranks);
    int **groups = hx_calloc((size_t)count, sizeof *groups);
    if (!ranks || !groups)
        goto out;
    for (int d = 0; d < n_dense; d++) {
        const int *dense = NULL;
        int n = seldp_layout_group(g, SELDP_GROUP_DP, d, &dense);
        for (int pos = 0; pos < c.cp; pos++) {
            int *mine = ranks + (d * c.cp + pos) * size, m = 0;
            for (int i = 0; i < n && m < size; i++)
                if (seldp_layout_position(g, SELDP_GROUP_CP, dense[i]) == pos)
                    mine[m++] = dense[i];
            groups[d * c.cp + pos] = mine;
        }
    }
    qsort(groups, (size_t)count, sizeof *groups, compare_first);
    for (int i = 0; i < count; i++) {
        hx_group grp = {size, groups[i], groups[i][0]};
        char text[256];
        hx_group_str(&grp, text, sizeof text);
        hx_buf_printf(&b, "%s%s", i ? " " : "", text);
    }
    groups_line(out, "dp", 10, count, size, count_width, &b);
out:
    hx_buf_free(&b);
    free(groups);
    free(ranks);
}

static void print_grid_groups(const seldp_layout *g, FILE *out)
{
    seldp_layout_config c = seldp_layout_get_config(g);
    int count_width = 2;
    for (int k = 0; k < SELDP_GROUP_KINDS; k++) {
        int w = digits(seldp_layout_group_count(g, (seldp_group_kind)k));
        count_width = w > count_width ? w : count_width;
    }
    fprintf(out, "groups\n");
    for (int k = 0; k < SELDP_GROUP_KINDS; k++) {
        seldp_group_kind kind = (seldp_group_kind)k;
        hx_buf b = {0};
        int n = seldp_layout_group_count(g, kind);
        for (int i = 0; i < n; i++) {
            const int *ranks = NULL;
            int size = seldp_layout_group(g, kind, i, &ranks);
            hx_group grp = {size, (int *)ranks, ranks[0]};
            char text[256];
            hx_group_str(&grp, text, sizeof text);
            hx_buf_printf(&b, "%s%s", i ? " " : "", text);
        }
        const char *name = kind == SELDP_GROUP_DP ? dense_word(&c) : seldp_group_kind_name(kind);
        groups_line(out, name, 10, n, seldp_layout_group(g, kind, 0, NULL), count_width, &b);
        hx_buf_free(&b);
        if (kind == SELDP_GROUP_DP && c.cp > 1)
            plain_dp_line(g, count_width, out);
    }
}

/* The replica sets, one line per kind of set, each set with its root. */
static void print_sets(const hx_run *run, FILE *out)
{
    const hx_sets *s = &run->sets;
    fprintf(out, "replica sets the run reduces over (@ its root)\n");
    int count_width = 2, name_width = 10;
    for (int i = 0, n = 0; i < s->n; i++) {
        n = i > 0 && s->sets[i].kind == s->sets[i - 1].kind ? n + 1 : 1;
        count_width = digits(n) > count_width ? digits(n) : count_width;
        int len = (int)strlen(s->sets[i].name);
        name_width = len > name_width ? len : name_width;
    }
    for (int i = 0; i < s->n;) {
        int j = i;
        hx_buf b = {0};
        bool one_size = true;
        while (j < s->n && s->sets[j].kind == s->sets[i].kind) {
            char text[300];
            set_text(&s->sets[j], text, sizeof text);
            hx_buf_printf(&b, "%s%s", j > i ? " " : "", text);
            one_size = one_size && s->sets[j].size == s->sets[i].size;
            j++;
        }
        groups_line(out, s->sets[i].name, name_width, j - i, one_size ? s->sets[i].size : 0,
                    count_width, &b);
        hx_buf_free(&b);
        i = j;
    }
}

/* "[0,4]*" for rank r's set of `kind` (* where r is its root), or "-". */
static void member_cell(const hx_run *run, int r, hx_set_kind kind, hx_table *t)
{
    const hx_set *s = hx_set_member(run, r, kind);
    if (!s) {
        hx_table_cell(t, "-");
        return;
    }
    char text[256];
    hx_group g = {s->size, s->ranks, s->root};
    hx_group_str(&g, text, sizeof text);
    hx_table_cell(t, "%s%s", text, s->root == r ? "*" : "");
}

static void group_cell(const seldp_layout *g, seldp_group_kind kind, int r, hx_table *t)
{
    const int *ranks = NULL;
    int index = seldp_layout_group_of(g, kind, r);
    int n = index < 0 ? 0 : seldp_layout_group(g, kind, index, &ranks);
    if (n == 0) {
        hx_table_cell(t, "-");
        return;
    }
    char text[256];
    hx_group grp = {n, (int *)ranks, ranks[0]};
    hx_group_str(&grp, text, sizeof text);
    hx_table_cell(t, "%s", text);
}

/* Per rank: stage, TP, CP and ETP positions, its dense and expert-data sets (* its root), its
 * EP and expert-TP groups, its experts. */
static void print_grid_ranks(const hx_run *run, FILE *out)
{
    const seldp_layout *g = run->layout->grid;
    bool sharded = hx_grid_sharded(run);
    hx_set_kind dense = sharded ? HX_SET_DENSE : HX_SET_SHARED;
    hx_set_kind expert = sharded ? HX_SET_EXPERT : HX_SET_DATA;
    const hx_set *d0 = hx_set_member(run, 0, dense), *e0 = hx_set_member(run, 0, expert);
    hx_table t = {.cols = 10, .right = 0x1f};
    static const char *const head[] = {"rank", "stage", "tp", "cp", "etp"};
    for (int c = 0; c < 5; c++)
        hx_table_cell(&t, "%s", head[c]);
    hx_table_cell(&t, "dense (%s)", d0 ? d0->name : "dp");
    hx_table_cell(&t, "EP group");
    hx_table_cell(&t, "expert-data (%s)", e0 ? e0->name : "-");
    hx_table_cell(&t, "expert-TP");
    hx_table_cell(&t, "experts");
    for (int r = 0; r < run->layout->world; r++) {
        hx_table_cell(&t, "%d", r);
        hx_table_cell(&t, "%d", seldp_layout_stage(g, r));
        hx_table_cell(&t, "%d", seldp_layout_position(g, SELDP_GROUP_TP, r));
        hx_table_cell(&t, "%d", seldp_layout_position(g, SELDP_GROUP_CP, r));
        hx_table_cell(&t, "%d", seldp_layout_position(g, SELDP_GROUP_EXPERT_TP, r));
        member_cell(run, r, dense, &t);
        group_cell(g, SELDP_GROUP_EP, r, &t);
        member_cell(run, r, expert, &t);
        group_cell(g, SELDP_GROUP_EXPERT_TP, r, &t);
        int first = 0, count = seldp_layout_local_experts(g, r, &first);
        if (count == 0)
            hx_table_cell(&t, "-");
        else if (count == 1)
            hx_table_cell(&t, "%d", first);
        else
            hx_table_cell(&t, "%d-%d", first, first + count - 1);
    }
    hx_table_print(&t, "  ", out);
}

static void print_text(const hx_run *run, FILE *out)
{
    const hx_layout *l = run->layout;
    char roots[160];
    if (l->roots_named)
        snprintf(roots, sizeof roots, "roots: %s of each group (--roots %s)",
                 hx_layout_roots_word(l->roots), hx_layout_roots_word(l->roots));
    else
        snprintf(roots, sizeof roots, "roots: each group's rank 0, the framework's own");
    if (l->grid) {
        seldp_layout_config c = seldp_layout_get_config(l->grid);
        fprintf(out, "layout: %s%s%s, world %d, tp %d, pp %d, cp %d, ep %d, etp %d (dp %d); %s\n",
                c.framework == SELDP_FRAMEWORK_NONE ? "explicit groups"
                                                    : seldp_framework_name(c.framework),
                c.order ? " " : "", c.order ? c.order : "", c.world, c.tp, c.pp, c.cp, c.ep, c.etp,
                seldp_layout_dp(l->grid), roots);
        print_grid_groups(l->grid, out);
        print_sets(run, out);
        print_grid_ranks(run, out);
        return;
    }
    /* a layout file of TP = PP = CP = ETP = 1: its own EP groups and owners */
    hx_layout_print(l, NULL, out);
    print_sets(run, out);
}

/* The layout as a run builds it: a layout file or the preset, the roots settled. */
static seldp_status build(hx_options *o, hx_layout **out)
{
    seldp_status st = SELDP_OK;
    hx_layout *l = NULL;
    HX_CHECK(hx_options_rules(o, NULL)); /* options_check.c */
    if (o->layout_file) {
        HX_CHECK(hx_layout_load(o->layout_file, o->world_given ? o->world : 0,
                                o->experts_given ? o->model.experts : 0, o->roots, &l));
        o->world = l->world;
        o->model.experts = l->experts;
    } else {
        /* the framework's own reason first, for sizes it refuses */
        seldp_layout *probe = NULL;
        HX_CHECK(hx_grid_build(&o->grid, o->world, o->ep, o->model.experts, &probe));
        seldp_layout_destroy(probe);
        HX_CHECK(
            hx_layout_generate_grid(o->world, o->ep, o->model.experts, &o->grid, o->roots, &l));
    }
    HX_CHECK(hx_layout_roots_merge(l, &o->roots, &o->roots_given));
    *out = l;
    return SELDP_OK;
fail:
    hx_layout_destroy(l);
    return st;
}

static int compare(const hx_layout *l, const char *path, FILE *out, FILE *err)
{
    char *text = NULL, msg[1200];
    size_t len = 0;
    hx_groups_file *f = NULL;
    if (hx_read_file(path, &text, &len) != SELDP_OK ||
        hx_groups_file_parse(text, len, path, &f) != SELDP_OK) {
        fprintf(err, "seldp-harness: --compare-groups %s\n", hx_last_error());
        free(text);
        return HX_EXIT_USAGE;
    }
    free(text);
    bool equal = hx_groups_compare(l, f, msg, sizeof msg);
    int listed = 0;
    for (int r = 0; r < f->world; r++)
        for (int k = 0; k <= HX_COMPARE_KINDS; k++)
            listed += f->ranks[r].listed[k];
    if (equal)
        fprintf(out, "compare-groups: PASS: %d groups of %d ranks in %s equal the layout's (%s)\n",
                listed, f->world, path, l->name);
    else
        fprintf(out, "compare-groups: FAIL: %s: %s (%s)\n", path, msg, l->name);
    hx_groups_file_free(f);
    return equal ? HX_EXIT_PASS : HX_EXIT_FAIL;
}

int hx_layout_show_main(const hx_options *opts, FILE *out, FILE *err)
{
    hx_options o = *opts;
    hx_layout *l = NULL;
    int status = HX_EXIT_USAGE;
    hx_run *run = hx_calloc(1, sizeof *run);
    if (!run || build(&o, &l) != SELDP_OK) {
        fprintf(err, "seldp-harness: %s\n", hx_last_error());
        free(run);
        return HX_EXIT_USAGE;
    }
    /* the replica sets of a run that is never started: sets.c's builders read the layout and
     * the options only */
    run->opts = o;
    run->layout = l;
    if (hx_sets_build(run) != SELDP_OK) {
        fprintf(err, "seldp-harness: %s\n", hx_last_error());
        goto out;
    }
    status = HX_EXIT_PASS;
    if (o.print_layout && o.print_json) {
        hx_buf b = {0};
        hx_layout_json(l, &b);
        if (!hx_buf_ok(&b)) {
            fprintf(err, "seldp-harness: out of memory\n");
            status = HX_EXIT_USAGE;
        } else {
            fprintf(out, "%s\n", hx_buf_str(&b));
        }
        hx_buf_free(&b);
    } else if (o.print_layout) {
        print_text(run, out);
    }
    if (status == HX_EXIT_PASS && o.compare_groups) /* stdout holds only the JSON under --json */
        status = compare(l, o.compare_groups, o.print_json ? err : out, err);
out:
    hx_sets_free(&run->sets);
    hx_layout_destroy(l);
    free(run);
    return status;
}

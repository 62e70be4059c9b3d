/* The known framework bugs (bugs.h): one row per mistake, in the order docs/harness.md lists
 * them. Each row says what the framework did, where it shipped, on which layouts it shows,
 * what the checks see of it (the diagnosis reads the same facts in diagnose.c) and, for a bug
 * that needs an option of the step that does not exist yet, that option. */
#include "bugs.h"

#include <string.h>

static const hx_bug table[] = {
    /* ---- the first set ------------------------------------------------------------------ */
    {HX_FAULT_EP_SCALE, "ep-scale",
     "expert gradients multiplied by the EP size on top of a correct mean", "DeepSpeed #6545",
     "ep > 1", "expert gradients ep\xc3\x97 too large, every other class right", NULL,
     "--world 8 --ep 4"},
    {HX_FAULT_RANK_MEAN, "rank-mean",
     "each rank's token mean averaged over the ranks with equal weights, instead of the global "
     "token mean",
     "torchtitan #1842", "2 data shards or more holding different token counts",
     "embed.weight and the shared gradients off without a common scale, token counts unequal", NULL,
     "--world 4 --ep 2"},
    {HX_FAULT_WORLD_DIV, "world-div",
     "expert gradients divided by the world size instead of the expert-data size", "", "ep > 1",
     "expert gradients ep\xc3\x97 too small, every other class right", NULL, "--world 8 --ep 2"},
    {HX_FAULT_TIED_TWICE, "tied-twice",
     "the tied embedding's already reduced gradient summed a second time over its group, as an "
     "embedding group does",
     "", "the tied embedding replicated on 2 ranks or more",
     "embed.weight's reduction returns n\xc3\x97 the mean of its inputs, every other gradient "
     "right",
     NULL, "--world 4 --ep 2"},
    {HX_FAULT_LOCAL_AUX, "local-aux",
     "with the load-balancing loss in global scope, each data shard takes f_e from its own "
     "assignment counts over its own tokens (the counts never combined)",
     "", "2 data shards or more, --aux-loss-coeff > 0 in global scope",
     "the routers' own FP32 gradients deviate most, routing and loss right", NULL,
     "--world 4 --ep 2 --aux-loss-coeff 0.01"},
    /* ---- the second set ----------------------------------------------------------------- */
    {HX_FAULT_ROUTER_TP, "router-tp",
     "router and norm gradients not summed over the TP group under sequence parallelism (reduced "
     "over the data-parallel group only, as parameters without the sequence-parallel mark)",
     "Megatron-LM #599 (PR #619); torchtitan #2387", "tp > 1",
     "router (and norm) gradients 1/tp of the reference on every TP rank, their sum over TP "
     "right; experts right",
     NULL, "--world 4 --tp 2 --ep 2"},
    {HX_FAULT_AUX_CP, "aux-cp",
     "the router losses' gradient not scaled for context parallelism (\xc3\x97"
     "1/cp)",
     "Megatron-LM #1652 (PR #2237)", "cp > 1, --aux-loss-coeff or --z-loss-coeff > 0",
     "routers' own FP32 gradients off; they match the reference whose router-loss "
     "coefficients are 1/cp",
     NULL, "--world 4 --cp 2 --ep 2 --aux-loss-coeff 0.1 --z-loss-coeff 0.01"},
    {HX_FAULT_AUX_DP, "aux-dp",
     "global-scope load-balancing loss with global counts but local probabilities and no "
     "\xc3\x97"
     "dp (\xc3\x97"
     "1/dp)",
     "Megatron-LM #3672 (PR #3769)", "dp > 1, --aux-loss-coeff > 0 in global scope",
     "routers' own FP32 gradients off; they match the reference whose load-balancing "
     "coefficient is 1/dp",
     NULL, "--world 4 --ep 2 --aux-loss-coeff 0.1"},
    {HX_FAULT_AUX_MICROBATCH, "aux-microbatch",
     "router losses not divided by the number of micro-batches (\xc3\x97M)",
     "NeMo Automodel #1408 (PR #1412); ISEEKYAN/Megatron-LM PR #57 (the MTP analogue)",
     "--micro-batches > 1, a router loss",
     "routers' own FP32 gradients match the reference whose router-loss coefficients are "
     "\xc3\x97M",
     NULL, "--world 4 --ep 2 --micro-batches 4 --aux-loss-coeff 0.1"},
    {HX_FAULT_LAST_MICROBATCH, "last-microbatch",
     "the token count of the last micro-batch used as the whole step's",
     "Megatron-LM #2417 (PR #3159)", "--micro-batches > 1",
     "every gradient off by one common factor: the step's tokens over the last micro-batch's", NULL,
     "--world 4 --ep 2 --micro-batches 4"},
    {HX_FAULT_NORM_PER_GROUP, "norm-per-group",
     "the global gradient norm taken from rank-local norms (each rank's own experts) averaged "
     "over the ranks, as if every rank held the same parameters: the experts' norm never "
     "combined over EP",
     "DeepSpeed #8475 (PR #8478); Megatron-LM PR #5916", "--clip-grad, ep > 1",
     "the global gradient norm off while every reduced gradient is right", NULL,
     "--world 4 --ep 2 --clip-grad 1"},
    {HX_FAULT_EDP1_SKIP, "edp1-skip",
     "expert gradients left unnormalized when the expert-data group has one rank (the skipped "
     "reduction skips the division by the data-parallel size too)",
     "PyTorch PR #167178",
     "an expert-data group of one rank (ep \xc3\x97 etp \xc3\x97 pp = world), a dense "
     "data-parallel group of 2 or more",
     "expert gradients dp\xc3\x97 too large (dp the dense group's size), every other class "
     "right; where dp is the EP size (every replicated layout) ep-scale is named beside it",
     NULL, "--world 4 --tp 2 --etp 1 --ep 4"},
    {HX_FAULT_SHARED_EXPERT_TP, "shared-expert-tp",
     "the shared expert's gradients all-reduced over the TP group a second time",
     "Pai-Megatron-Patch #397 (PR #402)", "tp > 1, --shared-expert-ff > 0",
     "the shared expert's gradients off (each TP shard holds the sum of the group's shards) "
     "while the ranks' own gradients and every other class are right",
     NULL, "--world 4 --tp 2 --ep 2 --shared-expert-ff 32"},
    {HX_FAULT_TIED_ZERO, "tied-zero",
     "with the sharded optimizer and pp > 1, the tied embedding's cross-stage sum done after the "
     "reduce-scatter (partial sums mixed)",
     "Megatron-LM #844", "--zero 1, pp > 1, 2 data-parallel ranks or more per stage",
     "embed.weight's reduce-scatter results off the sum of its inputs (a stage's sum plus the "
     "other stage's local gradient), every other gradient right",
     NULL, "--world 4 --pp 2 --ep 2 --zero 1"},
    {HX_FAULT_HALF_ACCUM, "half-accum",
     "the reduction accumulated in the half dtype instead of FP32 (each partial sum rounded to "
     "bf16/f16, as a ring all-reduce in the gradients' dtype does)",
     "DeepEP #176; Megatron-LM #502",
     "half-precision gradients (bf16 or f16 without --fp32-master), a replica set of 3 ranks or "
     "more",
     "reductions off their inputs' FP64 mean by more than one ulp of the half result, no "
     "common scale",
     NULL, "--world 4 --ep 2"},
    {HX_FAULT_FOUND_INF_LOCAL, "found-inf-local",
     "found_inf not agreed over all groups: the dense and expert optimizers disagree on "
     "skipping a step",
     "Megatron-Bridge PR #5591", "--loss-scale, an overflow",
     "one group's parameters stepped while another's skipped (post-step check)", NULL,
     "--world 4 --ep 2 --dtype f16 --optimizer adamw --loss-scale dynamic --inject-overflow 1"},
};

#define N_BUGS ((int)(sizeof table / sizeof table[0]))

int hx_bug_count(void)
{
    return N_BUGS;
}

const hx_bug *hx_bug_at(int i)
{
    return i >= 0 && i < N_BUGS ? &table[i] : NULL;
}

const hx_bug *hx_bug_of(hx_fault fault)
{
    for (int i = 0; i < N_BUGS; i++)
        if (table[i].fault == fault)
            return &table[i];
    return NULL;
}

bool hx_bug_is_framework(hx_fault fault)
{
    return hx_bug_of(fault) != NULL;
}

const char *hx_bug_expected_names(void)
{
    static char text[1024];
    if (text[0])
        return text;
    size_t at = (size_t)snprintf(text, sizeof text,
                                 "none, grad, replica or absent (defects the checks must "
                                 "catch), fail (an error that must stop every rank), or a "
                                 "framework bug:");
    for (int i = 0; i < N_BUGS && at < sizeof text; i++)
        at += (size_t)snprintf(text + at, sizeof text - at, "%s %s", i ? "," : "", table[i].name);
    return text;
}

seldp_status hx_bug_refuse_options(const hx_options *o)
{
    const hx_bug *bug = hx_bug_of(o->inject);
    if (!bug || !bug->pending)
        return SELDP_OK;
    return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                   "--inject %s: needs %s (%s does not exist in this build of the step yet)",
                   bug->name, bug->needs, bug->pending);
}

void hx_bug_cite(hx_fault f, char *buf, size_t size)
{
    const hx_bug *bug = hx_bug_of(f);
    if (!bug) {
        snprintf(buf, size, "no known bug");
        return;
    }
    if (bug->citation[0])
        snprintf(buf, size, "known bug %s (%s): %s?", bug->name, bug->citation, bug->mistake);
    else
        snprintf(buf, size, "known bug %s: %s?", bug->name, bug->mistake);
}

/* A table cell: '|' would end it. */
static void cell(hx_buf *b, const char *s)
{
    for (; *s; s++) {
        if (*s == '|')
            hx_buf_puts(b, "\\|");
        else
            hx_buf_append(b, s, 1);
    }
}

void hx_bugs_markdown(hx_buf *b)
{
    hx_buf_puts(b, "| name | the mistake | shipped in | shows on |\n|---|---|---|---|\n");
    for (int i = 0; i < N_BUGS; i++) {
        const hx_bug *bug = &table[i];
        hx_buf_printf(b, "| `%s` | ", bug->name);
        cell(b, bug->mistake);
        hx_buf_puts(b, " | ");
        cell(b, bug->citation);
        hx_buf_puts(b, " | ");
        cell(b, bug->needs);
        if (bug->pending)
            hx_buf_printf(b, " (refused until `%s` exists)", bug->pending);
        hx_buf_puts(b, " |\n");
    }
}

void hx_bugs_catalog(hx_buf *b)
{
    hx_buf_puts(b, "| # | name | shipped in | shows on | what the checks see | status |\n"
                   "|---|---|---|---|---|---|\n");
    for (int i = 0; i < N_BUGS; i++) {
        const hx_bug *bug = &table[i];
        hx_buf_printf(b, "| %d | [`%s`](#%s) | ", i + 1, bug->name, bug->name);
        cell(b, bug->citation[0] ? bug->citation : "(no public issue)");
        hx_buf_puts(b, " | ");
        cell(b, bug->needs);
        hx_buf_puts(b, " | ");
        cell(b, bug->signature);
        if (bug->pending)
            hx_buf_printf(b, " | pending: needs `%s` |\n", bug->pending);
        else
            hx_buf_puts(b, " | planted, caught, named |\n");
    }
}

const char *hx_fault_name(hx_fault fault)
{
    static const char *const self_tests[] = {"none", "grad", "replica", "absent", "fail"};
    if ((unsigned)fault < sizeof self_tests / sizeof self_tests[0])
        return self_tests[fault];
    const hx_bug *bug = hx_bug_of(fault);
    return bug ? bug->name : "invalid";
}

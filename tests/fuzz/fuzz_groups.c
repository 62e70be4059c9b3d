/* libFuzzer target: the --compare-groups file (harness/layout/compare.c) on arbitrary bytes. The
 * first byte picks the layout it is compared with (the layouts of the seed corpus's groups files:
 * Megatron's Mixtral grid of 32 ranks, its gpt-oss pipeline of 8, DeepSpeed's and torchtitan's
 * ep 8, a hot-expert layout file without the grid); the rest is the file.
 *
 * Properties: never a crash, a leak or a read outside the input; a refusal is one line; a file
 * that reads has one entry per rank with sorted, distinct, in-range ranks; the comparison
 * always ends with a verdict, and a difference is named on one line by its rank and kind. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare.h"
#include "layout.h"
#include "util.h"

static const char hot_expert[] =
    "{\"ep_groups\": [[0, 1], [2, 3]], \"experts\": [{\"owners\": [0, 1, 2, 3]}, {\"owners\": "
    "[0, 2]}, {\"owners\": [1, 3]}, {\"owners\": [1, 3], \"root\": 3}]}";

static hx_layout *layouts[5];

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    hx_grid megatron = HX_GRID_INIT, gptoss = HX_GRID_INIT, deepspeed = HX_GRID_INIT,
            torchtitan = HX_GRID_INIT;
    megatron.pp = 4;
    gptoss.pp = 8;
    deepspeed.framework = SELDP_FRAMEWORK_DEEPSPEED;
    torchtitan.framework = SELDP_FRAMEWORK_TORCHTITAN;
    if (hx_layout_generate_grid(32, 8, 8, &megatron, HX_ROOTS_FIRST, &layouts[0]) != SELDP_OK ||
        hx_layout_generate_grid(8, 1, 4, &gptoss, HX_ROOTS_FIRST, &layouts[1]) != SELDP_OK ||
        hx_layout_generate_grid(8, 8, 64, &deepspeed, HX_ROOTS_FIRST, &layouts[2]) != SELDP_OK ||
        hx_layout_generate_grid(8, 8, 64, &torchtitan, HX_ROOTS_FIRST, &layouts[3]) != SELDP_OK ||
        hx_layout_parse(hot_expert, sizeof hot_expert - 1, "hot.json", 0, 0, HX_ROOTS_FIRST,
                        &layouts[4]) != SELDP_OK)
        abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const hx_layout *l = layouts[data[0] % 5];
    size_t len = size - 1;
    char *text = malloc(len ? len : 1);
    if (!text)
        return 0;
    memcpy(text, data + 1, len);
    hx_groups_file *f = NULL;
    seldp_status st = hx_groups_file_parse(text, len, "fuzz.json", &f);
    free(text);
    if (st != SELDP_OK) {
        if (f || !hx_last_error()[0] || strchr(hx_last_error(), '\n'))
            abort();
        return 0;
    }
    for (int r = 0; r < f->world; r++)
        for (int k = 0; k <= HX_COMPARE_KINDS; k++)
            for (int i = 1; f->ranks[r].listed[k] && i < f->ranks[r].size[k]; i++)
                if (f->ranks[r].ranks[k][i] <= f->ranks[r].ranks[k][i - 1] ||
                    (k < HX_COMPARE_KINDS && f->ranks[r].ranks[k][i] >= f->world))
                    abort(); /* sorted, distinct, inside the world */
    char msg[1200] = "";
    bool equal = hx_groups_compare(l, f, msg, sizeof msg);
    if (!equal && (!msg[0] || strchr(msg, '\n')))
        abort();
    if (!equal && f->world == l->world && strncmp(msg, "rank ", 5) != 0)
        abort(); /* a difference of one world names its rank */
    hx_groups_file_free(f);
    return 0;
}

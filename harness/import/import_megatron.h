/* What the two halves of the Megatron import share (import_megatron.c reads the command line,
 * import_megatron_map.c maps it to harness options): the keys it reads and their values. */
#ifndef HX_IMPORT_MEGATRON_H
#define HX_IMPORT_MEGATRON_H

#include <stdbool.h>
#include <stddef.h>

#include "import.h"

#define MG_MAX_VALUES 64

/* The keys the import reads, and the ones it ignores for a stated reason. */
enum {
    K_TP,
    K_PP,
    K_CP,
    K_EP,
    K_ETP,
    K_EXPERTS,
    K_TOPK,
    K_LAYERS,
    K_LB_TYPE,
    K_AUX,
    K_Z,
    K_CAPACITY,
    K_DROP_POLICY,
    K_PAD,
    K_SHARED,
    K_SHARED_GATE,
    K_FFN,
    K_MOE_FFN,
    K_HIDDEN,
    K_MBS,
    K_GBS,
    K_DIST_OPT,
    K_BF16,
    K_FP16,
    K_ACCUM_FP32,
    K_REDUCE_BF16,
    K_CLIP,
    K_TP_PP_DP,
    K_SEQ_PAR,
    /* Megatron-DeepSpeed */
    K_MDS_EP,
    K_MDS_TOPK,
    K_MDS_AUX,
    K_MDS_CAPACITY,
    K_MDS_NO_DROP,
    K_MDS_MIN_CAPACITY,
    K_MDS_ETP,
    K_MDS_DEEPSPEED,
    K_MDS_CONFIG,
    K_MDS_ZERO,
    K_MDS_MLP_TYPE,
    K_MDS_INTERVAL,
    K_COUNT
};

/* What the command line said: per key its last occurrence's values. */
typedef struct mg_args {
    bool present[K_COUNT];
    const char *values[K_COUNT][MG_MAX_VALUES];
    int n_values[K_COUNT];
    const char *key_text[K_COUNT]; /* the key as written (for the sources) */
} mg_args;

/* The refusal of a value: the key, the value (escaped), what was expected, and a hint when it
 * is a shell variable no one expanded. */
seldp_status hx_mg_bad_value(const char *key, const char *value, const char *expected);
seldp_status hx_mg_positive_int(const char *key, const char *value, long *out);
seldp_status hx_mg_number(const char *key, const char *value, double *out);

/* "--key v1 v2" of an argument, for the sources and the lines. */
void hx_mg_arg_text(const mg_args *a, int id, char *buf, size_t size);

/* The command line's arguments as settings and lines into imp. */
seldp_status hx_mg_map(hx_import *imp, const mg_args *a);

#endif

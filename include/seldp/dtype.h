/** @file
 * Element types of tensors, and exact F16/BF16 <-> F32 conversion. */
#ifndef SELDP_DTYPE_H
#define SELDP_DTYPE_H

#include "seldp/export.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Element type of a tensor. Values are stable (they travel in manifests). */
typedef enum seldp_dtype {
    SELDP_F32 = 0,         /**< IEEE binary32 */
    SELDP_F64 = 1,         /**< IEEE binary64 */
    SELDP_F16 = 2,         /**< IEEE binary16 */
    SELDP_BF16 = 3,        /**< bfloat16: the upper half of a binary32 */
    SELDP_I8 = 4,          /**< signed 8-bit integer */
    SELDP_U8 = 5,          /**< unsigned 8-bit integer (NF4 packed bytes) */
    SELDP_I16 = 6,         /**< signed 16-bit integer */
    SELDP_U16 = 7,         /**< unsigned 16-bit integer */
    SELDP_I32 = 8,         /**< signed 32-bit integer (AWQ packed words) */
    SELDP_U32 = 9,         /**< unsigned 32-bit integer */
    SELDP_I64 = 10,        /**< signed 64-bit integer */
    SELDP_U64 = 11,        /**< unsigned 64-bit integer */
    SELDP_BOOL = 12,       /**< one byte, 0 or 1 */
    SELDP_DTYPE_COUNT = 13 /**< number of dtypes; not a dtype */
} seldp_dtype;

/** Size of one element in bytes; 0 for a value outside the enum. */
SELDP_API size_t seldp_dtype_size(seldp_dtype dtype);

/** Lower-case name ("f32", "bf16", "u8", "bool"...); "invalid" outside the enum. */
SELDP_API const char *seldp_dtype_name(seldp_dtype dtype);

/** Parse a name as printed by seldp_dtype_name (case-insensitive).
 * Returns false, leaving *out untouched, for an unknown name. */
SELDP_API bool seldp_dtype_parse(const char *name, seldp_dtype *out);

/** True for F32, F64, F16 and BF16. */
SELDP_API bool seldp_dtype_is_float(seldp_dtype dtype);

/** True for the integer types and BOOL. */
SELDP_API bool seldp_dtype_is_int(seldp_dtype dtype);

/** True for F16 and BF16. */
SELDP_API bool seldp_dtype_is_half(seldp_dtype dtype);

/** True when dtype is one of the enum's values. */
SELDP_API bool seldp_dtype_valid(seldp_dtype dtype);

/** IEEE binary16 bits -> F32 (exact; NaN payload kept, subnormals exact). */
SELDP_API float seldp_f16_to_f32(uint16_t bits);

/** F32 -> IEEE binary16 bits, round to nearest even; overflow gives Inf, NaN stays NaN. */
SELDP_API uint16_t seldp_f32_to_f16(float value);

/** bfloat16 bits -> F32 (exact). */
SELDP_API float seldp_bf16_to_f32(uint16_t bits);

/** F32 -> bfloat16 bits, round to nearest even; NaN stays a quiet NaN. */
SELDP_API uint16_t seldp_f32_to_bf16(float value);

/** Convert n elements of a half type (F16 or BF16) to F32 on the host (exact). */
SELDP_API void seldp_half_to_f32(seldp_dtype half, const uint16_t *src, float *dst, size_t n);
/** Convert n F32 elements to a half type (F16 or BF16) on the host, rounding to nearest
 * even as seldp_f32_to_f16 and seldp_f32_to_bf16 do. */
SELDP_API void seldp_f32_to_half(seldp_dtype half, const float *src, uint16_t *dst, size_t n);

#ifdef __cplusplus
}
#endif
#endif

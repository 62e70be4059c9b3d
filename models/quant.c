/* Quantized expert bases: NF4 (bitsandbytes' 4-bit NormalFloat, blocks of 64 with an F32
 * absmax) and AWQ-style asymmetric 4-bit groups of 32 packed eight to an I32 word, laid
 * out bit for bit as docs/model.md (Quantized variants) says. The FP64 reference decodes these
 * layouts with its own code, so a packing mistake here shows up as a gradient mismatch there. */
#include <math.h>
#include <string.h>

#include "tm_internal.h"

const float tm_nf4_codebook[16] = {
    -1.0f,
    -0.6961928009986877f,
    -0.5250730514526367f,
    -0.39491748809814453f,
    -0.28444138169288635f,
    -0.18477343022823334f,
    -0.09105003625154495f,
    0.0f,
    0.07958029955625534f,
    0.16093020141124725f,
    0.24611230194568634f,
    0.33791524171829224f,
    0.44070982933044434f,
    0.5626170039176941f,
    0.7229568362236023f,
    1.0f,
};

static unsigned nf4_nearest(float x)
{
    unsigned best = 0;
    float best_dist = fabsf(tm_nf4_codebook[0] - x);
    for (unsigned q = 1; q < 16; q++) {
        float d = fabsf(tm_nf4_codebook[q] - x);
        if (d < best_dist) { /* strict: ties keep the lower code */
            best = q;
            best_dist = d;
        }
    }
    return best;
}

seldp_status tm_nf4_quantize(const float *w, size_t n, uint8_t *qweight, float *absmax)
{
    if (n % TM_NF4_BLOCK != 0)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                        "nf4 quantize: %zu elements, expected a multiple of %d", n, TM_NF4_BLOCK);
    for (size_t b = 0; b < n / TM_NF4_BLOCK; b++) {
        const float *blk = w + b * TM_NF4_BLOCK;
        float amax = 0.0f;
        for (int i = 0; i < TM_NF4_BLOCK; i++)
            amax = fmaxf(amax, fabsf(blk[i]));
        absmax[b] = amax;
        for (int i = 0; i < TM_NF4_BLOCK; i += 2) {
            unsigned hi = amax > 0.0f ? nf4_nearest(blk[i] / amax) : 7;
            unsigned lo = amax > 0.0f ? nf4_nearest(blk[i + 1] / amax) : 7;
            qweight[(b * TM_NF4_BLOCK + (size_t)i) / 2] = (uint8_t)(hi << 4 | lo);
        }
    }
    return SELDP_OK;
}

void tm_nf4_dequantize(const uint8_t *qweight, const float *absmax, const float *codebook, size_t n,
                       float *w)
{
    for (size_t i = 0; i < n; i++) {
        uint8_t byte = qweight[i / 2];
        unsigned q = (i % 2 == 0) ? (unsigned)(byte >> 4) : (unsigned)(byte & 0x0f);
        w[i] = codebook[q] * absmax[i / TM_NF4_BLOCK];
    }
}

static int32_t word_to_i32(uint32_t word)
{
    int32_t v;
    memcpy(&v, &word, sizeof v);
    return v;
}

static uint32_t i32_to_word(int32_t v)
{
    uint32_t word;
    memcpy(&word, &v, sizeof word);
    return word;
}

static float clampf(float x, float lo, float hi)
{
    return x < lo ? lo : (x > hi ? hi : x);
}

seldp_status tm_awq_quantize(const float *w, int out, int in, int32_t *qweight, uint16_t *scales,
                             int32_t *qzeros)
{
    if (out <= 0 || in <= 0 || in % TM_AWQ_GROUP != 0)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                        "awq quantize: weight [%d, %d], expected in a multiple of %d", out, in,
                        TM_AWQ_GROUP);
    const int groups = in / TM_AWQ_GROUP;
    const int zero_words = (groups + 7) / 8;
    memset(qzeros, 0, sizeof(int32_t) * (size_t)out * (size_t)zero_words);
    for (int o = 0; o < out; o++) {
        const float *row = w + (size_t)o * (size_t)in;
        uint32_t *qrow = (uint32_t *)(void *)(qweight + (size_t)o * (size_t)(in / 8));
        memset(qrow, 0, sizeof(uint32_t) * (size_t)(in / 8));
        for (int g = 0; g < groups; g++) {
            /* The range always holds 0 so that the zero point is in [0, 15] and no element
             * is clamped by more than half a step. */
            float mn = 0.0f, mx = 0.0f;
            for (int i = g * TM_AWQ_GROUP; i < (g + 1) * TM_AWQ_GROUP; i++) {
                mn = fminf(mn, row[i]);
                mx = fmaxf(mx, row[i]);
            }
            uint16_t s_bits = seldp_f32_to_f16(fmaxf(mx - mn, 1e-5f) / 15.0f);
            float s = seldp_f16_to_f32(s_bits);
            scales[(size_t)o * (size_t)groups + (size_t)g] = s_bits;
            unsigned z = (unsigned)clampf(roundf(-mn / s), 0.0f, 15.0f);
            size_t zw = (size_t)o * (size_t)zero_words + (size_t)(g / 8);
            qzeros[zw] = word_to_i32(i32_to_word(qzeros[zw]) | (uint32_t)z << (4 * (g % 8)));
            for (int i = g * TM_AWQ_GROUP; i < (g + 1) * TM_AWQ_GROUP; i++) {
                unsigned q = (unsigned)clampf(roundf(row[i] / s) + (float)z, 0.0f, 15.0f);
                qrow[i / 8] |= (uint32_t)q << (4 * (i % 8));
            }
        }
    }
    return SELDP_OK;
}

void tm_awq_dequantize(const int32_t *qweight, const uint16_t *scales, const int32_t *qzeros,
                       int out, int in, float *w)
{
    const int groups = in / TM_AWQ_GROUP;
    const int zero_words = (groups + 7) / 8;
    for (int o = 0; o < out; o++) {
        for (int i = 0; i < in; i++) {
            int g = i / TM_AWQ_GROUP;
            uint32_t word = i32_to_word(qweight[(size_t)o * (size_t)(in / 8) + (size_t)(i / 8)]);
            uint32_t zword = i32_to_word(qzeros[(size_t)o * (size_t)zero_words + (size_t)(g / 8)]);
            int q = (int)(word >> (4 * (i % 8)) & 0xfu);
            int z = (int)(zword >> (4 * (g % 8)) & 0xfu);
            float s = seldp_f16_to_f32(scales[(size_t)o * (size_t)groups + (size_t)g]);
            w[(size_t)o * (size_t)in + (size_t)i] = (float)(q - z) * s;
        }
    }
}

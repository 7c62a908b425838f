/* kv_layout.h - the bytes of the paged K/V caches for each cache type, and the
 * q8_0 and fp8 caches' quantisation: one definition for the stores (src/model/model.c), the
 * pool's accounting (src/base/kv_cache.c), the CPU and CUDA kernels and the tests.
 *
 * A layer's K cache (and its V cache) is [n_blocks][n_kv_head] units, one per
 * (block, kv head), each holding the block's bs slots of hd values (kernels/backend.h):
 *   TDM_F32, TDM_F16: K as [hd][bs] elements (a block's keys side by side for each
 *     d), V as [bs][hd]; a unit is bs * hd elements.
 *   TDM_Q8_0: int8 quants in the same orders (K [hd][bs], V [bs][hd]), padded to 16
 *     bytes, then f32 scales [bs] (slot p's scale: its head vector's), padded to 16
 *     bytes; the value of (slot p, d) is scale[p] * q.  The scales live inside the
 *     unit, so copying a block's units (copy-on-write) copies them too.
 *     (Not GGUF's Q8_0 blocks of 32: the type only names "int8 with scales".)
 *   TDM_F8_E4M3 (fp8): E4M3 codes (dtype.h) in the same orders and the same f32
 *     scales per slot, at the same offsets as q8_0 (tdm_kv_scale_off); the value of
 *     (slot p, d) is scale[p] * e4m3(code).  Bytes per position and kv head:
 *     hd + 4, as q8_0's (hd 128: 132, 0.52 of f16's 256; hd 64: 68, 0.53).
 *     One scale per (position, kv head) vector rather than vLLM's one per tensor or
 *     head: no calibration, no overflow or underflow whatever a model's K/V
 *     magnitudes, and E4M3's 3 mantissa bits serve every vector at its own range;
 *     the scale is 3 % of the bytes at hd 128, 6 % at hd 64 (bench/RESULTS.md, "FP8 (E4M3)
 *     KV cache", measures the choice).
 *
 * Quantisation of one head vector x[hd] (tdm_kv_q8_quant_vec):
 *   amax = max |x_i|;  d = amax / 127 (0 for a zero vector);
 *   q_i = x_i / d rounded to nearest (ties to even), clamped to [-127, 127]; 0 when d = 0.
 * A vector holding a NaN or an infinity gets d = NaN and q = 0: its scores (K) or
 * weighted values (V) are NaN where an f32 cache would give NaN or infinite ones,
 * and attention treats them alike.
 *
 * Quantisation of one head vector for fp8 (tdm_kv_fp8_quant_vec): d = amax / 448
 * (TDM_E4M3_MAX; 0 for a zero vector), code_i = tdm_f32_to_e4m3(x_i / d) (round to
 * nearest even, saturating: the GPU's __nv_cvt_float_to_fp8 with __NV_SATFINITE gives
 * the same bytes); codes 0 when d = 0 or NaN (a non-finite vector, as q8_0).  So the
 * NaN codes 0x7f / 0xff never reach a cache; the readers still decode them as NaN.
 *
 * Attention reads the quants directly: score_j = scale * kscale_j * (q . kq_j) and
 * out = sum_j (p_j * vscale_j) vq_j / sum_j p_j, without a dequantised copy (kq_j,
 * vq_j: the int8 quants as integers, or the E4M3 codes' values).
 *
 * Plain C usable from CUDA (host and device).
 */
#ifndef TDM_KV_LAYOUT_H
#define TDM_KV_LAYOUT_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "dtype.h"

#if defined(__CUDACC__)
#define TDM_KV_FN static inline __host__ __device__
#else
#define TDM_KV_FN static inline
#endif

/* True for the element types a K/V cache can have. */
TDM_KV_FN bool tdm_kv_type_ok(uint32_t type) {
    return type == TDM_F32 || type == TDM_F16 || type == TDM_Q8_0 || type == TDM_F8_E4M3;
}

/* True for the cache types of one byte per value and f32 scales per slot (q8_0, fp8). */
TDM_KV_FN bool tdm_kv_scaled(uint32_t type) { return type == TDM_Q8_0 || type == TDM_F8_E4M3; }

/* Bytes of one stored value (q8_0, fp8: of one quant / code). */
TDM_KV_FN int32_t tdm_kv_elem_bytes(uint32_t type) { return type == TDM_F32 ? 4 : type == TDM_F16 ? 2 : 1; }

/* q8_0 and fp8: offset of the scales inside a unit (the quants' bytes, padded to 16). */
TDM_KV_FN int64_t tdm_kv_scale_off(int32_t bs, int32_t hd) { return ((int64_t)bs * hd + 15) & ~(int64_t)15; }

/* Bytes of one (block, kv head) unit of a cache of this type with bs slots of hd
 * values (the stride between units); 0 for a type caches do not take. */
TDM_KV_FN int64_t tdm_kv_unit_bytes(uint32_t type, int32_t bs, int32_t hd) {
    if (tdm_kv_scaled(type)) return tdm_kv_scale_off(bs, hd) + (((int64_t)bs * 4 + 15) & ~(int64_t)15);
    if (type == TDM_F32 || type == TDM_F16) return (int64_t)bs * hd * tdm_kv_elem_bytes(type);
    return 0;
}

/* The absolute-maximum step of the quantisation: max(m, |x|), NaN once either is NaN. */
TDM_KV_FN float tdm_kv_absmax(float m, float x) {
    const float a = fabsf(x);
    return (a > m || a != a) ? a : m;
}

/* The scale of a head vector whose absolute maximum is amax (tdm_kv_absmax from 0):
 * amax / 127, NaN when amax is not finite. */
TDM_KV_FN float tdm_kv_q8_scale(float amax) { return amax <= 3.40282347e+38f ? amax / 127.0f : NAN; }

/* The quant of x under scale d. */
TDM_KV_FN int8_t tdm_kv_q8_quant(float x, float d) {
    if (!(d > 0.0f)) return 0;
    const float v = fminf(fmaxf(rintf(x / d), -127.0f), 127.0f);
    return (int8_t)v;
}

/* Quantises x[0..n) into q[i * q_stride] for i < n; returns the scale. */
TDM_KV_FN float tdm_kv_q8_quant_vec(const float *x, int32_t n, int8_t *q, int64_t q_stride) {
    float amax = 0.0f;
    for (int32_t i = 0; i < n; i++) amax = tdm_kv_absmax(amax, x[i]);
    const float d = tdm_kv_q8_scale(amax);
    for (int32_t i = 0; i < n; i++) q[i * q_stride] = tdm_kv_q8_quant(x[i], d);
    return d;
}

/* fp8: the scale of a head vector whose absolute maximum is amax (tdm_kv_absmax
 * from 0): amax / 448, NaN when amax is not finite. */
TDM_KV_FN float tdm_kv_fp8_scale(float amax) { return amax <= 3.40282347e+38f ? amax / TDM_E4M3_MAX : NAN; }

#if !defined(__CUDA_ARCH__)
/* fp8: quantises x[0..n) into the E4M3 codes q[i * q_stride] for i < n (host code;
 * the GPU's warp writer is cuda_kvq8.cuh's); returns the scale. */
static inline float tdm_kv_fp8_quant_vec(const float *x, int32_t n, uint8_t *q, int64_t q_stride) {
    float amax = 0.0f;
    for (int32_t i = 0; i < n; i++) amax = tdm_kv_absmax(amax, x[i]);
    const float d = tdm_kv_fp8_scale(amax);
    for (int32_t i = 0; i < n; i++) q[i * q_stride] = d > 0.0f ? tdm_f32_to_e4m3(x[i] / d) : 0;
    return d;
}
#endif

#endif

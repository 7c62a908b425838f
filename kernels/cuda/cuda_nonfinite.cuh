/* cuda_nonfinite.cuh - keeping NaN and infinities visible in the kernels.
 *
 * A NaN or an infinity in a model's weights (or an overflow) must reach the logits,
 * where the engine reports it as a model error; the CPU backend's arithmetic carries
 * it there.  fmaxf drops a NaN, an online softmax whose maximum stays -inf weighs
 * every key 0, an output written as "l > 0 ? a / l : 0" turns a NaN sum into 0, and
 * tanh caps an infinity: each of these would turn the fault into plausible text.
 * The kernels use these helpers at those places instead. */
#ifndef TDM_CUDA_NONFINITE_CUH
#define TDM_CUDA_NONFINITE_CUH

#include <math.h>

/* max(a, b), NaN when either is NaN (fmaxf returns the other one). */
__device__ __forceinline__ float tdm_cu_max_nan(float a, float b) {
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}

/* An attention score as the online softmax takes it: -inf for a key the row does
 * not see, NaN for a seen key whose score is not finite (NaN; an infinity, which the
 * softmax would weigh 0 or 1 or make NaN depending on the other scores), else the
 * score. */
__device__ __forceinline__ float tdm_cu_score(bool sees, float s) {
    return !sees ? -INFINITY : isfinite(s) ? s : NAN;
}

/* An attention output a / l from the weighted sum a and the weights' sum l: 0 where
 * no key was seen (l = 0), NaN where l is (a NaN score). */
__device__ __forceinline__ float tdm_cu_attn_div(float a, float l) { return l == 0.0f ? 0.0f : a / l; }

/* Soft-capping: cap * tanh(x / cap), NaN for an infinite x (as the CPU's
 * tdm_cpu_softcap1: tanh would make it +-cap). */
__device__ __forceinline__ float tdm_cu_softcap(float x, float cap) {
    return isinf(x) ? NAN : cap * tanhf(x / cap);
}

#endif

// The epilogue activation of both Hopper tiles (wgmma.cu, wgmma_tma.cu): spliced into each .cu in place of
// its `#include "wgmma_epi.cuh"` line by kernels/ops/gemm/wgmma.py `cu_text`.

// x * sigmoid(z) = x * (1 / (1 + e^-z)): e^-z by ex2.approx (relative error ~2^-22), the reciprocal by
// rcp.approx.f32 (1 ulp; subnormal results kept: no .ftz), so no IEEE division, whose per-element check and
// slow-path branch cut the unrolled epilogue into one block per accumulator (2026-12-05, an H100: GELU cost
// 6.9-7.8 % over the plain linear with it). e^-z = inf gives 1 / inf = 0, so -0 or 0 for finite x; a NaN
// stays NaN. gelu_tanh's 0.5 (1 + tanh(u)) is sigmoid(2u) exactly, so both activations are this one form (no
// 1 + tanh cancellation for negative x).
__device__ __forceinline__ float wg_x_sigmoid(float x, float z) {
    float e, r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(z * -1.4426950408889634f));
    asm("rcp.approx.f32 %0, %1;" : "=f"(r) : "f"(1.0f + e));
    return x * r;
}

// ACT (wgmma.py ACTIVATIONS): 0 none, 1 silu, 2 gelu_tanh
template <int ACT>
__device__ __forceinline__ float wg_act(float x) {
    static_assert(ACT >= 0 && ACT <= 2, "ACT: 0 none, 1 silu, 2 gelu_tanh");
    if (ACT == 1) return wg_x_sigmoid(x, x);
    if (ACT == 2) return wg_x_sigmoid(x, 1.5957691216057308f * (x + 0.044715f * x * x * x));  // 2u
    return x;
}

// The epilogue of both Hopper tiles (wgmma.cu, wgmma_tma.cu): 16-bit words to and from fp32, the activation,
// and the store of one thread's pair of adjacent columns. Spliced into each .cu in place of its
// `#include "wgmma_epi.cuh"` line by kernels/ops/gemm/wgmma.py `cu_text`; needs u16 / u32 defined. DT: the
// input type (0 bf16, 1 fp16); OUT: 0 fp32 output, 1 the input type; RES: R added; ACT: ACTIVATIONS.

struct __align__(8) wg_f2 {  // two fp32 in one 8-byte store (no CUDA headers: no float2)
    float x, y;
};

template <int DT>
__device__ __forceinline__ float wg_to_f32(u16 h) {
    float f;
    if (DT == 0) {
        asm("mov.b32 %0, %1;" : "=f"(f) : "r"(((u32)h) << 16));
    } else {
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    }
    return f;
}

// (lo, hi) -> one 32-bit word of two 16-bit values, lo in the low half (the lower column)
template <int DT>
__device__ __forceinline__ u32 wg_pack(float lo, float hi) {
    u32 r;
    if (DT == 0) {
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    } else {
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    }
    return r;
}

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

// columns (at, at + 1) of C from x, y (bias and R already added): the activation, one rounding, one 8-byte
// (fp32) or 4-byte (16-bit) store; `at` even, so the stores are aligned
template <int DT, int OUT, int ACT>
__device__ __forceinline__ void wg_put2(long long c, long long at, float x, float y) {
    x = wg_act<ACT>(x);
    y = wg_act<ACT>(y);
    if (OUT == 0) {
        wg_f2 v;
        v.x = x;
        v.y = y;
        *reinterpret_cast<wg_f2*>(reinterpret_cast<float*>(c) + at) = v;
    } else {
        *reinterpret_cast<u32*>(reinterpret_cast<u16*>(c) + at) = wg_pack<DT>(x, y);
    }
}

// columns (at, at + 1) of C, from their accumulators x, y (a bias already added): + R (one aligned 4-byte
// read), then wg_put2
template <int DT, int OUT, int RES, int ACT>
__device__ __forceinline__ void wg_store2(long long c, long long res, long long at, float x, float y) {
    if (RES) {
        const u32 rw = *reinterpret_cast<const u32*>(reinterpret_cast<const u16*>(res) + at);
        x += wg_to_f32<DT>((u16)(rw & 0xFFFF));
        y += wg_to_f32<DT>((u16)(rw >> 16));
    }
    wg_put2<DT, OUT, ACT>(c, at, x, y);
}

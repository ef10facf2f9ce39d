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

// The tile epilogue of one thread, straight from its accumulators (both tiles: a warpgroup's thread (warp w,
// lane l) holds, for every n8 column block j, rows row0 = 16w + l/4 (+8) and columns colb + 8j = 8j + 2(l%4)
// (+1), in acc[4j + 2h], acc[4j + 2h + 1] for row row0 + 8h). Each chunk of EPI_J column groups reads all its
// bias and R words before it stores anything: the compiler cannot move a load above a store that may alias
// it, so a read per store made every R read wait a full memory latency (64 in a row per tile: o_proj 0.83x
// cuBLAS on the TMA tile, 2026-12-05). Exact aliasing (C is R, in place) stays right: every element is read
// and written by this one thread, read first. N % 8 == 0, so col < N implies col + 1 < N.
template <int DT, int OUT, int BIAS, int RES, int ACT, int BN, int EPI_J>
__device__ __forceinline__ void wg_epilogue(const float (&acc)[BN / 2], long long c, long long bias,
                                            long long res, int M, int N, int row0, int colb) {
    static_assert((BN / 8) % EPI_J == 0, "EPI_J must divide the tile's BN / 8 column groups");
#pragma unroll
    for (int j0 = 0; j0 < BN / 8; j0 += EPI_J) {
        u32 bw[EPI_J];     // columns col, col + 1 (col even: a 4-byte aligned word), one for both rows
        u32 rw[EPI_J][2];  // R at (row0 + 8h, col)
#pragma unroll
        for (int jj = 0; jj < EPI_J; ++jj) {
            const int col = colb + 8 * (j0 + jj);
            const bool in_n = col < N;
            bw[jj] = (BIAS && in_n) ? *reinterpret_cast<const u32*>(reinterpret_cast<const u16*>(bias) + col) : 0u;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = row0 + 8 * h;
                rw[jj][h] = (RES && in_n && row < M)
                    ? *reinterpret_cast<const u32*>(reinterpret_cast<const u16*>(res) + (long long)row * N + col)
                    : 0u;
            }
        }
#pragma unroll
        for (int jj = 0; jj < EPI_J; ++jj) {
            const int j = j0 + jj;
            const int col = colb + 8 * j;
            if (col >= N) continue;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = row0 + 8 * h;
                if (row >= M) continue;
                float x = acc[4 * j + 2 * h], y = acc[4 * j + 2 * h + 1];
                if (BIAS) {
                    x += wg_to_f32<DT>((u16)(bw[jj] & 0xFFFF));
                    y += wg_to_f32<DT>((u16)(bw[jj] >> 16));
                }
                if (RES) {
                    x += wg_to_f32<DT>((u16)(rw[jj][h] & 0xFFFF));
                    y += wg_to_f32<DT>((u16)(rw[jj][h] >> 16));
                }
                wg_put2<DT, OUT, ACT>(c, (long long)row * N + col, x, y);
            }
        }
    }
}

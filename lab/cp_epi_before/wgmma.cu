// Hopper (sm_90a) GEMM on wgmma, linked into a numba kernel (kernels/ops/gemm/wgmma.py):
//
//   C[M, N] = act(A[M, K] @ B (+ bias[N]) (+ R[M, N])),   A row-major bf16 or fp16, B [K, N] row-major
//   (WG_BT 0: gemm, o_proj) or [N, K] row-major (WG_BT 1: a torch Linear weight, linear), fp32 accumulation,
//   C fp32 (WG_OUT 0: gemm) or the input type (WG_OUT 1: o_proj, linear); bias (WG_BIAS 1) and R (WG_RES 1)
//   are of the input type and added in fp32, then the activation (WG_ACT: 0 none, 1 SiLU, 2 GELU with the
//   tanh approximation), then the one final rounding.
//
// sm_90a only: wgmma exists on no other target (ptxas refuses it for plain sm_90), and the launcher never
// compiles this file on another architecture. numba ABI: `int f(int* ret, args...)`, pointers as 64-bit
// integers; no CUDA headers (bf16 / fp16 travel as raw 16-bit words, converted with cvt in inline PTX), so
// NVRTC needs no include path.
//
// Tiling (one configuration per compile, set by #defines in front of this file; the defaults are the
// production tile, benchmarks/PERF.md):
//   - a block of 256 threads = 2 warpgroups computes a 128 x WG_BN tile of C; warpgroup g owns rows 64g..64g+63
//     and issues wgmma.m64n{WG_BN}k16 (A and B both from shared memory), WG_BN / 2 fp32 accumulators per thread;
//   - K walks in slices of 64 (one 128-byte row of 16-bit values): every slice of A (128 x 64) and B (64 x WG_BN)
//     is copied global -> shared by all 256 threads with cp.async (16-byte chunks, zero-filled past the edges),
//     WG_STAGES slices in shared memory, WG_STAGES - 1 - WG_INFLIGHT of them in flight ahead of the math;
//   - shared memory holds the canonical 128-byte-swizzle layouts of the wgmma descriptors:
//       A (K-major): row r of the slice at r * 128 bytes, its 16-byte chunk c at ((c ^ (r % 8)) * 16);
//         8-row groups 1024 bytes apart (SBO = 1024); k-step kk of 16 starts 32 * kk bytes further;
//       B (N-major): 1024-byte atoms of 8 k-rows x 64 n; atom (n / 64, k / 8) at ((n/64) * 8 + k/8) * 1024,
//         inside it k-row (k % 8) at 128 bytes each, chunk ((n % 64) / 8) ^ (k % 8); so the stride between
//         64-wide n blocks is 8 KB (LBO) and between 8-row k groups 1 KB (SBO); k-step kk starts 2 KB further;
//     every tile starts on a 1024-byte boundary (the swizzle is a function of the address bits 4-9);
//   - WG_INFLIGHT 1: a k-slice's wgmma group is still running while the next slice's copies are issued
//     (wgmma.wait_group 1); the slot overwritten is the one read two slices ago;
//   - epilogue straight from the accumulators: thread (warp w, lane l) of a warpgroup holds, for every n8
//     column block j, rows 16w + l/4 (+8) and columns 8j + 2(l%4) (+1): one 4- or 8-byte store per pair.
// Requirements (checked by the launcher): K and N multiples of 8, A / B / C / R / bias 16-byte aligned.

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#ifndef WG_BN
#define WG_BN 128
#endif
#ifndef WG_STAGES
#define WG_STAGES 6
#endif
#ifndef WG_INFLIGHT
#define WG_INFLIGHT 1
#endif
#ifndef WG_DT
#define WG_DT 0  // 0: bf16 inputs, 1: fp16
#endif
#ifndef WG_OUT
#define WG_OUT 0  // 0: fp32 output, 1: output in the input type
#endif
#ifndef WG_BT
#define WG_BT 0  // 0: B is [K, N] (N-major in smem, wgmma trans-b 1), 1: B is [N, K] (K-major, a torch weight)
#endif
#ifndef WG_RES
#define WG_RES 0  // 1: add R[M, N] (input type) in the epilogue
#endif
#ifndef WG_BIAS
#define WG_BIAS 0  // 1: add bias[N] (input type) in the epilogue
#endif
#ifndef WG_ACT
#define WG_ACT 0  // 0: none, 1: silu, 2: gelu_tanh (wg_act, wgmma_epi.cuh)
#endif
#ifndef WG_GROUP_M
#define WG_GROUP_M 8  // tile-rows walked before moving right: those blocks share their B columns in L2
#endif
#ifndef WG_NAME
#define WG_NAME wg_gemm
#endif

#define WG_BM 128
#define WG_BK 64
#define WG_THREADS 256
#define WG_A_BYTES (WG_BM * WG_BK * 2)
#define WG_B_BYTES (WG_BK * WG_BN * 2)
#define WG_STAGE_BYTES (WG_A_BYTES + WG_B_BYTES)
#define WG_ACC (WG_BN / 2)
#define WG_A_ITERS (WG_BM * WG_BK / 8 / WG_THREADS)  // 16-byte chunks per thread per slice
#define WG_B_ITERS (WG_BK * WG_BN / 8 / WG_THREADS)

static_assert(WG_BN == 128 || WG_BN == 256, "WG_BN: 128 or 256");
static_assert(WG_STAGES - 1 - WG_INFLIGHT >= 1, "need at least one slice in flight");
static_assert(WG_INFLIGHT == 0 || WG_INFLIGHT == 1, "WG_INFLIGHT: 0 or 1");
static_assert(WG_STAGE_BYTES % 1024 == 0, "stages must keep the 1024-byte alignment of the swizzle");

#include "wgmma_ops.cuh"
#include "wgmma_epi.cuh"

// (lab copy) the epilogue's old pair store with its R read, as wgmma_epi.cuh had it at 832ce86
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

#if WG_DT == 0
#if WG_BN == 256
#define WG_MMA wg_mma_n256_bf16<1 - WG_BT>
#else
#define WG_MMA wg_mma_n128_bf16<1 - WG_BT>
#endif
#else
#if WG_BN == 256
#define WG_MMA wg_mma_n256_f16<1 - WG_BT>
#else
#define WG_MMA wg_mma_n128_f16<1 - WG_BT>
#endif
#endif

extern __shared__ __align__(1024) unsigned char wg_dyn[];

__device__ __forceinline__ void wg_cp16(u32 dst, const void* src, bool pred) {
    int n = pred ? 16 : 0;  // src-size 0: write 16 zero bytes, read nothing
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
}

__device__ __forceinline__ void wg_cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int N>
__device__ __forceinline__ void wg_cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// cp.async writes through the generic proxy; wgmma reads shared memory through the async proxy
__device__ __forceinline__ void wg_fence_proxy() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// copy K-slice starting at k0 into the stage at shared address `st` (A then B)
__device__ __forceinline__ void wg_load(u32 st, const u16* A, const u16* B, int M, int N, int K, int m0, int n0,
                                        int k0, int tid) {
#pragma unroll
    for (int j = 0; j < WG_A_ITERS; ++j) {
        int i = tid + j * WG_THREADS;
        int r = i >> 3, c = i & 7;
        int gm = m0 + r, gk = k0 + c * 8;
        bool ok = gm < M && gk < K;
        const u16* src = ok ? A + (long long)gm * K + gk : A;
        wg_cp16(st + r * 128 + ((c ^ (r & 7)) << 4), src, ok);
    }
    u32 sb = st + WG_A_BYTES;
#pragma unroll
    for (int j = 0; j < WG_B_ITERS; ++j) {
        int i = tid + j * WG_THREADS;
#if WG_BT == 0
        // B[K, N]: k-row kr of the slice, 16-byte chunk cn of its WG_BN columns
        int kr = i / (WG_BN / 8), cn = i % (WG_BN / 8);
        int gk = k0 + kr, gn = n0 + cn * 8;
        bool ok = gk < K && gn < N;
        const u16* src = ok ? B + (long long)gk * N + gn : B;
        u32 off = ((cn >> 3) * (WG_BK / 8) + (kr >> 3)) * 1024 + (kr & 7) * 128 + (((cn & 7) ^ (kr & 7)) << 4);
#else
        // B[N, K]: row nr of the tile, chunk c of its 64 k
        int nr = i >> 3, c = i & 7;
        int gn = n0 + nr, gk = k0 + c * 8;
        bool ok = gn < N && gk < K;
        const u16* src = ok ? B + (long long)gn * K + gk : B;
        u32 off = nr * 128 + ((c ^ (nr & 7)) << 4);
#endif
        wg_cp16(sb + off, src, ok);
    }
}

extern "C" __device__ int WG_NAME(int* ret, long long a, long long b, long long bias, long long res,
                                  long long c, long long m, long long n, long long k) {
    const u16* A = reinterpret_cast<const u16*>(a);
    const u16* B = reinterpret_cast<const u16*>(b);
    const int M = (int)m, N = (int)n, K = (int)k;
    const int tid = threadIdx.x;
    const int wg = tid >> 7;  // warpgroup: rows 64 wg .. 64 wg + 63 of the tile

    // block -> tile, WG_GROUP_M tile-rows at a time
    const int tiles_m = (M + WG_BM - 1) / WG_BM, tiles_n = (N + WG_BN - 1) / WG_BN;
    const int pid = blockIdx.x, per_group = WG_GROUP_M * tiles_n;
    const int first_m = (pid / per_group) * WG_GROUP_M;
    const int gsz = tiles_m - first_m < WG_GROUP_M ? tiles_m - first_m : WG_GROUP_M;
    const int tm = first_m + (pid % per_group) % gsz, tn = (pid % per_group) / gsz;
    const int m0 = tm * WG_BM, n0 = tn * WG_BN;

    const u32 base = (wg_smem(wg_dyn) + 1023u) & ~1023u;  // the launcher asks for 1 KB more than the stages
    const int KT = (K + WG_BK - 1) / WG_BK;

    float acc[WG_ACC];
#pragma unroll
    for (int i = 0; i < WG_ACC; ++i) acc[i] = 0.f;

#pragma unroll
    for (int s = 0; s < WG_STAGES - 1 - WG_INFLIGHT; ++s) {
        if (s < KT) wg_load(base + s * WG_STAGE_BYTES, A, B, M, N, K, m0, n0, s * WG_BK, tid);
        wg_cp_commit();
    }

    for (int kt = 0; kt < KT; ++kt) {
        wg_cp_wait<WG_STAGES - 2 - WG_INFLIGHT>();  // this thread's copies of slice kt have landed
        wg_fence_proxy();
        __syncthreads();  // everyone's have; and every warpgroup is done with the slot refilled below
        const int pf = kt + WG_STAGES - 1 - WG_INFLIGHT;
        if (pf < KT) wg_load(base + (pf % WG_STAGES) * WG_STAGE_BYTES, A, B, M, N, K, m0, n0, pf * WG_BK, tid);
        wg_cp_commit();

        const u32 st = base + (kt % WG_STAGES) * WG_STAGE_BYTES;
        const u32 sa = st + wg * (64 * 128);
        const u32 sb = st + WG_A_BYTES;
#pragma unroll
        for (int i = 0; i < WG_ACC; ++i) wg_fence_reg(acc[i]);
        wg_mma_fence();
#pragma unroll
        for (int kk = 0; kk < WG_BK / 16; ++kk) {
            u64 da = wg_desc(sa + kk * 32, 16, 1024);
#if WG_BT == 0
            u64 db = wg_desc(sb + kk * 2048, (WG_BK / 8) * 1024, 1024);
#else
            u64 db = wg_desc(sb + kk * 32, 16, 1024);
#endif
            WG_MMA(acc, da, db);
        }
        wg_mma_commit();
        wg_mma_wait<WG_INFLIGHT>();
#pragma unroll
        for (int i = 0; i < WG_ACC; ++i) wg_fence_reg(acc[i]);
    }
    wg_mma_wait<0>();
    wg_cp_wait<0>();
#pragma unroll
    for (int i = 0; i < WG_ACC; ++i) wg_fence_reg(acc[i]);

    const int lane = tid & 31, warp = (tid >> 5) & 3;
    const int row0 = m0 + wg * 64 + warp * 16 + (lane >> 2);
    const int colb = n0 + 2 * (lane & 3);
#pragma unroll
    for (int j = 0; j < WG_BN / 8; ++j) {
        const int col = colb + 8 * j;
        if (col >= N) continue;  // N % 8 == 0: col < N implies col + 1 < N
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = row0 + 8 * h;
            if (row >= M) continue;
            float x = acc[4 * j + 2 * h], y = acc[4 * j + 2 * h + 1];
            const long long at = (long long)row * N + col;
#if WG_BIAS
            u32 bw = *reinterpret_cast<const u32*>(reinterpret_cast<const u16*>(bias) + col);
            x += wg_to_f32<WG_DT>((u16)(bw & 0xFFFF));
            y += wg_to_f32<WG_DT>((u16)(bw >> 16));
#endif
            wg_store2<WG_DT, WG_OUT, WG_RES, WG_ACT>(c, res, at, x, y);
        }
    }
    *ret = 0;
    return 0;
}

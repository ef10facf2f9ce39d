// Hopper (sm_90a) warp-specialized GEMM: TMA producer warpgroup + 2 wgmma consumer warpgroups, linked into a
// numba kernel (kernels/ops/gemm/wgmma_tma.py; first built and measured as lab/wgmma_ws, whose H100 run of
// 2026-12-05 checked the bf16 variants of this file and timed them against cuBLAS: lab/wgmma_ws/NOTES.md; the
// lab still compiles its other variants from this file). The product compiles the persistent, one-CTA form
// (WS_PERSIST 1, WS_CLUSTER 1) with WS_BN 256, WS_STAGES 4:
//
//   C[M, N] = act(A[M, K] @ B (+ bias[N]) (+ R[M, N])),   A row-major bf16 or fp16, fp32 accumulation,
//   B [K, N] row-major (WS_BT 0, "NN") or [N, K] row-major (WS_BT 1, "NT", a torch Linear weight),
//   C fp32 (WS_OUT 0) or the input type (WS_OUT 1); bias (WS_BIAS 1) and R (WS_RES 1) are of the input type
//   and added in fp32, then the activation (WS_ACT: 0 none, 1 SiLU, 2 GELU with the tanh approximation),
//   then the one final rounding: wgmma.cu's epilogue, in the same order.
//
// numba ABI: `int f(int* ret, args...)`; no CUDA headers. Arguments: `tmaps` the global address of two
// CUtensorMaps (128 bytes each, A's at +0, B's at +128, built on the host by cuTensorMapEncodeTiled: numba
// cannot pass a __grid_constant__ parameter, and PTX takes a tensor-map operand in global memory), c, bias,
// res, m, n, k.
//
// Block: 384 threads = 3 warpgroups. Warpgroup 0 is the producer: setmaxnreg.dec to WS_PROD_REGS, one thread
// issues every TMA copy. Warpgroups 1 and 2 are the consumers: setmaxnreg.inc to WS_CONS_REGS, consumer g
// (0 or 1) owns rows 64g..64g+63 of the 128 x WS_BN tile and issues wgmma.m64n{WS_BN}k16 from shared memory.
// The launcher compiles the numba kernel with launch_bounds (384, 1), so that ptxas knows the register
// count at entry (65536 / 384 -> 168) and honours setmaxnreg (else warning C7508).
//
// Pipeline: WS_STAGES K-slices of 64 in shared memory, each with a "full" mbarrier (count 1: the producer's
// arrive.expect_tx; TMA completes the transaction bytes) and an "empty" mbarrier (count 2: one arrive per
// consumer warpgroup once its wgmmas that read the slot are complete). Consumers keep one wgmma group in
// flight (wait_group 1) and release the slot of the previous K-slice. A global slice counter `it` (over all
// tiles of the block) gives slot it % S and phase (it / S) & 1.
//
// Shared memory (all tiles 1024-byte aligned; TMA SWIZZLE_128B writes the canonical 128-byte-swizzle layouts
// that the wgmma descriptors read; they are the layouts lab/wgmma's cp.async plan writes, validated on the H200):
//   A (K-major): one TMA box of 64 k (128 B) x 128 rows: row r at r*128, 16-byte chunk c at (c ^ (r%8))*16;
//     descriptor LBO 16 (unused), SBO 1024, k-step of 16 = +32 B.
//   NN B (N-major): WS_BN/64 boxes of 64 n (128 B) x 64 k rows, box j at j*8192: k-row kr at kr*128, chunk
//     (n%64)/8 ^ (kr%8); i.e. 1 KB atoms of 8 k-rows x 64 n, n-blocks 8 KB apart (LBO), k-groups 1 KB (SBO);
//     k-step = +2048 B; wgmma trans-b 1.
//   NT B (K-major): one box of 64 k x WS_BN rows, like A.
// Out-of-range rows / columns / k (M, N, K not multiples of the tile) are zero-filled by TMA; the expected
// transaction bytes are the full boxes either way.
//
// Non-persistent (WS_PERSIST 0): one tile per block, grid = tiles. Persistent (WS_PERSIST 1): grid = #SMs
// (or fewer), block b takes tiles b, b + grid, ...; the producer runs ahead into the next tile while the
// consumers store the current one. Tile order: WS_GROUP_M tile-rows at a time (B columns reused in L2).
//
// Hang guard: every mbarrier wait that has not completed after WS_TIMEOUT_NS of %globaltimer traps, so a
// parity / byte-count bug becomes a launch error, not a stuck GPU.
// Requirements (checked by the launcher): K, N multiples of 8; A, B, C, R, bias 16-byte aligned.

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#ifndef WS_BN
#define WS_BN 256
#endif
#ifndef WS_STAGES
#define WS_STAGES 4
#endif
#ifndef WS_DT
#define WS_DT 0  // 0: bf16, 1: fp16
#endif
#ifndef WS_OUT
#define WS_OUT 0  // 0: fp32 out, 1: input type
#endif
#ifndef WS_BT
#define WS_BT 0  // 0: B [K, N] (NN), 1: B [N, K] (NT)
#endif
#ifndef WS_RES
#define WS_RES 0  // 1: add R[M, N] (input type) in the epilogue
#endif
#ifndef WS_BIAS
#define WS_BIAS 0  // 1: add bias[N] (input type) in the epilogue
#endif
#ifndef WS_ACT
#define WS_ACT 0  // 0: none, 1: silu, 2: gelu_tanh (wg_act, wgmma_epi.cuh)
#endif
#ifndef WS_PERSIST
#define WS_PERSIST 0
#endif
#ifndef WS_GROUP_M
#define WS_GROUP_M 8
#endif
#ifndef WS_PROD_REGS
#define WS_PROD_REGS 40
#endif
#ifndef WS_CONS_REGS
#define WS_CONS_REGS 232
#endif
#ifndef WS_TIMEOUT_NS
#define WS_TIMEOUT_NS 2000000000ull
#endif
#ifndef WS_CLUSTER
#define WS_CLUSTER 1  // 2: 2-CTA clusters along M sharing B (each CTA loads half of B's boxes, multicast to both)
#endif
#ifndef WS_NAME
#define WS_NAME ws_gemm
#endif
#ifndef WS_EPI_J
#define WS_EPI_J 16  // epilogue column groups (8 columns of the tile each) whose bias / R words are read at once
#endif

#define WS_BM 128
#define WS_BK 64
#define WS_THREADS 384
#define WS_A_BYTES (WS_BM * WS_BK * 2)
#define WS_B_BYTES (WS_BK * WS_BN * 2)
#define WS_STAGE_BYTES (WS_A_BYTES + WS_B_BYTES)
#define WS_BAR_OFF (WS_STAGES * WS_STAGE_BYTES)  // 2 * WS_STAGES mbarriers (8 bytes each) after the stages
#define WS_ACC (WS_BN / 2)

static_assert(WS_BN == 128 || WS_BN == 256, "WS_BN: 128 or 256");
static_assert(WS_STAGES >= 2, "WS_STAGES >= 2");
static_assert(WS_STAGE_BYTES % 1024 == 0, "stages keep the 1024-byte alignment of the swizzle");
static_assert(WS_PROD_REGS % 8 == 0 && WS_CONS_REGS % 8 == 0, "setmaxnreg counts are multiples of 8");
static_assert(WS_CLUSTER == 1 || (WS_CLUSTER == 2 && WS_BT == 0 && !WS_PERSIST),
              "clusters: 2 CTAs, NN layout, one tile per block");
static_assert(128 * WS_PROD_REGS + 256 * WS_CONS_REGS <= 65536, "register file: 64K per SM");

#include "wgmma_ops.cuh"
#include "wgmma_epi.cuh"

#if WS_DT == 0
#if WS_BN == 256
#define WS_MMA wg_mma_n256_bf16<1 - WS_BT>
#else
#define WS_MMA wg_mma_n128_bf16<1 - WS_BT>
#endif
#else
#if WS_BN == 256
#define WS_MMA wg_mma_n256_f16<1 - WS_BT>
#else
#define WS_MMA wg_mma_n128_f16<1 - WS_BT>
#endif
#endif

extern __shared__ __align__(1024) unsigned char ws_dyn[];

// ---------------------------------------------------------------- mbarrier

__device__ __forceinline__ void ws_bar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void ws_bar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

__device__ __forceinline__ void ws_bar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

__device__ __forceinline__ void ws_bar_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ bool ws_bar_try(u32 bar, u32 parity) {
    u32 ok;
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(ok)
        : "r"(bar), "r"(parity)
        : "memory");
    return ok != 0;
}

__device__ __forceinline__ u64 ws_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// wait until the phase of parity `parity` of `bar` has completed; trap after WS_TIMEOUT_NS
__device__ __forceinline__ void ws_bar_wait(u32 bar, u32 parity) {
    if (ws_bar_try(bar, parity)) return;
    const u64 t0 = ws_ns();
    while (!ws_bar_try(bar, parity)) {
        if (ws_ns() - t0 > WS_TIMEOUT_NS) asm volatile("trap;");
    }
}

// ---------------------------------------------------------------- TMA

__device__ __forceinline__ void ws_tmap_acquire(u64 tmap) {
    // the maps were written by a host copy (generic proxy); the copy engine reads them through the tensormap
    // proxy
    asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n" ::"l"(tmap) : "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(tmap) : "memory");
}

__device__ __forceinline__ void ws_tma_2d(u32 dst, u64 tmap, int c0, int c1, u32 bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
            dst),
        "l"(tmap), "r"(c0), "r"(c1), "r"(bar)
        : "memory");
}

// same box, delivered to the same CTA-relative offset (data and mbarrier complete_tx) in every CTA of `mask`
__device__ __forceinline__ void ws_tma_2d_mc(u32 dst, u64 tmap, int c0, int c1, u32 bar, u16 mask) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
        " [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
        "l"(tmap), "r"(c0), "r"(c1), "r"(bar), "h"(mask)
        : "memory");
}

__device__ __forceinline__ u32 ws_cta_rank() {
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

__device__ __forceinline__ void ws_cluster_arrive() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void ws_cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory"); }

// arrive on the mbarrier at the same offset in CTA `cta` of the cluster (CUTLASS's ClusterBarrier::arrive form:
// default .release.cta semantics; the explicit .release.cluster costs a MEMBAR.ALL.GPU per call in SASS)
__device__ __forceinline__ void ws_bar_arrive_cta(u32 bar, u32 cta) {
    asm volatile(
        "{\n.reg .b32 ra;\n"
        "mapa.shared::cluster.u32 ra, %0, %1;\n"
        "mbarrier.arrive.shared::cluster.b64 _, [ra];\n}\n" ::"r"(bar),
        "r"(cta)
        : "memory");
}

// ---------------------------------------------------------------- wgmma

// tile t (of tiles_m x tiles_n tiles of bm x WS_BN) -> its corner, WS_GROUP_M tile-rows at a time
__device__ __forceinline__ void ws_tile_of(int t, int tiles_m, int tiles_n, int bm, int& m0, int& n0) {
    const int per_group = WS_GROUP_M * tiles_n;
    const int first_m = (t / per_group) * WS_GROUP_M;
    const int gsz = tiles_m - first_m < WS_GROUP_M ? tiles_m - first_m : WS_GROUP_M;
    m0 = (first_m + (t % per_group) % gsz) * bm;
    n0 = ((t % per_group) / gsz) * WS_BN;
}

extern "C" __device__ int WS_NAME(int* ret, long long tmaps, long long c, long long bias, long long res,
                                  long long m, long long n, long long k) {
    const int M = (int)m, N = (int)n, K = (int)k;
    const int tid = threadIdx.x;
    const int wg = tid >> 7;
    // a cluster of 2 takes a 256 x WS_BN tile: CTA rank r its rows 128 r .. 128 r + 127
    const int tiles_m = (M + WS_BM * WS_CLUSTER - 1) / (WS_BM * WS_CLUSTER), tiles_n = (N + WS_BN - 1) / WS_BN;
    const int ntiles = tiles_m * tiles_n;
    const int KT = (K + WS_BK - 1) / WS_BK;
    const u32 base = (wg_smem(ws_dyn) + 1023u) & ~1023u;  // the launcher asks for 1 KB more
    const u32 full = base + WS_BAR_OFF, empty = full + 8 * WS_STAGES;

    if (tid == 0) {
#pragma unroll
        for (int s = 0; s < WS_STAGES; ++s) {
            ws_bar_init(full + 8 * s, 1);
            ws_bar_init(empty + 8 * s, 2 * WS_CLUSTER);  // every consumer warpgroup of the cluster
        }
        ws_bar_init_fence();
    }
#if WS_CLUSTER == 1
    __syncthreads();
    const int rank = 0, t_block = blockIdx.x;
#else
    ws_cluster_arrive();  // the barriers of both CTAs are initialised before anyone multicasts or arrives
    ws_cluster_wait();
    const int rank = (int)ws_cta_rank(), t_block = blockIdx.x / WS_CLUSTER;
#endif

#if WS_PERSIST
    const int t_first = t_block, t_step = gridDim.x;
#else
    const int t_first = t_block, t_step = ntiles;  // one tile per block (per cluster)
#endif

    if (wg == 0) {
        // ------------------------------------------------ producer
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(WS_PROD_REGS));
        if (tid == 0) {
            const u64 ta = (u64)tmaps, tb = (u64)tmaps + 128;
            ws_tmap_acquire(ta);
            ws_tmap_acquire(tb);
            u32 it = 0;
            for (int t = t_first; t < ntiles; t += t_step) {
                int m0, n0;
                ws_tile_of(t, tiles_m, tiles_n, WS_BM * WS_CLUSTER, m0, n0);
                m0 += rank * WS_BM;
                for (int kt = 0; kt < KT; ++kt, ++it) {
                    const u32 s = it % WS_STAGES, ph = (it / WS_STAGES) & 1;
                    // the slot's consumers are done with it (with clusters: both CTAs', which arrive here too)
                    if (it >= WS_STAGES) ws_bar_wait(empty + 8 * s, ph ^ 1);
                    const u32 fb = full + 8 * s;
                    ws_bar_expect_tx(fb, WS_STAGE_BYTES);
                    const u32 st = base + s * WS_STAGE_BYTES;
                    const int k0 = kt * WS_BK;
                    ws_tma_2d(st, ta, k0, m0, fb);
#if WS_BT == 0 && WS_CLUSTER == 2
                    // this CTA's half of B's boxes, to both CTAs (their full barriers count all boxes)
#pragma unroll
                    for (int j = 0; j < WS_BN / 64; j += 2)
                        ws_tma_2d_mc(st + WS_A_BYTES + (j + rank) * 8192, tb, n0 + 64 * (j + rank), k0, fb, (u16)3);
#elif WS_BT == 0
#pragma unroll
                    for (int j = 0; j < WS_BN / 64; ++j) ws_tma_2d(st + WS_A_BYTES + j * 8192, tb, n0 + 64 * j, k0, fb);
#else
                    ws_tma_2d(st + WS_A_BYTES, tb, k0, n0, fb);
#endif
                }
            }
        }
#if WS_CLUSTER == 2
        ws_cluster_arrive();  // the whole producer warpgroup, converged again
        ws_cluster_wait();
#endif
    } else {
        // ------------------------------------------------ consumers
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(WS_CONS_REGS));
        const int cw = wg - 1;  // rows 64 cw .. 64 cw + 63 of the tile
        const bool leader = (tid & 127) == 0;
        const int lane = tid & 31, warp = (tid >> 5) & 3;
        u32 it = 0;
        for (int t = t_first; t < ntiles; t += t_step) {
            int m0, n0;
            ws_tile_of(t, tiles_m, tiles_n, WS_BM * WS_CLUSTER, m0, n0);
            m0 += rank * WS_BM;
            float acc[WS_ACC];
#pragma unroll
            for (int i = 0; i < WS_ACC; ++i) acc[i] = 0.f;
            u32 prev = 0;
            for (int kt = 0; kt < KT; ++kt, ++it) {
                const u32 s = it % WS_STAGES, ph = (it / WS_STAGES) & 1;
                ws_bar_wait(full + 8 * s, ph);
                const u32 st = base + s * WS_STAGE_BYTES;
                const u32 sa = st + cw * (64 * 128);
                const u32 sb = st + WS_A_BYTES;
#pragma unroll
                for (int i = 0; i < WS_ACC; ++i) wg_fence_reg(acc[i]);
                wg_mma_fence();
#pragma unroll
                for (int kk = 0; kk < WS_BK / 16; ++kk) {
                    u64 da = wg_desc(sa + kk * 32, 16, 1024);
#if WS_BT == 0
                    u64 db = wg_desc(sb + kk * 2048, 8192, 1024);
#else
                    u64 db = wg_desc(sb + kk * 32, 16, 1024);
#endif
                    WS_MMA(acc, da, db);
                }
                wg_mma_commit();
                wg_mma_wait<1>();  // the previous slice's group is complete: its slot can be refilled
#pragma unroll
                for (int i = 0; i < WS_ACC; ++i) wg_fence_reg(acc[i]);
                if (kt > 0 && leader) {
                    ws_bar_arrive(empty + 8 * prev);
#if WS_CLUSTER == 2
                    ws_bar_arrive_cta(empty + 8 * prev, rank ^ 1);  // the peer's producer multicasts here too
#endif
                }
                prev = s;
            }
            wg_mma_wait<0>();
#pragma unroll
            for (int i = 0; i < WS_ACC; ++i) wg_fence_reg(acc[i]);
            if (KT > 0 && leader) {
                ws_bar_arrive(empty + 8 * prev);
#if WS_CLUSTER == 2
                ws_bar_arrive_cta(empty + 8 * prev, rank ^ 1);
#endif
            }
#if WS_CLUSTER == 2
            // no CTA may exit while its peer can still arrive on its barriers: arrive now, wait after the stores
            ws_cluster_arrive();
#endif

            // epilogue straight from the accumulators, bias and R read a chunk at a time (wgmma_epi.cuh)
            wg_epilogue<WS_DT, WS_OUT, WS_BIAS, WS_RES, WS_ACT, WS_BN, WS_EPI_J>(
                acc, c, bias, res, M, N, m0 + cw * 64 + warp * 16 + (lane >> 2), n0 + 2 * (lane & 3));
        }
#if WS_CLUSTER == 2
        ws_cluster_wait();
#endif
    }
    *ret = 0;
    return 0;
}

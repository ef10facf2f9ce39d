// Hopper (sm_90a) warp-specialized GEMM: TMA producer warpgroup + 2 wgmma consumer warpgroups, linked into a
// numba kernel (kernels/ops/gemm/wgmma_tma.py; first built and measured as lab/wgmma_ws, whose H100 run of
// 2026-12-05 checked the bf16 variants of this file and timed them against cuBLAS: lab/wgmma_ws/NOTES.md; the
// lab still compiles its other variants from this file). The product compiles the persistent, one-CTA form
// (WS_PERSIST 1, WS_CLUSTER 1) with WS_BN 256, WS_STAGES 4:
//
//   C[M, N] = A[M, K] @ B (+ R[M, N]),   A row-major bf16 or fp16, fp32 accumulation,
//   B [K, N] row-major (WS_BT 0, "NN") or [N, K] row-major (WS_BT 1, "NT", a torch Linear weight),
//   C fp32 (WS_OUT 0) or the input type (WS_OUT 1), R (WS_RES 1) of the input type added in fp32.
//
// numba ABI: `int f(int* ret, args...)`; no CUDA headers. Arguments: `tmaps` the global address of two
// CUtensorMaps (128 bytes each, A's at +0, B's at +128, built on the host by cuTensorMapEncodeTiled: numba
// cannot pass a __grid_constant__ parameter, and PTX takes a tensor-map operand in global memory), c, res,
// m, n, k.
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
// Requirements (checked by the launcher): K, N multiples of 8; A, B 16-byte aligned; C, R 16-byte aligned.

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
struct __align__(8) ws_f2 {
    float x, y;
};

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
#define WS_RES 0
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

// BEGIN GENERATED by gen_ops.py: do not edit by hand
// D[64 x 128] += A[64 x 16] * B[16 x 128], bf16 in, fp32 accumulate; TB 1: B N-major in smem
template <int TB>
__device__ __forceinline__ void wg_mma_n128_bf16(float* d, u64 da, u64 db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, p, 1, 1, 0, %67;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db), "r"(1), "n"(TB));
}
// D[64 x 128] += A[64 x 16] * B[16 x 128], f16 in, fp32 accumulate; TB 1: B N-major in smem
template <int TB>
__device__ __forceinline__ void wg_mma_n128_f16(float* d, u64 da, u64 db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, p, 1, 1, 0, %67;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db), "r"(1), "n"(TB));
}
// D[64 x 256] += A[64 x 16] * B[16 x 256], bf16 in, fp32 accumulate; TB 1: B N-major in smem
template <int TB>
__device__ __forceinline__ void wg_mma_n256_bf16(float* d, u64 da, u64 db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
        "%128, %129, p, 1, 1, 0, %131;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(da), "l"(db), "r"(1), "n"(TB));
}
// D[64 x 256] += A[64 x 16] * B[16 x 256], f16 in, fp32 accumulate; TB 1: B N-major in smem
template <int TB>
__device__ __forceinline__ void wg_mma_n256_f16(float* d, u64 da, u64 db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
        "%128, %129, p, 1, 1, 0, %131;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(da), "l"(db), "r"(1), "n"(TB));
}
// END GENERATED

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

__device__ __forceinline__ u32 ws_smem(const void* p) {
    u64 a;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
    return (u32)a;
}

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

__device__ __forceinline__ bool ws_bar_try_cluster(u32 bar, u32 parity) {
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

// the producer's wait on an empty barrier that remote consumers arrive on too (cluster scope)
__device__ __forceinline__ void ws_bar_wait_cluster(u32 bar, u32 parity) {
    if (ws_bar_try_cluster(bar, parity)) return;
    const u64 t0 = ws_ns();
    while (!ws_bar_try_cluster(bar, parity)) {
        if (ws_ns() - t0 > WS_TIMEOUT_NS) asm volatile("trap;");
    }
}

// ---------------------------------------------------------------- wgmma

__device__ __forceinline__ void ws_mma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void ws_mma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void ws_mma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void ws_fence_reg(float& r) { asm volatile("" : "+f"(r)::"memory"); }

__device__ __forceinline__ u64 ws_desc(u32 saddr, u32 lbo, u32 sbo) {
    return (u64)((saddr & 0x3FFFF) >> 4) | ((u64)((lbo >> 4) & 0x3FFF) << 16) |
           ((u64)((sbo >> 4) & 0x3FFF) << 32) | (1ull << 62);
}

__device__ __forceinline__ float ws_to_f32(u16 h) {
    float f;
#if WS_DT == 0
    asm("mov.b32 %0, %1;" : "=f"(f) : "r"(((u32)h) << 16));
#else
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
#endif
    return f;
}

__device__ __forceinline__ u32 ws_pack(float lo, float hi) {
    u32 r;
#if WS_DT == 0
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#endif
    return r;
}

// tile t (of tiles_m x tiles_n tiles of bm x WS_BN) -> its corner, WS_GROUP_M tile-rows at a time
__device__ __forceinline__ void ws_tile_of(int t, int tiles_m, int tiles_n, int bm, int& m0, int& n0) {
    const int per_group = WS_GROUP_M * tiles_n;
    const int first_m = (t / per_group) * WS_GROUP_M;
    const int gsz = tiles_m - first_m < WS_GROUP_M ? tiles_m - first_m : WS_GROUP_M;
    m0 = (first_m + (t % per_group) % gsz) * bm;
    n0 = ((t % per_group) / gsz) * WS_BN;
}

extern "C" __device__ int WS_NAME(int* ret, long long tmaps, long long c, long long res, long long m, long long n,
                                  long long k) {
    const int M = (int)m, N = (int)n, K = (int)k;
    const int tid = threadIdx.x;
    const int wg = tid >> 7;
    // a cluster of 2 takes a 256 x WS_BN tile: CTA rank r its rows 128 r .. 128 r + 127
    const int tiles_m = (M + WS_BM * WS_CLUSTER - 1) / (WS_BM * WS_CLUSTER), tiles_n = (N + WS_BN - 1) / WS_BN;
    const int ntiles = tiles_m * tiles_n;
    const int KT = (K + WS_BK - 1) / WS_BK;
    const u32 base = (ws_smem(ws_dyn) + 1023u) & ~1023u;  // the launcher asks for 1 KB more
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
#if WS_CLUSTER == 1
                    if (it >= WS_STAGES) ws_bar_wait(empty + 8 * s, ph ^ 1);
#else
                    if (it >= WS_STAGES) ws_bar_wait_cluster(empty + 8 * s, ph ^ 1);  // both CTAs' consumers
#endif
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
                for (int i = 0; i < WS_ACC; ++i) ws_fence_reg(acc[i]);
                ws_mma_fence();
#pragma unroll
                for (int kk = 0; kk < WS_BK / 16; ++kk) {
                    u64 da = ws_desc(sa + kk * 32, 16, 1024);
#if WS_BT == 0
                    u64 db = ws_desc(sb + kk * 2048, 8192, 1024);
#else
                    u64 db = ws_desc(sb + kk * 32, 16, 1024);
#endif
                    WS_MMA(acc, da, db);
                }
                ws_mma_commit();
                ws_mma_wait<1>();  // the previous slice's group is complete: its slot can be refilled
#pragma unroll
                for (int i = 0; i < WS_ACC; ++i) ws_fence_reg(acc[i]);
                if (kt > 0 && leader) {
                    ws_bar_arrive(empty + 8 * prev);
#if WS_CLUSTER == 2
                    ws_bar_arrive_cta(empty + 8 * prev, rank ^ 1);  // the peer's producer multicasts here too
#endif
                }
                prev = s;
            }
            ws_mma_wait<0>();
#pragma unroll
            for (int i = 0; i < WS_ACC; ++i) ws_fence_reg(acc[i]);
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

            // epilogue straight from the accumulators (layout as in lab/wgmma)
            const int row0 = m0 + cw * 64 + warp * 16 + (lane >> 2);
            const int colb = n0 + 2 * (lane & 3);
#pragma unroll
            for (int j = 0; j < WS_BN / 8; ++j) {
                const int col = colb + 8 * j;
                if (col >= N) continue;
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int row = row0 + 8 * h;
                    if (row >= M) continue;
                    float x = acc[4 * j + 2 * h], y = acc[4 * j + 2 * h + 1];
                    const long long at = (long long)row * N + col;
#if WS_RES
                    u32 rw = *reinterpret_cast<const u32*>(reinterpret_cast<const u16*>(res) + at);
                    x += ws_to_f32((u16)(rw & 0xFFFF));
                    y += ws_to_f32((u16)(rw >> 16));
#endif
#if WS_OUT == 0
                    ws_f2 v;
                    v.x = x;
                    v.y = y;
                    *reinterpret_cast<ws_f2*>(reinterpret_cast<float*>(c) + at) = v;
#else
                    *reinterpret_cast<u32*>(reinterpret_cast<u16*>(c) + at) = ws_pack(x, y);
#endif
                }
            }
        }
#if WS_CLUSTER == 2
        ws_cluster_wait();
#endif
    }
    *ret = 0;
    return 0;
}

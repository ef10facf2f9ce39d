// Tensor-core GEMM for fp16 inputs with fp32 accumulation, linked into numba kernels (kernels/ops/cuda/mma.py).
//
//   C[M, N] = A[M, K] @ B[K, N]   (+ bias[N]) (+ residual[M, N]),  A, B row-major fp16, accumulate in fp32.
//
// numba-cuda has no tensor-core API, so the whole block tile lives here as a device function that a thin
// numba kernel calls (numba ABI: `int f(int* ret, args...)`, pointers passed as 64-bit integers). No CUDA
// headers are included: fp16 values travel as raw 16-bit words and are converted with cvt in inline PTX, so
// NVRTC needs no include path.
//
// Tiling (defaults below; every macro can be overridden by a #define placed before this file, which is how
// kernels/ops/cuda/mma.py builds other configurations):
//   - a block of 32 * HG_WM * HG_WN threads computes a HG_BM x HG_BN tile of C;
//   - K is walked in slices of HG_BK (32 or 64); each slice of A (HG_BM x HG_BK) and B (HG_BK x HG_BN) is copied
//     global -> shared with cp.async (16-byte chunks, zero-filled past the matrix edge), HG_STAGES slices in
//     flight, in dynamic shared memory (> 48 KB needs the launcher to raise the function's limit);
//   - warps form a HG_WM x HG_WN grid, each owns a (HG_BM / HG_WM) x (HG_BN / HG_WN) sub-tile of m16n8 mma
//     tiles whose fp32 accumulators stay in registers for the whole K loop (64 x 64 per warp: 128 per thread);
//   - fragments come from shared memory through ldmatrix (x4; .trans for B, stored k-major), and shared
//     addresses are XOR-swizzled per 16-byte chunk so every 8-row ldmatrix phase hits 8 distinct bank groups;
//   - epilogue: bias and residual are added while the accumulators are still in registers, then stored once.
// When K or N is not a multiple of 8, or a pointer is not 16-byte aligned, 16-byte chunks could straddle the
// edge: that case (`aligned == 0`) fills shared memory with bounds-checked scalar loads instead; the rest of
// the kernel is the same.
//
// Production defaults (benchmarks/notes-mma.md, H200 round 1, 2026-11-30): 128x128 blocks of 4 warps, 64-wide K
// slices in 3 stages (96 KB, 2 blocks per SM), the prefetch issued after the first k-step's ldmatrix with a
// 32-bit copy plan (HG_LATE, HG_CPY32: ~7 issue cycles per HMMA per warp instead of ~9.6), and a vector
// epilogue (HG_EPI). Other tiles and switches were measured and are off by default; an mbarrier stage
// pipeline and a persistent grid lost and were removed (benchmarks/notes-mma.md).

#ifndef HG_BM
#define HG_BM 128
#endif
#ifndef HG_BN
#define HG_BN 128
#endif
#ifndef HG_STAGES
#define HG_STAGES 3
#endif
#ifndef HG_WM
#define HG_WM 2
#endif
#ifndef HG_WN
#define HG_WN 2
#endif
#ifndef HG_SUFFIX
#define HG_SUFFIX
#endif
#ifndef HG_BK
#define HG_BK 64
#endif
#ifndef HG_LATE
#define HG_LATE 1  // 1: a slice's prefetch is issued after the first k-step's fragment loads, not before them
#endif
#ifndef HG_CPY32
#define HG_CPY32 1  // 1: aligned copy plan with 32-bit chunk offsets and predicates (fewer integer instructions)
#endif
#ifndef HG_EPI
#define HG_EPI 1  // 1: aligned kernels' epilogue uses 2-element vector accesses, residual loads batched first
#endif
#ifndef HG_GROUP_M
#define HG_GROUP_M 8  // block swizzle: 8 tile-rows share their B columns in L2
#endif
#define HG_THREADS (32 * HG_WM * HG_WN)
#define HG_MI (HG_BM / HG_WM / 16)  // m16 tiles per warp
#define HG_NJ (HG_BN / HG_WN / 8)   // n8 tiles per warp
#define HG_A_ITERS (HG_BM * HG_BK / 8 / HG_THREADS)
#define HG_B_ITERS (HG_BK * HG_BN / 8 / HG_THREADS)
#define HG_ACH (HG_BK / 8)  // 16-byte chunks per row of an A slice
#define HG_BCH (HG_BN / 8)  // 16-byte chunks per row of a B slice
#define HG_A_RSTEP (HG_THREADS / HG_ACH)  // rows between a thread's consecutive A chunks
#define HG_B_RSTEP (HG_THREADS / HG_BCH)
#define HG_CAT(a, b) a##b
#define HG_NAME(a, b) HG_CAT(a, b)

static_assert(HG_A_ITERS * HG_THREADS * 8 == HG_BM * HG_BK, "A slice must split evenly over the threads");
static_assert(HG_B_ITERS * HG_THREADS * 8 == HG_BK * HG_BN, "B slice must split evenly over the threads");
static_assert(HG_NJ % 2 == 0 && HG_MI >= 1, "warp tile: 16-row multiples, 16-column multiples");
static_assert(HG_BK == 32 || HG_BK == 64, "HG_BK: 32 or 64");
// a thread's chunks sit HG_*_RSTEP rows apart; multiples of 8 keep their XOR swizzle identical
static_assert(HG_A_RSTEP % 8 == 0 && HG_B_RSTEP % 8 == 0, "row steps must be multiples of 8");

typedef unsigned short hbits;  // raw fp16
struct __align__(8) hg_f2 {  // two fp32 moved as one 8-byte access (no CUDA headers: no float2)
    float x, y;
};

__device__ __forceinline__ float hg_h2f(hbits h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ hbits hg_f2h(float f) {
    hbits h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ unsigned hg_smem(const void* p) {
    unsigned long long a;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
    return (unsigned)a;
}

__device__ __forceinline__ void hg_cp16(unsigned dst, const void* src, bool pred) {
    int n = pred ? 16 : 0;  // src-size 0: write 16 zero bytes, read nothing
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}

__device__ __forceinline__ void hg_commit() { asm volatile("cp.async.commit_group;\n" ::); }

__device__ __forceinline__ void hg_wait_stages() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(HG_STAGES - 2));
}

__device__ __forceinline__ void hg_ldm_x4(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

__device__ __forceinline__ void hg_ldm_x4_t(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

// volatile keeps program order; a non-volatile version compiled to the same register count (ptxas -v), so
// the interleaving of ldmatrix and mma is left to ptxas' scheduler either way
__device__ __forceinline__ void hg_mma(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// element offset of 16-byte chunk `c` (8 halves) of row `r` in one stage, after the XOR swizzle
// (A rows are 64 B for HG_BK = 32: two rows share a 128-byte line, so the XOR key is (r / 2) % 4)
#if HG_BK == 32
__device__ __forceinline__ int hg_off_a(int r, int c) { return r * HG_BK + ((c ^ ((r >> 1) & 3)) << 3); }
#else
__device__ __forceinline__ int hg_off_a(int r, int c) { return r * HG_BK + ((c ^ (r & 7)) << 3); }
#endif
__device__ __forceinline__ int hg_off_b(int r, int c) { return r * HG_BN + ((c ^ (r & 7)) << 3); }

// 8 halves from row-major src[row, col..col+7] with bounds checks, for the unaligned case
__device__ __forceinline__ void hg_fill8(hbits* dst, const hbits* src, long long row, long long rows,
                                         long long col, long long cols) {
    unsigned w[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        long long c0 = col + 2 * e;
        hbits lo = (row < rows && c0 < cols) ? src[row * cols + c0] : (hbits)0;
        hbits hi = (row < rows && c0 + 1 < cols) ? src[row * cols + c0 + 1] : (hbits)0;
        w[e] = (unsigned)lo | ((unsigned)hi << 16);
    }
    asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};\n" ::"r"(hg_smem(dst)), "r"(w[0]), "r"(w[1]), "r"(w[2]),
                 "r"(w[3]));
}

// Unaligned case: every chunk through bounds-checked scalar loads (synchronous st.shared).
__device__ __forceinline__ void hg_load_stage_scalar(hbits* sa, hbits* sb, const hbits* A, const hbits* B,
                                                     long long M, long long N, long long K, long long m0,
                                                     long long n0, long long k0, int tid) {
#pragma unroll
    for (int j = 0; j < HG_A_ITERS; ++j) {  // A slice: HG_BM rows x HG_ACH chunks
        int id = tid + j * HG_THREADS;
        int r = id / HG_ACH, c = id % HG_ACH;
        hg_fill8(sa + hg_off_a(r, c), A, m0 + r, M, k0 + c * 8, K);
    }
#pragma unroll
    for (int j = 0; j < HG_B_ITERS; ++j) {  // B slice: HG_BK rows x HG_BCH chunks
        int id = tid + j * HG_THREADS;
        int r = id / HG_BCH, c = id % HG_BCH;
        hg_fill8(sb + hg_off_b(r, c), B, k0 + r, K, n0 + c * 8, N);
    }
}

// Aligned case: a per-thread copy plan fixed for the block. Thread chunk j of A is row ra + j*HG_A_RSTEP,
// chunk column ca; of B, row rb + j*HG_B_RSTEP, chunk column cb. Source pointers advance by one K slice per
// issue, so a slice costs a few adds and compares per chunk instead of 64-bit index arithmetic.
struct HgCopy {
    const hbits* a;  // &A[m0 + ra, ca*8 + k0]
    const hbits* b;  // &B[rb + k0, n0 + cb*8]
    long long a_step, b_step;  // elements between a thread's consecutive chunks (HG_*_RSTEP rows)
    int a_step32, b_step32;  // the same in 32 bits (HG_CPY32: the launcher keeps HG_BM * K and HG_BK * N < 2^31)
    unsigned sa, sb;  // byte offsets of chunk 0 inside an A / B stage (swizzled)
    int a_rows;  // rows of A left below ra (chunk j valid while j * HG_A_RSTEP < a_rows)
    int ka;  // ca * 8
    int rb;
    bool b_col;  // the B chunk's columns are inside N
};

__device__ __forceinline__ void hg_copy_init(HgCopy& cp, const hbits* A, const hbits* B, long long M,
                                             long long N, long long K, long long m0, long long n0, int tid) {
    const int ra = tid / HG_ACH, ca = tid % HG_ACH;
    const int rb = tid / HG_BCH, cb = tid % HG_BCH;
    const long long rows = M - m0 - ra;
    cp.a_rows = rows > HG_BM ? HG_BM : (int)rows;
    cp.a = A + (m0 + ra) * K + ca * 8;
    cp.b = B + (long long)rb * N + n0 + cb * 8;
    cp.a_step = HG_A_RSTEP * K;
    cp.b_step = HG_B_RSTEP * N;
    cp.a_step32 = (int)cp.a_step;
    cp.b_step32 = (int)cp.b_step;
    cp.sa = 2u * hg_off_a(ra, ca);
    cp.sb = 2u * hg_off_b(rb, cb);
    cp.ka = ca * 8;
    cp.rb = rb;
    cp.b_col = n0 + cb * 8 < N;
    if (cp.a_rows <= 0) cp.a = A;  // keep every source address inside the allocation, even when unused
    if (!cp.b_col) cp.b = B;
}

// issue one K slice (k_left = K - k0 columns of A / rows of B remain) into the stage at sa_base / sb_base
__device__ __forceinline__ void hg_copy_issue(HgCopy& cp, unsigned sa_base, unsigned sb_base, long long k_left,
                                              long long N) {
#if HG_CPY32
    // predicates and offsets in 32 bits: a predicated-off chunk reads from the chunk-0 address (offset 0)
    const int kl = k_left < HG_BK ? (int)k_left : HG_BK;
    const bool ka_ok = cp.ka < kl;
#pragma unroll
    for (int j = 0; j < HG_A_ITERS; ++j) {
        bool p = ka_ok && j * HG_A_RSTEP < cp.a_rows;
        hg_cp16(sa_base + cp.sa + j * (HG_A_RSTEP * HG_BK * 2), cp.a + (p ? j * cp.a_step32 : 0), p);
    }
#pragma unroll
    for (int j = 0; j < HG_B_ITERS; ++j) {
        bool p = cp.b_col && cp.rb + j * HG_B_RSTEP < kl;
        hg_cp16(sb_base + cp.sb + j * (HG_B_RSTEP * HG_BN * 2), cp.b + (p ? j * cp.b_step32 : 0), p);
    }
#else
    const bool ka_ok = cp.ka < k_left;
#pragma unroll
    for (int j = 0; j < HG_A_ITERS; ++j) {
        bool p = ka_ok && j * HG_A_RSTEP < cp.a_rows;
        hg_cp16(sa_base + cp.sa + j * (HG_A_RSTEP * HG_BK * 2), p ? cp.a + j * cp.a_step : cp.a, p);
    }
#pragma unroll
    for (int j = 0; j < HG_B_ITERS; ++j) {
        bool p = cp.b_col && cp.rb + j * HG_B_RSTEP < k_left;
        hg_cp16(sb_base + cp.sb + j * (HG_B_RSTEP * HG_BN * 2), p ? cp.b + j * cp.b_step : cp.b, p);
    }
#endif
    cp.a += HG_BK;
    if (cp.b_col) cp.b += HG_BK * N;
}

// Dynamic shared memory: HG_STAGES * (HG_BM + HG_BN) * HG_BK * 2 bytes, A stages first.
extern __shared__ __align__(128) unsigned char hg_dyn[];

// One K slice of the block tile from the stage at a_base / b_base: ldmatrix fragments, then mma.sync into acc.
// `mid()` runs between the first k-step's fragment loads and its mma (HG_LATE puts the next prefetch there: the
// loads this slice needs go out first, and the copy's integer work fills issue slots among the mma).
template <typename F>
__device__ __forceinline__ void hg_slice_mma(float (&acc)[HG_MI][HG_NJ][4], unsigned a_base, unsigned b_base,
                                             int wm, int wn, int lane, F&& mid) {
#pragma unroll
    for (int kk = 0; kk < HG_BK; kk += 16) {
        unsigned af[HG_MI][4];
        unsigned bf[HG_NJ][2];
#pragma unroll
        for (int mi = 0; mi < HG_MI; ++mi) {
            // matrices: rows 0-7/8-15 (lane % 16) x k 0-7/8-15 (lane / 16)
            int r = wm * (HG_BM / HG_WM) + mi * 16 + (lane & 15);
            int c = (kk >> 3) + (lane >> 4);
            hg_ldm_x4(a_base + 2 * hg_off_a(r, c), af[mi][0], af[mi][1], af[mi][2], af[mi][3]);
        }
#pragma unroll
        for (int nj = 0; nj < HG_NJ / 2; ++nj) {
            // matrices: k 0-7 / 8-15 ((lane / 8) % 2) x n 0-7 / 8-15 (lane / 16) of a 16-column pair
            int r = kk + (lane & 7) + (((lane >> 3) & 1) << 3);
            int c = (wn * (HG_BN / HG_WN) + nj * 16 + ((lane >> 4) << 3)) >> 3;
            hg_ldm_x4_t(b_base + 2 * hg_off_b(r, c), bf[2 * nj][0], bf[2 * nj][1], bf[2 * nj + 1][0],
                        bf[2 * nj + 1][1]);
        }
        if (kk == 0) mid();
#pragma unroll
        for (int mi = 0; mi < HG_MI; ++mi)
#pragma unroll
            for (int nj = 0; nj < HG_NJ; ++nj) hg_mma(acc[mi][nj], af[mi], bf[nj][0], bf[nj][1]);
    }
}

// Epilogue, element by element with bounds checks (any N, any alignment): thread holds rows (lane/4,
// lane/4 + 8), columns (lane%4)*2 + {0, 1} of each m16n8 tile.
template <bool OUT_HALF>
__device__ __forceinline__ void hg_epilogue(const float (&acc)[HG_MI][HG_NJ][4], const void* bias, const void* res,
                                            void* out, long long M, long long N, long long m0, long long n0,
                                            int wm, int wn, int lane) {
#pragma unroll
    for (int mi = 0; mi < HG_MI; ++mi) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const long long row = m0 + wm * (HG_BM / HG_WM) + mi * 16 + (lane >> 2) + h * 8;
            if (row >= M) continue;
#pragma unroll
            for (int nj = 0; nj < HG_NJ; ++nj) {
                const long long col = n0 + wn * (HG_BN / HG_WN) + nj * 8 + (lane & 3) * 2;
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const long long cc = col + e;
                    if (cc >= N) continue;
                    float v = acc[mi][nj][2 * h + e];
                    if (OUT_HALF) {
                        if (bias) v += hg_h2f(((const hbits*)bias)[cc]);
                        if (res) v += hg_h2f(((const hbits*)res)[row * N + cc]);
                        ((hbits*)out)[row * N + cc] = hg_f2h(v);
                    } else {
                        if (bias) v += ((const float*)bias)[cc];
                        if (res) v += ((const float*)res)[row * N + cc];
                        ((float*)out)[row * N + cc] = v;
                    }
                }
            }
        }
    }
}

// Epilogue of the aligned kernels with HG_EPI: thread holds rows (lane/4, lane/4 + 8), columns (lane%4)*2 +
// {0, 1} of each m16n8 tile.
template <bool OUT_HALF>
__device__ __forceinline__ void hg_epilogue_vec(const float (&acc)[HG_MI][HG_NJ][4], const void* bias,
                                                const void* res, void* out, long long M, long long N,
                                                long long m0, long long n0, int wm, int wn, int lane) {
    // N % 8 == 0 and 16-byte aligned out / bias / res (the launcher checks): a column pair (col, col + 1)
    // is inside N whenever col is, and one 8-byte (fp32) or 4-byte (fp16) access moves it. The residual
    // of both rows is loaded before any store: out may alias res, so the compiler would otherwise keep
    // each load behind the previous store and pay one memory latency per element.
#pragma unroll
    for (int mi = 0; mi < HG_MI; ++mi) {
        const long long row0 = m0 + wm * (HG_BM / HG_WM) + mi * 16 + (lane >> 2);
        float rv[2][HG_NJ][2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const long long row = row0 + h * 8;
#pragma unroll
            for (int nj = 0; nj < HG_NJ; ++nj) {
                const long long col = n0 + wn * (HG_BN / HG_WN) + nj * 8 + (lane & 3) * 2;
                rv[h][nj][0] = rv[h][nj][1] = 0.0f;
                if (res && row < M && col < N) {
                    if (OUT_HALF) {
                        const unsigned w = *(const unsigned*)((const hbits*)res + row * N + col);
                        rv[h][nj][0] = hg_h2f((hbits)(w & 0xffffu));
                        rv[h][nj][1] = hg_h2f((hbits)(w >> 16));
                    } else {
                        const hg_f2 w = *(const hg_f2*)((const float*)res + row * N + col);
                        rv[h][nj][0] = w.x;
                        rv[h][nj][1] = w.y;
                    }
                }
            }
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const long long row = row0 + h * 8;
            if (row >= M) continue;
#pragma unroll
            for (int nj = 0; nj < HG_NJ; ++nj) {
                const long long col = n0 + wn * (HG_BN / HG_WN) + nj * 8 + (lane & 3) * 2;
                if (col >= N) continue;
                float v0 = acc[mi][nj][2 * h], v1 = acc[mi][nj][2 * h + 1];
                if (OUT_HALF) {
                    if (bias) {
                        const unsigned w = *(const unsigned*)((const hbits*)bias + col);
                        v0 += hg_h2f((hbits)(w & 0xffffu));
                        v1 += hg_h2f((hbits)(w >> 16));
                    }
                    v0 += rv[h][nj][0];
                    v1 += rv[h][nj][1];
                    *(unsigned*)((hbits*)out + row * N + col) =
                        (unsigned)hg_f2h(v0) | ((unsigned)hg_f2h(v1) << 16);
                } else {
                    if (bias) {
                        const hg_f2 w = *(const hg_f2*)((const float*)bias + col);
                        v0 += w.x;
                        v1 += w.y;
                    }
                    *(hg_f2*)((float*)out + row * N + col) = hg_f2{v0 + rv[h][nj][0], v1 + rv[h][nj][1]};
                }
            }
        }
    }
}

// Grouped tile order: consecutive tile indices walk down HG_GROUP_M tile-rows before moving right, so the
// blocks in flight share B columns (and A rows) in L2.
__device__ __forceinline__ void hg_tile_origin(long long t, long long M, long long N, long long& m0, long long& n0) {
    const long long tiles_m = (M + HG_BM - 1) / HG_BM;
    const long long tiles_n = (N + HG_BN - 1) / HG_BN;
    const long long per_group = HG_GROUP_M * tiles_n;
    const long long first_m = (t / per_group) * HG_GROUP_M;
    const long long gsize = (tiles_m - first_m) < HG_GROUP_M ? (tiles_m - first_m) : HG_GROUP_M;
    m0 = (first_m + (t % per_group) % gsize) * HG_BM;
    n0 = ((t % per_group) / gsize) * HG_BN;
}

// OUT_HALF: out/bias/residual are fp16 (o_proj with fp16 inputs), else fp32.
template <bool ALIGNED, bool OUT_HALF>
__device__ __forceinline__ void hg_tile(const hbits* A, const hbits* B, const void* bias, const void* res,
                                        void* out, long long M, long long N, long long K) {
    hbits* hg_sA = reinterpret_cast<hbits*>(hg_dyn);
    hbits* hg_sB = hg_sA + HG_STAGES * HG_BM * HG_BK;
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int wm = warp / HG_WN, wn = warp % HG_WN;

    long long m0, n0;
    hg_tile_origin(blockIdx.x, M, N, m0, n0);

    float acc[HG_MI][HG_NJ][4];
#pragma unroll
    for (int i = 0; i < HG_MI; ++i)
#pragma unroll
        for (int j = 0; j < HG_NJ; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

    const int KT = (int)((K + HG_BK - 1) / HG_BK);
    const unsigned smem_a = hg_smem(hg_sA), smem_b = hg_smem(hg_sB);
    constexpr unsigned A_STAGE = HG_BM * HG_BK * 2, B_STAGE = HG_BK * HG_BN * 2;  // bytes
    HgCopy cp;
    if (ALIGNED) hg_copy_init(cp, A, B, M, N, K, m0, n0, tid);
#pragma unroll
    for (int s = 0; s < HG_STAGES - 1; ++s) {
        if (s < KT) {
            if (ALIGNED)
                hg_copy_issue(cp, smem_a + s * A_STAGE, smem_b + s * B_STAGE, K - (long long)s * HG_BK, N);
            else
                hg_load_stage_scalar(hg_sA + s * HG_BM * HG_BK, hg_sB + s * HG_BK * HG_BN, A, B, M, N, K, m0, n0,
                                     (long long)s * HG_BK, tid);
        }
        hg_commit();
    }

    int rs = 0, ws = HG_STAGES - 1;  // stage read this iteration / written by this iteration's prefetch
    for (int kt = 0; kt < KT; ++kt) {
        hg_wait_stages();
        __syncthreads();  // slice kt has landed for every thread; slice kt-1's stage is free to refill
        const int nk = kt + HG_STAGES - 1;
        auto issue = [&]() {
            if ((ALIGNED && HG_LATE) || nk < KT) {  // HG_LATE: no branch (copies past K are zero-filled)
                if (ALIGNED)
                    hg_copy_issue(cp, smem_a + ws * A_STAGE, smem_b + ws * B_STAGE, K - (long long)nk * HG_BK, N);
                else
                    hg_load_stage_scalar(hg_sA + ws * HG_BM * HG_BK, hg_sB + ws * HG_BK * HG_BN, A, B, M, N, K,
                                         m0, n0, (long long)nk * HG_BK, tid);
            }
            hg_commit();
        };
#if HG_LATE
        hg_slice_mma(acc, smem_a + rs * A_STAGE, smem_b + rs * B_STAGE, wm, wn, lane, issue);
#else
        issue();
        hg_slice_mma(acc, smem_a + rs * A_STAGE, smem_b + rs * B_STAGE, wm, wn, lane, [] {});
#endif
        ws = ws + 1 == HG_STAGES ? 0 : ws + 1;
        rs = rs + 1 == HG_STAGES ? 0 : rs + 1;
    }
    // drain: no cp.async may still target shared memory when the block exits
    asm volatile("cp.async.wait_all;\n" ::);

#if HG_EPI
    if constexpr (ALIGNED) {
        hg_epilogue_vec<OUT_HALF>(acc, bias, res, out, M, N, m0, n0, wm, wn, lane);
        return;
    }
#endif
    hg_epilogue<OUT_HALF>(acc, bias, res, out, M, N, m0, n0, wm, wn, lane);
}

// Entry points (numba ABI), one per (output type, aligned or not): separate kernels, so the aligned fast path
// is register-allocated on its own (the scalar-load path needs more registers and would spill into it).
// Pointers are device addresses passed as int64; bias / res may be 0 (absent).
// Launch: grid = ceil(M/HG_BM) * ceil(N/HG_BN) blocks (1-D), HG_THREADS threads, dynamic shared memory
// HG_STAGES * (HG_BM + HG_BN) * HG_BK * 2 bytes. The aligned entries need K % 8 == 0, N % 8 == 0 and
// 16-byte aligned A and B.
#define HG_ENTRY(NAME, ALIGNED, OUT_HALF)                                                                      \
    extern "C" __device__ int HG_NAME(NAME, HG_SUFFIX)(int* ret, long long a, long long b, long long bias,     \
                                                       long long res, long long out, long long M, long long N, \
                                                       long long K) {                                          \
        hg_tile<ALIGNED, OUT_HALF>((const hbits*)a, (const hbits*)b, (const void*)bias, (const void*)res,      \
                                   (void*)out, M, N, K);                                                       \
        *ret = 0;                                                                                              \
        return 0;                                                                                              \
    }

HG_ENTRY(hgemm_mma_f32out_a, true, false)
HG_ENTRY(hgemm_mma_f32out_u, false, false)
HG_ENTRY(hgemm_mma_f16out_a, true, true)
HG_ENTRY(hgemm_mma_f16out_u, false, true)

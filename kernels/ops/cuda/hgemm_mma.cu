// Tensor-core GEMM for fp16 inputs with fp32 accumulation, linked into numba kernels (kernels/ops/cuda/mma.py).
//
//   C[M, N] = A[M, K] @ B[K, N]   (+ bias[N]) (+ residual[M, N]),  A, B row-major fp16, accumulate in fp32.
//
// numba-cuda has no tensor-core API, so the whole block tile lives here as a device function that a thin
// numba kernel calls (numba ABI: `int f(int* ret, args...)`, pointers passed as 64-bit integers). No CUDA
// headers are included: fp16 values travel as raw 16-bit words and are converted with cvt in inline PTX, so
// NVRTC needs no include path.
//
// Tiling (one block of 128 threads = 4 warps computes a 128 x 128 tile of C):
//   - K is walked in slices of BK = 32; each slice of A (128 x 32) and B (32 x 128) is copied global -> shared
//     with cp.async (16-byte chunks, zero-filled past the matrix edge), STAGES = 3 slices in flight:
//     3 x (8 KB + 8 KB) = 48 KB, the static shared-memory limit numba kernels live under;
//   - warps form a 2 x 2 grid, each owns a 64 x 64 sub-tile = 4 x 8 mma tiles of m16n8 -> 128 fp32
//     accumulators per thread, held in registers for the whole K loop;
//   - fragments come from shared memory through ldmatrix (x4; .trans for B, stored k-major), and shared
//     addresses are XOR-swizzled per 16-byte chunk so every 8-row ldmatrix phase hits 8 distinct bank groups;
//   - epilogue: bias and residual are added while the accumulators are still in registers, then stored once.
// When K or N is not a multiple of 8, or a pointer is not 16-byte aligned, 16-byte chunks could straddle the
// edge: that case (`aligned == 0`) fills shared memory with bounds-checked scalar loads instead; the rest of
// the kernel is the same.

#define HG_BM 128
#define HG_BN 128
#define HG_BK 32
#define HG_STAGES 3
#define HG_THREADS 128
#define HG_GROUP_M 8  // block swizzle: 8 tile-rows share their B columns in L2

typedef unsigned short hbits;  // raw fp16

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

__device__ __forceinline__ void hg_mma(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// element offset of 16-byte chunk `c` (8 halves) of row `r` in one stage, after the XOR swizzle
__device__ __forceinline__ int hg_off_a(int r, int c) { return r * HG_BK + ((c ^ ((r >> 1) & 3)) << 3); }
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

template <bool ALIGNED>
__device__ __forceinline__ void hg_load_stage(hbits* sa, hbits* sb, const hbits* A, const hbits* B, long long M,
                                              long long N, long long K, long long m0, long long n0,
                                              long long k0, int tid) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // A slice: 128 rows x 4 chunks = 512 chunks, 4 per thread
        int id = tid + j * HG_THREADS;
        int r = id >> 2, c = id & 3;
        long long gm = m0 + r, gk = k0 + c * 8;
        hbits* d = sa + hg_off_a(r, c);
        if (ALIGNED) {
            bool p = gm < M && gk < K;
            hg_cp16(hg_smem(d), p ? (const void*)(A + gm * K + gk) : (const void*)A, p);
        } else {
            hg_fill8(d, A, gm, M, gk, K);
        }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // B slice: 32 rows x 16 chunks = 512 chunks, 4 per thread
        int id = tid + j * HG_THREADS;
        int r = id >> 4, c = id & 15;
        long long gk = k0 + r, gn = n0 + c * 8;
        hbits* d = sb + hg_off_b(r, c);
        if (ALIGNED) {
            bool p = gk < K && gn < N;
            hg_cp16(hg_smem(d), p ? (const void*)(B + gk * N + gn) : (const void*)B, p);
        } else {
            hg_fill8(d, B, gk, K, gn, N);
        }
    }
}

// One copy for every instantiation below (a function-scope __shared__ would be allocated once per template
// instance and push the block past 48 KB).
__shared__ __align__(128) hbits hg_sA[HG_STAGES * HG_BM * HG_BK];
__shared__ __align__(128) hbits hg_sB[HG_STAGES * HG_BK * HG_BN];

// OUT_HALF: out/bias/residual are fp16 (o_proj with fp16 inputs), else fp32.
template <bool ALIGNED, bool OUT_HALF>
__device__ __forceinline__ void hg_tile(const hbits* A, const hbits* B, const void* bias, const void* res,
                                        void* out, long long M, long long N, long long K) {
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int wm = warp >> 1, wn = warp & 1;

    // grouped block order: consecutive blocks walk down HG_GROUP_M tile-rows before moving right
    const long long tiles_m = (M + HG_BM - 1) / HG_BM;
    const long long tiles_n = (N + HG_BN - 1) / HG_BN;
    const long long bid = blockIdx.x;
    const long long per_group = HG_GROUP_M * tiles_n;
    const long long first_m = (bid / per_group) * HG_GROUP_M;
    const long long gsize = (tiles_m - first_m) < HG_GROUP_M ? (tiles_m - first_m) : HG_GROUP_M;
    const long long tm = first_m + (bid % per_group) % gsize;
    const long long tn = (bid % per_group) / gsize;
    const long long m0 = tm * HG_BM, n0 = tn * HG_BN;

    float acc[4][8][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

    const int KT = (int)((K + HG_BK - 1) / HG_BK);
#pragma unroll
    for (int s = 0; s < HG_STAGES - 1; ++s) {
        if (s < KT)
            hg_load_stage<ALIGNED>(hg_sA + s * HG_BM * HG_BK, hg_sB + s * HG_BK * HG_BN, A, B, M, N, K, m0, n0,
                                   (long long)s * HG_BK, tid);
        hg_commit();
    }

    for (int kt = 0; kt < KT; ++kt) {
        hg_wait_stages();
        __syncthreads();  // slice kt has landed for every thread; slice kt-1's stage is free to refill
        const int nk = kt + HG_STAGES - 1;
        if (nk < KT) {
            const int s = nk % HG_STAGES;
            hg_load_stage<ALIGNED>(hg_sA + s * HG_BM * HG_BK, hg_sB + s * HG_BK * HG_BN, A, B, M, N, K, m0, n0,
                                   (long long)nk * HG_BK, tid);
        }
        hg_commit();

        const int s = kt % HG_STAGES;
        const unsigned a_base = hg_smem(hg_sA + s * HG_BM * HG_BK);
        const unsigned b_base = hg_smem(hg_sB + s * HG_BK * HG_BN);
#pragma unroll
        for (int kk = 0; kk < HG_BK; kk += 16) {
            unsigned af[4][4];
            unsigned bf[8][2];
#pragma unroll
            for (int mi = 0; mi < 4; ++mi) {
                // matrices: rows 0-7/8-15 (lane % 16) x k 0-7/8-15 (lane / 16)
                int r = wm * 64 + mi * 16 + (lane & 15);
                int c = (kk >> 3) + (lane >> 4);
                hg_ldm_x4(a_base + 2 * hg_off_a(r, c), af[mi][0], af[mi][1], af[mi][2], af[mi][3]);
            }
#pragma unroll
            for (int nj = 0; nj < 4; ++nj) {
                // matrices: k 0-7 / 8-15 ((lane / 8) % 2) x n 0-7 / 8-15 (lane / 16) of a 16-column pair
                int r = kk + (lane & 7) + (((lane >> 3) & 1) << 3);
                int c = (wn * 64 + nj * 16 + ((lane >> 4) << 3)) >> 3;
                hg_ldm_x4_t(b_base + 2 * hg_off_b(r, c), bf[2 * nj][0], bf[2 * nj][1], bf[2 * nj + 1][0],
                            bf[2 * nj + 1][1]);
            }
#pragma unroll
            for (int mi = 0; mi < 4; ++mi)
#pragma unroll
                for (int nj = 0; nj < 8; ++nj) hg_mma(acc[mi][nj], af[mi], bf[nj][0], bf[nj][1]);
        }
    }
    // drain: no cp.async may still target shared memory when the block exits
    asm volatile("cp.async.wait_all;\n" ::);

    // epilogue: thread holds rows (lane/4, lane/4 + 8), columns (lane%4)*2 + {0, 1} of each m16n8 tile
#pragma unroll
    for (int mi = 0; mi < 4; ++mi) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const long long row = m0 + wm * 64 + mi * 16 + (lane >> 2) + h * 8;
            if (row >= M) continue;
#pragma unroll
            for (int nj = 0; nj < 8; ++nj) {
                const long long col = n0 + wn * 64 + nj * 8 + (lane & 3) * 2;
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

// Entry points (numba ABI). Pointers are device addresses passed as int64; bias / res may be 0 (absent).
// Launch: grid = ceil(M/128) * ceil(N/128) blocks (1-D), 128 threads, no dynamic shared memory.
extern "C" __device__ int hgemm_mma_f32out(int* ret, long long a, long long b, long long bias,
                                           long long res, long long out, long long M, long long N, long long K,
                                           int aligned) {
    if (aligned)
        hg_tile<true, false>((const hbits*)a, (const hbits*)b, (const void*)bias, (const void*)res, (void*)out,
                             M, N, K);
    else
        hg_tile<false, false>((const hbits*)a, (const hbits*)b, (const void*)bias, (const void*)res,
                              (void*)out, M, N, K);
    *ret = 0;
    return 0;
}

extern "C" __device__ int hgemm_mma_f16out(int* ret, long long a, long long b, long long bias,
                                           long long res, long long out, long long M, long long N, long long K,
                                           int aligned) {
    if (aligned)
        hg_tile<true, true>((const hbits*)a, (const hbits*)b, (const void*)bias, (const void*)res, (void*)out,
                            M, N, K);
    else
        hg_tile<false, true>((const hbits*)a, (const hbits*)b, (const void*)bias, (const void*)res,
                             (void*)out, M, N, K);
    *ret = 0;
    return 0;
}

"""gemm: C = A @ B with fp32 accumulation; A [M, K], B [K, N] fp32 or fp16 (row-major), C [M, N] fp32.

This module owns the matmul kernels; `o_proj` reuses them with its fused epilogue (bias, residual).

Floors (H200): FLOPs 2*M*N*K; bytes (M*K + K*N) * itemsize + 4*M*N. 4096^3: 137 GFLOP over 0.20 GB fp32 ->
2.05 ms at the 66.9 TFLOP/s fp32 FMA peak vs 0.05 ms at 4.1 TB/s: compute-bound by ~40x. fp16 inputs on
tensor cores: ~0.19 ms at cuBLAS's ~740 TFLOP/s, still compute-bound. Measured on the H200 (see
benchmarks/notes-matmul.md): simt2 47.1 / 46.9 TFLOP/s at 4096^3 / 8192x2560x2560 (0.916x / 0.956x cuBLAS
SGEMM; the old simt 28.3, 0.55x), mma 385 TFLOP/s (0.52x cuBLAS).

Four paths, one contract (`PATHS`):
  - "portable": 16x16 shared-memory tiles, one output per thread. Pure numba, runs under the CUDA simulator
    and on any GPU; correctness first.
  - "simt": register-blocked CUDA-core kernel. A block of 256 threads owns a 128 x 128 tile of C; each thread
    owns 8 x 8 outputs (rows ty*4+{0..3} and 64+ty*4+{0..3}, same for columns: the two 4-wide halves make
    every shared-memory read a conflict-free 16-byte vector). K is walked in slices of 8 staged through two
    shared buffers (double buffering: slice t+1 is fetched into registers while slice t is multiplied).
    Per k step a thread issues 4 ld.shared.v4 and 64 FFMA. numba has no vector loads, so `_lds4` is a
    small intrinsic that emits one 16-byte shared load.
  - "simt_wide": the same with an 8 x 16 tile per thread (block 128 x 256), fewer shared loads per FFMA but
    198 registers, so one block per SM: measured 2-10% slower than "simt", kept as an explicit path.
  - "simt2" (fp32 only): register-blocked tiles generated as Python source by `gen_source` and compiled by
    numba, so that nothing is left for LLVM to keep rolled: every k step, every accumulator and fragment
    register is spelled out (simt's kk loop stayed a loop: 59 % of its issue slots were FFMA, 84-88 % here).
    Fragments double-buffered in registers, 16-byte global loads where K, N and the pointers allow (else
    4-byte loads), out-of-range rows/columns clamped instead of predicated. The tile setting is chosen per
    case from H200 measurements (`s2_config`): 128 x 256 x 16 for gemm, 128 x 128 x 8 at 2 blocks per SM when
    the epilogue reads a residual (o_proj), 128 x 128 x 16 for the 4-byte fallback. Runs under the simulator.
  - "mma": fp16 inputs on tensor cores (mma.sync m16n8k16, fp32 accumulate) through linked CUDA C
    (kernels/ops/cuda/). Not available under the simulator, which cannot link CUDA C.
"auto" picks portable under the simulator, mma for fp16 where tensor cores exist, SIMT_DEFAULT for fp32
otherwise (simt for fp16 without tensor cores).

Host overhead: a launcher call with `out` on device arrays whose layout (shapes, strides, dtypes, 16-byte
alignment) and path were validated before replays that launch from a `kernels.launch.FastCache`.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
from numba import cuda, float32

from kernels import arrays
from kernels.arrays import FLOAT_IO, SIMULATED, HostSync, Operand
from kernels.launch import FastCache, kernel
from kernels.ops.cuda import mma
from kernels.registry import Case, OpSpec, Problem, register

PATHS = ("auto", "portable", "simt", "simt_wide", "simt2", "mma")
# what "auto" runs for fp32 on a GPU (and fp16 without tensor cores); chosen from H200 measurements, see
# benchmarks/notes-matmul.md
SIMT_DEFAULT = "simt2"
F32 = np.dtype(np.float32)
F16 = np.dtype(np.float16)

# --- portable path: shared-memory tiles ------------------------------------------------------------------

PT = 16  # tile edge; block = PT x PT threads
PT1 = PT + 1  # padded row (shared-array shapes must be literal constants for numba-cuda on a GPU)


@cache
def _portable(has_bias: bool, has_res: bool) -> Any:
    """C tile of PT x PT per block, one element per thread; A and B tiles staged through shared memory.
    Edges: out-of-range loads read 0 (they add nothing to the dot product); out-of-range stores are skipped.
    """

    @cuda.jit
    def portable(a, b, bias, res, out, m, n, k):  # type: ignore[no-untyped-def]
        sa = cuda.shared.array((PT, PT), float32)
        sb = cuda.shared.array((PT, PT1), float32)  # +1: column reads sb[i, tx] spread over banks
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        row = cuda.blockIdx.y * PT + ty
        col = cuda.blockIdx.x * PT + tx
        acc = float32(0.0)
        for k0 in range(0, k, PT):
            ka = k0 + tx
            sa[ty, tx] = float32(a[row, ka]) if (row < m and ka < k) else float32(0.0)
            kb = k0 + ty
            sb[ty, tx] = float32(b[kb, col]) if (kb < k and col < n) else float32(0.0)
            cuda.syncthreads()
            for i in range(PT):
                acc += sa[ty, i] * sb[i, tx]
            cuda.syncthreads()
        if row < m and col < n:
            if has_bias:
                acc += float32(bias[col])
            if has_res:
                acc += float32(res[row, col])
            out[row, col] = acc

    return portable


# --- simt path: register-blocked CUDA-core kernel --------------------------------------------------------

BM = 128
BN = 128
BK = 8
SIMT_THREADS = 256
_SMEM = 2 * BK * BM  # floats per operand: two K-slices (double buffer)


@cache
def _lds4() -> Any:
    """Intrinsic: four consecutive float32 of a 1-D shared array from element `i` (i % 4 == 0, array 16-byte
    aligned) as one ld.shared.v4.f32. NVVM does not vectorise these loads itself (checked in the PTX)."""
    from llvmlite import ir
    from numba.core import types
    from numba.cuda.extending import intrinsic

    @intrinsic
    def lds4(typingctx, arr, idx):  # type: ignore[no-untyped-def]
        sig = types.UniTuple(types.float32, 4)(arr, idx)

        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            ary = context.make_array(sig.args[0])(context, builder, args[0])
            p = builder.gep(ary.data, [args[1]])
            vec = ir.VectorType(ir.FloatType(), 4)
            sp = builder.addrspacecast(p, ir.PointerType(ir.FloatType(), 3))  # 3 = shared
            v = builder.load(builder.bitcast(sp, ir.PointerType(vec, 3)), align=16)
            vals = [builder.extract_element(v, ir.Constant(ir.IntType(32), i)) for i in range(4)]
            return context.make_tuple(builder, sig.return_type, vals)

        return sig, codegen

    return lds4


@cache
def _simt(has_bias: bool, has_res: bool) -> Any:
    lds4 = _lds4()

    @cuda.jit
    def simt(a, b, bias, res, out, m, n, k):  # type: ignore[no-untyped-def]
        sa = cuda.shared.array(_SMEM, float32, alignment=16)  # [2][BK][BM]: A slice stored k-major
        sb = cuda.shared.array(_SMEM, float32, alignment=16)  # [2][BK][BN]
        tid = cuda.threadIdx.x
        tx = tid % 16
        ty = tid // 16
        m0 = cuda.blockIdx.y * BM
        n0 = cuda.blockIdx.x * BN
        acc = cuda.local.array((8, 8), float32)  # constant indices only (unrolled): stays in registers
        for i in range(8):
            for j in range(8):
                acc[i, j] = float32(0.0)
        fa = cuda.local.array(8, float32)
        fb = cuda.local.array(8, float32)
        ra = cuda.local.array(4, float32)
        rb = cuda.local.array(4, float32)
        # global -> shared: A slice 128 x 8: thread loads row tid/2, k (tid%2)*4 + 0..3 (transposed into sa);
        # B slice 8 x 128: thread loads k row tid/32, columns (tid%32)*4 + 0..3
        a_row = m0 + tid // 2
        a_k = (tid % 2) * 4
        b_k = tid // 32
        b_c = (tid % 32) * 4
        for q in range(4):
            kk = a_k + q
            ra[q] = float32(a[a_row, kk]) if (a_row < m and kk < k) else float32(0.0)
            cc = n0 + b_c + q
            rb[q] = float32(b[b_k, cc]) if (b_k < k and cc < n) else float32(0.0)
        for q in range(4):
            sa[(a_k + q) * BM + tid // 2] = ra[q]
            sb[b_k * BN + b_c + q] = rb[q]
        cuda.syncthreads()
        ntiles = (k + BK - 1) // BK
        for t in range(ntiles):
            cur = (t % 2) * (BK * BM)
            if t + 1 < ntiles:  # prefetch slice t+1 into registers; its latency hides behind the FFMAs
                k1 = (t + 1) * BK
                for q in range(4):
                    kk = k1 + a_k + q
                    ra[q] = float32(a[a_row, kk]) if (a_row < m and kk < k) else float32(0.0)
                    kb = k1 + b_k
                    cc = n0 + b_c + q
                    rb[q] = float32(b[kb, cc]) if (kb < k and cc < n) else float32(0.0)
            for kk in range(BK):
                fa[0], fa[1], fa[2], fa[3] = lds4(sa, cur + kk * BM + ty * 4)
                fa[4], fa[5], fa[6], fa[7] = lds4(sa, cur + kk * BM + 64 + ty * 4)
                fb[0], fb[1], fb[2], fb[3] = lds4(sb, cur + kk * BN + tx * 4)
                fb[4], fb[5], fb[6], fb[7] = lds4(sb, cur + kk * BN + 64 + tx * 4)
                for i in range(8):
                    for j in range(8):
                        acc[i, j] += fa[i] * fb[j]
            if t + 1 < ntiles:
                nxt = (1 - t % 2) * (BK * BM)
                for q in range(4):
                    sa[nxt + (a_k + q) * BM + tid // 2] = ra[q]
                    sb[nxt + b_k * BN + b_c + q] = rb[q]
            cuda.syncthreads()
        for i in range(8):
            r = m0 + ty * 4 + (i % 4) + (i // 4) * 64
            for j in range(8):
                c = n0 + tx * 4 + (j % 4) + (j // 4) * 64
                if r < m and c < n:
                    v = acc[i, j]
                    if has_bias:
                        v += float32(bias[c])
                    if has_res:
                        v += float32(res[r, c])
                    out[r, c] = v

    return simt


BN_WIDE = 256
_SMEM_B_WIDE = 2 * BK * BN_WIDE


@cache
def _simt_wide(has_bias: bool, has_res: bool) -> Any:
    """The simt kernel with an 8 x 16 tile per thread (block tile 128 x 256): 6 ld.shared.v4 per 128 FFMA
    instead of 4 per 64. A warp-wide 16-byte shared load is served in 4 passes of 8 threads, so the 8 x 8
    kernel spends as many shared-memory cycles as FFMA cycles per k step; this one 25% fewer."""
    lds4 = _lds4()

    @cuda.jit
    def simt_wide(a, b, bias, res, out, m, n, k):  # type: ignore[no-untyped-def]
        sa = cuda.shared.array(_SMEM, float32, alignment=16)  # [2][BK][BM]
        sb = cuda.shared.array(_SMEM_B_WIDE, float32, alignment=16)  # [2][BK][BN_WIDE]
        tid = cuda.threadIdx.x
        tx = tid % 16
        ty = tid // 16
        m0 = cuda.blockIdx.y * BM
        n0 = cuda.blockIdx.x * BN_WIDE
        acc = cuda.local.array((8, 16), float32)
        for i in range(8):
            for j in range(16):
                acc[i, j] = float32(0.0)
        fa = cuda.local.array(8, float32)
        fb = cuda.local.array(16, float32)
        ra = cuda.local.array(4, float32)
        rb = cuda.local.array(8, float32)
        a_row = m0 + tid // 2
        a_k = (tid % 2) * 4
        b_k = tid // 32
        b_c = (tid % 32) * 8
        for q in range(4):
            kk = a_k + q
            ra[q] = float32(a[a_row, kk]) if (a_row < m and kk < k) else float32(0.0)
        for q in range(8):
            cc = n0 + b_c + q
            rb[q] = float32(b[b_k, cc]) if (b_k < k and cc < n) else float32(0.0)
        for q in range(4):
            sa[(a_k + q) * BM + tid // 2] = ra[q]
        for q in range(8):
            sb[b_k * BN_WIDE + b_c + q] = rb[q]
        cuda.syncthreads()
        ntiles = (k + BK - 1) // BK
        for t in range(ntiles):
            cur_a = (t % 2) * (BK * BM)
            cur_b = (t % 2) * (BK * BN_WIDE)
            if t + 1 < ntiles:
                k1 = (t + 1) * BK
                for q in range(4):
                    kk = k1 + a_k + q
                    ra[q] = float32(a[a_row, kk]) if (a_row < m and kk < k) else float32(0.0)
                kb = k1 + b_k
                for q in range(8):
                    cc = n0 + b_c + q
                    rb[q] = float32(b[kb, cc]) if (kb < k and cc < n) else float32(0.0)
            for kk in range(BK):
                fa[0], fa[1], fa[2], fa[3] = lds4(sa, cur_a + kk * BM + ty * 4)
                fa[4], fa[5], fa[6], fa[7] = lds4(sa, cur_a + kk * BM + 64 + ty * 4)
                fb[0], fb[1], fb[2], fb[3] = lds4(sb, cur_b + kk * BN_WIDE + tx * 4)
                fb[4], fb[5], fb[6], fb[7] = lds4(sb, cur_b + kk * BN_WIDE + 64 + tx * 4)
                fb[8], fb[9], fb[10], fb[11] = lds4(sb, cur_b + kk * BN_WIDE + 128 + tx * 4)
                fb[12], fb[13], fb[14], fb[15] = lds4(sb, cur_b + kk * BN_WIDE + 192 + tx * 4)
                for i in range(8):
                    for j in range(16):
                        acc[i, j] += fa[i] * fb[j]
            if t + 1 < ntiles:
                nxt_a = (1 - t % 2) * (BK * BM)
                nxt_b = (1 - t % 2) * (BK * BN_WIDE)
                for q in range(4):
                    sa[nxt_a + (a_k + q) * BM + tid // 2] = ra[q]
                for q in range(8):
                    sb[nxt_b + b_k * BN_WIDE + b_c + q] = rb[q]
            cuda.syncthreads()
        # epilogue in three short passes: one fused loop over 128 outputs is past LLVM's full-unroll size,
        # and a loop that is not unrolled indexes `acc` at run time, which moves it to local memory
        if has_bias:
            for j in range(16):
                c = n0 + tx * 4 + (j % 4) + (j // 4) * 64
                fb[j] = float32(bias[c]) if c < n else float32(0.0)
            for i in range(8):
                for j in range(16):
                    acc[i, j] += fb[j]
        if has_res:
            for i in range(8):
                r = m0 + ty * 4 + (i % 4) + (i // 4) * 64
                for j in range(16):
                    c = n0 + tx * 4 + (j % 4) + (j // 4) * 64
                    if r < m and c < n:
                        acc[i, j] += float32(res[r, c])
        for i in range(8):
            r = m0 + ty * 4 + (i % 4) + (i // 4) * 64
            for j in range(16):
                c = n0 + tx * 4 + (j % 4) + (j // 4) * 64
                if r < m and c < n:
                    out[r, c] = acc[i, j]

    return simt_wide


# --- simt2 path: generated, fully unrolled register-blocked kernel ----------------------------------------

# memory-access intrinsics: raw element index, no wraparound/bounds code, explicit width -------------


def _make_intrinsics() -> dict[str, Any]:
    from llvmlite import ir
    from numba.core import types
    from numba.cuda.extending import intrinsic

    f32 = ir.FloatType()

    def _ptr(
        context: Any, builder: Any, arr_ty: Any, arr: Any, idx_ty: Any, idx: Any, space: int, w: int
    ) -> Any:
        ary = context.make_array(arr_ty)(context, builder, arr)
        i = context.cast(builder, idx, idx_ty, types.intp)
        p = builder.addrspacecast(builder.gep(ary.data, [i]), ir.PointerType(f32, space))
        return p if w == 1 else builder.bitcast(p, ir.PointerType(ir.VectorType(f32, w), space))

    def make_load(space: int, w: int) -> Any:
        @intrinsic
        def ld(typingctx, arr, idx):  # type: ignore[no-untyped-def]
            ret = types.float32 if w == 1 else types.UniTuple(types.float32, w)
            sig = ret(arr, idx)

            def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
                p = _ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1], space, w)
                v = builder.load(p, align=4 * w)
                if w == 1:
                    return v
                vals = [builder.extract_element(v, ir.Constant(ir.IntType(32), e)) for e in range(w)]
                return context.make_tuple(builder, sig.return_type, vals)

            return sig, codegen

        return ld

    def store_codegen(space: int, w: int) -> Any:
        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            p = _ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1], space, w)
            if w == 1:
                builder.store(args[2], p, align=4)
            else:
                v = ir.Constant(ir.VectorType(f32, w), ir.Undefined)
                for e in range(w):
                    v = builder.insert_element(v, args[2 + e], ir.Constant(ir.IntType(32), e))
                builder.store(v, p, align=4 * w)
            return context.get_dummy_value()

        return codegen

    def make_store(space: int, w: int) -> Any:
        if w == 1:

            @intrinsic
            def st1(typingctx, arr, idx, v0):  # type: ignore[no-untyped-def]
                return types.void(arr, idx, types.float32), store_codegen(space, 1)

            return st1

        @intrinsic
        def st4(typingctx, arr, idx, v0, v1, v2, v3):  # type: ignore[no-untyped-def]
            return types.void(arr, idx, *([types.float32] * 4)), store_codegen(space, 4)

        return st4

    return {
        "ldg1": make_load(1, 1), "ldg4": make_load(1, 4), "stg1": make_store(1, 1), "stg4": make_store(1, 4),
        "lds4": make_load(3, 4), "sts1": make_store(3, 1), "sts4": make_store(3, 4),
    }  # fmt: skip


def _make_sim_helpers() -> dict[str, Any]:
    """The same names as plain device functions for the CUDA simulator (it runs Python, not LLVM)."""

    @cuda.jit(device=True)
    def ld1(arr, i):  # type: ignore[no-untyped-def]
        return arr[i]

    @cuda.jit(device=True)
    def ld4(arr, i):  # type: ignore[no-untyped-def]
        return arr[i], arr[i + 1], arr[i + 2], arr[i + 3]

    @cuda.jit(device=True)
    def st1(arr, i, v):  # type: ignore[no-untyped-def]
        arr[i] = v

    @cuda.jit(device=True)
    def st4(arr, i, v0, v1, v2, v3):  # type: ignore[no-untyped-def]
        arr[i] = v0
        arr[i + 1] = v1
        arr[i + 2] = v2
        arr[i + 3] = v3

    return {"ldg1": ld1, "ldg4": ld4, "stg1": st1, "stg4": st4, "lds4": ld4, "sts1": st1, "sts4": st4}


@cache
def _helpers() -> dict[str, Any]:
    return _make_sim_helpers() if SIMULATED else _make_intrinsics()


def gen_source(
    bk: int,
    vec: bool,
    has_bias: bool,
    has_res: bool,
    group: int = 8,
    dbuf: bool = True,
    layout: str = "4x8",
    tn: int = 8,
) -> str:
    """Python source of one simt2 kernel: 256 threads, block tile 128 x (16 * tn), each thread 8 x tn outputs
    (rows ty*4 + {0..3} and 64 + ty*4 + {0..3}; columns tx*4 + 64*h + {0..3}), K in slices of `bk` through
    two shared buffers. `vec`: 16-byte global loads/stores (K, N multiples of 4, aligned pointers). `group`:
    block rows per rasterisation group. `dbuf`: fragments double-buffered in registers. `layout`: lanes of a
    warp as 4 x 8 or 2 x 16 (ty, tx) groups. Every loop here runs in Python: the emitted code is straight."""
    BM = 128
    BN = 16 * tn
    nh = tn // 4  # 4-wide column groups per thread, 64 apart
    # A row padded by 4 floats (transposed stores of lanes sharing a row hit other banks) while the two
    # buffers fit numba's 48 KB of static shared memory
    LDA = BM + 4 if 2 * bk * (BM + 4 + BN) * 4 <= 48 * 1024 else BM
    nva = bk * BM // 1024  # 16-byte vectors per thread per slice of A, and of B
    nvb = bk * BN // 1024
    nparts = max(nva, nvb)
    sa_sz = 2 * bk * LDA
    sb_sz = 2 * bk * BN
    L: list[str] = []
    e = L.append
    e("def simt2(a, b, bias, res, out, m, n, k):")
    al = "" if SIMULATED else ", alignment=16"  # the simulator rejects the argument
    e(f"    sa = cuda.shared.array({sa_sz}, float32{al})")
    e(f"    sb = cuda.shared.array({sb_sz}, float32{al})")
    e("    tid = cuda.threadIdx.x")
    e("    lane = tid % 32")
    e("    w = tid // 32")
    if layout == "4x8":  # a warp is 4 row groups x 8 column groups: 4 + 8 distinct float4 per k step
        e("    ty = (w // 2) * 4 + lane // 8")
        e("    tx = (w % 2) * 8 + lane % 8")
    else:  # "2x16", the simt kernel's layout: 2 + 16 distinct float4 per k step
        e("    ty = tid // 16")
        e("    tx = tid % 16")
    # block -> tile, grouped along M so consecutive blocks share B column panels in L2
    e(f"    gm = (m + {BM - 1}) // {BM}")
    e(f"    gn = (n + {BN - 1}) // {BN}")
    e("    pid = cuda.blockIdx.x")
    if group > 1:
        e(f"    gsize = {group} * gn")
        e(f"    first = (pid // gsize) * {group}")
        e(f"    rows_in = min(gm - first, {group})")
        e("    bm = first + (pid % gsize) % rows_in")
        e("    bn = (pid % gsize) // rows_in")
    else:
        e("    bm = pid // gn")
        e("    bn = pid % gn")
    e(f"    m0 = bm * {BM}")
    e(f"    n0 = bn * {BN}")
    # global-load plan: vector v = tid + 256 j; A: row v // (bk/4), k col (v % (bk/4)) * 4; B: k row
    # v // (BN/4), col (v % (BN/4)) * 4. Rows/cols past the matrix are clamped onto the last one: they load
    # real memory and feed only outputs that are never stored, so the main loop carries no predicates.
    for j in range(nva):
        e(f"    ar{j} = (tid + {256 * j}) // {bk // 4}")
        e(f"    ak{j} = (tid % {bk // 4}) * 4")
        e(f"    ga{j} = min(m0 + ar{j}, m - 1) * k + ak{j}")
    for j in range(nvb):
        e(f"    br{j} = (tid + {256 * j}) // {BN // 4}")
        e(f"    bc{j} = (tid % {BN // 4}) * 4")
        if vec:
            e(f"    gb{j} = min(n0 + bc{j}, n - 4)")
        else:
            e(f"    gb{j} = n0 + bc{j}")
    for i in range(8):
        for j in range(tn):
            e(f"    c{i}_{j} = float32(0.0)")

    def load_a(ind: str, k0: str, checked: bool, j: int) -> None:
        """A: 4 consecutive k of one row."""
        if vec:
            if checked:
                e(f"{ind}if {k0} + ak{j} < k:")
                e(f"{ind}    xa{j}_0, xa{j}_1, xa{j}_2, xa{j}_3 = ldg4(a, ga{j} + {k0})")
                e(f"{ind}else:")
                for q in range(4):
                    e(f"{ind}    xa{j}_{q} = float32(0.0)")
            else:
                e(f"{ind}xa{j}_0, xa{j}_1, xa{j}_2, xa{j}_3 = ldg4(a, ga{j} + {k0})")
        else:
            for q in range(4):
                if checked:
                    ld = f"ldg1(a, ga{j} + {k0} + {q})"
                    e(f"{ind}xa{j}_{q} = {ld} if {k0} + ak{j} + {q} < k else float32(0.0)")
                else:
                    e(f"{ind}xa{j}_{q} = ldg1(a, ga{j} + {k0} + {q})")

    def load_b(ind: str, k0: str, checked: bool, j: int) -> None:
        """B: 4 consecutive columns of one k row."""
        e(f"{ind}rowb = ({k0} + br{j}) * n")
        if checked:
            e(f"{ind}if {k0} + br{j} < k:")
            ind2 = ind + "    "
        else:
            ind2 = ind
        if vec:
            e(f"{ind2}xb{j}_0, xb{j}_1, xb{j}_2, xb{j}_3 = ldg4(b, rowb + gb{j})")
        else:
            for q in range(4):
                e(f"{ind2}xb{j}_{q} = ldg1(b, rowb + min(gb{j} + {q}, n - 1))")
        if checked:
            e(f"{ind}else:")
            for q in range(4):
                e(f"{ind}    xb{j}_{q} = float32(0.0)")

    def load_part(ind: str, k0: str, checked: bool, j: int) -> None:
        if j < nva:
            load_a(ind, k0, checked, j)
        if j < nvb:
            load_b(ind, k0, checked, j)

    def store_part(ind: str, buf: str, j: int) -> None:
        if j < nva:
            for q in range(4):
                e(f"{ind}sts1(sa, ({buf}) * {bk * LDA} + (ak{j} + {q}) * {LDA} + ar{j}, xa{j}_{q})")
        if j < nvb:
            xb = ", ".join(f"xb{j}_{q}" for q in range(4))
            e(f"{ind}sts4(sb, ({buf}) * {bk * BN} + br{j} * {BN} + bc{j}, {xb})")

    e(f"    nfull = k // {bk}")
    e(f"    nt = (k + {bk - 1}) // {bk}")
    e("    if nfull > 0:")
    for j in range(nparts):
        load_part("        ", "0", False, j)
    e("    else:")
    for j in range(nparts):
        load_part("        ", "0", True, j)
    for j in range(nparts):
        store_part("    ", "0", j)
    e("    cuda.syncthreads()")
    e("    for t in range(nt):")
    e("        cur = t % 2")
    e(f"        oa = cur * {bk * LDA} + ty * 4")
    e(f"        ob = cur * {bk * BN} + tx * 4")
    e(f"        k1 = (t + 1) * {bk}")

    def frag(s: int, kk: int) -> None:
        e(f"        a{s}_0, a{s}_1, a{s}_2, a{s}_3 = lds4(sa, oa + {kk * LDA})")
        e(f"        a{s}_4, a{s}_5, a{s}_6, a{s}_7 = lds4(sa, oa + {kk * LDA + 64})")
        for h in range(nh):
            regs = ", ".join(f"b{s}_{4 * h + q}" for q in range(4))
            e(f"        {regs} = lds4(sb, ob + {kk * BN + 64 * h})")

    # the next slice is staged in parts (one A and/or one B vector each): part j is loaded at step j * span
    # and stored to the other buffer after step (j + 1) * span - 1 (that buffer was last read before the
    # previous barrier), so at most 8 staging registers are live at any time whatever BK is
    span = bk // nparts
    for kk in range(bk):
        s = kk % 2 if dbuf else 0
        part, r = divmod(kk, span)
        if r == 0:
            e("        if t + 1 < nfull:")
            load_part("            ", "k1", False, part)
            e("        elif t + 1 < nt:")
            load_part("            ", "k1", True, part)
        if kk == 0:
            frag(0, 0)
        if dbuf and kk + 1 < bk:
            frag((kk + 1) % 2, kk + 1)
        for i in range(8):
            for j in range(tn):
                e(f"        c{i}_{j} += a{s}_{i} * b{s}_{j}")
        if not dbuf and kk + 1 < bk:
            frag(0, kk + 1)
        if r == span - 1:
            e("        if t + 1 < nt:")
            store_part("            ", "1 - cur", part)
    e("        cuda.syncthreads()")
    # epilogue: 8 rows x nh 4-wide column groups per thread
    for i in range(8):
        r = f"m0 + ty * 4 + {i % 4 + (i // 4) * 64}"
        e(f"    r = {r}")
        e("    if r < m:")
        for h in range(nh):
            e(f"        cc = n0 + tx * 4 + {h * 64}")
            vals = [f"c{i}_{h * 4 + q}" for q in range(4)]
            if vec:
                e("        if cc < n:")
                e("            o = r * n + cc")
                if has_bias:
                    e("            y0, y1, y2, y3 = ldg4(bias, cc)")
                    for q in range(4):
                        e(f"            {vals[q]} += y{q}")
                if has_res:
                    e("            y0, y1, y2, y3 = ldg4(res, o)")
                    for q in range(4):
                        e(f"            {vals[q]} += y{q}")
                e(f"            stg4(out, o, {', '.join(vals)})")
            else:
                for q in range(4):
                    e(f"        if cc + {q} < n:")
                    e(f"            v = {vals[q]}")
                    if has_bias:
                        e(f"            v += ldg1(bias, cc + {q})")
                    if has_res:
                        e(f"            v += ldg1(res, r * n + cc + {q})")
                    e(f"            stg1(out, r * n + cc + {q}, v)")
    return "\n".join(L) + "\n"


SIMT2_THREADS = 256
S2_BM = 128  # simt2's block tile rows (gen_source); its columns are 16 * tn


@cache
def _simt2(
    bk: int,
    vec: bool,
    has_bias: bool,
    has_res: bool,
    group: int = 8,
    dbuf: bool = True,
    min_blocks: int = 2,
    layout: str = "4x8",
    tn: int = 8,
) -> Any:
    """The numba kernel for one generator setting (gen_source); `min_blocks` > 0 sets launch_bounds (256,
    min_blocks), which caps registers (2 -> 128 per thread), 0 leaves ptxas free."""
    src = gen_source(bk, vec, has_bias, has_res, group, dbuf, layout, tn)
    ns: dict[str, Any] = {"cuda": cuda, "float32": float32, "min": min, **_helpers()}
    exec(compile(src, f"<simt2 bk={bk} tn={tn} vec={vec} bias={has_bias} res={has_res}>", "exec"), ns)
    opts: dict[str, Any] = (
        {} if SIMULATED else {"launch_bounds": (SIMT2_THREADS, min_blocks)} if min_blocks else {}
    )
    return cuda.jit(**opts)(ns["simt2"])


# --- launch ------------------------------------------------------------------------------------------------

_NB = {F32: "float32", F16: "float16"}


def _sig(in_dt: np.dtype, out_dt: np.dtype) -> str:
    i, o = _NB[in_dt], _NB[out_dt]
    return f"void({i}[:, ::1], {i}[:, ::1], {o}[::1], {o}[:, ::1], {o}[:, ::1], int64, int64, int64)"


@cache
def _fast(path: str, has_bias: bool, has_res: bool, in_dt: np.dtype, out_dt: np.dtype) -> Any:
    make = {"portable": _portable, "simt": _simt, "simt_wide": _simt_wide}[path]
    return kernel(make(has_bias, has_res), _sig(in_dt, out_dt))


_RESOLVED: dict[tuple[str, np.dtype], str] = {}  # (path, input dtype) -> path, for paths that can run here


def resolve_path(path: str, in_dtype: np.dtype) -> str:
    """The path `path` means here: "auto" -> portable under the simulator, mma for fp16 on tensor cores,
    simt otherwise. An explicit path that cannot run here raises ValueError."""
    hit = _RESOLVED.get((path, in_dtype))
    if hit is not None:
        return hit
    resolved = _resolve_path(path, in_dtype)
    _RESOLVED[(path, in_dtype)] = resolved
    return resolved


def _resolve_path(path: str, in_dtype: np.dtype) -> str:
    if path not in PATHS:
        raise ValueError(f"path: {path!r} is not a matmul path; allowed: {', '.join(PATHS)}")
    if path == "auto":
        if SIMULATED:
            return "portable"
        if in_dtype == F16:
            return "mma" if mma.available() else "simt"
        return SIMT_DEFAULT
    if path == "simt2" and in_dtype != F32:
        raise ValueError(f"path: 'simt2' needs float32 inputs; got {in_dtype} inputs")
    if SIMULATED and path not in ("portable", "simt2"):
        raise ValueError(
            f"path: {path!r} needs a real GPU; under the simulator only 'portable' and 'simt2' run"
        )
    if path == "mma" and (in_dtype != F16 or not mma.available()):
        raise ValueError(
            f"path: 'mma' needs float16 inputs and tensor cores (cc >= 8.0); got {in_dtype} inputs"
            + ("" if mma.available() else " on a device without them")
        )
    return path


def run_matmul(
    a: Operand,
    b: Operand,
    bias: Operand | None,
    res: Operand | None,
    out: Operand,
    path: str,
    stream: int = 0,
    replay: bool = False,
) -> Replay | None:
    """out = a @ b (+ bias) (+ res) on validated 2-D operands; `path` already resolved. With `replay`, also
    returns the same launch as a `Replay` for the launcher's FastCache (device operands only)."""
    m, k = a.shape
    n = b.shape[1]
    if path == "mma":
        mma.launch(
            a=a.ptr, b=b.ptr, bias=bias.ptr if bias else 0, res=res.ptr if res else 0, out=out.ptr,
            m=m, n=n, k=k, out_half=out.dtype == F16, stream=stream,
        )  # fmt: skip
        return _mma_replay(a, b, bias, res, out) if replay else None
    # absent epilogue operands: the kernel is compiled without the read, any array of the right type will do
    bias_op = bias if bias is not None else _placeholder_1d(out.dtype)
    res_op = res if res is not None else out
    block: Any
    if path == "simt2":
        ptrs = (a.ptr, b.ptr, out.ptr) + ((bias.ptr,) if bias else ()) + ((res.ptr,) if res else ())
        vec = simt2_vec_ok(m, n, k, ptrs)
        kern = _fast2(vec, bias is not None, res is not None)
        bn2 = 16 * s2_config(vec, res is not None)[5]
        grid: Any = ((m + S2_BM - 1) // S2_BM) * ((n + bn2 - 1) // bn2)
        block = SIMT2_THREADS
    else:
        kern = _fast(path, bias is not None, res is not None, a.dtype, out.dtype)
        if path == "portable":
            grid, block = ((n + PT - 1) // PT, (m + PT - 1) // PT), (PT, PT)
        else:
            bn = BN_WIDE if path == "simt_wide" else BN
            grid, block = ((n + bn - 1) // bn, (m + BM - 1) // BM), (SIMT_THREADS,)
    args = (a, b, bias_op, res_op, out, m, n, k)
    kern.launch(grid, block, args, stream=stream)
    if not replay:
        return None
    return _kernel_replay(kern.bind(grid, block, args), bias_op.ptr, res is not None, bias is not None)


class Replay:
    """A validated matmul launch, replayed with new device pointers: the value the gemm / o_proj launchers
    keep in their FastCache (kernels.launch). `launch(ptrs, stream)` takes the pointers of the cache key's
    operands in the order (a, b, out[, res][, bias])."""

    __slots__ = ("launch",)

    def __init__(self, fn: Any) -> None:
        self.launch = fn


def _kernel_replay(bound: Any, bias_ph: int, has_res: bool, has_bias: bool) -> Replay:
    # the kernels' array slots are (a, b, bias, res, out); absent ones hold the placeholder / out
    go = bound.launch
    if has_res and has_bias:
        return Replay(lambda p, s=0: go((p[0], p[1], p[4], p[3], p[2]), s))
    if has_res:
        return Replay(lambda p, s=0: go((p[0], p[1], bias_ph, p[3], p[2]), s))
    if has_bias:
        return Replay(lambda p, s=0: go((p[0], p[1], p[3], p[2], p[2]), s))
    return Replay(lambda p, s=0: go((p[0], p[1], bias_ph, p[2], p[2]), s))


def _mma_replay(a: Operand, b: Operand, bias: Operand | None, res: Operand | None, out: Operand) -> Replay:
    """The mma launch as a Replay. With the production tile's `epi` the kernel choice depends on the shapes
    and on whether all five pointers are 16-byte aligned, which the FastCache key holds (shapes, pointers
    OR-ed & 15): so the choice, grid and whole parameter block are made once here, and a replay writes only
    the pointers (the per-call selection cost ~3 us of host time on the H200, issue 4)."""
    m, k = a.shape
    n = b.shape[1]
    half = out.dtype == F16
    ri = 3 if res is not None else -1
    bi = (4 if res is not None else 3) if bias is not None else -1
    if mma.DEFAULT.epi:
        # p = (a, b, out[, res][, bias]) -> the kernel's arguments (a 0, b 1, bias 2, res 3, out 4)
        order = (0, 1, 4) + ((3,) if res is not None else ()) + ((2,) if bias is not None else ())
        bound = mma.bind(
            a=a.ptr, b=b.ptr, bias=bias.ptr if bias else 0, res=res.ptr if res else 0, out=out.ptr,
            m=m, n=n, k=k, out_half=half, ptr_args=order,
        )  # fmt: skip
        return Replay(bound.launch)

    def go(p: Any, s: Any = 0) -> None:  # the choice depends on a and b alone: decide per call
        mma.launch(
            a=p[0], b=p[1], bias=p[bi] if bi >= 0 else 0, res=p[ri] if ri >= 0 else 0, out=p[2],
            m=m, n=n, k=k, out_half=half, stream=s,
        )  # fmt: skip

    return Replay(go)


SIG_FLAT = "void(float32[::1], float32[::1], float32[::1], float32[::1], float32[::1], int64, int64, int64)"


# the generator settings (bk, group, dbuf, min_blocks, layout, tn) "simt2" runs, per case; chosen from the
# H200 rounds of benchmarks/probe_sgemm.py (benchmarks/notes-matmul.md, "fp32 v2"):
# 16-byte loads, no residual: 128 x 256 tiles (8 x 16 per thread), BK 16, 249 regs, 1 block of 8 warps per SM:
# 0.916x / 0.956x cuBLAS at 4096^3 / 8192x2560x2560 (128 x 128 BK 16: 0.886x / 0.920x)
S2_GEMM: tuple[int, int, bool, int, str, int] = (16, 8, True, 1, "4x8", 16)
# 16-byte loads with a residual epilogue (o_proj): 128 x 128, BK 8, capped at 128 regs for 2 blocks per SM, so
# one block's residual reads and stores overlap the other block's main loop: 0.953x cuBLAS + add, where the
# 1-block-per-SM BK 16 kernel pays ~115 us of exposed epilogue (0.918x)
S2_RES: tuple[int, int, bool, int, str, int] = (8, 8, True, 2, "4x8", 8)
# 4-byte fallback (K or N not a multiple of 4, or unaligned pointers): 128 x 128, BK 16, no register cap
# (0.737x / 0.790x; capped at 128 regs it spilled and ran at 0.661x)
S2_SCALAR: tuple[int, int, bool, int, str, int] = (16, 8, True, 1, "4x8", 8)


def s2_config(vec: bool, has_res: bool) -> tuple[int, int, bool, int, str, int]:
    if not vec:
        return S2_SCALAR
    return S2_RES if has_res else S2_GEMM


@cache
def _fast2(vec: bool, has_bias: bool, has_res: bool) -> Any:
    return kernel(_simt2_prod(vec, has_bias, has_res), SIG_FLAT)


def _simt2_prod(vec: bool, has_bias: bool, has_res: bool) -> Any:
    bk, group, dbuf, min_blocks, layout, tn = s2_config(vec, has_res)
    return _simt2(bk, vec, has_bias, has_res, group, dbuf, min_blocks, layout, tn)


def simt2_vec_ok(m: int, n: int, k: int, ptrs: tuple[int, ...]) -> bool:
    """The 16-byte load/store variant needs K and N multiples of 4 (every row starts 16-byte aligned) and
    16-byte aligned base pointers; otherwise the scalar variant of the same kernel runs."""
    return n % 4 == 0 and k % 4 == 0 and all(p % 16 == 0 for p in ptrs)


@cache
def _placeholder_1d(dtype: np.dtype) -> Operand:
    return arrays.empty_like_device("bias", (1,), dtype)


def check_matmul_operands(a: Operand, b: Operand, a_name: str = "a", b_name: str = "b") -> None:
    """dtype, contiguity and inner-dimension checks shared by gemm and o_proj (a may be N-d: rows x K).
    One comparison chain on the hot path (host overhead); the detailed checks and messages on a miss."""
    dt = a.dtype
    if (
        (dt is F32 or dt is F16)
        and b.dtype is dt
        and len(b.shape) == 2
        and a.shape[-1] == b.shape[0]
        and 0 not in a.shape
        and 0 not in b.shape
        and a.strides == arrays.c_strides(a.shape, dt.itemsize)
        and b.strides == arrays.c_strides(b.shape, dt.itemsize)
    ):
        return
    arrays.check_dtype(a, FLOAT_IO)
    arrays.check_same_dtype(b, a)
    arrays.check_ndim(b, (2,))
    arrays.check_contiguous(a)
    arrays.check_contiguous(b)
    arrays.check_nonempty(a)
    arrays.check_nonempty(b)
    if a.shape[-1] != b.shape[0]:
        raise ValueError(
            f"{b_name}: inner dimensions do not match: {a_name} has K = {a.shape[-1]} (shape {a.shape}), "
            f"{b_name} has {b.shape[0]} rows (shape {b.shape}); expected {b_name}.shape[0] == {a.shape[-1]}"
        )


def gemm(a: Any, b: Any, out: Any = None, *, path: str = "auto", stream: int = 0) -> Any:
    """C = a @ b, fp32 output. a [M, K], b [K, N], both float32 or both float16, C-contiguous.
    Returns `out` (a new device array when None; numpy when the inputs are numpy)."""
    if out is not None:  # hot path: a layout validated before, new pointers (kernels.launch.FastCache)
        hit, ptrs = _FAST_GEMM.find((a, b, out), path)
        if hit is not None:
            hit.launch(ptrs, stream)
            return out
    sync = HostSync()
    ao = arrays.operand("a", a, sync)
    bo = arrays.operand("b", b, sync)
    arrays.check_ndim(ao, (2,))
    check_matmul_operands(ao, bo)
    resolved = resolve_path(path, ao.dtype)
    oo = arrays.output("out", out, sync, (ao.shape[0], bo.shape[1]), F32)
    keep = out is not None and ao.host is None and bo.host is None and oo.host is None and not SIMULATED
    rep = run_matmul(ao, bo, None, None, oo, resolved, stream, replay=keep)
    if rep is not None:
        _FAST_GEMM.store((a, b, out), path, rep)
    return arrays.finish(sync, oo, out, ao)


_FAST_GEMM = FastCache()  # validated gemm launches by operand layout and path


# --- registry ----------------------------------------------------------------------------------------------


def _make_problem(case: Case, rng: np.random.Generator) -> Problem:
    m, n, k = case.params["M"], case.params["N"], case.params["K"]
    dt = np.dtype(case.dtype)
    a = rng.standard_normal((m, k)).astype(dt)
    b = rng.standard_normal((k, n)).astype(dt)
    ref = a.astype(np.float64) @ b.astype(np.float64)  # on the rounded inputs: only the kernel's error counts
    return Problem(inputs={"a": a, "b": b}, outputs={"c": ((m, n), F32)}, reference={"c": ref})


def _spec_launch(args: dict[str, Any]) -> None:
    gemm(args["a"], args["b"], args["c"])


def _cupy(args: dict[str, Any]) -> None:
    """cuBLAS through CuPy, writing the same fp32 C. fp32: SGEMM (`a @ b`, no TF32 unless CUPY_TF32 is set).
    fp16: cublasGemmEx with fp16 A/B, fp32 C and fp32 compute, the same computation as ours (cupy's own
    `a @ b` on fp16 would round C to fp16)."""
    import cupy as cp

    a, b, c = args["a"], args["b"], args["c"]
    if a.dtype == cp.float32:
        cp.matmul(a, b, out=c)
        return
    cublas_gemm_f16_f32(a, b, c)


def cublas_gemm_f16_f32(a: Any, b: Any, c: Any) -> None:
    """c[M, N] (fp32) = a[M, K] (fp16) @ b[K, N] (fp16) with cublasGemmEx, fp32 accumulate, on CuPy arrays.
    Row-major C = A B is column-major C^T = B^T A^T: cuBLAS sees B as the first operand."""
    import cupy as cp
    from cupy.cuda import cublas
    from cupy.cuda import runtime as rt

    m, k = a.shape
    n = b.shape[1]
    one = np.ones(1, dtype=np.float32)
    zero = np.zeros(1, dtype=np.float32)
    handle = cp.cuda.device.get_cublas_handle()  # cupy binds it to the current stream on each call
    compute_32f = getattr(cublas, "CUBLAS_COMPUTE_32F", 68)
    cublas.gemmEx(
        handle, cublas.CUBLAS_OP_N, cublas.CUBLAS_OP_N, n, m, k,
        one.ctypes.data, b.data.ptr, rt.CUDA_R_16F, n, a.data.ptr, rt.CUDA_R_16F, k,
        zero.ctypes.data, c.data.ptr, rt.CUDA_R_32F, n, compute_32f, cublas.CUBLAS_GEMM_DEFAULT,
    )  # fmt: skip


def _cases(shapes: list[tuple[str, int, int, int]]) -> tuple[Case, ...]:
    dts = ("float32", "float16")
    return tuple(Case(label, {"M": m, "N": n, "K": k}, dt) for label, m, n, k in shapes for dt in dts)


def path_for(case: Case) -> str:
    """The path "auto" takes for `case` on this machine (reported by verify/bench)."""
    return resolve_path("auto", np.dtype(case.dtype))


def _flops(c: Case) -> float:
    return 2.0 * c.params["M"] * c.params["N"] * c.params["K"]


def _bytes(c: Case) -> float:
    m, n, k = c.params["M"], c.params["N"], c.params["K"]
    return float((m * k + k * n) * np.dtype(c.dtype).itemsize + 4 * m * n)


def ptx_kernels(op: str, has_bias: bool, has_res: bool, out_same_dtype: bool) -> tuple[tuple[Any, ...], ...]:
    """Offline-PTX entries (kernels.ptx) for the kernels an op runs: portable and simt per input dtype, simt2
    (fp32), and the aligned tensor-core kernel (linked CUDA C: the 4th item names the file)."""
    out: list[tuple[Any, ...]] = []
    for dt in (F32, F16):
        o = dt if out_same_dtype else F32
        out.append((f"{op}_portable_{dt.name}", _portable(has_bias, has_res), _sig(dt, o)))
        out.append((f"{op}_simt_{dt.name}", _simt(has_bias, has_res), _sig(dt, o)))
    # simt2 is fp32 only (fp32 in and out for gemm and o_proj alike): its 16-byte variant, what auto runs
    out.append((f"{op}_simt2_float32", _simt2_prod(True, has_bias, has_res), SIG_FLAT))
    mma_kernel = mma.dispatchers(mma.DEFAULT)[(out_same_dtype, True)]
    out.append((f"{op}_mma_float16", mma_kernel, mma.KERNEL_SIG, (mma.CU_FILE,)))
    return tuple(out)


SPEC = register(
    OpSpec(
        name="gemm",
        dtypes=("float32", "float16"),
        make_problem=_make_problem,
        launch=_spec_launch,
        flops=_flops,
        bytes=_bytes,
        # fp32 accumulation over K <= 4096 lands near 1e-6; TF32 (3e-4) or a wrong tile fails
        tolerance={"float32": 2e-5, "float16": 1e-4},
        sim_cases=_cases([("tiny-odd", 19, 23, 17)]),
        # odd (unaligned: scalar-load path of mma) and multiple-of-8 but not of the tile (cp.async zero-fill)
        verify_cases=_cases([("odd", 257, 129, 67), ("edge8", 520, 392, 264)]),
        bench_cases=_cases([("4096^3", 4096, 4096, 4096), ("8192x2560x2560", 8192, 2560, 2560)]),
        cupy=_cupy,
        bound="compute",
        path=path_for,
        ptx_kernels=() if SIMULATED else ptx_kernels("gemm", False, False, False),
    )
)

"""layernorm: out[i, :] = (x[i, :] - mean) / sqrt(var + eps) * weight + bias, row-wise over the last dim.

Floors per row of n: 8n FLOP; bytes = 2 * n * itemsize (x read once, out written once; weight and bias are
2n elements shared by every row). Bandwidth-bound.
Kernels, one block of 256 threads per row, as rmsnorm:
  - `_make_reg` (rows of up to BLOCK * PER = 4096): the row sits in registers, so the variance is the
    exact two-pass E[(x - mean)^2] at the cost of one more block reduction, no extra memory traffic.
  - `_layernorm_vec` (same rows when x, weight, bias, out are 16-byte aligned and a row is a multiple of 16
    bytes): the register kernel with 16-byte loads and stores (kernels.primitives.vector).
  - `make_rows_half2` (fp16; kernels/ops/rows.py ROW_KERNELS sends fp16 "auto" calls to it): one block per
    row, one two-sum reduction of x - x[row, 0], and an output stage in packed halves whose weight / bias
    loads are batched ahead of the stores. fp32 takes the vector kernel on "auto" too. The measurements
    behind both choices, and the kernels that lost, are in benchmarks/notes-memory.md.
  - `_make_stream` (longer rows): pass 1 accumulates the sum and the sum of squares of (x - k) with
    k = x[i, 0]: shifting by a sample of the row keeps var = E[(x-k)^2] - E[x-k]^2 free of the catastrophic
    cancellation the unshifted formula suffers when |mean| >> std, in a single read of the row. Pass 2
    re-reads the row from L1/L2 and writes.
  - bf16 (`ml_dtypes.bfloat16`, the same dtype as residual_add / cast): the register and streaming kernels
    above, built from the same bodies with kernels.ops.rows.WORDS: uint16 words widened exactly to fp32,
    fp32 arithmetic, one round to nearest even on the store (NaN stays NaN); and the vector kernel, which
    moves the words as 16-byte vectors of 8 (kernels.primitives.vector.ldg_into / stg_from).
  - Vector rows in fp16 / bf16 past BLOCK * PER, or much shorter: the vector kernel at a kernels.ops.rows
    WIDE_ROWS shape (32 x 32 up to 1024 x 32 threads x values), chosen by rows.wide_for, so rows of up to
    32768 columns stay in registers (one read of the row) instead of streaming (two). Rows of 8193-16384
    columns run that kernel with `wb_shared` (rows.WIDE_WB_SHARED, where the device holds it:
    rows.wb_shared_fits): each thread's weight and bias vectors copied into 64 KB of dynamic shared memory
    by cp.async while its row loads, read back in the write pass; the same words as the plain shape.
  - `make_onchip` (fp16 / bf16 rows of kernels.ops.rows.ONCHIP_ROWS.from_cols to .cols columns: 128256 to
    131584, the vocabularies, and built again as rows.ONCHIP_MID_ROWS for rows of 32776 to 65536: two
    blocks of 512 threads per SM; "auto" and "vector" take it there, on GPUs that let a block opt in to its
    shared memory: rows.chip_fits, sm_90): rmsnorm's on-chip layout (1024 threads x 16 values in
    registers, the rest of the row in up to 225 KB of dynamic shared memory packed two columns to a 32-bit
    word, each thread's own slots, so the row is read once) with make_stream_vec's shifted sums and one
    two-sum reduction, and the next row loaded in the write pass. ptxas sm_90: 46-48 registers, no spills, at
    ONCHIP_ROWS' 2 vectors in flight. On an H100 (2026-12-06), bf16 at 261 x 128256: 0.76 of copy (the
    two-pass form before it: 0.72, 1.08x its streaming kernel); it takes rmsnorm's widths and layout.
  - `make_stream_vec` (path="vector" on rows past what registers hold: 32768 columns in fp16 / bf16, e.g.
    vocabularies of 128256; 4096 in fp32): the streaming kernel on 16-byte vectors, 1024 threads per row,
    L2 hints so that pass 2 re-reads the row from L2 (kernels.ops.rows.STREAM_ROWS). "auto" takes it in the
    rows.STREAM_VECTOR_AUTO dtypes, fp32 from rows.STREAM_VECTOR_AUTO_FROM's width (on the H200 1.1-5.5x
    the scalar streaming kernel).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import cuda, float32, uint32

from kernels.ops.rows import (
    BF16_ELEM_TOL,
    BF16_TOL,
    Half2Rows,
    OnChipRows,
    RowConfig,
    RowIO,
    RowKernels,
    StreamRows,
    VectorRows,
    WideRows,
    make_stream_loads,
    onchip_part,
    row_cases,
    row_choice_of,
    row_path_of,
    shared_vec_reader,
    vec_jit,
)
from kernels.primitives.cache_hints import l2_evict_first, l2_evict_last
from kernels.primitives.cp_async import commit, cp16, wait_all
from kernels.primitives.reductions import (
    BLOCK,
    PER,
    ROW_JIT,
    block_sum,
    make_block_sum,
    make_block_sum2,
    row_slots,
)
from kernels.primitives.vector import PATHS as VECTOR_PATHS
from kernels.primitives.vector import (
    RAW_DTYPE,
    RAW_PER_VEC,
    VEC_BYTES,
    ldg_into,
    ldg_raw,
    make_row_io,
    stg_from,
    unpack_h8,
    vector_ok,
)
from kernels.registry import SPECIALS, Case, OpSpec, Problem, poison, register
from kernels.runtime import arrays
from kernels.runtime.arrays import BF16, FLOAT_IO_BF16, SIMULATED, HostSync
from kernels.runtime.launch import FastCache


def _make_stream(io: RowIO):  # type: ignore[no-untyped-def]
    """The streaming kernel (rows longer than BLOCK * PER), reading and writing through `io`."""
    load, store = io.load, io.store

    @cuda.jit
    def _layernorm_kernel(x, w, b, out, eps):  # type: ignore[no-untyped-def]
        smem = cuda.shared.array(BLOCK, float32)
        tid = cuda.threadIdx.x
        rows = x.shape[0]
        n = x.shape[1]
        row = cuda.blockIdx.x
        while row < rows:
            k = load(x[row, 0])
            s0 = float32(0.0)
            s1 = float32(0.0)
            q0 = float32(0.0)
            q1 = float32(0.0)
            j = tid
            while j + 3 * BLOCK < n:
                v0 = load(x[row, j]) - k
                v1 = load(x[row, j + BLOCK]) - k
                v2 = load(x[row, j + 2 * BLOCK]) - k
                v3 = load(x[row, j + 3 * BLOCK]) - k
                s0 += v0 + v2
                s1 += v1 + v3
                q0 += v0 * v0 + v2 * v2
                q1 += v1 * v1 + v3 * v3
                j += 4 * BLOCK
            while j < n:
                v = load(x[row, j]) - k
                s0 += v
                q0 += v * v
                j += BLOCK
            fn = float32(n)
            sm = block_sum(s0 + s1, smem) / fn
            sq = block_sum(q0 + q1, smem) / fn
            # abs, not max(., 0): a GPU max drops a NaN (max.f32), turning the NaN variance of a row holding
            # an infinity into 0; the cancellation error abs folds back is as small as the one max would zero
            var = abs(sq - sm * sm)
            rstd = float32(1.0) / math.sqrt(var + eps)
            mean = k + sm
            j = tid
            while j + 3 * BLOCK < n:
                v0 = load(x[row, j])
                v1 = load(x[row, j + BLOCK])
                v2 = load(x[row, j + 2 * BLOCK])
                v3 = load(x[row, j + 3 * BLOCK])
                out[row, j] = store((v0 - mean) * rstd * load(w[j]) + load(b[j]))
                j1 = j + BLOCK
                out[row, j1] = store((v1 - mean) * rstd * load(w[j1]) + load(b[j1]))
                j2 = j + 2 * BLOCK
                out[row, j2] = store((v2 - mean) * rstd * load(w[j2]) + load(b[j2]))
                j3 = j + 3 * BLOCK
                out[row, j3] = store((v3 - mean) * rstd * load(w[j3]) + load(b[j3]))
                j += 4 * BLOCK
            while j < n:
                out[row, j] = store((load(x[row, j]) - mean) * rstd * load(w[j]) + load(b[j]))
                j += BLOCK
            row += cuda.gridDim.x

    return _layernorm_kernel


def _make_reg(io: RowIO):  # type: ignore[no-untyped-def]
    """The register kernel (rows of up to BLOCK * PER), reading and writing through `io`."""
    load, store = io.load, io.store

    @cuda.jit(**ROW_JIT)
    def _layernorm_reg(x, w, b, out, eps):  # type: ignore[no-untyped-def]
        smem = cuda.shared.array(BLOCK, float32)
        v = cuda.local.array(PER, float32)
        tid = cuda.threadIdx.x
        rows = x.shape[0]
        n = x.shape[1]
        fn = float32(n)
        full = n >= BLOCK * PER
        row = cuda.blockIdx.x
        while row < rows:
            # 1-d row views and uint32 column indices: no negative-index wraparound code and one running
            # address per array instead of PER precomputed 64-bit ones (171 -> 34 registers for rmsnorm)
            xr = x[row]
            orow = out[row]
            if full:
                for k in range(PER):
                    v[k] = load(xr[uint32(tid + k * BLOCK)])
            else:
                for k in range(PER):
                    j = uint32(tid + k * BLOCK)
                    v[k] = load(xr[j]) if j < n else float32(0.0)
            s = float32(0.0)
            for k in range(PER):
                s += v[k]
            mean = block_sum(s, smem) / fn
            q = float32(0.0)
            for k in range(PER):
                if tid + k * BLOCK < n:
                    d = v[k] - mean
                    q += d * d
            rstd = float32(1.0) / math.sqrt(block_sum(q, smem) / fn + eps)
            for k in range(PER):
                j = uint32(tid + k * BLOCK)
                if j < n:
                    orow[j] = store((v[k] - mean) * rstd * load(w[j]) + load(b[j]))
            row += cuda.gridDim.x

    return _layernorm_reg


# The write pass of a full row in the vector kernels loads the weight and bias vectors of WRITE_GROUP of a
# thread's vectors before the group's first store (a load may not pass a store to memory that might alias it,
# so one vector at a time took a round trip to L2 per vector, after the block's reductions). ptxas sm_90
# (bf16 / fp16 registers, spills) at the WIDE_ROWS shapes: one at a time 60-62 / 56-64, none; 2: 62 / 63-64,
# none; 4: 64 / 64 with 16-40 bytes spilled in fp16 at 32 x 32 and 1024 x 32. Groups of 2 against one at a
# time, H100 (benchmarks/PERF.md, nineteenth session): 1.010-1.046x at 1024-32768, bits unchanged.
WRITE_GROUP = 2


def _make_vec(  # type: ignore[no-untyped-def]
    width: int,
    fastmath: bool = False,
    threads: int = BLOCK,
    per: int = PER,
    min_blocks: int = 0,
    wb_shared: bool = False,
    word: bool = False,
):
    """The vector kernel: `threads` x `per` values per row in registers (rows of <= threads * per), 16-byte
    loads and stores; the mean, then the variance of the registers (two reductions, alternating halves of
    the shared slots). Other shapes than BLOCK x PER: kernels.ops.rows.WIDE_ROWS (and rows.vec_jit).
    `wb_shared` (rows.WIDE_WB_SHARED; fp16 / bf16, `word`: bf16 words): each thread first starts cp.async
    copies of its own weight and bias vectors into dynamic shared memory (rows.WideRows.wb_shared_bytes:
    weight vector q of thread t in words 4 (q * threads + t) .. + 3, bias vector q in 4 ((nv + q) * threads +
    t) .. + 3), once per block, and its write pass reads them back with one 16-byte shared load each, so no
    L2 round trip waits behind the block's second reduction. A thread reads only the words it copied:
    cp.async.wait_all, no barrier. The arithmetic and its order are the plain kernel's: the same words."""
    load_row, col_of = make_row_io(width, threads, per)
    bsum, slots = make_block_sum(threads), row_slots(threads)
    nsm = 2 * slots  # a compile-time constant for the shared array (numba folds names, not expressions)
    jit_kw = vec_jit(threads, min_blocks, fastmath)
    nv = per // width
    group = min(WRITE_GROUP, nv)
    gn = group * width
    assert nv % group == 0, f"layernorm: {nv} vectors a thread do not split into groups of {group}"
    take = shared_vec_reader(word)
    wb_align = None if SIMULATED else 16  # lds4's 16-byte loads (the simulator takes no alignment)

    @cuda.jit(**jit_kw)
    def k(x, w, b, out, eps):  # type: ignore[no-untyped-def]
        sm = cuda.shared.array(nsm, float32)
        v = cuda.local.array(per, float32)
        tw = cuda.local.array(width, float32)
        tb = cuda.local.array(width, float32)
        gw = cuda.local.array(gn, float32)
        gb = cuda.local.array(gn, float32)
        rows = x.shape[0]
        n = x.shape[1]
        fn = float32(n)
        row = cuda.blockIdx.x
        if wb_shared:  # weight and bias on their way to shared memory before the first row's loads
            wbs = cuda.shared.array(0, uint32, alignment=wb_align)
            tid = cuda.threadIdx.x
            for q in range(nv):
                if col_of(q) < n:
                    cp16(wbs, 4 * (q * threads + tid), w, col_of(q))
                    cp16(wbs, 4 * ((nv + q) * threads + tid), b, col_of(q))
            commit()
        while row < rows:
            orow = out[row]
            load_row(v, x[row], n, float32(0.0))
            s = float32(0.0)
            for e in range(per):
                s += v[e]
            mean = bsum(s, sm, 0) / fn
            q2 = float32(0.0)
            for q in range(per // width):
                if col_of(q) < n:  # padding lanes hold 0, not the mean: leave them out of the variance
                    for e in range(width):
                        d = v[q * width + e] - mean
                        q2 += d * d
            rstd = float32(1.0) / math.sqrt(bsum(q2, sm, slots) / fn + eps)
            if wb_shared:
                wait_all()
                for q in range(nv):
                    col = col_of(q)
                    if col < n:
                        take(tw, wbs, q * threads + tid)
                        take(tb, wbs, (nv + q) * threads + tid)
                        for e in range(width):
                            tw[e] = (v[q * width + e] - mean) * rstd * tw[e] + tb[e]
                        stg_from(orow, col, tw, 0)
            elif n >= threads * per:  # full rows: a group's weight and bias loads before its first store
                for g in range(0, nv, group):
                    for q in range(g, g + group):
                        ldg_into(gw, (q - g) * width, w, col_of(q))
                        ldg_into(gb, (q - g) * width, b, col_of(q))
                    for q in range(g, g + group):
                        o = (q - g) * width
                        for e in range(width):
                            gw[o + e] = (v[q * width + e] - mean) * rstd * gw[o + e] + gb[o + e]
                        stg_from(orow, col_of(q), gw, o)
            else:
                for q in range(nv):
                    col = col_of(q)
                    if col < n:
                        ldg_into(tw, 0, w, col)
                        ldg_into(tb, 0, b, col)
                        for e in range(width):
                            tw[e] = (v[q * width + e] - mean) * rstd * tw[e] + tb[e]
                        stg_from(orow, col, tw, 0)
            row += cuda.gridDim.x

    return k


# --- make_rows_half2's output stage: two steps over packed words ------------------------------------------
#
#   pack_norm_h8(dst, doff, src, soff, scale, shift): dst[doff + k] = the fp16 pair (src[soff + 2k] * scale +
#     shift, src[soff + 2k + 1] * scale + shift) (fp32 FFMAs, rounded to fp16, F2FP packs 2) for k < 4: the
#     8 normalised values of one vector as 4 packed words (RAW_DTYPE; the 32 fp32 row registers die);
#   stg_fma_h8(out, idx, y, wr, br, off): out[idx : idx + 8] = y * w + b as 4 `fma.rn.f16x2` on the 4 words
#     y[off:], wr[off:], br[off:] (weight and bias loaded with kernels.primitives.vector.ldg_raw), one 16-byte
# store. With both, a thread's weight / bias loads can be written in program order BEFORE its first store;
# a one-step output stage loads them inside each vector's step, after the previous vector's store, which
# neither LLVM nor ptxas may reorder (out may alias w / b): 4 serial round trips per row for 128 x 32.
# Under the simulator the word buffers hold 8 float32 values per vector (RAW_PER_VEC), rounded to fp16.


def _norm_split_intrinsics() -> tuple[Any, Any]:
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.cuda.extending import intrinsic

    i32 = ir.IntType(32)
    f32 = ir.FloatType()
    h2 = ir.VectorType(ir.HalfType(), 2)
    h8 = ir.VectorType(ir.HalfType(), 8)

    def _slot(context: Any, builder: Any, loc_ty: Any, loc: Any, off_ty: Any, off: Any, k: int) -> Any:
        la = context.make_array(loc_ty)(context, builder, loc)
        o = context.cast(builder, off, off_ty, types.intp)
        return builder.gep(la.data, [builder.add(o, ir.Constant(o.type, k))])

    def _words(a: Any, what: str) -> None:
        if not isinstance(a, types.Array) or a.dtype != types.uint32:
            raise TypeError(f"{what} needs uint32 local arrays of packed halves, got {a}")

    @intrinsic
    def pack_norm_h8(typingctx, dst, doff, src, soff, scale, shift):  # type: ignore[no-untyped-def]
        _words(dst, "pack_norm_h8")
        if not isinstance(src, types.Array) or src.dtype != types.float32:
            raise TypeError(f"pack_norm_h8 needs a float32 local array, got {src}")
        sig = types.void(dst, doff, src, soff, types.float32, types.float32)

        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            a_dst, a_doff, a_src, a_soff, a_sc, a_sh = args
            t = sig.args
            fma32 = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(f32, [f32] * 3), "llvm.fma.f32"
            )
            for k in range(4):
                pair = ir.Constant(h2, ir.Undefined)
                for j in range(2):
                    e = builder.load(_slot(context, builder, t[2], a_src, t[3], a_soff, 2 * k + j))
                    e = builder.fptrunc(builder.call(fma32, [e, a_sc, a_sh]), ir.HalfType())
                    pair = builder.insert_element(pair, e, ir.Constant(i32, j))
                at = _slot(context, builder, t[0], a_dst, t[1], a_doff, k)
                builder.store(builder.bitcast(pair, i32), at)
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def stg_fma_h8(typingctx, out, idx, y, wr, br, off):  # type: ignore[no-untyped-def]
        if not isinstance(out, types.Array) or out.dtype != types.float16:
            raise TypeError(f"stg_fma_h8 needs a float16 output array, got {out}")
        for a in (y, wr, br):
            _words(a, "stg_fma_h8")
        sig = types.void(out, idx, y, wr, br, off)

        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            a_out, a_idx, a_y, a_w, a_b, a_off = args
            t = sig.args

            def vec(pos: int) -> Any:
                v = ir.Constant(ir.VectorType(i32, 4), ir.Undefined)
                for k in range(4):
                    e = builder.load(_slot(context, builder, t[pos], args[pos], t[5], a_off, k))
                    v = builder.insert_element(v, e, ir.Constant(i32, k))
                return builder.bitcast(v, h8)

            fty = ir.FunctionType(h8, [h8] * 3)
            fma16 = cgutils.get_or_insert_function(builder.module, fty, "llvm.fma.v8f16")
            r = builder.call(fma16, [vec(2), vec(3), vec(4)])
            ary = context.make_array(t[0])(context, builder, a_out)
            i = context.cast(builder, a_idx, t[1], types.intp)
            p = builder.gep(ary.data, [i])
            gp = builder.addrspacecast(p, ir.PointerType(p.type.pointee, 1))  # 1 = global
            builder.store(r, builder.bitcast(gp, ir.PointerType(h8, 1)), align=VEC_BYTES)
            return context.get_dummy_value()

        return sig, codegen

    return pack_norm_h8, stg_fma_h8


if SIMULATED:

    @cuda.jit(device=True)
    def pack_norm_h8(dst, doff, src, soff, scale, shift):  # type: ignore[no-untyped-def]
        for k in range(8):
            dst[doff + k] = float32(np.float16(src[soff + k] * scale + shift))

    @cuda.jit(device=True)
    def stg_fma_h8(out, idx, y, wr, br, off):  # type: ignore[no-untyped-def]
        for k in range(8):
            out[idx + k] = np.float16(y[off + k] * wr[off + k] + br[off + k])

else:
    pack_norm_h8, stg_fma_h8 = _norm_split_intrinsics()


def make_rows_half2(  # type: ignore[no-untyped-def]
    threads: int, per: int, min_blocks: int, full_rows: bool, wb_early: bool, group: int
):
    """fp16 register-row kernel: one block per row, one two-sum reduction of x - x[row, 0], fastmath,
    y = (x - k) * rstd + shift in fp32 rounded to fp16, then y * w + b as half2 FMAs, with the weight / bias
    loads batched ahead of the stores. An output stage that loads w, loads b, computes and stores per vector
    makes per / 8 serial round trips after the barrier, since a load cannot pass the previous vector's store
    (out may alias w / b). Here (pack_norm_h8, stg_fma_h8 above, kernels.primitives.vector.ldg_raw):
      - wb_early=False: after the reduction every vector's y is computed and packed first (per / 2 words; the
        fp32 row dies), then this thread's weight and bias vectors are loaded back to back, `group` vectors
        at a time (0 = all: per / 8 x 2 16-byte loads in flight, per registers), then each vector of the
        group is one HFMA2 x 4 and one store. group = g: per / 8 / g round trips instead of per / 8.
      - wb_early=True: the row is loaded as packed halves (ldg_raw, per / 2 registers) and this thread's
        weight and bias right after it, before the reduction's barrier (per more registers): their latency
        hides behind the sums and the barrier. The row is unpacked twice (sums; output stage).
    `full_rows`: rows of exactly threads * per columns skip the per-vector column checks (others take the
    checked body)."""
    width = 8
    nv = per // width
    g = nv if group <= 0 or group > nv else group
    if nv % g:
        raise ValueError(f"make_rows_half2: group {group} does not divide {nv} vectors per thread")
    nraw = nv * RAW_PER_VEC
    bsum2 = make_block_sum2(threads)
    half = 2 * row_slots(threads)
    smem_size = 2 * half
    jit_kw: dict[str, Any] = {} if SIMULATED else {"launch_bounds": (threads, min_blocks), "fastmath": True}
    nf = width if wb_early else per
    nxr = nraw if wb_early else 1

    def make_body(checked: bool):  # type: ignore[no-untyped-def]
        @cuda.jit(device=True, inline="always")
        def col_of(qv):  # type: ignore[no-untyped-def]
            return (qv * threads + cuda.threadIdx.x) * width

        @cuda.jit(device=True, inline="always")
        def inside(qv, n):  # type: ignore[no-untyped-def]
            return (not checked) or col_of(qv) < n

        @cuda.jit(device=True, inline="always")
        def clear_vec(buf, qv):  # type: ignore[no-untyped-def]
            # lanes past the row's end: written anyway, so no word stays live from the previous row
            for i in range(RAW_PER_VEC):
                buf[qv * RAW_PER_VEC + i] = 0

        @cuda.jit(device=True, inline="always")
        def body(x, w, b, out, eps, row, base, sm, v, xw, yw, wr, br):  # type: ignore[no-untyped-def]
            n = x.shape[1]
            fn = float32(n)
            xr = x[row]
            kk = float32(xr[0])
            s = float32(0.0)
            q = float32(0.0)
            if wb_early:
                for qv in range(nv):
                    if inside(qv, n):
                        ldg_raw(xw, qv * RAW_PER_VEC, xr, col_of(qv))
                    else:
                        clear_vec(xw, qv)
                for qv in range(nv):  # in flight during the sums and the barrier
                    if inside(qv, n):
                        ldg_raw(wr, qv * RAW_PER_VEC, w, col_of(qv))
                        ldg_raw(br, qv * RAW_PER_VEC, b, col_of(qv))
                    else:
                        clear_vec(wr, qv)
                        clear_vec(br, qv)
                for qv in range(nv):
                    if inside(qv, n):
                        unpack_h8(v, 0, xw, qv * RAW_PER_VEC)
                        for e in range(width):
                            d = v[e] - kk
                            s += d
                            q += d * d
            else:
                for qv in range(nv):
                    if inside(qv, n):
                        ldg_into(v, qv * width, xr, col_of(qv))
                    else:
                        for e in range(width):
                            v[qv * width + e] = kk
                for qv in range(nv):
                    if inside(qv, n):
                        for e in range(width):
                            d = v[qv * width + e] - kk
                            v[qv * width + e] = d
                            s += d
                            q += d * d
            s, q = bsum2(s, q, sm, base)
            ms = s / fn
            var = abs(q / fn - ms * ms)  # abs, not max(., 0): see _layernorm_kernel
            rstd = float32(1.0) / math.sqrt(var + eps)
            shift = -ms * rstd
            orow = out[row]
            if wb_early:
                for qv in range(nv):
                    if inside(qv, n):
                        unpack_h8(v, 0, xw, qv * RAW_PER_VEC)
                        for e in range(width):
                            v[e] = v[e] - kk
                        pack_norm_h8(yw, qv * RAW_PER_VEC, v, 0, rstd, shift)
                        stg_fma_h8(orow, col_of(qv), yw, wr, br, qv * RAW_PER_VEC)
            else:
                for qv in range(nv):  # the fp32 row dies here: per / 2 words of y
                    if inside(qv, n):
                        pack_norm_h8(yw, qv * RAW_PER_VEC, v, qv * width, rstd, shift)
                    else:
                        clear_vec(yw, qv)
                for g0 in range(nv // g):
                    for qi in range(g):  # this group's weight / bias loads, back to back
                        qv = g0 * g + qi
                        if inside(qv, n):
                            ldg_raw(wr, qv * RAW_PER_VEC, w, col_of(qv))
                            ldg_raw(br, qv * RAW_PER_VEC, b, col_of(qv))
                        else:
                            clear_vec(wr, qv)
                            clear_vec(br, qv)
                    for qi in range(g):
                        qv = g0 * g + qi
                        if inside(qv, n):
                            stg_fma_h8(orow, col_of(qv), yw, wr, br, qv * RAW_PER_VEC)

        return body

    body_full = make_body(False)
    body_checked = make_body(True)

    @cuda.jit(**jit_kw)
    def k(x, w, b, out, eps):  # type: ignore[no-untyped-def]
        sm = cuda.shared.array(smem_size, float32)
        v = cuda.local.array(nf, float32)
        xw = cuda.local.array(nxr, RAW_DTYPE)
        yw = cuda.local.array(nraw, RAW_DTYPE)
        wr = cuda.local.array(nraw, RAW_DTYPE)
        br = cuda.local.array(nraw, RAW_DTYPE)
        rows = x.shape[0]
        full = full_rows and x.shape[1] == threads * per
        row = cuda.blockIdx.x
        step = cuda.gridDim.x
        base = 0
        while row < rows:
            if full:
                body_full(x, w, b, out, eps, row, base, sm, v, xw, yw, wr, br)
            else:
                body_checked(x, w, b, out, eps, row, base, sm, v, xw, yw, wr, br)
            base = half - base
            row += step

    return k


def make_stream_vec(config: StreamRows, width: int):  # type: ignore[no-untyped-def]
    """Rows past what registers hold (kernels.ops.rows.StreamRows): pass 1 sums v - k and (v - k)^2 over
    16-byte vectors, k the row's first element (the streaming kernel's shift: no cancellation for rows far
    from 0), `config.vectors` in flight per thread, marking the row evict_last in L2; pass 2 re-reads it
    evict_first (its last use) and writes (v - mean) * rstd * w + b."""
    threads, nvec = config.threads, config.vectors
    span = threads * width  # columns that one vector per thread covers
    nvals = nvec * width
    step, tail = make_stream_loads(config, width)
    bsum2, slots = make_block_sum2(threads), row_slots(threads)
    nsm = 4 * slots  # two sums, two halves: consecutive rows alternate (reductions)
    jit_kw = vec_jit(threads, config.min_blocks, False)

    @cuda.jit(**jit_kw)
    def k(x, w, b, out, eps):  # type: ignore[no-untyped-def]
        sm = cuda.shared.array(nsm, float32)
        v = cuda.local.array(nvals, float32)
        tw = cuda.local.array(width, float32)
        tb = cuda.local.array(width, float32)
        keep = l2_evict_last()
        drop = l2_evict_first()
        rows = x.shape[0]
        n = x.shape[1]
        fn = float32(n)
        first = cuda.threadIdx.x * width
        row = cuda.blockIdx.x
        base = 0
        while row < rows:
            xr = x[row]
            ldg_into(tw, 0, xr, 0)  # the shift: every thread reads the row's first vector (a broadcast)
            shift = tw[0]
            s = float32(0.0)
            q2 = float32(0.0)
            col = first
            while col + (nvec - 1) * span < n:
                step(v, xr, col, keep)
                for e in range(nvals):
                    d = v[e] - shift
                    s += d
                    q2 += d * d
                col += nvec * span
            # the rest: fewer than nvec vectors of this thread, their loads all in flight at once
            tail(v, xr, col, n, keep)
            for u in range(nvec - 1):
                if col + u * span < n:
                    for e in range(width):
                        d = v[u * width + e] - shift
                        s += d
                        q2 += d * d
            s, q2 = bsum2(s, q2, sm, base)
            base = 2 * slots - base
            dmean = s / fn  # the mean of v - shift
            # abs, not max(., 0): a GPU max drops a NaN (the streaming kernel's rule, and why)
            rstd = float32(1.0) / math.sqrt(abs(q2 / fn - dmean * dmean) + eps)
            mean = shift + dmean
            orow = out[row]
            col = first
            while col + (nvec - 1) * span < n:
                step(v, xr, col, drop)
                for u in range(nvec):
                    ldg_into(tw, 0, w, col + u * span)
                    ldg_into(tb, 0, b, col + u * span)
                    for e in range(width):
                        tw[e] = (v[u * width + e] - mean) * rstd * tw[e] + tb[e]
                    stg_from(orow, col + u * span, tw, 0)
                col += nvec * span
            tail(v, xr, col, n, drop)
            for u in range(nvec - 1):
                if col + u * span < n:
                    ldg_into(tw, 0, w, col + u * span)
                    ldg_into(tb, 0, b, col + u * span)
                    for e in range(width):
                        tw[e] = (v[u * width + e] - mean) * rstd * tw[e] + tb[e]
                    stg_from(orow, col + u * span, tw, 0)
            row += cuda.gridDim.x

    return k


def make_onchip(config: OnChipRows, width: int, word: bool):  # type: ignore[no-untyped-def]
    """Rows past what registers hold, read once (kernels.ops.rows.OnChipRows; fp16 / bf16 `word`s), rmsnorm's
    `make_onchip` with layernorm's statistics: the block's first row loads its first threads x per columns
    into registers and streams the rest into the thread's own shared-memory slots (`config.vectors` 16-byte
    loads in flight), two columns to a uint32 (rows.onchip_pairs), summing v - k and (v - k)^2 as it goes, k
    the row's first element (make_stream_vec's shift: no cancellation for rows far from 0). Then, row after
    row: one two-sum reduction, and one pass that writes (v - mean) * rstd * w + b from registers and from
    each slot and, in the same step, refills the slot with the next row's vector (issued after this row's
    stores: rmsnorm's `early` order, the loads first, would need 8 more registers than launch_bounds' 64
    leave here), summing its shifted values. One read and one write of the row, where the streaming kernel
    reads it twice. Against the two-pass form on an H100 (2026-12-06, lab/onchip_prefetch.py's "overlap",
    bf16 -> benchmarks/h100/2026-12-06/overlap/): 1.044x at 261 x 128256 (0.76 of copy against 0.73), 1.016x
    at 512 x 65536 (0.80 against 0.78). ptxas sm_90: 46-48 registers, no spills."""
    threads, per, nvec = config.threads, config.per, config.vectors
    load_row, col_of = make_row_io(width, threads, per)
    bsum2, slots = make_block_sum2(threads), row_slots(threads)
    nsm = 4 * slots  # two sums, two halves: consecutive rows alternate (reductions)
    head = threads * per  # columns held in registers
    nv = per // width
    nvals = nvec * width  # a name, not an expression: numba folds names into local array sizes
    load_step, keep_step, take = onchip_part(config, width, word)

    @cuda.jit(**vec_jit(threads, config.min_blocks, False))
    def k(x, w, b, out, eps):  # type: ignore[no-untyped-def]
        sm = cuda.shared.array(nsm, float32)
        part = cuda.shared.array(0, uint32)  # the shared part (rows.onchip_part)
        v = cuda.local.array(per, float32)
        t = cuda.local.array(nvals, float32)
        tw = cuda.local.array(width, float32)
        tb = cuda.local.array(width, float32)
        tid = cuda.threadIdx.x
        rows = x.shape[0]
        n = x.shape[1]
        fn = float32(n)
        nt = (n - head) // width
        row = cuda.blockIdx.x
        if row >= rows:
            return
        # the block's first row: its load pass alone
        xr = x[row]
        ldg_into(tb, 0, xr, 0)  # the shift: every thread reads the row's first vector (a broadcast)
        shift = tb[0]
        load_row(v, xr, n, float32(0.0))
        s = float32(0.0)
        q2 = float32(0.0)
        j = tid
        while j < nt:
            load_step(t, xr, j, nt, shift)  # a missing vector's shift adds nothing
            for e in range(nvals):
                d = t[e] - shift
                s += d
                q2 += d * d
            keep_step(t, part, j, nt)
            j += nvec * threads
        for e in range(per):  # the register part: whole (takes: n > head), no padding lanes
            d = v[e] - shift
            s += d
            q2 += d * d
        base = 0
        while row < rows:
            s, q2 = bsum2(s, q2, sm, base)
            base = 2 * slots - base
            dmean = s / fn  # the mean of v - shift
            # abs, not max(., 0): a GPU max drops a NaN (the streaming kernel's rule, and why)
            rstd = float32(1.0) / math.sqrt(abs(q2 / fn - dmean * dmean) + eps)
            mean = shift + dmean
            nxt = row + cuda.gridDim.x
            more = nxt < rows
            xn = x[nxt if more else row]
            orow = out[row]
            for q in range(nv):
                col = col_of(q)
                ldg_into(t, 0, w, col)
                ldg_into(tb, 0, b, col)
                for e in range(width):
                    t[e] = (v[q * width + e] - mean) * rstd * t[e] + tb[e]
                stg_from(orow, col, t, 0)
            ldg_into(tb, 0, xn, 0)  # the next row's shift (the last row reads its own again: unused)
            shift = tb[0]
            s = float32(0.0)
            q2 = float32(0.0)
            j = tid
            while j < nt:  # this thread's own slots: no other thread reads or writes them
                for u in range(nvec):
                    i = j + u * threads
                    if i < nt:
                        col = head + i * width
                        ldg_into(tw, 0, w, col)
                        ldg_into(tb, 0, b, col)
                        take(t, part, i, nt)
                        for e in range(width):
                            t[e] = (t[e] - mean) * rstd * tw[e] + tb[e]
                        stg_from(orow, col, t, 0)
                if more:
                    load_step(t, xn, j, nt, shift)  # into the slots just written out
                    for e in range(nvals):
                        d = t[e] - shift
                        s += d
                        q2 += d * d
                    keep_step(t, part, j, nt)
                j += nvec * threads
            if more:
                load_row(v, xn, n, float32(0.0))
                for e in range(per):
                    d = v[e] - shift
                    s += d
                    q2 += d * d
            row = nxt

    return k


_SIGS: dict[np.dtype, str] = {
    np.dtype(np.float32): "void(float32[:, ::1], float32[::1], float32[::1], float32[:, ::1], float32)",
    np.dtype(np.float16): "void(float16[:, ::1], float16[::1], float16[::1], float16[:, ::1], float32)",
    BF16: "void(uint16[:, ::1], uint16[::1], uint16[::1], uint16[:, ::1], float32)",  # words (rows.WORDS)
}


def _row_kernel(config: RowConfig, width: int, *, word: bool) -> tuple[Any, int, bool]:
    """(dispatcher, threads per block, grid-stride?) of a kernels.ops.rows.ROW_KERNELS entry or a wide shape
    (`word`: bf16 operands; layernorm has no packed shape, rows.WIDE_PACKED)."""
    if isinstance(config, VectorRows):
        return _make_vec(width, config.fastmath), BLOCK, False
    if isinstance(config, WideRows) and not config.packed:
        w = config
        return _make_vec(width, False, w.threads, w.per, w.min_blocks, w.wb_shared, word), w.threads, False
    if isinstance(config, Half2Rows):  # fp16 only; one block per row
        if width != 8:
            raise ValueError("layernorm: half2 row kernels are for float16 rows")
        c = config
        return (
            make_rows_half2(c.threads, c.per, c.min_blocks, c.full_rows, c.wb_early, c.group),
            c.threads,
            False,
        )
    raise ValueError(f"layernorm: no row kernel for {config}")


_K = RowKernels(
    "layernorm",
    _SIGS,
    stream=_make_stream,
    reg=_make_reg,
    make_vec=_make_vec,
    row_kernel=_row_kernel,
    stream_vec=make_stream_vec,
    onchip=make_onchip,
)
_FAST = FastCache()  # validated launches by operand layout (kernels.runtime.launch.FastCache)
PATHS = VECTOR_PATHS  # what `layernorm(path=...)` takes


def layernorm(
    x: Any,
    weight: Any,
    bias: Any,
    out: Any = None,
    *,
    eps: float = 1e-5,
    stream: int = 0,
    path: str = "auto",
) -> Any:
    """Row-wise layer norm over the last dimension of x (any ndim >= 1), weight and bias [x.shape[-1]].
    `path`: "auto", "scalar" or "vector" (kernels.primitives.vector.choose; vector covers rows of
    <= BLOCK * PER); "auto" takes the ROW_KERNELS kernel of the dtype where one is listed."""
    if out is not None:
        bound, ptrs = _FAST.find((x, weight, bias, out), (eps, path))
        if bound is not None:
            bound.launch(ptrs, stream)
            return out
    if path not in PATHS:
        raise ValueError(f"path: {path!r} is not a path; expected one of: {', '.join(PATHS)}")
    sync = HostSync()
    xo = arrays.operand("x", x, sync)
    wo = arrays.operand("weight", weight, sync)
    bo = arrays.operand("bias", bias, sync)
    arrays.check_dtype(xo, FLOAT_IO_BF16)
    arrays.check_nonempty(xo)
    arrays.check_contiguous(xo)
    arrays.check_vector(wo, xo, xo.shape[-1], "x's last dimension")
    arrays.check_vector(bo, xo, xo.shape[-1], "x's last dimension")
    e = arrays.check_positive("eps", eps)
    oo = arrays.output("out", out, sync, xo.shape, xo.dtype)
    xr = arrays.as_rows(xo)
    n = xr.shape[1]
    aligned = vector_ok((xo.ptr, wo.ptr, bo.ptr, oo.ptr), n * xo.dtype.itemsize)
    k, block, grid = _K.pick(path, xo.dtype, aligned, n, xr.shape[0])
    args = (xr, wo, bo, arrays.as_rows(oo), e)
    k.launch(grid, block, args, stream=stream)
    if out is not None and xo.host is None and wo.host is None and bo.host is None and oo.host is None:
        _FAST.store((x, weight, bias, out), (eps, path), k.bind(grid, block, args))
    return arrays.finish(sync, oo, out, xo)


def reference(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=-1, keepdims=True)
    var = ((x64 - mean) ** 2).mean(axis=-1, keepdims=True)
    out: np.ndarray = (x64 - mean) / np.sqrt(var + eps) * w.astype(np.float64) + b.astype(np.float64)
    return out


EPS = 1e-5


def _make_problem(case: Case, rng: np.random.Generator) -> Problem:
    rows, n = case.params["rows"], case.params["cols"]
    dt = np.dtype(case.dtype)
    # an offset mean (3.0) with unit std: the shifted one-pass variance must survive it
    x = (rng.standard_normal((rows, n), dtype=np.float32) + 3.0).astype(dt)
    if case.params.get(SPECIALS):
        x = poison(x, case.params[SPECIALS])
    w = (1.0 + 0.5 * rng.standard_normal(n)).astype(dt)
    b = (0.5 * rng.standard_normal(n)).astype(dt)
    return Problem(
        inputs={"x": x, "weight": w, "bias": b},
        outputs={"out": ((rows, n), dt)},
        reference={"out": reference(x, w, b, EPS)},
        scalars={"eps": EPS},
    )


def _spec_launch(a: dict[str, Any]) -> None:
    layernorm(a["x"], a["weight"], a["bias"], a["out"], eps=a["eps"])


def _cupy(a: dict[str, Any]) -> None:
    import cupy as cp

    xf = a["x"].astype(cp.float32, copy=False)
    mean = cp.mean(xf, axis=-1, keepdims=True)
    xc = xf - mean
    var = cp.mean(xc * xc, axis=-1, keepdims=True)
    y = xc * cp.reciprocal(cp.sqrt(var + a["eps"])) * a["weight"] + a["bias"]
    a["out"][...] = y


def _bytes(c: Case) -> float:
    it = np.dtype(c.dtype).itemsize
    return float((2 * c.params["rows"] + 2) * c.params["cols"] * it)


SPEC = register(
    OpSpec(
        name="layernorm",
        dtypes=("float32", "float16", "bfloat16"),
        make_problem=_make_problem,
        launch=_spec_launch,
        flops=lambda c: 8.0 * c.params["rows"] * c.params["cols"],
        bytes=_bytes,
        # bf16: one rounding to 8 significant bits, at most 2^-8 = 3.9e-3 relative per element (and so in the
        # norm); kernels.ops.rows.BF16_TOL says what was measured
        tolerance={"float32": 1e-5, "float16": 2e-3, "bfloat16": BF16_TOL},
        elem_tolerance={"bfloat16": BF16_ELEM_TOL},
        **row_cases(),
        cupy=_cupy,
        bound="memory",
        ptx_kernels=_K.ptx_kernels(),
        path=row_path_of("layernorm"),
        choose=row_choice_of("layernorm"),
    )
)

"""16-byte global loads and stores for the memory-bound kernels, and the rule that decides when they may run.

numba-cuda 0.30.4 has no vector loads (FACTS.md): `x[i]` on a float16 array is one 2-byte `ld.global.u16`,
so a warp instruction moves 64 B where fp32 moves 128 B, and fp16 kernels pay twice the load/store
instructions and address arithmetic per byte (benchmarks/notes-memory.md, "Why the misses"). The two
intrinsics below emit one `ld.global.v4.b32` / `st.global.v4.b32` (16 bytes: 8 halves or 4 floats) each,
the technique kernels/ops/gemm/__init__.py uses for shared memory, here in address space 1 (global):

  ldg_into(dst, off, arr, i): dst[off + k] = float32(arr[i + k]) for k < width(arr)  (one 16-byte load)
  stg_from(arr, i, src, off): arr[i + k] = src[off + k] for k < width(arr)            (one 16-byte store)
  round_like(arr, x):         x rounded to arr's element type and widened back to fp32, in registers: what
                              storing x into arr and loading it back gives (fp16: round to nearest even;
                              bf16 words: stg_from's rounding; fp32: x itself)

A uint16 `arr` is bf16 as raw words (kernels.primitives.bf16): the load widens each word exactly (a shift
into the high half), the store rounds to nearest even (kernels.primitives.bf16.round_pair: one
`cvt.rn.bf16x2.f32` per two words on sm_80 and newer, integer arithmetic before) and keeps NaN a NaN; both
move the 8 words as one `<4 x i32>`.
`dst`/`src` are float32 local arrays indexed with constants after unrolling, so they stay in registers.
The caller guarantees alignment: `arr`'s element `i` must sit on a 16-byte boundary (see `vector_ok`).

The CUDA simulator runs Python, not LLVM: under it the same names are plain device functions with the same
meaning, element by element, so the vector kernels' indexing is still tested there. `choose()` keeps the
simulator's "auto" path on the scalar kernels (nothing to gain there, and those are what other GPUs run).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
from numba import cuda, float32, uint32

from kernels.primitives.bf16 import WORD, bf16_to_f32, f32_to_bf16
from kernels.runtime.arrays import BF16, SIMULATED

VEC_BYTES = 16
PATHS = ("auto", "scalar", "vector")
F32, F16 = np.dtype(np.float32), np.dtype(np.float16)
# elements per 16-byte vector
WIDTH: dict[np.dtype, int] = {F32: 4, F16: 8, BF16: 8}
# dtypes whose "auto" path is the vector one on a GPU. fp32 already reaches 0.91-1.03 of copy with scalar
# loads (4 B per lane = 128 B per warp instruction); its vector kernels exist and are timed side by side
# (benchmarks/notes-memory.md), but stay opt-in until they are measured to be no slower. An op whose scalar
# kernel is slow at fp32 passes its own `auto` dtypes to `choose` (cast_fp8.AUTO_CAST).
AUTO_VECTOR: tuple[np.dtype, ...] = (F16, BF16)


def vector_ok(ptrs: Iterable[int], row_bytes: int) -> bool:
    """True when every pointer is 16-byte aligned and every row starts on a 16-byte boundary (rows of
    `row_bytes` laid end to end; pass 0 for flat elementwise kernels, whose tails are handled in scalar)."""
    return row_bytes % VEC_BYTES == 0 and all(p % VEC_BYTES == 0 for p in ptrs)


def choose(path: str, dtype: np.dtype, ok: bool, auto: tuple[np.dtype, ...] = AUTO_VECTOR) -> bool:
    """Whether a launcher takes its vector kernel. `path`: "auto" (vector on a GPU for the `auto` dtypes,
    AUTO_VECTOR unless the op names its own, when `ok`, else scalar), "scalar", or "vector" (an error when
    the operands are not aligned for it)."""
    if path == "auto":
        return ok and not SIMULATED and dtype in auto
    if path == "scalar":
        return False
    if path == "vector":
        if not ok:
            raise ValueError(
                "path: 'vector' needs 16-byte aligned pointers and rows of a multiple of 16 bytes; "
                "use 'auto' or 'scalar' for these operands"
            )
        return True
    raise ValueError(f"path: {path!r} is not a path; expected one of: {', '.join(PATHS)}")


def _intrinsics() -> tuple[Any, Any, Any]:
    from llvmlite import ir
    from numba.core import types
    from numba.cuda.extending import intrinsic

    from kernels.primitives.bf16 import round_pair

    i32 = ir.IntType(32)

    def _vec(
        context: Any, builder: Any, arr_ty: Any, arr: Any, idx_ty: Any, idx: Any
    ) -> tuple[Any, Any, int]:
        """A pointer to element `idx` of `arr` as a 16-byte vector in global memory, its element type, and the
        array elements it holds. bf16 words (uint16 arrays) move as 4 x i32, two words each: NVPTX has no
        8-wide 16-bit integer load, and splits <8 x i16> into two 8-byte loads."""
        ary = context.make_array(arr_ty)(context, builder, arr)
        i = context.cast(builder, idx, idx_ty, types.intp)
        # numba stores float16 as i16 (its data model); the vector is typed half so LLVM converts it directly
        elem = {types.float16: ir.HalfType(), types.uint16: i32}.get(arr_ty.dtype, ir.FloatType())
        width = VEC_BYTES // (arr_ty.dtype.bitwidth // 8)
        lanes = 4 if arr_ty.dtype == types.uint16 else width
        p = builder.gep(ary.data, [i])
        gp = builder.addrspacecast(p, ir.PointerType(p.type.pointee, 1))  # 1 = global
        vp = builder.bitcast(gp, ir.PointerType(ir.VectorType(elem, lanes), 1))
        return vp, elem, width

    def _local_slot(context: Any, builder: Any, loc_ty: Any, loc: Any, off_ty: Any, off: Any, k: int) -> Any:
        la = context.make_array(loc_ty)(context, builder, loc)
        o = context.cast(builder, off, off_ty, types.intp)
        return builder.gep(la.data, [builder.add(o, ir.Constant(o.type, k))])

    def _check(arr: Any, loc: Any) -> None:
        if not isinstance(arr, types.Array) or arr.dtype not in (types.float16, types.float32, types.uint16):
            raise TypeError(f"vector access needs a float16, float32 or uint16 (bf16 words) array, got {arr}")
        if not isinstance(loc, types.Array) or loc.dtype != types.float32:
            raise TypeError(f"vector access needs a float32 local array, got {loc}")

    @intrinsic
    def ldg_into(typingctx, dst, off, arr, idx):  # type: ignore[no-untyped-def]
        _check(arr, dst)
        sig = types.void(dst, off, arr, idx)

        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            vp, elem, width = _vec(context, builder, sig.args[2], args[2], sig.args[3], args[3])
            v = builder.load(vp, align=VEC_BYTES)

            def put(k: int, e: Any) -> None:
                builder.store(e, _local_slot(context, builder, sig.args[0], args[0], sig.args[1], args[1], k))

            if elem == i32:  # bf16 words, little-endian pairs: the fp32 of a word is the word << 16 (exact)
                for k in range(4):
                    w = builder.extract_element(v, ir.Constant(i32, k))
                    put(2 * k, builder.bitcast(builder.shl(w, ir.Constant(i32, 16)), ir.FloatType()))
                    hi = builder.and_(w, ir.Constant(i32, 0xFFFF0000))
                    put(2 * k + 1, builder.bitcast(hi, ir.FloatType()))
                return context.get_dummy_value()
            for k in range(width):
                e = builder.extract_element(v, ir.Constant(i32, k))
                put(k, e if elem == ir.FloatType() else builder.fpext(e, ir.FloatType()))
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def stg_from(typingctx, arr, idx, src, off):  # type: ignore[no-untyped-def]
        _check(arr, src)
        sig = types.void(arr, idx, src, off)

        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            vp, elem, width = _vec(context, builder, sig.args[0], args[0], sig.args[1], args[1])

            def get(k: int) -> Any:
                return builder.load(
                    _local_slot(context, builder, sig.args[2], args[2], sig.args[3], args[3], k)
                )

            if elem == i32:  # bf16: two rounded words per i32, the even element in the low half
                v = ir.Constant(ir.VectorType(i32, 4), ir.Undefined)
                for k in range(4):
                    w = round_pair(builder, get(2 * k), get(2 * k + 1))
                    v = builder.insert_element(v, w, ir.Constant(i32, k))
            else:
                v = ir.Constant(ir.VectorType(elem, width), ir.Undefined)
                for k in range(width):
                    e = get(k)
                    if elem != ir.FloatType():
                        e = builder.fptrunc(e, elem)  # round to nearest even, as float16(x) does
                    v = builder.insert_element(v, e, ir.Constant(i32, k))
            builder.store(v, vp, align=VEC_BYTES)
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def round_like(typingctx, arr, x):  # type: ignore[no-untyped-def]
        if not isinstance(arr, types.Array) or arr.dtype not in (types.float16, types.float32, types.uint16):
            raise TypeError(f"round_like needs a float16, float32 or uint16 (bf16 words) array, got {arr}")
        if x != types.float32:
            raise TypeError(f"round_like rounds a float32, got {x}")
        sig = types.float32(arr, x)

        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            v, dt = args[1], sig.args[0].dtype
            if dt == types.float16:
                return builder.fpext(builder.fptrunc(v, ir.HalfType()), ir.FloatType())
            if dt == types.uint16:  # the pair's high half is v's bf16, already in place
                word = builder.and_(round_pair(builder, v, v), ir.Constant(i32, 0xFFFF0000))
                return builder.bitcast(word, ir.FloatType())
            return v

        return sig, codegen

    return ldg_into, stg_from, round_like


def _raw_intrinsics() -> tuple[Any, Any]:
    """ldg_raw / unpack_h8: a 16-byte fp16 load kept as 4 packed 32-bit words (half the registers of 8
    floats), converted later (kernels/ops/layernorm.py make_rows_half2: row, weight, bias as packed
    halves)."""
    from llvmlite import ir
    from numba.core import types
    from numba.cuda.extending import intrinsic

    i32 = ir.IntType(32)

    def _slot(context: Any, builder: Any, loc_ty: Any, loc: Any, off_ty: Any, off: Any, k: int) -> Any:
        la = context.make_array(loc_ty)(context, builder, loc)
        o = context.cast(builder, off, off_ty, types.intp)
        return builder.gep(la.data, [builder.add(o, ir.Constant(o.type, k))])

    @intrinsic
    def ldg_raw(typingctx, dst, off, arr, idx):  # type: ignore[no-untyped-def]
        if not isinstance(arr, types.Array) or arr.dtype != types.float16:
            raise TypeError(f"ldg_raw needs a float16 array, got {arr}")
        if not isinstance(dst, types.Array) or dst.dtype != types.uint32:
            raise TypeError(f"ldg_raw needs a uint32 local array, got {dst}")
        sig = types.void(dst, off, arr, idx)

        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            ary = context.make_array(sig.args[2])(context, builder, args[2])
            i = context.cast(builder, args[3], sig.args[3], types.intp)
            p = builder.gep(ary.data, [i])
            gp = builder.addrspacecast(p, ir.PointerType(p.type.pointee, 1))
            vp = builder.bitcast(gp, ir.PointerType(ir.VectorType(i32, 4), 1))
            v = builder.load(vp, align=VEC_BYTES)
            for k in range(4):
                e = builder.extract_element(v, ir.Constant(i32, k))
                builder.store(e, _slot(context, builder, sig.args[0], args[0], sig.args[1], args[1], k))
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def unpack_h8(typingctx, dst, off, raw, roff):  # type: ignore[no-untyped-def]
        if not isinstance(dst, types.Array) or dst.dtype != types.float32:
            raise TypeError(f"unpack_h8 needs a float32 local array, got {dst}")
        if not isinstance(raw, types.Array) or raw.dtype != types.uint32:
            raise TypeError(f"unpack_h8 needs a uint32 local array, got {raw}")
        sig = types.void(dst, off, raw, roff)

        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            h2 = ir.VectorType(ir.HalfType(), 2)
            for k in range(4):
                w = builder.load(_slot(context, builder, sig.args[2], args[2], sig.args[3], args[3], k))
                pair = builder.bitcast(w, h2)
                for j in range(2):
                    e = builder.fpext(builder.extract_element(pair, ir.Constant(i32, j)), ir.FloatType())
                    at = _slot(context, builder, sig.args[0], args[0], sig.args[1], args[1], 2 * k + j)
                    builder.store(e, at)
            return context.get_dummy_value()

        return sig, codegen

    return ldg_raw, unpack_h8


# words of the raw buffer per 16-byte fp16 vector: 4 packed uint32 on a GPU; under the simulator the raw
# buffer holds the 8 values as float32 (no bit casts there), so kernels index it with RAW_PER_VEC
RAW_PER_VEC = 8 if SIMULATED else 4
RAW_DTYPE = float32 if SIMULATED else uint32

# Under the simulator these are plain Python functions, not simulated device functions: a simulated
# device-function call takes a per-module lock the block's threads contend for (kernels.primitives.bf16).
if SIMULATED:

    def ldg_raw(dst: Any, off: Any, arr: Any, idx: Any) -> None:
        for k in range(8):
            dst[off + k] = float32(arr[idx + k])

    def unpack_h8(dst: Any, off: Any, raw: Any, roff: Any) -> None:
        for k in range(8):
            dst[off + k] = raw[roff + k]

else:
    ldg_raw, unpack_h8 = _raw_intrinsics()


if SIMULATED:

    def ldg_into(dst: Any, off: Any, arr: Any, idx: Any) -> None:
        words = arr.dtype == WORD
        for k in range(VEC_BYTES // arr.dtype.itemsize):
            dst[off + k] = bf16_to_f32(arr[idx + k]) if words else float32(arr[idx + k])

    def stg_from(arr: Any, idx: Any, src: Any, off: Any) -> None:
        words = arr.dtype == WORD
        for k in range(VEC_BYTES // arr.dtype.itemsize):
            arr[idx + k] = f32_to_bf16(src[off + k]) if words else src[off + k]

    def round_like(arr: Any, x: Any) -> Any:
        if arr.dtype == WORD:
            return bf16_to_f32(f32_to_bf16(x))
        return float32(arr.dtype.type(x))

else:
    ldg_into, stg_from, round_like = _intrinsics()


def make_row_io(width: int, block: int, per: int) -> tuple[Any, Any]:
    """Device helpers for register-resident rows (kernels.primitives.reductions: `block` threads x `per`
    elements each) read and written as 16-byte vectors. Thread `tid` owns vectors q < per // width at columns
    (q * block + tid) * width: a warp's 32 vectors are 512 contiguous bytes. Rows must satisfy `vector_ok`,
    so a vector is either wholly inside the row or wholly past its end.

      load_row(v, xr, n, fill): v[q * width + e] = xr[col_q + e], or `fill` past the end of the row
      col_of(q): the first column of this thread's vector q
    """
    nv = per // width

    @cuda.jit(device=True, inline="always")
    def col_of(q):  # type: ignore[no-untyped-def]
        return (q * block + cuda.threadIdx.x) * width

    @cuda.jit(device=True, inline="always")
    def load_row(v, xr, n, fill):  # type: ignore[no-untyped-def]
        if n >= block * per:  # full row: every load issues back to back, no compare
            for q in range(nv):
                ldg_into(v, q * width, xr, col_of(q))
        else:
            for q in range(nv):
                if col_of(q) < n:
                    ldg_into(v, q * width, xr, col_of(q))
                else:
                    for e in range(width):
                        v[q * width + e] = fill

    return load_row, col_of

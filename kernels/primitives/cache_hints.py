"""L2 cache-policy hints for 16-byte global accesses (sm_80 and newer).

  l2_evict_last() / l2_evict_first(): a 64-bit L2 cache policy (`createpolicy.fractional.L2::evict_*.b64
    p, 1.0`: every access made with it gets that eviction priority), made once per thread and kept in a
    register;
  ldg_hint_into(dst, off, arr, i, policy): kernels.primitives.vector.ldg_into with the policy
    (`ld.global.L2::cache_hint.v4.u32`);
  stg_hint_from(arr, i, src, off, policy): stg_from with the policy (`st.global.L2::cache_hint.v4.u32`).
Inline PTX (NVVM has no intrinsic for these). The 4 words are bit-cast to 4 floats or 8 halves exactly as
ldg_into/stg_from convert the vector; ldg_hint_into also widens bf16 words (a uint16 array, two words per
32 bits) exactly as ldg_into does. Under the simulator: plain accesses, policy 0.
"""

from __future__ import annotations

from typing import Any

from numba import float32, uint64

from kernels.primitives.bf16 import WORD, bf16_to_f32
from kernels.primitives.vector import VEC_BYTES
from kernels.runtime.arrays import SIMULATED


def _hint_intrinsics() -> tuple[Any, Any, Any, Any]:
    from llvmlite import ir
    from numba.core import types
    from numba.cuda.extending import intrinsic

    i32, i64 = ir.IntType(32), ir.IntType(64)
    words = ir.LiteralStructType([i32] * 4)

    def _policy(kind: str) -> Any:
        @intrinsic
        def make(typingctx):  # type: ignore[no-untyped-def]
            sig = types.uint64()

            def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
                asm = f"createpolicy.fractional.L2::{kind}.b64 $0, 1.0;"
                return builder.asm(ir.FunctionType(i64, []), asm, "=l", [], False, name=kind)

            return sig, codegen

        return make

    def _addr(context: Any, builder: Any, arr_ty: Any, arr: Any, idx_ty: Any, idx: Any) -> Any:
        """Element `idx` of `arr` as a 64-bit global-space address (cvta.to.global of the generic one)."""
        ary = context.make_array(arr_ty)(context, builder, arr)
        i = context.cast(builder, idx, idx_ty, types.intp)
        p = builder.gep(ary.data, [i])
        return builder.ptrtoint(builder.addrspacecast(p, ir.PointerType(p.type.pointee, 1)), i64)

    def _slot(context: Any, builder: Any, loc_ty: Any, loc: Any, off_ty: Any, off: Any, k: int) -> Any:
        la = context.make_array(loc_ty)(context, builder, loc)
        o = context.cast(builder, off, off_ty, types.intp)
        return builder.gep(la.data, [builder.add(o, ir.Constant(o.type, k))])

    def _check(arr: Any, loc: Any, policy: Any, words_ok: bool = False) -> None:
        ok = (types.float16, types.float32, types.uint16) if words_ok else (types.float16, types.float32)
        if not isinstance(arr, types.Array) or arr.dtype not in ok:
            raise TypeError(f"vector access needs a {' or '.join(map(str, ok))} array, got {arr}")
        if not isinstance(loc, types.Array) or loc.dtype != types.float32:
            raise TypeError(f"vector access needs a float32 local array, got {loc}")
        if policy != types.uint64:
            raise TypeError(f"the L2 policy must be a uint64 (l2_evict_last / l2_evict_first), got {policy}")

    h2 = ir.VectorType(ir.HalfType(), 2)

    @intrinsic
    def ldg_hint_into(typingctx, dst, off, arr, idx, policy):  # type: ignore[no-untyped-def]
        _check(arr, dst, policy, words_ok=True)
        sig = types.void(dst, off, arr, idx, policy)

        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            a = _addr(context, builder, sig.args[2], args[2], sig.args[3], args[3])
            asm = "ld.global.L2::cache_hint.v4.u32 {$0, $1, $2, $3}, [$4], $5;"
            r = builder.asm(ir.FunctionType(words, [i64, i64]), asm, "=r,=r,=r,=r,l,l", [a, args[4]], False)
            half = sig.args[2].dtype == types.float16
            bf16 = sig.args[2].dtype == types.uint16
            k = 0
            for w in range(4):
                word = builder.extract_value(r, w)
                if bf16:  # little-endian pairs: the fp32 of a bf16 word is the word << 16 (exact)
                    lo = builder.shl(word, ir.Constant(i32, 16))
                    hi = builder.and_(word, ir.Constant(i32, 0xFFFF0000))
                    vals = [builder.bitcast(lo, ir.FloatType()), builder.bitcast(hi, ir.FloatType())]
                elif half:
                    pair = builder.bitcast(word, h2)
                    vals = [builder.fpext(builder.extract_element(pair, ir.Constant(i32, j)), ir.FloatType())
                            for j in range(2)]  # fmt: skip
                else:
                    vals = [builder.bitcast(word, ir.FloatType())]
                for e in vals:
                    builder.store(e, _slot(context, builder, sig.args[0], args[0], sig.args[1], args[1], k))
                    k += 1
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def stg_hint_from(typingctx, arr, idx, src, off, policy):  # type: ignore[no-untyped-def]
        _check(arr, src, policy)
        sig = types.void(arr, idx, src, off, policy)

        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            a = _addr(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            half = sig.args[0].dtype == types.float16

            def val(k: int) -> Any:
                return builder.load(_slot(context, builder, sig.args[2], args[2], sig.args[3], args[3], k))

            ws = []
            for w in range(4):
                if half:
                    pair = ir.Constant(h2, ir.Undefined)
                    for j in range(2):  # round to nearest even, as float16(x) does
                        pair = builder.insert_element(
                            pair, builder.fptrunc(val(2 * w + j), ir.HalfType()), ir.Constant(i32, j)
                        )
                    ws.append(builder.bitcast(pair, i32))
                else:
                    ws.append(builder.bitcast(val(w), i32))
            asm = "st.global.L2::cache_hint.v4.u32 [$0], {$1, $2, $3, $4}, $5;"
            fty = ir.FunctionType(ir.VoidType(), [i64, i32, i32, i32, i32, i64])
            builder.asm(fty, asm, "l,r,r,r,r,l,~{memory}", [a, *ws, args[4]], True)
            return context.get_dummy_value()

        return sig, codegen

    return _policy("evict_last"), _policy("evict_first"), ldg_hint_into, stg_hint_from


if SIMULATED:  # plain Python functions (why: kernels.primitives.bf16)

    def l2_evict_last() -> Any:
        return uint64(0)

    def l2_evict_first() -> Any:
        return uint64(0)

    def ldg_hint_into(dst: Any, off: Any, arr: Any, idx: Any, policy: Any) -> None:
        words = arr.dtype == WORD
        for k in range(VEC_BYTES // arr.dtype.itemsize):
            dst[off + k] = bf16_to_f32(arr[idx + k]) if words else float32(arr[idx + k])

    def stg_hint_from(arr: Any, idx: Any, src: Any, off: Any, policy: Any) -> None:
        for k in range(VEC_BYTES // arr.dtype.itemsize):
            arr[idx + k] = src[off + k]

else:
    l2_evict_last, l2_evict_first, ldg_hint_into, stg_hint_from = _hint_intrinsics()

"""cp.async (sm_80 and newer): 16-byte copies from global to shared memory with no register in between
(LDGSTS), for kernels that fill shared memory while they work on something else: layernorm's
weight-and-bias-in-shared-memory rows (kernels.ops.rows.WideRows `wb_shared`) copy a thread's weight and bias
vectors while its row loads and reduces, and read them back in the write pass.

  cp16(part, w, src, i): start copying the 16 bytes at &src[i] to words w .. w + 3 of `part`, a uint32
    shared array (w a multiple of 4; src[i] 16-byte aligned: kernels.primitives.vector.vector_ok rows);
    `cp.async.cg` (through L2, not L1)
  commit(): close this thread's copies started so far into one group (`cp.async.commit_group`)
  wait_all(): wait until every copy of this thread has landed (`cp.async.wait_all`); only the thread that
    started a copy may then read its words without a barrier
  lds4(part, w): the 4 words part[w:w + 4] in one 16-byte shared load (a copied vector: column 2p in word
    p's low half, as the bytes lie in memory; kernels.ops.rows.onchip_pairs unpacks them)

Inline PTX through llvmlite (NVVM has no intrinsic for cp.async); each statement clobbers memory, so the
compiler keeps shared loads and stores in program order around it. Under the simulator the copy is done at
once, in the same layout.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kernels.runtime.arrays import SIMULATED


def _intrinsics() -> tuple[Any, Any, Any, Any]:
    from llvmlite import ir
    from numba.core import types as nt
    from numba.cuda.extending import intrinsic

    i32, i64 = ir.IntType(32), ir.IntType(64)

    def asm(builder: Any, ret: Any, text: str, cons: str, args: list[Any], tys: list[Any]) -> Any:
        f = ir.InlineAsm(ir.FunctionType(ret, tys), text, cons, side_effect=True)
        return builder.call(f, args)

    def element_ptr(context: Any, builder: Any, aty: Any, arr: Any, ity: Any, idx: Any) -> Any:
        ary = context.make_array(aty)(context, builder, arr)
        return builder.gep(ary.data, [context.cast(builder, idx, ity, nt.intp)])

    def statement(text: str) -> Any:
        @intrinsic
        def run(typingctx):  # type: ignore[no-untyped-def]
            def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
                asm(builder, ir.VoidType(), text, "~{memory}", [], [])
                return context.get_dummy_value()

            return nt.void(), codegen

        return run

    @intrinsic
    def cp16(typingctx, part, w, src, i):  # type: ignore[no-untyped-def]
        if getattr(part, "dtype", None) != nt.uint32 or src.dtype.bitwidth != 16:
            return None  # a uint32 shared part and a 16-bit source (bf16 words, fp16) only

        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            p = element_ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            # numba gives shared arrays' data as generic pointers: the 32-bit shared-window address
            d = builder.ptrtoint(builder.addrspacecast(p, ir.PointerType(p.type.pointee, 3)), i32)
            s = element_ptr(context, builder, sig.args[2], args[2], sig.args[3], args[3])
            text = "cp.async.cg.shared.global [$0], [$1], 16;"
            asm(builder, ir.VoidType(), text, "r,l,~{memory}", [d, builder.ptrtoint(s, i64)], [i32, i64])
            return context.get_dummy_value()

        return nt.void(part, w, src, i), codegen

    @intrinsic
    def lds4(typingctx, part, w):  # type: ignore[no-untyped-def]
        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            p = element_ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            vt = ir.VectorType(i32, 4)
            p3 = builder.addrspacecast(builder.bitcast(p, ir.PointerType(vt)), ir.PointerType(vt, 3))
            v = builder.load(p3, align=16)
            vals = [builder.extract_element(v, ir.Constant(i32, k)) for k in range(4)]
            return context.make_tuple(builder, sig.return_type, vals)

        return nt.UniTuple(nt.uint32, 4)(part, w), codegen  # type: ignore[attr-defined]

    return cp16, statement("cp.async.commit_group;"), statement("cp.async.wait_all;"), lds4


if SIMULATED:

    def cp16(part: Any, w: Any, src: Any, i: Any) -> None:
        for k in range(4):
            lo, hi = src[i + 2 * k], src[i + 2 * k + 1]
            if src.dtype == np.float16:
                lo, hi = np.float16(lo).view(np.uint16), np.float16(hi).view(np.uint16)
            part[w + k] = np.uint32(lo) | (np.uint32(hi) << np.uint32(16))

    def commit() -> None:
        pass

    def wait_all() -> None:
        pass

    def lds4(part: Any, w: Any) -> Any:
        return part[w], part[w + 1], part[w + 2], part[w + 3]

else:
    cp16, commit, wait_all, lds4 = _intrinsics()

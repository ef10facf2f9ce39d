"""Inline PTX for the lab's probes (GPU only; not shipped): numba intrinsics built on llvmlite's InlineAsm.

  statement(text)            an intrinsic f() that runs `text` (e.g. "cp.async.wait_all;"), ordered against
                             memory accesses (a memory clobber)
  special_register(name, b)  an intrinsic f() -> int32 / int64 (`b` bits) reading %name (smid, globaltimer)
  element_ptr(...)           in a codegen: the generic pointer to arr[idx]
  shared_u32(...)            in a codegen: the 32-bit shared-window address of arr[idx], arr a shared array
                             (numba gives its data as a generic pointer: cast to addrspace 3, then to i32)

Used by lab/onchip_cpasync.py (cp.async), lab/onchip_cluster.py (cluster barrier, DSMEM, %smid) and
lab/onchip_timeline.py (%globaltimer).
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba.core import types as nt
from numba.cuda.extending import intrinsic

I32, I64 = ir.IntType(32), ir.IntType(64)


def asm(builder: Any, ret: Any, text: str, cons: str, args: list[Any], tys: list[Any]) -> Any:
    """Call inline PTX `text` with LLVM constraints `cons` (side effects: never dropped or merged)."""
    f = ir.InlineAsm(ir.FunctionType(ret, tys), text, cons, side_effect=True)
    return builder.call(f, args)


def statement(text: str) -> Any:
    @intrinsic
    def run(typingctx):  # type: ignore[no-untyped-def]
        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            asm(builder, ir.VoidType(), text, "~{memory}", [], [])
            return context.get_dummy_value()

        return nt.void(), codegen

    return run


def special_register(name: str, bits: int) -> Any:
    ty, cons = (I64, "=l") if bits == 64 else (I32, "=r")

    @intrinsic
    def read(typingctx):  # type: ignore[no-untyped-def]
        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            return asm(builder, ty, f"mov.u{bits} $0, %{name};", cons + ",~{memory}", [], [])

        return (nt.int64 if bits == 64 else nt.int32)(), codegen

    return read


def element_ptr(context: Any, builder: Any, aty: Any, arr: Any, ity: Any, idx: Any) -> Any:
    ary = context.make_array(aty)(context, builder, arr)
    return builder.gep(ary.data, [context.cast(builder, idx, ity, nt.intp)])


def shared_u32(context: Any, builder: Any, aty: Any, arr: Any, ity: Any, idx: Any) -> Any:
    p = element_ptr(context, builder, aty, arr, ity, idx)
    return builder.ptrtoint(builder.addrspacecast(p, ir.PointerType(p.type.pointee, 3)), I32)

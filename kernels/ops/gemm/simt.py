"""gemm's simt kernel (fp32): register-blocked tiles on the CUDA cores, generated as Python source by
`gen_source` and compiled by numba, so that nothing is left for LLVM to keep rolled: every k step, every
accumulator and fragment register is spelled out.

A block of 256 threads owns a 128 x (16 * tn) tile of C; each thread owns 8 x tn outputs (rows ty*4+{0..3}
and 64+ty*4+{0..3}, columns in 4-wide groups 64 apart, so every shared-memory read is a conflict-free 16-byte
vector). K is walked in slices of `bk` staged through two shared buffers; fragments are double-buffered in
registers. 16-byte global loads where K, N and the pointers allow (`vec_ok`), else 4-byte loads;
out-of-range rows and columns are clamped instead of predicated. The tile setting per case is a `Config`
(`config_for`), chosen from H200 measurements (benchmarks/notes-matmul.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from numba import cuda, float32

from kernels.runtime.arrays import SIMULATED
from kernels.runtime.launch import Kernel, kernel

SIG = "void(float32[::1], float32[::1], float32[::1], float32[::1], float32[::1], int64, int64, int64)"


@dataclass(frozen=True)
class Config:
    """One generator setting. `bk`: K slice per shared-memory stage; `group`: block rows per rasterisation
    group; `double_buffer`: fragments double-buffered in registers; `min_blocks`: launch_bounds' blocks per
    SM (caps registers; 0 leaves ptxas free); `layout`: a warp's lanes as "4x8" or "2x16" (ty, tx);
    `tn`: outputs per thread along N (block tile 128 x 16*tn)."""

    bk: int
    group: int = 8
    double_buffer: bool = True
    min_blocks: int = 1
    layout: str = "4x8"
    tn: int = 8


# 16-byte loads, no residual: 128 x 256 tiles (8 x 16 per thread), BK 16, one block of 8 warps per SM
GEMM = Config(bk=16, min_blocks=1, tn=16)
# 16-byte loads with a residual epilogue (o_proj): 128 x 128, BK 8, capped at 128 registers for 2 blocks per
# SM, so one block's residual reads and stores overlap the other block's main loop
RESIDUAL = Config(bk=8, min_blocks=2, tn=8)
# 4-byte fallback (K or N not a multiple of 4, or unaligned pointers): 128 x 128, BK 16, no register cap
# (capped at 128 registers it spills)
SCALAR = Config(bk=16, min_blocks=1, tn=8)


def config_for(vec: bool, has_res: bool) -> Config:
    if not vec:
        return SCALAR
    return RESIDUAL if has_res else GEMM


def vec_ok(m: int, n: int, k: int, ptrs: tuple[int, ...]) -> bool:
    """The 16-byte load/store variant needs K and N multiples of 4 (every row starts 16-byte aligned) and
    16-byte aligned base pointers; otherwise the 4-byte variant of the same kernel runs."""
    return n % 4 == 0 and k % 4 == 0 and all(p % 16 == 0 for p in ptrs)


# --- memory-access intrinsics: raw element index, no wraparound/bounds code, explicit width ---------------

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
            ret = types.float32 if w == 1 else types.UniTuple(types.float32, w)  # type: ignore[attr-defined]
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
    """Python source of one simt kernel: 256 threads, block tile 128 x (16 * tn), each thread 8 x tn outputs
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
    e("def simt(a, b, bias, res, out, m, n, k):")
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
        row = f"m0 + ty * 4 + {i % 4 + (i // 4) * 64}"
        e(f"    r = {row}")
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


THREADS = 256
BM = 128  # block tile rows (gen_source); its columns are 16 * tn


@cache
def build(
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
    exec(compile(src, f"<simt bk={bk} tn={tn} vec={vec} bias={has_bias} res={has_res}>", "exec"), ns)
    opts: dict[str, Any] = {} if SIMULATED else {"launch_bounds": (THREADS, min_blocks)} if min_blocks else {}
    return cuda.jit(**opts)(ns["simt"])


def dispatcher(vec: bool, has_bias: bool, has_res: bool) -> Any:
    """The @cuda.jit kernel the launcher runs for this case (uncompiled)."""
    c = config_for(vec, has_res)
    return build(c.bk, vec, has_bias, has_res, c.group, c.double_buffer, c.min_blocks, c.layout, c.tn)


@cache
def compiled(vec: bool, has_bias: bool, has_res: bool) -> Kernel:
    return kernel(dispatcher(vec, has_bias, has_res), SIG)

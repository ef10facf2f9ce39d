"""Probe (GPU only, not shipped): the register-row kernels with every load of a full row issued together.
Run in the nineteenth session (an H100): head won everywhere, 1.06x for fused_add_rmsnorm at 32768, and
shipped; figures in benchmarks/PERF.md ("nineteenth session"). Since then main is head: the base is e536dea's
modules (`git show e536dea:kernels/ops/rmsnorm.py > lab/loads_base/rmsnorm.py` and the other two).

Why (eighteenth session, read from the SASS, ptxas sm_90 offline): fused_add_rmsnorm's WIDE_ROWS kernel
(`_make_vec`, at 1024, 2048, 5120 and 32768 columns) loaded its residual one 16-byte vector at a time: each
load sat in its own bounds-checked branch and its sum was used before the next branch, so the four residual
vectors of a thread took four DRAM round trips one after another where x's four took one. Its write pass, and
rmsnorm's `_make_vec`'s (1024-5120 columns, and the 4096-column BLOCK x PER kernel), loaded each weight
vector after the previous vector's store, and a load may not pass a store to memory that might alias it:
four L2 round trips a row, in the phase right after the block reduction where nothing else is in flight for
that block. Liger-Kernel's Triton kernels load the whole row of x, residual and weight up front.

The change (head: branch full-row-loads, lab/full_row_loads.patch): full rows (n >= threads x per: every
standard width) take the residual loads without a compare (as load_row does for x: they issue back to back),
and load every weight vector before the first store. Registers (ptxas sm_90, bf16 / fp16):
fused_add_rmsnorm's WIDE_ROWS kernels 53 / 55 -> 61 / 60, rmsnorm's 54 / 55 -> 58 / 58, both still under 64:
at 160 x 32 (5120) that is 6 blocks per SM where 53-56 registers gave 7 (30 warps against 35); at 32 x 32 / 32
and 64 x 32 / 16, 32 warps either way; at 1024 x 32 (one block a SM) the same 32 warps. The BLOCK x PER
kernels: rmsnorm 35 / 36 -> 34 / 36, layernorm 38-40 -> 40 (fp32 38 -> 40 in both).

rmsnorm's on-chip kernel (make_onchip: 32776-65536 and 128256-131584 columns) loaded the weight vector of
each of its two register vectors, and of each of the two shared-part vectors of a loop step, after the
previous vector's store; head loads each group's weights before the group's stores (the shared step's next-row
loads were in flight before them already). 64 registers, no spills (fused_add_rmsnorm's on-chip kernel
takes one vector a step: groups of one, the order as before; the base module imports head's make_onchip
and _make_packed, so its on-chip and packed arms are head against head, controls only). layernorm's
`_make_vec` loads the weight and bias of two vectors at a time before their stores (layernorm.WRITE_GROUP:
all four spill in fp16).

Prediction: fused_add_rmsnorm 1.02-1.06x at 32768 (one block a SM: the residual's three extra round trips
are exposed; at ~0.7 us each, up to ~2 us of a ~12 us row, but Liger's kernel, which issues them together,
led by only 4-5 %, and that bounds the gain), 1.01-1.04x at 1024-2048; 5120 level to
1.02x (fewer warps). rmsnorm: level to 1.02x (the weight comes from L2, its latency partly hidden by other
blocks), possibly worse at 5120 (6 blocks instead of 7), level to 1.03x on chip; layernorm 1.01-1.04x at
1024-32768.

Arms, interleaved call by call (kernels.harness.bench.time_interleaved; 2^25 elements, SETS input sets):
  base   the kernel of the same shape from the base modules (LA_BASE_DIR, default lab/loads_base/:
         lab/gpu_call_eighteenth.sh copies main's three modules there before it applies the patch; by
         hand, `git show main:kernels/ops/rmsnorm.py > lab/loads_base/rmsnorm.py` and the other two;
         created here from git at LA_BASE when missing and git is there)
  head   the product's kernel
Both through the module's own RowKernels.pick("auto", ...) (the simulator: "vector"), so the arms launch the
kernel a user's call takes, on its grid (the on-chip ones with their dynamic shared memory).
Both arms then run once more from the same fresh inputs on a grid of two blocks (each loops over rows and
alternates its reduction halves): out (and fused_add_rmsnorm's new residual) must be bit for bit the base
arm's (the arithmetic is unchanged), and out within the op's per-element bound of float64 in every row.

    [LA_OPS=fused_add_rmsnorm,layernorm,rmsnorm] [LA_COLS=...] [LA_DTYPES=...] python lab/loads_ab.py
    NUMBA_ENABLE_CUDASIM=1 python lab/loads_ab.py          (the checks only, at simulator shapes)
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
from numba import cuda

from kernels.harness.bench import SETS, time_interleaved
from kernels.ops import fused_add_rmsnorm, layernorm, rmsnorm, rows
from kernels.primitives.reductions import BLOCK, PER
from kernels.registry import Case
from kernels.runtime import arrays
from kernels.runtime.arrays import BF16, SIMULATED, HostSync

F16 = np.dtype(np.float16)
BASE = os.environ.get("LA_BASE", "main")
BASE_DIR = Path(os.environ.get("LA_BASE_DIR", Path(__file__).parent / "loads_base"))
MODS = {"fused_add_rmsnorm": fused_add_rmsnorm, "rmsnorm": rmsnorm, "layernorm": layernorm}


def base_module(op: str) -> Any:
    """The base commit's module of `op`, loaded under another name; its registry call made a no-op (the
    product's module registered the op already)."""
    path = BASE_DIR / f"{op}.py"
    if not path.exists():
        BASE_DIR.mkdir(parents=True, exist_ok=True)
        text = subprocess.run(["git", "show", f"{BASE}:kernels/ops/{op}.py"], capture_output=True, text=True,
                              check=True).stdout  # fmt: skip
        path.write_text(text)
    src = path.read_text()
    assert src.count("SPEC = register(") == 1, f"{path}: expected one registry call"
    src = src.replace("SPEC = register(", "SPEC = (")
    spec = importlib.util.spec_from_loader(f"lab_base_{op}", loader=None)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    mod.__file__ = str(path)
    sys.modules[spec.name] = mod
    exec(compile(src, str(path), "exec"), mod.__dict__)
    return mod


def factory(mod: Any, op: str, dt: np.dtype, n: int, m: int) -> tuple[Any, int, int]:
    """(kernel, threads, grid) that `mod`'s launcher takes on "auto" for m full rows of n columns (its
    RowKernels.pick: the same rule in base and head, so the arms differ only in the kernel text)."""
    k, th, grid = mod._K.pick("vector" if SIMULATED else "auto", dt, True, n, m)  # simulator: auto is scalar
    return k, th, grid


def op_args(op: str, x: Any, r: Any, w: Any, b: Any, out: Any, sync: HostSync) -> tuple[Any, ...]:
    """The kernel's arguments: fused_add_rmsnorm (x, residual, weight, out, eps), layernorm (x, weight, bias,
    out, eps), rmsnorm (x, weight, out, eps)."""
    xo = arrays.as_rows(arrays.operand("x", x, sync))
    oo = arrays.as_rows(arrays.operand("out", out, sync))
    wo = arrays.operand("weight", w, sync)
    if op == "fused_add_rmsnorm":
        return (xo, arrays.as_rows(arrays.operand("residual", r, sync)), wo, oo, 1e-6)
    if op == "layernorm":
        return (xo, wo, arrays.operand("bias", b, sync), oo, 1e-6)
    return (xo, wo, oo, 1e-6)


# Per op, the widths whose kernel changed, and the controls, whose kernel did not: 8192 (packed) in rmsnorm
# and fused_add_rmsnorm, layernorm's 4096 in fp16 (half2). LA_COLS replaces them for every op.
COLS = {
    "fused_add_rmsnorm": "1024,2048,5120,32768,8192",
    "layernorm": "1024,2048,4096,5120,8192,16384,32768",
    "rmsnorm": "1024,2048,4096,5120,65536,128256,8192",
}


def sim_cols(op: str) -> list[int]:
    """Under the simulator: full rows of every shape (for_machine's 1/32 threads), one with masked vectors
    each, and two rows past vector_cols (the on-chip kernels there)."""
    out = [BLOCK * PER, 2 * rows.vector_cols(BF16), rows.vector_cols(BF16) + 8 * 3]
    for c in map(rows.for_machine, rows.wide_shapes(op)):
        if isinstance(c, rows.WideRows):
            out += [c.threads * c.per, c.threads * c.per - 8 * 3]
    return sorted(set(out))


def main() -> int:
    from kernels.runtime.device import peaks

    out_dir = os.environ.get("OUT")
    gbs = 1.0 if SIMULATED else float(peaks()["mem_gbs"] or 1.0)
    print(f"copy {gbs:.0f} GB/s", flush=True)
    rng = np.random.default_rng(0)
    ops = os.environ.get("LA_OPS", "fused_add_rmsnorm,layernorm,rmsnorm").split(",")
    dts = [
        np.dtype(BF16 if d == "bfloat16" else d)
        for d in os.environ.get("LA_DTYPES", "bfloat16,float16").split(",")
    ]
    rows_out: list[dict[str, Any]] = []
    ok = True
    for op in ops:
        head, base = MODS[op], base_module(op)
        fused = op == "fused_add_rmsnorm"
        cols = sim_cols(op) if SIMULATED else [int(c) for c in os.environ.get("LA_COLS", COLS[op]).split(",")]
        for dt in dts:
            for n in cols:
                m = 5 if SIMULATED else (1 << 25) // n
                got = {a: factory(mod, op, dt, n, m) for a, mod in (("base", base), ("head", head))}
                label = rows.row_path_of(op)(Case("ab", {"rows": m, "cols": n}, dt.name))
                sync = HostSync()
                rs_ = (2.0 ** (np.arange(m) % 5 - 2))[:, None]  # each row at its own scale
                xh = [(rng.standard_normal((m, n)) * rs_).astype(dt) for _ in range(SETS)]
                rh = [(rng.standard_normal((m, n)) * 2 * rs_).astype(dt) for _ in range(SETS)]
                wh = (1 + 0.5 * rng.standard_normal(n)).astype(dt)
                bh = (0.5 * rng.standard_normal(n)).astype(dt)
                xs = [arrays.to_device(a) for a in xh]
                w, bias = arrays.to_device(wh), arrays.to_device(bh)
                arms: dict[str, Any] = {}
                checks: dict[str, Any] = {}
                bufs: dict[str, Any] = {}
                for a in ("base", "head"):
                    kk, th, grid = got[a]
                    rsd = [arrays.to_device(b) for b in rh]
                    outs = [cuda.device_array((m, n), dt) for _ in range(SETS)]
                    bufs[a] = (rsd, outs)

                    argsets = [op_args(op, xs[s], rsd[s], w, bias, outs[s], sync) for s in range(SETS)]
                    arms[a] = lambda s, g=argsets, kk=kk, th=th, grid=grid: kk.launch(grid, th, g[s])
                    checks[a] = lambda g=argsets, kk=kk, th=th: kk.launch(2, th, g[0])
                if SIMULATED:
                    ts = [[1.0], [1.0]]
                else:
                    ts = time_interleaved([(arms[a], list(range(SETS)), None) for a in ("base", "head")], 30)
                if fused:
                    o64 = fused_add_rmsnorm.reference(xh[0], rh[0], wh, 1e-6)[1]
                elif op == "layernorm":
                    o64 = layernorm.reference(xh[0], wh, bh, 1e-6)
                else:
                    o64 = rmsnorm.reference(xh[0], wh, 1e-6)
                res: dict[str, Any] = {}
                for a in ("base", "head"):
                    cuda.synchronize()
                    arrays.words(bufs[a][0][0]).copy_to_device(arrays.host_words(rh[0]))
                    checks[a]()
                    cuda.synchronize()
                    res[a] = (arrays.host_words(arrays.to_host(bufs[a][1][0])),
                              arrays.host_words(arrays.to_host(bufs[a][0][0])))  # fmt: skip
                got_o = arrays.to_host(bufs["head"][1][0]).astype(np.float64)
                err = float((np.abs(got_o - o64).max(axis=1) / np.abs(o64).max(axis=1)).max())  # worst row
                same = all(np.array_equal(res["base"][i], res["head"][i]) for i in range(2))
                tol = 5e-3 if dt == BF16 else 2e-3  # bf16: kernels.ops.rows.BF16_ELEM_TOL
                good = bool(np.isfinite(got_o).all()) and err < tol and same
                ok &= good
                tb, th_ = float(np.median(ts[0])), float(np.median(ts[1]))
                nbytes = (4 if fused else 2) * m * n * dt.itemsize
                rec = {
                    "op": op, "dtype": dt.name, "rows": m, "cols": n, "shape": label,
                    "base_us": round(tb, 2), "head_us": round(th_, 2),
                    "head_of_copy": round(nbytes / th_ / 1e3 / gbs, 3), "x_base": round(tb / th_, 3),
                    "err": err, "same_bits": same, "ok": good,
                }  # fmt: skip
                rows_out.append(rec)
                print(json.dumps(rec), flush=True)
    if out_dir:
        with open(os.path.join(out_dir, "loads_ab.json"), "w") as f:
            json.dump({"copy_gbs": gbs, "base": BASE, "rows": rows_out}, f, indent=1)
    head_line = ("op", "dtype", "shape", "kernel", "base us", "head us", "of copy", "x base", "err")
    print("{:18s} {:9s} {:12s} {:12s} {:>8s} {:>8s} {:>7s} {:>6s} {}".format(*head_line))
    for r in rows_out:
        shape = f"{r['rows']}x{r['cols']}"
        bad = "" if r["ok"] else " BAD"
        print(
            f"{r['op']:18s} {r['dtype']:9s} {shape:12s} {r['shape']:12s} {r['base_us']:8.2f} "
            f"{r['head_us']:8.2f} {r['head_of_copy']:7.3f} {r['x_base']:6.3f} {r['err']:.1e}{bad}"
        )
    print("all outputs right:", "yes" if ok else "NO")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

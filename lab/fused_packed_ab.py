# ruff: noqa: B023  (a probe: each closure is called within its own loop iteration)
"""A/B probe (GPU timing; correctness in the simulator too; not shipped): fused_add_rmsnorm's rows of
8192-32768 columns held as packed pairs, as rmsnorm's are (kernels.ops.rows.WIDE_PACKED), against the
WIDE_ROWS kernel `auto` takes there (the "block" arm, launched directly as the packed arms are).

Why. On the H200 (fourteenth session, `benchmarks/h200/2026-12-06/rows/llm.txt`, the bench's new method)
fused_add_rmsnorm bf16 is 0.84 / 0.82 / 0.77 of copy at 8192 / 16384 / 32768 columns and 0.91x / 0.89x /
0.87x Liger, where rmsnorm, on packed pairs, is 0.86 / 0.85 / 0.81 and 1.02-1.13x Liger. rmsnorm's packed
pairs took it from 54-55 registers to 32 and twice the blocks per SM (twelfth session, an H100: 1.02-1.04x in
bf16); ncu on layernorm (fourteenth session, the H200) put it at half rmsnorm's occupancy and 1.12-1.26x its
time (with 1.3x its instructions).

Variant ("packed"): the product's kernel, rmsnorm's packed kernel text with the add in front
(kernels.ops.rmsnorm._make_packed(..., add=True)): the row of x loaded as packed pairs, every residual vector
loaded and added in fp32 before the first store, the sums rounded to the dtype and packed back, stored to
residual, squared and summed in rmsnorm's packed order (so out is bit for bit rmsnorm's packed kernel on the
rounded residual), and rmsnorm's packed write pass. The same bytes as the WIDE_ROWS kernel. Until the
sixteenth session's three device calls this file timed its own copy of that kernel (`make_fused_packed`,
`git show dad2ac7:lab/fused_packed_ab.py`), which differs from the product's in the row's address
arithmetic (PTX, sm_90); every figure below up to and including the narrow widths' is that copy's. The
product's packed shapes were then timed again in the table's run (95.1 us at 8192 / 16384, as the copy).

Shapes: rmsnorm's WIDE_PACKED threads x 32 values at its blocks per SM (8 / 4 / 2: a 32-register cap), and
at 8192-16384 at fewer blocks (6 / 3: 40 registers), since the residual's loads in flight beside the packed
row need more registers than rmsnorm's row alone. ptxas sm_90 (offline, `--ptxas`): at 32 registers bf16
spills 48 bytes and fp16 16; at 40 neither spills. (Without the full-row path the residual's loads issued
one at a time, a helper's read of the SASS found, and bf16 fit 32 registers with no spills.) Which wins,
twice the blocks with spills or 1.5x with the loads in flight, is what the probe measures.

Prediction (from rmsnorm's packed gain, 1.02-1.04x, and the occupancy gap ncu measured on layernorm):
1.03-1.10x at 8192-16384 for the 40-register builds; the 32-register builds level or worse (their spills sit
in the row's add loop).

The product form, ready to ship if this wins: rmsnorm's `_make_packed` with an `add` (this kernel as the
same text, rmsnorm's packed PTX unchanged), wired into rows.WIDE_PACKED at 256x32/6 and 512x32/3 (1024x32/2
spills, which test_ptx's no-spill rule refuses), and its test in test_fused_add_rmsnorm.py (residual bit
for bit, out bit for bit rmsnorm's packed kernel, per-row float64, a bf16 row past fp16's range, a row of 5/8
the columns, a two-block launch). Written in the fifteenth session and taken back out unmeasured (no device
machine came): `git revert 53bd05a` restores it.

Outcome (sixteenth session, an H100, benchmarks/h100/2026-12-07/fused-packed/): 1.024-1.039x at 8192-16384
for the 40-register builds, 0.984-1.000x for the spilling ones there (1.010-1.021x at 32768, where the
prediction said level or worse); shipped at 8192-16384 (rows.WIDE_PACKED).

The narrow widths (sixteenth session, FP_SHAPES below; ptxas sm_90, bf16 / fp16 registers, no spills unless
named; warps per SM from each of the four sub-partitions' 16K registers, a thread's registers rounded up to
8, and 32 blocks a SM at most: 32 registers give 64 warps, 40 give 48, 48 give 40, 53-56 give 36). WIDE_ROWS
there, 53 / 55 registers: 32x32/32 at 1024 (one-warp blocks, capped at 32 blocks: 32 warps), 64x32/16 at
2048 (18 blocks: 36 warps), 160x32/6 at 5120 (7 blocks: 35 warps), each warp with 8 16-byte loads of x and
residual in flight. Candidates, and the loads in flight per SM against WIDE_ROWS':
  1024: packed 64x16/32 (32 / 30 registers; 64 warps x 4 loads: level), packed 64x16/24 (38 / 36; 48 x 4:
        0.75x);
  2048: packed 64x32/24 (40 / 40; 48 warps x 8: 1.33x), packed 128x16/16 (32 / 30; 64 x 4: 0.89x);
  5120: packed 160x32/9 (40 / 40; 9 blocks, 45 warps x 8: 1.29x), packed 320x16/6 (32 / 30; 60 x 4: 0.86x).
(packed 64x32/32, 160x32/10 and 160x32/12 spill 16-48 bytes at 32 registers: not timed.) Prediction, from
the 8192 shape (256x32/6: 48 warps against 32, 1.5x the loads in flight, gained 2.4-3.9 %): 2048 64x32/24
and 5120 160x32/9 1.01-1.03x; the others level or worse (1024 cannot add loads in flight without two rows a
block).

    FP_COLS=1024,2048,5120 FP_SHAPES="1024:64x16/32p,1024:64x16/24p,2048:64x32/24p,2048:128x16/16p,\
    5120:160x32/9p,5120:320x16/6p" python lab/fused_packed_ab.py

Outcome (sixteenth session, an H100, benchmarks/h100/2026-12-07/fused-narrow/), x WIDE_ROWS bf16 / fp16:
1024 64x16/32 1.011 / 1.013, 64x16/24 1.014 / 1.013; 2048 64x32/24 1.001 / 1.005, 128x16/16 1.014 / 1.012;
5120 160x32/9 1.015 / 1.016, 320x16/6 1.026 / 1.023. The most warps won at 2048 and 5120 (1024: a tie),
against the prediction's loads-in-flight model; 5120's builds are past the spread, 320x16/6 the most.
lab/gpu_call_seventeenth.sh times them again as the product's kernel, with rmsnorm at the same shapes.

Timing: kernels.harness.bench.time_interleaved (a device-side pause before each call, each timed call after an
untimed one of its own arm, CUDA events, rotation over SETS input sets). The residual drifts (each call adds x
to it), the same for both arms. Each arm is then checked once from fresh inputs, the packed arms on a grid of
two blocks (each loops over rows and alternates its reduction halves): the residual bit for bit against the
op's rule (the sum in fp32, rounded once); out within the op's per-element bound of float64 in every row
(rows at their own scales, so a row normed with another's statistics fails), and, for the packed arms, bit
for bit rmsnorm's packed kernel at the same shape on the new residual. Planted faults caught in the simulator:
the sums left unrounded (bf16), the reduction halves not alternating, out scaled by 1.0039.

    source benchmarks/h200_env.sh; OUT=$OUT $PY lab/fused_packed_ab.py     (FP_COLS, FP_DTYPES narrow it;
                                                                           FP_SHAPES sets the shapes)
    NUMBA_ENABLE_CUDASIM=1 python lab/fused_packed_ab.py                   (simulator: correctness only)
    NUMBA_ENABLE_CUDASIM=0 python lab/fused_packed_ab.py --ptxas           (offline: registers, spills; sm_90)
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import numpy as np
from numba import cuda

from kernels.harness.bench import SETS, time_interleaved
from kernels.ops import fused_add_rmsnorm as fam
from kernels.ops import rmsnorm
from kernels.ops.rows import WIDE_ROWS, WideRows, for_machine
from kernels.runtime import arrays
from kernels.runtime.arrays import BF16, SIMULATED, HostSync
from kernels.runtime.launch import kernel

F16 = np.dtype(np.float16)
# columns -> the shapes timed (threads, values a thread, blocks per SM): rmsnorm's WIDE_PACKED and one less
SHAPES: dict[int, list[WideRows]] = {
    8192: [WideRows(256, 32, 8, packed=True), WideRows(256, 32, 6, packed=True)],
    16384: [WideRows(512, 32, 4, packed=True), WideRows(512, 32, 3, packed=True)],
    32768: [WideRows(1024, 32, 2, packed=True)],
}
# FP_SHAPES="1024:64x16/32p,1024:128x8/16,...": the shapes timed at those widths instead (p: packed; without
# it the op's own WIDE_ROWS kernel factory at that shape), each against the WIDE_ROWS kernel of the width


def _shapes_from(spec: str) -> dict[int, list[WideRows]]:
    out: dict[int, list[WideRows]] = {}
    for item in filter(None, spec.split(",")):
        n, shape = item.split(":")
        tp, b = shape.rstrip("p").split("/")
        t, p = tp.split("x")
        out.setdefault(int(n), []).append(WideRows(int(t), int(p), int(b), packed=shape.endswith("p")))
    return out


SHAPES.update(_shapes_from(os.environ.get("FP_SHAPES", "")))


def cases() -> list[tuple[int, int, list[WideRows]]]:
    """(rows, cols, shapes); under the simulator the shapes as they run there (1/32 of the threads) at rows
    with masked vectors."""
    if SIMULATED:
        out = []
        for shapes in SHAPES.values():
            sim = list(dict.fromkeys(s for s in map(for_machine, shapes) if isinstance(s, WideRows)))
            out.append((5, sim[0].threads * sim[0].per - 8 * 3, sim))  # the last vectors masked
        return out
    cols = [int(c) for c in os.environ.get("FP_COLS", "8192,16384,32768").split(",")]
    return [((1 << 25) // n, n, SHAPES[n]) for n in cols]


def main() -> int:
    from kernels.runtime.device import peaks

    out_dir = os.environ.get("OUT")
    gbs = 1.0 if SIMULATED else float(peaks()["mem_gbs"] or 1.0)
    print(f"copy {gbs:.0f} GB/s", flush=True)
    rng = np.random.default_rng(0)
    names = os.environ.get("FP_DTYPES", "bfloat16,float16").split(",")
    dts = [np.dtype(BF16 if d == "bfloat16" else d) for d in names]
    rows_out: list[dict[str, Any]] = []
    resources: dict[str, Any] = {}
    ok = True
    for m, n, shapes in cases():
        for dt in dts:
            sync = HostSync()
            width = 16 // dt.itemsize
            rs_ = (2.0 ** (np.arange(m) % 5 - 2))[:, None]  # each row at its own scale
            xh = [(rng.standard_normal((m, n)) * rs_).astype(dt) for _ in range(SETS)]
            rh = [(rng.standard_normal((m, n)) * 2 * rs_).astype(dt) for _ in range(SETS)]
            wh = (1 + 0.5 * rng.standard_normal(n)).astype(dt)
            xs = [arrays.to_device(a) for a in xh]
            w = arrays.to_device(wh)
            # first the WIDE_ROWS kernel of the packed shapes' width (auto's there): every ratio is against it
            block = next(c for c in map(for_machine, WIDE_ROWS) if c.cols == shapes[0].cols)
            arms_of = [block, *shapes]
            labels = [f"{'packed' if c.packed else 'block'} {c.threads}x{c.per}/{c.min_blocks}"
                      for c in arms_of]  # fmt: skip
            rs = {a: [arrays.to_device(b) for b in rh] for a in labels}
            outs = {a: [cuda.device_array((m, n), dt) for _ in range(SETS)] for a in labels}
            arms: dict[str, Any] = {}
            checks: dict[str, Any] = {}
            theirs: dict[str, Any] = {}
            ref_out = cuda.device_array((m, n), dt)
            for label, shape in zip(labels, arms_of, strict=True):
                fn = fam._row_kernel(shape, width, word=dt == BF16)[0]  # packed: rmsnorm._make_packed(add)
                kk = kernel(fn, fam._K.sigs[dt])
                if not SIMULATED:
                    d = kk.dispatcher
                    kk._prepare()
                    res = {
                        "registers": next(iter(d.get_regs_per_thread().values())),
                        "local_bytes": next(iter(d.get_local_mem_per_thread().values())),
                    }
                    resources[f"{dt.name} {m}x{n} {label}"] = res
                    print(f"{dt.name} {m}x{n} {label}: {res}", flush=True)
                argsets = [
                    (
                        arrays.as_rows(arrays.operand("x", xs[s], sync)),
                        arrays.as_rows(arrays.operand("residual", rs[label][s], sync)),
                        arrays.operand("weight", w, sync),
                        arrays.as_rows(arrays.operand("out", outs[label][s], sync)),
                        1e-6,
                    )
                    for s in range(SETS)
                ]
                arms[label] = lambda s, a=argsets, kk=kk, th=shape.threads: kk.launch(m, th, a[s])
                # the check's call: two blocks, so each loops over rows and alternates its reduction halves
                checks[label] = lambda a=argsets, kk=kk, th=shape.threads: kk.launch(min(m, 2), th, a[0])
                if not shape.packed:
                    continue
                # and rmsnorm's packed kernel at the same shape, for out bit for bit from the new residual
                rk = kernel(
                    rmsnorm._make_packed(width, shape.threads, shape.per, shape.min_blocks, dt == BF16),
                    rmsnorm._K.sigs[dt],
                )
                theirs[label] = lambda rk=rk, th=shape.threads, lab=label: rk.launch(
                    m,
                    th,
                    (
                        arrays.as_rows(arrays.operand("x", rs[lab][0], sync)),
                        arrays.operand("weight", w, sync),
                        arrays.as_rows(arrays.operand("out", ref_out, sync)),
                        1e-6,
                    ),
                )
            if SIMULATED:
                ts = [[1.0] for _ in labels]
            else:
                ts = time_interleaved([(arms[a], list(range(SETS)), None) for a in labels], 30)
            o64 = fam.reference(xh[0], rh[0], wh, 1e-6)[1]
            r_ref = (xh[0].astype(np.float32) + rh[0].astype(np.float32)).astype(dt).astype(np.float64)
            for a in labels:
                cuda.synchronize()
                arrays.words(rs[a][0]).copy_to_device(arrays.host_words(rh[0]))
                checks[a]()
                cuda.synchronize()
                got_o = arrays.to_host(outs[a][0]).astype(np.float64)
                got_r = arrays.to_host(rs[a][0]).astype(np.float64)
                err = float((np.abs(got_o - o64).max(axis=1) / np.abs(o64).max(axis=1)).max())  # worst row
                r_exact = bool(np.array_equal(got_r, r_ref))
                same = True  # a packed arm's out: rmsnorm's packed kernel on its new residual, bit for bit
                if a in theirs:
                    theirs[a]()
                    cuda.synchronize()
                    same = bool(np.array_equal(arrays.host_words(arrays.to_host(ref_out)),
                                               arrays.host_words(arrays.to_host(outs[a][0]))))  # fmt: skip
                tol = 5e-3 if dt == BF16 else 2e-3  # bf16: kernels.ops.rows.BF16_ELEM_TOL
                good = bool(np.isfinite(got_o).all()) and err < tol and r_exact and same
                ok &= good
                us = float(np.median(ts[labels.index(a)]))
                rec = {
                    "dtype": dt.name, "rows": m, "cols": n, "kernel": a, "us": round(us, 2),
                    "of_copy": round(4 * m * n * dt.itemsize / us / 1e3 / gbs, 3),
                    "x_block": round(float(np.median(ts[0])) / us, 3), "err": err, "residual_exact": r_exact,
                    "out_as_rmsnorm": same, "ok": good,
                }  # fmt: skip
                rows_out.append(rec)
                print(json.dumps(rec), flush=True)
    if out_dir:
        with open(os.path.join(out_dir, "fused_packed_ab.json"), "w") as f:
            json.dump({"copy_gbs": gbs, "rows": rows_out, "resources": resources}, f, indent=1)
    print(f"{'dtype':9s} {'shape':12s} {'kernel':20s} {'us':>8s} {'of copy':>7s} {'x block':>7s} err")
    for r in rows_out:
        shape = f"{r['rows']}x{r['cols']}"
        print(
            f"{r['dtype']:9s} {shape:12s} {r['kernel']:20s} {r['us']:8.2f} {r['of_copy']:7.3f} "
            f"{r['x_block']:7.3f} {r['err']:.1e}{'' if r['ok'] else ' BAD'}"
        )
    print("all outputs right:", "yes" if ok else "NO")
    return 0 if ok else 1


def ptxas_report() -> int:
    """Offline (no GPU): registers and spills (ptxas sm_90) of every shape in SHAPES, fp16 and bf16."""
    from kernels.runtime import ptx

    for dt in (BF16, F16):
        for n, shapes in SHAPES.items():
            if os.environ.get("FP_COLS") and str(n) not in os.environ["FP_COLS"].split(","):
                continue
            for s in shapes:
                fn = fam._row_kernel(s, 16 // dt.itemsize, word=dt == BF16)[0]
                r = ptx._ptxas(ptx.compile_one(fn, fam._K.sigs[dt], (9, 0)), (9, 0), False)
                shape = f"{'packed' if s.packed else 'block'} {s.threads}x{s.per}/{s.min_blocks}"
                print(
                    f"{dt.name:8s} {n:6d} {shape}: registers {r.get('registers')}, "
                    f"spills {r.get('spill_bytes')}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(ptxas_report() if "--ptxas" in sys.argv else main())

"""Device probe of layernorm fp16 v6b (issue 4: >= 0.9 of copy at 16384 x 4096): the production path ("auto",
v6 since the v6 run: make_rows6, one block per row) and the v6b variants (kernels/ops/layernorm.py
make_rows6b: v6 with this thread's weight / bias loads batched ahead of its stores, one block per row) side by
side, one process; the production path is timed again last, so the table shows the drift of the run.
(The v7 rows, make_rows7, were removed with the kernel: notes-memory.md "layernorm fp16 v7", commit 9228156.)

Every variant's output (NaN-poisoned first) is checked against a float64 reference at the bench shape and at
odd shapes (rows not a multiple of the grid, columns not a multiple of a block's row, one row with
|mean| / std ~ 1e4); timing as kernels/bench.py: 3 input sets rotated, 3 warm-ups, 20 timed calls, CUDA
events, median. The copy bandwidth is measured in the same run (kernels.device.measure_copy_bandwidth).
Prints a table and writes $OUT/layernorm.json.

    timeout 100 python3 benchmarks/probe_layernorm.py --out $OUT          (prod, v6b rows, prod; ~25 s)
    NUMBA_ENABLE_CUDASIM=1 python benchmarks/probe_layernorm.py --dry-run --out /tmp/x   (tiny shape)
"""

from __future__ import annotations

import argparse
import json
import os
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

T0 = time.monotonic()
SETS, WARM, ITERS = 3, 3, 20
EPS = 1e-5
TOL = 2e-3  # the fp16 tolerance of kernels.verify (OpSpec tolerance)
# v6b variants (make_rows6b): name -> (threads, per, blocks per SM, full_rows, wb_early, group), one block per
# row. The launcher's path="v6b" (V6B_CONFIG = the "batch" row) is timed as its own row. wb_early spills 64 B
# in the full-row body (ptxas sm_90, 64 registers): not in the default list, `--v6b-early` adds it.
# Predictions: benchmarks/notes-memory.md "layernorm fp16 v6b".
V6B_VARIANTS: dict[str, tuple[int, int, int, bool, bool, int]] = {
    "v6b_128x32_b8_full_half": (128, 32, 8, True, False, 2),
}
V6B_EARLY = {"v6b_128x32_b8_full_early (spills)": (128, 32, 8, True, True, 0)}


def log(s: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {s}", flush=True)


def reference(x: Any, w: Any, b: Any) -> np.ndarray:
    x64 = np.asarray(x, dtype=np.float64)
    mean = x64.mean(axis=-1, keepdims=True)
    var = ((x64 - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x64 - mean) / np.sqrt(var + EPS) * np.asarray(w, np.float64) + np.asarray(b, np.float64)


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    g = got.astype(np.float64)
    if not np.isfinite(g).all():
        return float("nan")
    # worst row: an offset row must not hide in the others' norm
    num = np.linalg.norm(g - ref, axis=-1)
    den = np.maximum(np.linalg.norm(ref, axis=-1), 1e-30)
    return float((num / den).max())


def make_inputs(rows: int, cols: int, seed: int, offset_row: bool) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, cols), dtype=np.float32) + 3.0).astype(np.float16)
    if offset_row and rows > 1:
        x[1] = 1000.0 + 0.1 * rng.standard_normal(cols)
    w = (1.0 + 0.5 * rng.standard_normal(cols, dtype=np.float32)).astype(np.float16)
    b = (0.5 * rng.standard_normal(cols, dtype=np.float32)).astype(np.float16)
    return x, w, b


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--dry-run", action="store_true", help="tiny shape, no copy measurement (simulator)")
    ap.add_argument("--v6b-early", action="store_true", help="also time v6b wb_early (spills 64 B)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    from numba import cuda

    from kernels import arrays
    from kernels.device import measure_copy_bandwidth, versions
    from kernels.launch import kernel
    from kernels.ops import layernorm as ln
    from kernels.rowcases import ROW_KERNELS

    global WARM, ITERS
    rows, cols = (6, 256) if a.dry_run else (16384, 4096)
    if a.dry_run:
        WARM, ITERS = 1, 2
    # odd shapes: checked rows (1000 columns) on single-row and on multi-row persistent blocks (2999 rows: one
    # block one row short), full rows on blocks of unequal row counts (2113), tiny rows
    odd = [(37, 1000), (2999, 1000), (2113, cols), (5, cols), (3, 8)] if not a.dry_run else [(5, 136), (3, 8)]
    f16 = np.dtype(np.float16)
    sig = ln._SIGS[f16]
    res: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "shape": [rows, cols],
        "method": {"sets": SETS, "warmup": WARM, "iters": ITERS, "stat": "median of CUDA-event times"},
        "prod_row_kernel": str(ROW_KERNELS["layernorm"].get(f16)),
        "v6_config": ln.V6_CONFIG,
        "v6b_config": ln.V6B_CONFIG,
        "v6b_variants_cfg": V6B_VARIANTS,
        "rows": [],
        "errors": [],
    }
    try:
        res["versions"] = versions()
    except Exception as e:  # noqa: BLE001
        res["versions"] = repr(e)

    def save() -> None:
        res["wall_s"] = round(time.monotonic() - T0, 1)
        (out / "layernorm.json").write_text(json.dumps(res, indent=1, default=str))

    if a.dry_run:
        copy_gbs = 1.0
        res["copy_gbs"] = "dry-run"
    else:
        copy = measure_copy_bandwidth()
        res["copy_gbs"] = copy
        copy_gbs = max(copy.values())
        log(f"copy GB/s: {copy}")
    save()

    # inputs on the device (CuPy where present: generated there; else host-made and copied)
    try:
        import cupy as cp

        def dev(h: np.ndarray) -> Any:
            return cp.asarray(h)

        def host(d: Any) -> np.ndarray:
            return cp.asnumpy(d)

        def empty_nan(shape: tuple[int, int]) -> Any:
            return cp.full(shape, cp.nan, dtype=cp.float16)

        def poison(d: Any) -> None:
            d.fill(cp.nan)

        def gen_x(seed: int) -> Any:
            cp.random.seed(seed)
            return (cp.random.standard_normal((rows, cols), dtype=cp.float32) + 3.0).astype(cp.float16)
    except ImportError:

        def dev(h: np.ndarray) -> Any:
            return cuda.to_device(h)

        def host(d: Any) -> np.ndarray:
            return d.copy_to_host()

        def empty_nan(shape: tuple[int, int]) -> Any:
            return cuda.to_device(np.full(shape, np.nan, np.float16))

        def poison(d: Any) -> None:
            d.copy_to_device(np.full(d.shape, np.nan, np.float16))

        def gen_x(seed: int) -> Any:
            return cuda.to_device(make_inputs(rows, cols, seed, False)[0])

    _, wh, bh = make_inputs(8, cols, 99, False)
    w, b = dev(wh), dev(bh)
    xs = [gen_x(s) for s in range(SETS)]
    outs = [empty_nan((rows, cols)) for _ in range(SETS)]
    ref0 = reference(host(xs[0]), wh, bh)
    nbytes = 2 * rows * cols * 2
    log("inputs ready")

    # candidates: name -> launch(x, w, b, out) on device arrays
    def prod(x: Any, w_: Any, b_: Any, o: Any) -> None:
        ln.layernorm(x, w_, b_, o, eps=EPS)

    cands: list[tuple[str, Callable[[Any, Any, Any, Any], None], dict[str, Any]]] = [
        ("prod (auto = v6 path)", prod, {}),
        (
            "v6b path=v6b (batch, V6B_CONFIG)",
            lambda x, w_, b_, o: ln.layernorm(x, w_, b_, o, eps=EPS, path="v6b"),
            {},
        ),
    ]
    v6b = dict(V6B_VARIANTS, **(V6B_EARLY if a.v6b_early else {}))
    for name, (th, per, blocks, full, early, group) in v6b.items():
        try:
            t_c = time.monotonic()
            if ln.SIMULATED:
                from kernels.reduce import BLOCK, PER

                th, per, blocks = BLOCK, PER, 1
            k6 = kernel(ln.make_rows6b(th, per, blocks, full, early, group), sig)

            def launch6(x: Any, w_: Any, b_: Any, o: Any, k: Any = k6, th: int = th) -> None:
                ops = [
                    arrays.operand(n, v) for n, v in zip(("x", "w", "b", "out"), (x, w_, b_, o), strict=True)
                ]
                k.launch(ops[0].shape[0], th, (*ops, EPS))  # one block per row

            launch6(xs[0][:2], w, b, outs[0][:2])  # compile outside the timing
            meta = {"compile_s": round(time.monotonic() - t_c, 2), "resident_blocks": k6.resident_blocks(th)}
            cands.append((name, launch6, meta))
        except Exception as e:  # noqa: BLE001
            res["errors"].append(f"{name}: build failed: {traceback.format_exc()[-800:]}")
            log(f"{name}: build failed: {e!r}")
    cands.append(("prod (auto = v6 path), repeat", prod, {}))
    try:
        cands[1][2].update(resident_blocks=ln._V6B_K.resident_blocks(ln._V6B_CFG[0]))
    except Exception as e:  # noqa: BLE001
        res["errors"].append(f"v6b path occupancy: {e!r}")
    odd_sets = []
    for i, (r, c) in enumerate(odd):
        xh, wh2, bh2 = make_inputs(r, c, 1000 + i, True)
        odd_sets.append((dev(xh), dev(wh2), dev(bh2), reference(xh, wh2, bh2)))
    log("odd-shape inputs ready")

    for name, fn, meta in cands:
        row: dict[str, Any] = {"variant": name, **meta}
        try:
            # odd shapes first (correctness, incl. an |mean| / std ~ 1e4 row)
            odd_err = 0.0
            for (r, c), (xd, wd, bd, ref) in zip(odd, odd_sets, strict=True):
                o = empty_nan((r, c))
                fn(xd, wd, bd, o)
                odd_err = max(odd_err, rel_err(host(o), ref))
            row["odd_rel_err"] = odd_err
            poison(outs[0])
            fn(xs[0], w, b, outs[0])
            cuda.synchronize()
            row["rel_err"] = rel_err(host(outs[0]), ref0)
            evs = []
            for i in range(WARM + ITERS):
                s = i % SETS
                e0, e1 = cuda.event(), cuda.event()
                e0.record()
                fn(xs[s], w, b, outs[s])
                e1.record()
                if i >= WARM:
                    evs.append((e0, e1))
            cuda.synchronize()
            us = np.array([e0.elapsed_time(e1) * 1e3 for e0, e1 in evs])
            med = float(np.median(us))
            row.update(
                median_us=round(med, 2),
                p10_us=round(float(np.percentile(us, 10)), 2),
                p90_us=round(float(np.percentile(us, 90)), 2),
            )
            row["ok"] = bool(row["rel_err"] < TOL and odd_err < TOL)  # NaN (unwritten output) fails too
            if not row["ok"]:
                res["errors"].append(f"{name}: rel err {row['rel_err']:.2e} / odd {odd_err:.2e} >= {TOL}")
            gbs = nbytes / (med * 1e-6) / 1e9 if med > 0 else float("nan")
            row.update(gbs=round(gbs, 1), sol=round(gbs / copy_gbs, 3))
        except Exception as e:  # noqa: BLE001
            row["error"] = repr(e)[:300]
            res["errors"].append(f"{name}: {traceback.format_exc()[-800:]}")
        res["rows"].append(row)
        log(json.dumps(row, default=str))
        save()

    print(f"\nlayernorm fp16 {rows}x{cols}, copy {copy_gbs:.0f} GB/s, floor {nbytes / copy_gbs / 1e3:.1f} us")
    print(f"{'variant':36s} {'median us':>10s} {'GB/s':>8s} {'SOL':>6s} {'rel err':>9s} {'odd err':>9s} grid")
    for r in res["rows"]:
        if "error" in r:
            print(f"{r['variant']:36s} ERROR {r['error'][:80]}")
            continue
        print(
            f"{r['variant']:36s} {r['median_us']:10.2f} {r['gbs']:8.1f} {r['sol']:6.3f} "
            f"{r['rel_err']:9.2e} {r['odd_rel_err']:9.2e} {r.get('grid', 'rows')}"
        )
    save()
    return 1 if res["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())

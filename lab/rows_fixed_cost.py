# ruff: noqa: B023, E501  (a probe: each lambda is timed within its own loop iteration)
"""Probe (GPU only, not shipped): does rmsnorm bf16 pay a cost that follows neither its shape nor its bytes?

On an H100 (2026-12-05, benchmarks/h100/2026-12-05/latest/) rmsnorm bf16 took 66.4-67.9 us at every block
shape from 32768 x 1024 to 2048 x 16384 (134 MB moved, 2.0 TB/s), while fused_add_rmsnorm, which moves twice
the bytes, took 96-97 us at the same shapes (2.8 TB/s). This times both ops, auto's path, at one width and
1/8, 1/4, 1/2, 1 and 2 times the bench's rows, back to back (ours only: no interleaved reference) over SETS
input copies, and fits time = fixed + bytes / bandwidth per op by least squares. A fixed cost of ~20 us for
rmsnorm and ~0 for fused_add_rmsnorm says the cost is per launch (a tail, a second kernel, a wait); the same
bandwidth with no fixed cost says the latest run's figure was the bench's, not the kernel's.

    PYTHONPATH=<numpy 2.4 site>:. OUT=dir python lab/rows_fixed_cost.py   (RF_COLS, RF_ELEMS narrow it)

Every output of the last timed call is checked against the op's float64 reference on 64 sampled rows.
Prints a table; $OUT/rows_fixed_cost.json holds every point and fit.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from numba import cuda

sys.path.insert(0, str(Path(__file__).resolve().parent))
from wide_rows_ab import ITERS, SETS, WARMUP, timed  # the same back-to-back CUDA-event timing

from kernels.ops.fused_add_rmsnorm import fused_add_rmsnorm
from kernels.ops.rmsnorm import rmsnorm
from kernels.runtime import arrays
from kernels.runtime.arrays import BF16

COLS = int(os.environ.get("RF_COLS", 8192))
ELEMS = int(os.environ.get("RF_ELEMS", 1 << 25))  # the bench's 2^25 elements per operand
FACTORS = (0.125, 0.25, 0.5, 1.0, 2.0)
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", flush=True)


def ref_rmsnorm(x: np.ndarray, w: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    x64 = x.astype(np.float64)
    return x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps) * w.astype(np.float64)


def rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got.astype(np.float64) - want)) / max(np.max(np.abs(want)), 1e-30))


def point(op: str, rows: int, rng: np.random.Generator) -> dict[str, float | int | str]:
    xs = [rng.standard_normal((rows, COLS), dtype=np.float32).astype(BF16) for _ in range(SETS)]
    w = (1.0 + 0.1 * rng.standard_normal(COLS, dtype=np.float32)).astype(BF16)
    dw = arrays.to_device(w)
    dx = [arrays.to_device(x) for x in xs]
    out = [arrays.to_device(np.zeros((rows, COLS), BF16)) for _ in range(SETS)]
    # fused_add_rmsnorm's residual grows by x per call: small x keeps it finite over the timed calls
    small = (
        [arrays.to_device((x.astype(np.float32) * 1e-3).astype(BF16)) for x in xs] if op != "rmsnorm" else []
    )
    res = [arrays.to_device(x) for x in xs] if op != "rmsnorm" else []
    nbytes = (2 if op == "rmsnorm" else 4) * rows * COLS * 2

    def call(i: int) -> None:
        if op == "rmsnorm":
            rmsnorm(dx[i], dw, out[i])
        else:
            fused_add_rmsnorm(small[i], res[i], dw, out[i])

    us = timed([call], ITERS)[0]
    cuda.synchronize()
    pick = rng.choice(rows, min(64, rows), replace=False)
    last = (WARMUP + ITERS - 1) % SETS  # the set the last timed call wrote
    if op == "rmsnorm":
        want = ref_rmsnorm(xs[last][pick], w)
    else:
        want = ref_rmsnorm(arrays.to_host(res[last])[pick].astype(np.float64), w)
    err = rel(arrays.to_host(out[last])[pick], want)
    return {"op": op, "rows": rows, "cols": COLS, "bytes": nbytes, "us": round(us, 2),
            "gbs": round(nbytes / us / 1e3, 1), "rel_err": err, "ok": err <= 8e-3}  # fmt: skip


def fit(points: list[dict]) -> dict[str, float]:
    b = np.array([p["bytes"] for p in points], dtype=np.float64)
    t = np.array([p["us"] for p in points], dtype=np.float64)
    slope, intercept = np.polyfit(b, t, 1)
    return {"fixed_us": round(float(intercept), 2), "gbs": round(float(1.0 / slope / 1e3), 1)}


def main() -> int:
    rng = np.random.default_rng(0)
    base_rows = max(1, ELEMS // COLS)
    rows_list = sorted({max(1, int(base_rows * f)) for f in FACTORS})
    name = getattr(cuda.get_current_device(), "name", "simulator")
    device = name.decode() if isinstance(name, bytes) else str(name)
    result: dict[str, object] = {"device": device, "cols": COLS, "points": [], "fits": {}}
    for op in ("rmsnorm", "fused_add_rmsnorm"):
        pts = []
        for rows in rows_list:
            p = point(op, rows, rng)
            log(json.dumps(p))
            pts.append(p)
        result["points"] += pts  # type: ignore[operator]
        result["fits"][op] = fit(pts)  # type: ignore[index]
    Path(os.environ.get("OUT", "."), "rows_fixed_cost.json").write_text(json.dumps(result, indent=1))
    print(f"{'op':18} {'rows':>6} {'us':>8} {'GB/s':>8} ok")
    for p in result["points"]:  # type: ignore[attr-defined]
        print(f"{p['op']:18} {p['rows']:6d} {p['us']:8.2f} {p['gbs']:8.1f} {'ok' if p['ok'] else 'FAIL'}")
    for op, f in result["fits"].items():  # type: ignore[attr-defined]
        print(f"fit {op}: time = {f['fixed_us']} us + bytes / {f['gbs']} GB/s")
    return 0 if all(p["ok"] for p in result["points"]) else 1  # type: ignore[attr-defined]


if __name__ == "__main__":
    raise SystemExit(main())

"""Probe (GPU only, not shipped): the launches to profile under Nsight Compute, one row op after another.

Run under ncu, this makes exactly two launches of each op in RN_OPS (auto's path, bf16, RN_ROWS x RN_COLS:
4096 x 8192 by default, the bench's 2^25 elements; 261 x 128256 for Llama-3's vocabulary), so that the
counters (DRAM throughput, bytes read and written, achieved occupancy, warp stalls) say where each kernel's
time goes:

    ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
        --section LaunchStats --section WarpStateStats --csv --page details python lab/rows_ncu.py

History: rmsnorm bf16 took 66-68 us at every block shape on an H100 while fused_add_rmsnorm moved twice the
bytes in 96-97 us; ncu showed 43.1 us in the kernel (the bench was timing the host; fixed 2026-12-05).
Prints the kernel each launch ran (for matching ncu's rows) and checks the last outputs against float64.
"""

from __future__ import annotations

import os

import numpy as np
from numba import cuda

from kernels.ops import fused_add_rmsnorm, layernorm, rmsnorm, softmax
from kernels.runtime import arrays
from kernels.runtime.arrays import BF16

ROWS, COLS = int(os.environ.get("RN_ROWS", 4096)), int(os.environ.get("RN_COLS", 8192))
OPS = os.environ.get("RN_OPS", "rmsnorm,fused_add_rmsnorm").split(",")


def main() -> int:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((ROWS, COLS), dtype=np.float32).astype(BF16)
    r = rng.standard_normal((ROWS, COLS), dtype=np.float32).astype(BF16)
    w = (1.0 + 0.1 * rng.standard_normal(COLS, dtype=np.float32)).astype(BF16)
    b = (0.1 * rng.standard_normal(COLS, dtype=np.float32)).astype(BF16)
    dx, dw, db = arrays.to_device(x), arrays.to_device(w), arrays.to_device(b)
    out = arrays.to_device(np.zeros((ROWS, COLS), BF16))
    worst = 0.0
    for op in OPS:
        if op == "fused_add_rmsnorm":  # res += x twice
            dr = arrays.to_device(r)
            for _ in range(2):
                fused_add_rmsnorm.fused_add_rmsnorm(dx, dr, dw, out)
            f = np.float32
            once = (r[:64].astype(f) + x[:64].astype(f)).astype(BF16)  # the residual is rounded each call
            want = rmsnorm.reference((once.astype(f) + x[:64].astype(f)).astype(BF16), w, 1e-6)
        else:
            for _ in range(2):
                if op == "rmsnorm":
                    rmsnorm.rmsnorm(dx, dw, out)
                elif op == "layernorm":
                    layernorm.layernorm(dx, dw, db, out)
                else:
                    softmax.softmax(dx, out)
            want = {
                "rmsnorm": lambda: rmsnorm.reference(x[:64], w, 1e-6),
                "layernorm": lambda: layernorm.reference(x[:64], w, b, 1e-5),
                "softmax": lambda: softmax.reference(x[:64]),
            }[op]()
        cuda.synchronize()
        got = arrays.to_host(out)[:64].astype(np.float64)
        err = float(np.max(np.abs(got - want.astype(np.float64)) / (np.abs(want.astype(np.float64)) + 1e-3)))
        worst = max(worst, err)
        print(f"{op} bf16 {ROWS}x{COLS}: max rel err {err:.3g}", flush=True)
    return 0 if worst < 0.05 else 1


if __name__ == "__main__":
    raise SystemExit(main())

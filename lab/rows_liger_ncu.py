"""Probe (GPU only, not shipped): our row kernels and Liger-Kernel's, side by side under Nsight Compute.

Why: softmax bf16 is 0.95-0.97x Liger at 1024, 4096 and 8192 columns (thirteenth session, `h200_llm.py`), and
rmsnorm 0.98x at 1024, while both kernels move the same bytes. The bench says how far apart they are, not why;
ncu's counters on the two kernels at one shape (DRAM throughput, registers, achieved occupancy, instructions
executed, warp-stall reasons) say which of them is the difference. Outcome (fourteenth session, an H100,
benchmarks/h100/2026-12-06/fourteenth/ncu/): the same time within 3 %, so the gap was the bench's call order
(lab/bench_order_ab.py).

Between cuda.profile_start() and profile_stop() this makes, for each op in RL_OPS (softmax, rmsnorm,
fused_add_rmsnorm: Liger's out of place, ours in place) and each width in RL_COLS
(bf16, 2^25 elements: the bench's sweep shapes), two launches of ours (auto's path) and then two of Liger's,
so run it under ncu with profiling from the start off:

    ncu --profile-from-start off --clock-control none --section SpeedOfLight --section Occupancy \
        --section LaunchStats --section WarpStateStats --section InstructionStats --csv --page details \
        python lab/rows_liger_ncu.py

It prints, in launch order, which kernel each launch is (ncu's IDs follow the same order) and checks both
outputs of every case against the float64 reference (rows 0-63 and the last 64); exit 1 if any is off.
"""

from __future__ import annotations

import os

import numpy as np
from numba import cuda

from kernels.ops import fused_add_rmsnorm, rmsnorm, softmax
from kernels.runtime import arrays
from kernels.runtime.arrays import BF16

ELEMS = 1 << 25
COLS = [int(c) for c in os.environ.get("RL_COLS", "1024,4096,8192").split(",")]
OPS = os.environ.get("RL_OPS", "softmax,rmsnorm").split(",")
EPS = 1e-6


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    g, w = got.astype(np.float64), want.astype(np.float64)
    return float(np.max(np.abs(g - w) / (np.abs(w) + 1e-3)))


def main() -> int:
    import liger_kernel.transformers.functional as lf
    import torch

    rng = np.random.default_rng(0)
    cases = []
    for op in OPS:
        for n in COLS:
            rows = ELEMS // n
            x = rng.standard_normal((rows, n), dtype=np.float32).astype(BF16)
            w = (1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(BF16)
            r = rng.standard_normal((rows, n), dtype=np.float32).astype(BF16)
            dx, dw, dr = arrays.to_device(x), arrays.to_device(w), arrays.to_device(r)
            dout = arrays.to_device(np.zeros((rows, n), BF16))
            tx = torch.from_numpy(x.view(np.int16)).cuda().view(torch.bfloat16)
            tw = torch.from_numpy(w.view(np.int16)).cuda().view(torch.bfloat16)
            tr = torch.from_numpy(r.view(np.int16)).cuda().view(torch.bfloat16)
            cases.append((op, n, x, w, r, dx, dw, dr, dout, tx, tw, tr))
    cuda.synchronize()
    torch.cuda.synchronize()
    outs = []
    cuda.profile_start()
    for op, n, x, _w, _r, dx, dw, dr, dout, tx, tw, tr in cases:
        for who in ("ours", "ours", "liger", "liger"):
            print(f"launch: {op} {x.shape[0]}x{n} {who}", flush=True)
            if who == "ours":
                if op == "softmax":
                    softmax.softmax(dx, dout)
                elif op == "fused_add_rmsnorm":  # residual += x in place: twice over the two launches
                    fused_add_rmsnorm.fused_add_rmsnorm(dx, dr, dw, dout, eps=EPS)
                else:
                    rmsnorm.rmsnorm(dx, dw, dout, eps=EPS)
                cuda.synchronize()
            else:
                if op == "softmax":
                    t = lf.liger_softmax(tx)
                elif op == "fused_add_rmsnorm":  # out of place: its residual input is left as it was
                    t, _ = lf.liger_fused_add_rms_norm(tx, tr, tw, EPS, in_place=False)
                else:
                    t = lf.liger_rms_norm(tx, tw, EPS, in_place=False)
                torch.cuda.synchronize()
        outs.append(t)
    cuda.profile_stop()
    worst = 0.0
    f32 = np.float32
    for (op, n, x, w, r, _dx, _dw, _dr, dout, *_), t in zip(cases, outs, strict=True):
        ours = arrays.to_host(dout)
        theirs = t.view(torch.int16).cpu().numpy().view(BF16)
        once = (r.astype(f32) + x.astype(f32)).astype(BF16)  # fused: the residual after one call, rounded
        twice = (once.astype(f32) + x.astype(f32)).astype(BF16)
        for name, got in (("ours", ours), ("liger", theirs)):
            err = 0.0
            for sl in (slice(0, 64), slice(-64, None)):
                if op == "softmax":
                    want = softmax.reference(x[sl])
                elif op == "fused_add_rmsnorm":  # ours ran twice in place, Liger's out of place
                    want = rmsnorm.reference((twice if name == "ours" else once)[sl], w, EPS)
                else:
                    want = rmsnorm.reference(x[sl], w, EPS)
                err = max(err, rel_err(got[sl], want))
            worst = max(worst, err)
            print(f"{op} bf16 {x.shape[0]}x{n} {name}: max rel err {err:.3g}", flush=True)
    return 0 if worst < 0.05 else 1


if __name__ == "__main__":
    raise SystemExit(main())

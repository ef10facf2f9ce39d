# ruff: noqa: E501  (a probe)
"""Probe (GPU only, not shipped): the 16-byte streaming row kernels (rows past 32768 bf16 columns, e.g. a
vocabulary of 128256) at fewer blocks than SMs.

On an H100 (2026-12-05) rmsnorm / layernorm bf16 at 261 x 128256 ran at 0.71-0.73 of copy and softmax at
0.61: close to what a pass 2 that re-reads every row from DRAM would give (3 row-lengths of traffic instead
of 2). One block per SM keeps 132 rows of 256 KB (33 MB) between their two passes, against a 50 MB L2 that
also takes the writes. A grid of a fraction of the SMs keeps fewer rows in flight, while 1024 threads x 4
vectors x 16 B = 64 KB in flight per block should still cover Little's law. This times each op (auto's
kernel, its grid from rows.sm_count patched to fraction x SMs) interleaved call by call with the bench's
method (kernels.harness.bench.time_interleaved: rotation over SETS copies, a device-side pause before each
call, CUDA events), and checks every fraction's output bit for bit against the full grid's.

    PYTHONPATH=<numpy 2.4 site>:. OUT=dir python lab/stream_grid_ab.py   (SG_COLS, SG_ROWS narrow it)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from numba import cuda

from kernels.harness.bench import SETS, time_interleaved
from kernels.ops import fused_add_rmsnorm as far
from kernels.ops import layernorm, rmsnorm, rows, softmax
from kernels.runtime import arrays, device
from kernels.runtime.arrays import BF16
from kernels.runtime.launch import FastCache, sm_count

ROWS, COLS = int(os.environ.get("SG_ROWS", 261)), int(os.environ.get("SG_COLS", 128256))
FRACTIONS = (1.0, 0.75, 0.5, 0.375, 0.25)
MODS = {"rmsnorm": rmsnorm, "layernorm": layernorm, "softmax": softmax, "fused_add_rmsnorm": far}


def main() -> int:
    rng = np.random.default_rng(0)
    sms = sm_count()
    copy = device.peaks()["mem_gbs"]
    w = arrays.to_device((1 + 0.1 * rng.standard_normal(COLS)).astype(BF16))
    b = arrays.to_device((0.1 * rng.standard_normal(COLS)).astype(BF16))
    xs = [arrays.to_device(rng.standard_normal((ROWS, COLS)).astype(BF16)) for _ in range(SETS)]
    small = [arrays.to_device((1e-3 * rng.standard_normal((ROWS, COLS))).astype(BF16)) for _ in range(SETS)]
    result: dict[str, object] = {"device": device.describe().get("name"), "rows": ROWS, "cols": COLS, "sms": sms, "ops": {}}
    ok = True
    print(f"{'op':18} {'blocks':>6} {'us':>8} {'of copy':>8} same")
    for name, mod in MODS.items():
        nbytes = (4 if name == "fused_add_rmsnorm" else 2) * ROWS * COLS * 2
        outs = {f: [cuda.device_array((ROWS, COLS), BF16) for _ in range(SETS)] for f in FRACTIONS}
        res = {f: [cuda.device_array((ROWS, COLS), BF16) for _ in range(SETS)] for f in FRACTIONS}
        caches = {}

        def call(f: float, s: int, name: str = name, mod=mod, outs=outs, res=res, caches=caches) -> None:
            mod._FAST = caches[f]
            if name == "rmsnorm":
                mod.rmsnorm(xs[s], w, outs[f][s])
            elif name == "layernorm":
                mod.layernorm(xs[s], w, b, outs[f][s])
            elif name == "softmax":
                mod.softmax(xs[s], outs[f][s])
            else:
                mod.fused_add_rmsnorm(small[s], res[f][s], w, outs[f][s])

        saved_fast, saved_count = mod._FAST, rows.sm_count
        try:
            for f in FRACTIONS:
                caches[f] = FastCache()
                for s in range(SETS):
                    res[f][s].copy_to_device(xs[s])
                rows.sm_count = lambda f=f: max(1, int(sms * f))
                call(f, 0)  # binds this grid into caches[f]
            rows.sm_count = saved_count
            for f in FRACTIONS:  # the same starting residual for every fraction
                for s in range(SETS):
                    res[f][s].copy_to_device(xs[s])
            times = time_interleaved([(lambda _a, f=f: call(f, _a["s"]), [{"s": s} for s in range(SETS)], None) for f in FRACTIONS], 30)
        finally:
            mod._FAST, rows.sm_count = saved_fast, saved_count
        cuda.synchronize()
        want = outs[1.0][0].copy_to_host().view(np.uint16)
        op_rows = []
        for f, t in zip(FRACTIONS, times, strict=True):
            us = float(np.median(t))
            same = bool(np.array_equal(outs[f][0].copy_to_host().view(np.uint16), want))
            ok &= same
            blocks = min(ROWS, max(1, int(sms * f)))
            op_rows.append({"fraction": f, "blocks": blocks, "us": round(us, 2), "of_copy": round(nbytes / us / 1e3 / copy, 3), "same": same})
            print(f"{name:18} {blocks:6d} {us:8.2f} {nbytes / us / 1e3 / copy:8.3f} {same}")
        result["ops"][name] = op_rows  # type: ignore[index]
    Path(os.environ.get("OUT", "."), "stream_grid_ab.json").write_text(json.dumps(result, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

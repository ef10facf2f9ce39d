# ruff: noqa: E501, B023  (a probe: each lambda is timed within its own loop iteration)
"""Probe (GPU only, not shipped): the copy ceiling at the bytes a row op moves, not at 1 GiB.

"Of copy" in the row-op figures divides by kernels.runtime.device.peaks()'s copy: a 1 GiB device-to-device
copy (2 GiB moved, ~700 us), whose launch and ramp are lost in its length. A row op at 261 x 128256 bf16
moves 134 MB in ~54 us, and lab/onchip_timeline.py (ninth session) showed 3-5 us of each such call outside
every block's lifetime (the launch, the first blocks' start, the last one's end). A copy of the same bytes
pays the same. This times, interleaved in one process with the bench's method (time_interleaved), the
product's rmsnorm (auto's path, bf16) and copies of the same byte count: the driver's memcpy and
device.py's tiled copy kernels (4 and 8 deep), so the op's fraction of a copy of its own size can be read
next to its fraction of the 1 GiB copy. rmsnorm's output is checked against float64.

    PYTHONPATH=<numpy 2.4 site>:. OUT=dir python lab/copy_same_bytes.py   (CS_SHAPES=261x128256,...)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from numba import cuda

from kernels.harness.bench import SETS, time_interleaved
from kernels.ops.rmsnorm import reference, rmsnorm
from kernels.runtime import arrays, device
from kernels.runtime.arrays import BF16, operand
from kernels.runtime.device import COPY_KERNELS
from kernels.runtime.launch import kernel

SHAPES = [
    tuple(map(int, s.split("x")))
    for s in os.environ.get("CS_SHAPES", "261x128256,1024x128256,512x65536,1024x40960,4096x8192").split(",")
]


def main() -> int:
    rng = np.random.default_rng(0)
    big = device.peaks()["mem_gbs"]
    report: dict[str, object] = {"device": device.describe().get("name"), "copy_1gib_gbs": big, "rows": []}
    ok = True
    ks = {d: kernel(disp, "void(float32[::1], float32[::1])") for d, disp in COPY_KERNELS.items()}
    print(f"copy of 1 GiB (device.peaks): {big:.0f} GB/s")
    for rows, cols in SHAPES:
        xs_h = [(rng.standard_normal((rows, cols)) * 2 + 0.5).astype(BF16) for _ in range(SETS)]
        w_h = (1 + 0.5 * rng.standard_normal(cols)).astype(BF16)
        xs = [arrays.to_device(x) for x in xs_h]
        w = arrays.to_device(w_h)
        outs = [arrays.to_device(np.zeros((rows, cols), BF16)) for _ in range(SETS)]
        n = rows * cols // 2  # float32 words of the same bytes
        srcs = [cuda.to_device(rng.standard_normal(n, dtype=np.float32)) for _ in range(SETS)]
        dsts = [cuda.device_array(n, np.float32) for _ in range(SETS)]
        ops = [(operand("src", s), operand("dst", d)) for s, d in zip(srcs, dsts, strict=True)]
        provs = [("rmsnorm", lambda a: rmsnorm(xs[a["s"]], w, outs[a["s"]]))]
        provs.append(("memcpy", lambda a: dsts[a["s"]].copy_to_device(srcs[a["s"]])))
        for d, k in ks.items():
            grid = (n + 256 * d - 1) // (256 * d)
            provs.append((f"copy{d}", lambda a, k=k, grid=grid: k.launch(grid, 256, ops[a["s"]])))
        sets = [{"s": s} for s in range(SETS)]
        t = time_interleaved([(fn, sets, None) for _, fn in provs], 30)
        cuda.synchronize()
        ref = reference(xs_h[0].astype(np.float32), w_h, 1e-6)
        got = arrays.to_host(outs[0]).astype(np.float64)
        err = float(np.abs(got - ref).max() / np.abs(ref).max())
        ok &= err < 8e-3 and all(
            np.array_equal(dsts[s].copy_to_host()[:4096], srcs[s].copy_to_host()[:4096]) for s in range(SETS)
        )
        us = {name: float(np.median(t[i])) for i, (name, _) in enumerate(provs)}
        nbytes = 2 * rows * cols * 2
        gbs = {k: nbytes / v / 1e3 for k, v in us.items()}
        best = max(v for k, v in gbs.items() if k != "rmsnorm")
        rec = {
            "rows": rows,
            "cols": cols,
            "us": us,
            "gbs": gbs,
            "rmsnorm_of_same_bytes_copy": gbs["rmsnorm"] / best,
            "rmsnorm_of_1gib_copy": gbs["rmsnorm"] / big,
            "same_bytes_copy_of_1gib": best / big,
            "err": err,
        }
        report["rows"].append(rec)  # type: ignore[attr-defined]
        print(
            f"bf16 {rows}x{cols} ({nbytes / 1e6:.0f} MB): "
            + " ".join(f"{k} {v:.2f} us ({gbs[k]:.0f} GB/s)" for k, v in us.items())
            + f"; best same-bytes copy = {best / big:.3f} of the 1 GiB copy; rmsnorm {rec['rmsnorm_of_same_bytes_copy']:.3f} of it"
            f" ({rec['rmsnorm_of_1gib_copy']:.3f} of the 1 GiB copy); err {err:.2e}",
            flush=True,
        )
    Path(os.environ.get("OUT", "."), "copy_same_bytes.json").write_text(json.dumps(report, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

# ruff: noqa: E501, B023  (a probe: each closure is called within its own loop iteration)
"""Probe (GPU only, not shipped): a row op's on-chip kernel (OA_OPS: rmsnorm; softmax's on-chip kernel, measured
slower and kept in lab/onchip/softmax_onchip.py, must be registered again with RowKernels(onchip=...) to A/B it) (kernels.ops.rows.OnChipRows: the row's first
16384 columns in registers, the rest in dynamic shared memory, one read) against its 16-byte streaming kernel
(two reads of the row), interleaved call by call with the bench's method (kernels.harness.bench:
rotation over SETS copies, a device-side pause before each call, CUDA events), at vocabulary widths.
Prints registers and local memory (spills) of the on-chip kernel, and each output's error against float64.

    PYTHONPATH=<numpy 2.4 site>:. OUT=dir python lab/onchip_ab.py
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
from numba import cuda

from kernels.harness.bench import SETS, time_interleaved
from kernels.ops import rmsnorm, softmax
from kernels.runtime import arrays, device
from kernels.runtime.arrays import BF16
from kernels.runtime.launch import FastCache

SHAPES = ((261, 128256), (256, 131072), (512, 65536), (1024, 40960))
MODS = {"rmsnorm": rmsnorm, "softmax": softmax}
OPS = os.environ.get("OA_OPS", "rmsnorm").split(",")


def run(m, name: str, dev_args, out):  # type: ignore[no-untyped-def]
    if name == "rmsnorm":
        m.rmsnorm(*dev_args, out, path="vector")
    else:
        m.softmax(dev_args[0], out, path="vector")


def reference(name: str, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    if name == "rmsnorm":
        return rmsnorm.reference(x, w, 1e-6)
    return softmax.reference(x)


def main() -> int:
    rng = np.random.default_rng(0)
    copy = device.peaks()["mem_gbs"]
    out: dict[str, object] = {"device": device.describe().get("name"), "copy_gbs": copy, "rows": []}
    ok = True
    print(f"{'op':8} {'dtype':9} {'shape':12} {'on-chip us':>10} {'stream us':>10} {'x':>6} {'of copy':>14} err")
    for name, dt, (rows, cols) in [(o, d, sh) for o in OPS for d in (BF16, np.dtype(np.float16)) for sh in SHAPES]:
            m = MODS[name]
            xs_h = [(rng.standard_normal((rows, cols)) * 2 + 0.5).astype(dt) for _ in range(SETS)]
            w_h = (1 + 0.5 * rng.standard_normal(cols)).astype(dt)
            xs = [arrays.to_device(x) for x in xs_h]
            w = arrays.to_device(w_h)
            outs_v = {p: [arrays.to_device(np.zeros((rows, cols), dt)) for _ in range(SETS)] for p in ("chip", "stream")}
            caches = {"chip": FastCache(), "stream": FastCache()}
            saved, saved_chip, saved_shape = m._FAST, dict(m._K.chip_k), m._K.chip_shape
            m._K.chip_shape = replace(saved_shape, from_cols=0)  # on chip at every width it holds, for the A/B
            try:
                for p in ("chip", "stream"):
                    m._FAST = caches[p]
                    if p == "stream":
                        m._K.chip_k.clear()
                    for s in range(SETS):
                        run(m, name, (xs[s], w), outs_v[p][s])
                    m._K.chip_k.update(saved_chip)

                def call(p: str, s: int) -> None:
                    m._FAST = caches[p]
                    run(m, name, (xs[s], w), outs_v[p][s])

                t = time_interleaved([(lambda a, p=p: call(p, a["s"]), [{"s": s} for s in range(SETS)], None) for p in ("chip", "stream")], 30)
            finally:
                m._FAST, m._K.chip_shape = saved, saved_shape
                m._K.chip_k.update(saved_chip)
            cuda.synchronize()
            ref = reference(name, xs_h[0][:32], w_h)
            errs = {}
            for p in ("chip", "stream"):
                got = arrays.to_host(outs_v[p][0])[:32].astype(np.float64)
                errs[p] = float(np.abs(got - ref).max() / np.abs(ref).max())
            ok &= max(errs.values()) < 8e-3
            chip_us, stream_us = float(np.median(t[0])), float(np.median(t[1]))
            nbytes = 2 * rows * cols * dt.itemsize
            row = {"op": name, "dtype": dt.name, "rows": rows, "cols": cols, "onchip_us": round(chip_us, 2), "stream_us": round(stream_us, 2),
                   "speedup": round(stream_us / chip_us, 3), "onchip_of_copy": round(nbytes / chip_us / 1e3 / copy, 3),
                   "stream_of_copy": round(nbytes / stream_us / 1e3 / copy, 3), "err": errs}
            out["rows"].append(row)  # type: ignore[attr-defined]
            print(f"{name:8} {dt.name:9} {rows}x{cols:<7} {chip_us:10.2f} {stream_us:10.2f} {stream_us / chip_us:6.3f} {row['onchip_of_copy']:6.3f} / {row['stream_of_copy']:5.3f} {max(errs.values()):.2e}")
    for dt, k in [(f"{o} {d}", k) for o in OPS for d, k in MODS[o]._K.chip_k.items()]:
        d = k.dispatcher
        try:
            print(f"on-chip {dt}: registers {d.get_regs_per_thread()}, local bytes {d.get_local_mem_per_thread()}, shared {d.get_shared_mem_per_block()}")
        except Exception as e:  # noqa: BLE001
            print(f"on-chip {dt}: no resource figures ({e})")
    Path(os.environ.get("OUT", "."), "onchip_ab.json").write_text(json.dumps(out, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

# ruff: noqa: E501, B023  (a probe: each closure is called within its own loop iteration)
"""Probe (GPU only, not shipped): the row ops' on-chip kernels (OA_OPS: rmsnorm, layernorm, softmax)
(kernels.ops.rows.OnChipRows: the row's first threads x per columns in registers, the rest in dynamic shared
memory as packed pairs, one read) against their 16-byte streaming kernels (two reads of the row), interleaved
call by call with the bench's method (kernels.harness.bench: rotation over SETS copies, a device-side pause
before each call, CUDA events), at vocabulary widths. Variants:

  stream   the op's make_stream_vec (rows.STREAM_ROWS)
  chip     the product's on-chip kernel of rows.ONCHIP_ROWS (one block of 1024 threads per SM), at every width
           it holds
  chip512  the product's on-chip kernel of rows.ONCHIP_MID_ROWS (two blocks of 512 threads per SM, so one
           block's reductions and pass 2 overlap the other's loads; rows of up to 8192 + 57344 = 65536
           columns), at every width it holds. Until 2026-12-06 a lab build of the same config (this file at
           be2b985); the product since.

Each output is checked against float64; registers and local memory (spills) are printed.

    PYTHONPATH=<numpy 2.4 site>:. OUT=dir python lab/onchip_ab.py      (OA_SHAPES=1024x40960,512x65536)
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
from numba import cuda

from kernels.harness.bench import SETS, time_interleaved
from kernels.ops import layernorm, rmsnorm, softmax
from kernels.runtime import arrays, device
from kernels.runtime.arrays import BF16, SIMULATED
from kernels.runtime.launch import FastCache

SHAPES = [tuple(map(int, s.split("x"))) for s in os.environ.get("OA_SHAPES", "261x128256,1024x40960,512x65536").split(",")]
if SIMULATED:
    SHAPES = [(5, 2568), (5, 2000)]  # the second inside the simulator's chip512 (16 threads: 2048 columns)
MODS = {"rmsnorm": rmsnorm, "layernorm": layernorm, "softmax": softmax}
OPS = os.environ.get("OA_OPS", "rmsnorm,layernorm,softmax").split(",")


def run(name: str, dev_args, out):  # type: ignore[no-untyped-def]
    if name == "rmsnorm":
        rmsnorm.rmsnorm(dev_args[0], dev_args[1], out, path="vector")
    elif name == "layernorm":
        layernorm.layernorm(*dev_args, out, path="vector")
    else:
        softmax.softmax(dev_args[0], out, path="vector")


def reference(name: str, x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    x = x.astype(np.float32)
    if name == "rmsnorm":
        return rmsnorm.reference(x, w, 1e-6)
    if name == "layernorm":
        return layernorm.reference(x, w, b, 1e-5)
    return softmax.reference(x)


def main() -> int:
    rng = np.random.default_rng(0)
    copy = device.peaks()["mem_gbs"] if not SIMULATED else 1.0
    out: dict[str, object] = {"device": device.describe().get("name"), "copy_gbs": copy, "rows": []}
    ok = True
    c512 = {(o, dt): MODS[o]._K.mid_k[dt] for o in OPS for dt in (BF16, np.dtype(np.float16))}
    print(f"{'op':9} {'dtype':9} {'shape':12} {'chip us':>9} {'stream us':>9} {'c512 us':>9}  chip/stream c512/stream  of copy (chip, stream, c512)  err")
    for name, dt, (rows, cols) in [(o, d, sh) for o in OPS for d in (BF16, np.dtype(np.float16)) for sh in SHAPES]:
        m = MODS[name]
        C512 = replace(m._K.mid_shape, from_cols=0)
        variants = ("chip", "stream") + (("chip512",) if C512.takes(cols) else ())
        xs_h = [(rng.standard_normal((rows, cols)) * 2 + 0.5).astype(dt) for _ in range(SETS)]
        w_h = (1 + 0.5 * rng.standard_normal(cols)).astype(dt)
        b_h = (0.5 * rng.standard_normal(cols)).astype(dt)
        xs = [arrays.to_device(x) for x in xs_h]
        w, b = arrays.to_device(w_h), arrays.to_device(b_h)
        outs_v = {p: [arrays.to_device(np.zeros((rows, cols), dt)) for _ in range(SETS)] for p in variants}
        caches = {p: FastCache() for p in variants}
        saved, saved_chip, saved_shape = m._FAST, dict(m._K.chip_k), m._K.chip_shape
        saved_mid, saved_mid_shape = dict(m._K.mid_k), m._K.mid_shape

        def use(p: str) -> None:
            m._FAST = caches[p]
            m._K.chip_k.clear()
            m._K.mid_k.clear()
            m._K.chip_shape = replace(saved_shape, from_cols=0)  # on chip at every width it holds, for the A/B
            m._K.mid_shape = C512
            if p == "chip":
                m._K.chip_k.update(saved_chip)
            elif p == "chip512":
                m._K.mid_k.update(saved_mid)

        try:
            for p in variants:
                use(p)
                k, threads, grid = m._K.pick("vector", dt, True, cols, rows)
                want = {"chip": saved_chip.get(dt), "stream": m._K.svec_k[dt], "chip512": c512[(name, dt)]}[p]
                assert getattr(k, "kernel", k) is want, (name, dt, p)
                for s in range(SETS):
                    run(name, (xs[s], w, b), outs_v[p][s])

            def call(p: str, s: int) -> None:
                use(p)
                run(name, (xs[s], w, b), outs_v[p][s])

            if SIMULATED:
                t = [[1.0]] * len(variants)
            else:
                t = time_interleaved([(lambda a, p=p: call(p, a["s"]), [{"s": s} for s in range(SETS)], None) for p in variants], 30)
        finally:
            m._FAST, m._K.chip_shape, m._K.mid_shape = saved, saved_shape, saved_mid_shape
            m._K.chip_k.clear()
            m._K.chip_k.update(saved_chip)
            m._K.mid_k.clear()
            m._K.mid_k.update(saved_mid)
        cuda.synchronize()
        ref = reference(name, xs_h[0][:32], w_h, b_h)
        errs = {}
        for p in variants:
            got = arrays.to_host(outs_v[p][0])[:32].astype(np.float64)
            errs[p] = float(np.abs(got - ref).max() / np.abs(ref).max())
        ok &= max(errs.values()) < 8e-3
        us = {p: float(np.median(t[i])) for i, p in enumerate(variants)}
        nbytes = 2 * rows * cols * dt.itemsize
        frac = {p: round(nbytes / us[p] / 1e3 / copy, 3) for p in variants}
        row = {"op": name, "dtype": dt.name, "rows": rows, "cols": cols, "us": us, "of_copy": frac, "err": errs,
               "chip_vs_stream": round(us["stream"] / us["chip"], 3),
               "chip512_vs_stream": round(us["stream"] / us["chip512"], 3) if "chip512" in us else None}
        out["rows"].append(row)  # type: ignore[attr-defined]
        c5 = f"{us['chip512']:9.2f}" if "chip512" in us else " " * 9
        print(f"{name:9} {dt.name:9} {rows}x{cols:<7} {us['chip']:9.2f} {us['stream']:9.2f} {c5}  {row['chip_vs_stream']:11.3f} {row['chip512_vs_stream'] or 0:11.3f}  "
              + " ".join(f"{frac[p]:.3f}" for p in variants) + f"  {max(errs.values()):.2e}")
    kernels = [(f"chip {o} {d}", k) for o in OPS for d, k in MODS[o]._K.chip_k.items()] + [(f"chip512 {o} {d}", k) for (o, d), k in c512.items()]
    for label, k in kernels:
        d = k.dispatcher
        try:
            print(f"{label}: registers {d.get_regs_per_thread()}, local bytes {d.get_local_mem_per_thread()}")
        except Exception as e:  # noqa: BLE001
            print(f"{label}: no resource figures ({e})")
    Path(os.environ.get("OUT", "."), "onchip_ab.json").write_text(json.dumps(out, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

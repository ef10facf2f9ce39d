# ruff: noqa: E501, B023  (a probe: each closure is called within its own loop iteration)
"""Probe (not shipped): softmax at vocabulary widths, three kernels interleaved call by call with the bench's
method (kernels.harness.bench.time_interleaved: rotation over SETS copies, a device-side pause before each call,
CUDA events), each output checked against float64:

  fold    the product's 16-byte streaming kernel (kernels/ops/softmax.py make_stream_vec: a step folded at once,
          one exp per value, the SFU's in 16-bit)
  push    the same kernel before the fold (lab/softmax_stream/push_kernel.py: a branch and the accurate expf
          per value)
  chip    the product's on-chip kernel (kernels/ops/softmax.py make_onchip: one read of the row, rmsnorm's layout;
          it was lab/softmax_stream/onchip_fold.py at 0cea28f, 16-bit words, when first measured)

    PYTHONPATH=<numpy 2.4 site>:. OUT=dir python lab/softmax_stream_ab.py      (SA_SHAPES=261x128256,...)
Under the simulator (NUMBA_ENABLE_CUDASIM=1) it checks the three kernels at a small shape and times nothing.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
from numba import cuda

sys.path.insert(0, str(Path(__file__).resolve().parent / "softmax_stream"))

import push_kernel  # noqa: E402

from kernels.harness.bench import SETS, time_interleaved  # noqa: E402
from kernels.ops import softmax as m  # noqa: E402
from kernels.ops.rows import WIDTH  # noqa: E402
from kernels.runtime import arrays, device  # noqa: E402
from kernels.runtime.arrays import BF16, SIMULATED  # noqa: E402
from kernels.runtime.launch import FastCache, kernel  # noqa: E402

SHAPES = [tuple(map(int, s.split("x"))) for s in os.environ.get("SA_SHAPES", "261x128256,256x131072,512x65536,1024x40960").split(",")]
F32_SHAPES = [tuple(map(int, s.split("x"))) for s in os.environ.get("SA_F32_SHAPES", "4096x8192,2048x16384,261x128256").split(",")]
if SIMULATED:
    SHAPES, F32_SHAPES = [(5, 2568)], [(5, 1284)]
F32 = np.dtype(np.float32)
VARIANTS = ("fold", "push", "chip")


def main() -> int:
    rng = np.random.default_rng(0)
    copy = device.peaks()["mem_gbs"] if not SIMULATED else 1.0
    out: dict[str, object] = {"device": device.describe().get("name"), "copy_gbs": copy, "rows": []}
    ok = True
    built = {
        dt: {
            "push": kernel(push_kernel.make_stream_vec(m._K.svec_shape, WIDTH[dt]), m._SIGS[dt]),
        }
        for dt in (BF16, np.dtype(np.float16), F32)
    }
    for dt in (BF16, np.dtype(np.float16)):  # on chip: 16-bit rows only
        built[dt]["chip"] = m._K.chip_k[dt]
    saved_svec, saved_chip, saved_shape, saved_fast = dict(m._K.svec_k), dict(m._K.chip_k), m._K.chip_shape, m._FAST
    saved_mid = dict(m._K.mid_k)  # rows.ONCHIP_MID_ROWS: away, so that each variant is the kernel it names
    caches = {p: FastCache() for p in VARIANTS}

    def use(p: str, dt: np.dtype) -> None:
        m._FAST = caches[p]
        m._K.svec_k.update(saved_svec)
        m._K.chip_k.clear()
        m._K.mid_k.clear()
        m._K.chip_shape = replace(saved_shape, from_cols=0)
        if p == "push":
            m._K.svec_k[dt] = built[dt]["push"]
        elif p == "chip":
            m._K.chip_k[dt] = built[dt]["chip"]

    print(f"{'dtype':9} {'shape':12} " + " ".join(f"{p + ' us':>9}" for p in VARIANTS) + f" {'fold/push':>9} {'chip/fold':>9}  of copy (fold, push, chip)  err")
    try:
        for dt, rows, cols in [(d, r, c) for d in (BF16, np.dtype(np.float16)) for r, c in SHAPES] + [(F32, r, c) for r, c in F32_SHAPES]:
            variants = tuple(p for p in VARIANTS if p in built[dt] or p == "fold")
            if True:
                xs_h = [(rng.standard_normal((rows, cols)) * 2 + 0.5).astype(dt) for _ in range(SETS)]
                xs = [arrays.to_device(x) for x in xs_h]
                outs = {p: [arrays.to_device(np.zeros((rows, cols), dt)) for _ in range(SETS)] for p in variants}
                for p in variants:
                    use(p, dt)
                    k = m._K.pick("vector", dt, True, cols, rows)[0]
                    want = saved_svec[dt] if p == "fold" else built[dt][p]
                    assert getattr(k, "kernel", k) is want, (p, dt, cols)
                    for s in range(SETS):
                        for c in caches.values():
                            c.__init__()
                        use(p, dt)
                        m.softmax(xs[s], outs[p][s], path="vector")

                def call(p: str, s: int) -> None:
                    use(p, dt)
                    m.softmax(xs[s], outs[p][s], path="vector")

                if SIMULATED:
                    t = [[1.0]] * len(variants)
                else:
                    t = time_interleaved([(lambda a, p=p: call(p, a["s"]), [{"s": s} for s in range(SETS)], None) for p in variants], 30)
                cuda.synchronize()
                ref = m.reference(xs_h[0][:32].astype(np.float32))
                errs = {}
                for p in variants:
                    got = arrays.to_host(outs[p][0])[:32].astype(np.float64)
                    errs[p] = float(np.abs(got - ref).max() / np.abs(ref).max())
                ok &= max(errs.values()) < (8e-3 if dt.itemsize == 2 else 1e-5)
                us = {p: float(np.median(t[i])) for i, p in enumerate(variants)}
                nbytes = 2 * rows * cols * dt.itemsize
                frac = {p: round(nbytes / us[p] / 1e3 / copy, 3) for p in variants}
                row = {"dtype": dt.name, "rows": rows, "cols": cols, "us": us, "of_copy": frac, "err": errs,
                       "fold_vs_push": round(us["push"] / us["fold"], 3), "chip_vs_fold": round(us["fold"] / us["chip"], 3) if "chip" in us else None}
                out["rows"].append(row)  # type: ignore[attr-defined]
                print(f"{dt.name:9} {rows}x{cols:<7} " + " ".join(f"{us[p]:9.2f}" if p in us else " " * 9 for p in VARIANTS)
                      + f" {row['fold_vs_push']:9.3f} {row['chip_vs_fold'] or 0:9.3f}  " + " ".join(f"{frac[p]:.3f}" for p in variants) + f"  {max(errs.values()):.2e}")
    finally:
        m._K.svec_k.update(saved_svec)
        m._K.chip_k.clear()
        m._K.chip_k.update(saved_chip)
        m._K.mid_k.update(saved_mid)
        m._K.chip_shape, m._FAST = saved_shape, saved_fast
    for dt, ks in built.items():
        for p, k in ks.items():
            d = k.dispatcher
            try:
                print(f"{p} {dt.name}: registers {d.get_regs_per_thread()}, local bytes {d.get_local_mem_per_thread()}")
            except Exception as e:  # noqa: BLE001
                print(f"{p} {dt.name}: no resource figures ({e})")
    Path(os.environ.get("OUT", "."), "softmax_stream_ab.json").write_text(json.dumps(out, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

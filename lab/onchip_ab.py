# ruff: noqa: E501, B023  (a probe: each closure is called within its own loop iteration)
"""Probe (GPU only, not shipped): a row op's on-chip kernel (OA_OPS: rmsnorm, layernorm) (kernels.ops.rows.OnChipRows:
the row's first 16384 columns in registers, the rest in dynamic shared memory, one read) against its 16-byte
streaming kernel (two reads of the row), interleaved call by call with the bench's method
(kernels.harness.bench: rotation over SETS copies, a device-side pause before each call, CUDA events), at
vocabulary widths. OA_PACKED=1 adds, for rmsnorm bf16, lab/onchip/rmsnorm_packed.py (the shared part as
packed pairs: half the shared loads and stores). softmax's on-chip kernels are A/B'd by lab/softmax_stream_ab.py.
Prints registers and local memory (spills) of the on-chip kernels, and each output's error against float64.

    PYTHONPATH=<numpy 2.4 site>:. OUT=dir python lab/onchip_ab.py
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
from numba import cuda

sys.path.insert(0, str(Path(__file__).resolve().parent / "onchip"))

from kernels.harness.bench import SETS, time_interleaved  # noqa: E402
from kernels.ops import layernorm, rmsnorm  # noqa: E402
from kernels.ops.rows import ONCHIP_ROWS, for_machine  # noqa: E402
from kernels.runtime import arrays, device  # noqa: E402
from kernels.runtime.arrays import BF16, SIMULATED  # noqa: E402
from kernels.runtime.launch import FastCache, dynamic_smem, kernel  # noqa: E402

SHAPES = ((261, 128256), (256, 131072), (512, 65536), (1024, 40960)) if not SIMULATED else ((5, 2568),)
MODS = {"rmsnorm": rmsnorm, "layernorm": layernorm}
OPS = os.environ.get("OA_OPS", "rmsnorm").split(",")
PACKED = os.environ.get("OA_PACKED") == "1"


def run(m, name: str, dev_args, out):  # type: ignore[no-untyped-def]
    if name == "rmsnorm":
        m.rmsnorm(dev_args[0], dev_args[1], out, path="vector")
    else:
        m.layernorm(*dev_args, out, path="vector")


def reference(name: str, x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    if name == "rmsnorm":
        return rmsnorm.reference(x, w, 1e-6)
    return layernorm.reference(x, w, b, 1e-5)


def main() -> int:
    rng = np.random.default_rng(0)
    copy = device.peaks()["mem_gbs"] if not SIMULATED else 1.0
    out: dict[str, object] = {"device": device.describe().get("name"), "copy_gbs": copy, "rows": []}
    ok = True
    extra = {}
    if PACKED:
        import rmsnorm_packed

        oc = for_machine(ONCHIP_ROWS)
        pc = replace(oc, vectors=int(os.environ.get("OA_PACKED_VECTORS", 2)))  # 3 spill 24 bytes (ptxas sm_90)
        extra[("rmsnorm", BF16)] = kernel(rmsnorm_packed.make_onchip_packed(pc, 8, True), rmsnorm._SIGS[BF16], on_load=dynamic_smem(oc.smem))
    print(f"{'op':9} {'dtype':9} {'shape':12} {'on-chip us':>10} {'stream us':>10} {'x':>6} {'of copy':>14} {'packed us':>9} err")
    for name, dt, (rows, cols) in [(o, d, sh) for o in OPS for d in (BF16, np.dtype(np.float16)) for sh in SHAPES]:
        m = MODS[name]
        variants = ("chip", "stream") + (("packed",) if (name, dt) in extra else ())
        xs_h = [(rng.standard_normal((rows, cols)) * 2 + 0.5).astype(dt) for _ in range(SETS)]
        w_h = (1 + 0.5 * rng.standard_normal(cols)).astype(dt)
        b_h = (0.5 * rng.standard_normal(cols)).astype(dt)
        xs = [arrays.to_device(x) for x in xs_h]
        w, b = arrays.to_device(w_h), arrays.to_device(b_h)
        outs_v = {p: [arrays.to_device(np.zeros((rows, cols), dt)) for _ in range(SETS)] for p in variants}
        caches = {p: FastCache() for p in variants}
        saved, saved_chip, saved_shape = m._FAST, dict(m._K.chip_k), m._K.chip_shape

        def use(p: str) -> None:
            m._FAST = caches[p]
            m._K.chip_k.clear()
            if p == "chip":
                m._K.chip_k.update(saved_chip)
            elif p == "packed":
                m._K.chip_k[dt] = extra[(name, dt)]

        m._K.chip_shape = replace(saved_shape, from_cols=0)  # on chip at every width it holds, for the A/B
        try:
            for p in variants:
                use(p)
                k = m._K.pick("vector", dt, True, cols, rows)[0]
                want = {"chip": saved_chip.get(dt), "stream": m._K.svec_k[dt], "packed": extra.get((name, dt))}[p]
                assert getattr(k, "kernel", k) is want, (name, dt, p)
                for s in range(SETS):
                    run(m, name, (xs[s], w, b), outs_v[p][s])

            def call(p: str, s: int) -> None:
                use(p)
                run(m, name, (xs[s], w, b), outs_v[p][s])

            if SIMULATED:
                t = [[1.0]] * len(variants)
            else:
                t = time_interleaved([(lambda a, p=p: call(p, a["s"]), [{"s": s} for s in range(SETS)], None) for p in variants], 30)
        finally:
            m._FAST, m._K.chip_shape = saved, saved_shape
            m._K.chip_k.clear()
            m._K.chip_k.update(saved_chip)
        cuda.synchronize()
        ref = reference(name, xs_h[0][:32], w_h, b_h)
        errs = {}
        for p in variants:
            got = arrays.to_host(outs_v[p][0])[:32].astype(np.float64)
            errs[p] = float(np.abs(got - ref).max() / np.abs(ref).max())
        ok &= max(errs.values()) < 8e-3
        us = {p: float(np.median(t[i])) for i, p in enumerate(variants)}
        nbytes = 2 * rows * cols * dt.itemsize
        row = {"op": name, "dtype": dt.name, "rows": rows, "cols": cols, "onchip_us": round(us["chip"], 2), "stream_us": round(us["stream"], 2),
               "speedup": round(us["stream"] / us["chip"], 3), "onchip_of_copy": round(nbytes / us["chip"] / 1e3 / copy, 3),
               "stream_of_copy": round(nbytes / us["stream"] / 1e3 / copy, 3), "err": errs}
        if "packed" in us:
            row |= {"packed_us": round(us["packed"], 2), "packed_vs_chip": round(us["chip"] / us["packed"], 3)}
        out["rows"].append(row)  # type: ignore[attr-defined]
        pk = f"{us['packed']:9.2f}" if "packed" in us else " " * 9
        print(f"{name:9} {dt.name:9} {rows}x{cols:<7} {us['chip']:10.2f} {us['stream']:10.2f} {us['stream'] / us['chip']:6.3f} {row['onchip_of_copy']:6.3f} / {row['stream_of_copy']:5.3f} {pk} {max(errs.values()):.2e}")
    kernels = [(f"{o} {d}", k) for o in OPS for d, k in MODS[o]._K.chip_k.items()] + [(f"packed {o} {d}", k) for (o, d), k in extra.items()]
    for label, k in kernels:
        d = k.dispatcher
        try:
            print(f"on-chip {label}: registers {d.get_regs_per_thread()}, local bytes {d.get_local_mem_per_thread()}")
        except Exception as e:  # noqa: BLE001
            print(f"on-chip {label}: no resource figures ({e})")
    Path(os.environ.get("OUT", "."), "onchip_ab.json").write_text(json.dumps(out, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

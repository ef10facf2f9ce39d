"""Device probe of host launch cost (issue 4: <= 10 us per op call on device arrays): where a call's host time
goes, from the bare ctypes call up to the op launchers, and whether a CUDA graph (one cuGraphLaunch for
clip_grad_norm's two kernels) beats two cuLaunchKernel calls. One process, medians of 2000 calls each,
queue drained every 200 calls outside the timed region (kernels.overhead._time).

Rows:
  ctypes call, 11 int args    libc abs() through ctypes with cuLaunchKernel's argument count: the FFI floor
  cuLaunchKernel, prebuilt    the driver call alone, every argument prebuilt (residual_add's kernel)
  Kernel.launch               kernels.launch: pack + driver call
  residual_add op             the launcher (FastCache hit)
  clip two: 2 x cuLaunchKernel  clip_grad_norm's lean path (2 arrays, fp16)
  clip two: cuGraphLaunch     the same two launches captured once (kernels.launch.LaunchGraph), replayed
Then the graph's result is checked against float64 (norm and clipped arrays) at 2 x 1M fp16 elements.

    timeout 120 python3 benchmarks/probe_launch.py --out $OUT
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
from pathlib import Path
from typing import Any

import numpy as np


def check(rc: int, what: str) -> None:
    if rc:
        raise RuntimeError(f"{what}: CUresult {rc}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    from numba import cuda

    from kernels import launch as L
    from kernels.ops import clip_grad_norm as C
    from kernels.ops import residual_add
    from kernels.overhead import CALLS, _time

    # the launchers' own graph replay off: the rows below time direct launches, and the graph row builds its
    # graph by hand from clip's direct launches (the probe measured the case for kernels.launch.GRAPH_REPLAY)
    L.GRAPH_REPLAY = False

    rows: dict[str, dict[str, float]] = {}
    sync = cuda.synchronize
    libc = ctypes.CDLL(None)

    def ffi() -> None:
        libc.abs(1, 1, 1, 1, 1, 1, 1, 1, 0, None, None)

    rows["ctypes call, 11 int args"] = _time(ffi, CALLS)

    n = 4096
    x = cuda.to_device(np.ones(n, np.float32))
    y = cuda.to_device(np.ones(n, np.float32))
    o = cuda.device_array(n, np.float32)
    residual_add.residual_add(x, y, out=o)
    sync()
    rows["residual_add op (FastCache hit)"] = _time(lambda: residual_add.residual_add(x, y, out=o), CALLS)
    bound = next(iter(residual_add._FAST._d.values()), None)
    if bound is not None:
        k = bound._kern
        f, params = k._func, k._params
        gx, gy, gz, bx, by, bz = bound._dims
        drv = L._driver().cuLaunchKernel

        def bare() -> None:
            drv(f, gx, gy, gz, bx, by, bz, 0, None, params, None)

        rows["cuLaunchKernel, prebuilt"] = _time(bare, CALLS)
        ptrs = [x.device_ctypes_pointer.value, y.device_ctypes_pointer.value, o.device_ctypes_pointer.value]
        rows["Bound.launch"] = _time(lambda: bound.launch(ptrs), CALLS)

    g16 = [cuda.to_device(np.ones(1 << 12, np.float16)) for _ in range(2)]
    nrm = cuda.device_array(1, np.float32)
    C.clip_grad_norm(g16, 1.0, norm_out=nrm)
    sync()
    rows["clip two: 2 x cuLaunchKernel"] = _time(lambda: C.clip_grad_norm(g16, 1.0, norm_out=nrm), CALLS)
    plan = C._fast_plans[(np.dtype(np.float16), "two")]

    def cap(s: Any) -> None:
        for kk, gg in zip(plan.kernels, plan._grids, strict=True):
            check(kk._launch(kk._func, gg, 1, 1, C.BLOCK, 1, 1, 0, s, kk._params, None), "launch in capture")

    graph = L.LaunchGraph(cap)
    rows["clip two: cuGraphLaunch"] = _time(lambda: graph.launch(None), CALLS)

    # the graph's result, checked: 2 x 1M fp16, clipping to half the norm
    rng = np.random.default_rng(0)
    hs = [rng.standard_normal(1 << 20).astype(np.float16) for _ in range(2)]
    ds = [cuda.to_device(h) for h in hs]
    C.clip_grad_norm(ds, 1e9, norm_out=nrm)  # no clip: builds the words for these arrays, repacks the plan
    sync()
    ref_norm = float(np.sqrt(sum((h.astype(np.float64) ** 2).sum() for h in hs)))
    graph2 = L.LaunchGraph(cap)
    plan._last = None  # the plan's blocks now hold max_norm 1e9; the graph captured them
    graph2.launch(None)
    sync()
    ok_noclip = all((d.copy_to_host() == h).all() for d, h in zip(ds, hs, strict=True))
    got_norm = float(nrm.copy_to_host()[0])
    mx = ref_norm / 2
    C.clip_grad_norm(ds, mx, norm_out=nrm)  # direct launches pack mx; recapture replays with it
    sync()
    for d, h in zip(ds, hs, strict=True):
        d.copy_to_device(h)
    graph3 = L.LaunchGraph(cap)
    graph3.launch(None)
    sync()
    coef = mx / (ref_norm + 1e-6)
    err = max(
        float(np.abs(d.copy_to_host().astype(np.float64) - h.astype(np.float64) * coef).max())
        for d, h in zip(ds, hs, strict=True)
    )
    check_row = {
        "norm_rel_err": abs(got_norm - ref_norm) / ref_norm,
        "noclip_bit_identical": ok_noclip,
        "clip_max_abs_err": err,
    }
    dev = cuda.get_current_device().name
    dev = dev.decode() if isinstance(dev, bytes) else dev
    res = {"rows": rows, "graph_check": check_row, "device": dev}
    (out / "launch.json").write_text(json.dumps(res, indent=1))
    for name, r in rows.items():
        print(f"{name:36s} {r['median_us']:7.2f} us  (p10 {r['p10_us']:.2f}, p90 {r['p90_us']:.2f})")
    print("graph check:", check_row)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

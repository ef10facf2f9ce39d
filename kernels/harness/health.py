"""`python -m kernels health`: a fast node check (< 3 s on a GPU): the device is visible (or the simulator
is declared), a tiny op runs and matches its float64 reference, and free device memory is reported."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from kernels.runtime import device
from kernels.runtime.arrays import SIMULATED


def _check(name: str, fn: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        ok, detail = fn()
    except Exception as e:  # noqa: BLE001  (a health check reports, it does not raise)
        ok, detail = False, f"{type(e).__name__}: {e}"
    return {"name": name, "ok": bool(ok), "detail": detail, "seconds": round(time.perf_counter() - t0, 3)}


def _device() -> tuple[bool, str]:
    if SIMULATED:
        return True, "simulator declared (NUMBA_ENABLE_CUDASIM=1): no GPU facts"
    device.require_device()
    d = device.describe()
    return True, f"{d['name']} cc {d['compute_capability']}, {d['sm_count']} SMs"


def _tiny_op() -> tuple[bool, str]:
    from kernels.ops.residual_add import residual_add

    rng = np.random.default_rng()
    x = rng.standard_normal((3, 37)).astype(np.float32)
    r = rng.standard_normal((3, 37)).astype(np.float32)
    out = np.full_like(x, np.nan)
    residual_add(x, r, out)
    ref = x.astype(np.float64) + r
    err = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
    return bool(np.isfinite(out).all() and err <= 1e-6), f"residual_add 3x37 fp32 rel_err {err:.2e}"


def _memory() -> tuple[bool, str]:
    if SIMULATED:
        return True, "simulator: no device memory"
    d = device.describe()
    free, total = d["memory_free_bytes"], d["memory_total_bytes"]
    # a node with under 1 GiB free cannot stage even one bench case
    return free >= 1 << 30, f"{free / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB"


def run() -> dict[str, Any]:
    checks = [_check("device", _device)]
    if checks[0]["ok"]:
        checks += [_check("tiny_op", _tiny_op), _check("memory", _memory)]
    return {"ok": all(c["ok"] for c in checks), "simulated": SIMULATED, "checks": checks}

"""`python -m kernels verify`: every op, every case, against its float64 reference.

For each case: fresh random inputs (a new seed each run, reported so a failure can be replayed with
`--seed`), inputs copied to the device, outputs allocated on the device and filled with NaN, one launch, then
every output and in-place input is copied back and must be finite wherever the reference is (so an element
the kernel never wrote fails, as NaN) and within the op's tolerance: ||out - ref|| / ||ref|| <= tol.
Under the simulator only the tiny `sim_cases` run and the report says `"simulated": true`.
"""

from __future__ import annotations

import secrets
import time
import traceback
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import cuda

from kernels.registry import Case, OpSpec, Problem
from kernels.runtime import device
from kernels.runtime.arrays import SIMULATED

SHAPES = ("verify", "bench", "all")


@dataclass
class CaseResult:
    op: str
    dtype: str
    case: str
    ok: bool
    rel_err: float | None
    tol: float
    seconds: float
    error: str | None = None
    path: str | None = None

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "op": self.op,
            "dtype": self.dtype,
            "case": self.case,
            "ok": self.ok,
            "rel_err": self.rel_err,
            "tol": self.tol,
            "seconds": round(self.seconds, 3),
        }
        if self.path is not None:
            d["path"] = self.path
        if self.error is not None:
            d["error"] = self.error
        return d


def stage(problem: Problem) -> dict[str, Any]:
    """Device arguments of one problem: inputs copied, outputs NaN-poisoned, scalars passed through."""
    args: dict[str, Any] = {k: cuda.to_device(v) for k, v in problem.inputs.items()}
    for name, (shape, dtype) in problem.outputs.items():
        args[name] = cuda.to_device(np.full(shape, np.nan, dtype=dtype))
    args.update(problem.scalars)
    return args


CHUNK = 1 << 22  # elements per slice: float64 temporaries stay in cache-sized pieces at bench shapes


def rel_error(out: np.ndarray, ref: np.ndarray) -> tuple[float, str | None]:
    """||out - ref|| / ||ref|| in float64 over the elements where the reference is finite, and a reason
    when outputs are missing (still NaN) or non-finite where the reference is finite."""
    if out.shape != ref.shape:
        return float("inf"), f"shape {out.shape}, expected {ref.shape}"
    o_all, r_all = out.reshape(-1), ref.reshape(-1)
    bad = 0
    num = den = 0.0
    for s in range(0, o_all.size, CHUNK):
        o = o_all[s : s + CHUNK].astype(np.float64)
        r = r_all[s : s + CHUNK]
        fin = np.isfinite(r)
        bad += int(np.count_nonzero(~np.isfinite(o) & fin))
        if fin.all():
            d = o - r
            num += float(np.dot(d, d))
            den += float(np.dot(r, r))
        else:
            d = (o - r)[fin]
            num += float(np.dot(d, d))
            den += float(np.dot(r[fin], r[fin]))
    if bad:
        return float("nan"), f"{bad} of {o_all.size} elements not written or not finite"
    return (float(np.sqrt(num / den)) if den > 0 else float(np.sqrt(num))), None


def check_case(spec: OpSpec, case: Case, rng: np.random.Generator) -> CaseResult:
    res = _check_case(spec, case, rng)
    if spec.path is not None:
        try:
            res.path = spec.path(case)
        except Exception as e:  # noqa: BLE001
            res.path = f"unknown ({type(e).__name__})"
    return res


def _check_case(spec: OpSpec, case: Case, rng: np.random.Generator) -> CaseResult:
    tol = float(spec.tolerance[case.dtype])
    t0 = time.perf_counter()
    try:
        problem = spec.make_problem(case, rng)
        args = stage(problem)
        spec.launch(args)
        cuda.synchronize()
        worst = 0.0
        for name, ref in problem.reference.items():
            err, why = rel_error(args[name].copy_to_host(), ref)
            if why is not None:
                return CaseResult(spec.name, case.dtype, case.label, False, None, tol,
                                  time.perf_counter() - t0, f"{name}: {why}")  # fmt: skip
            worst = max(worst, err)
        ok = worst <= tol
        error = None if ok else f"relative error {worst:.3g} exceeds tolerance {tol:.3g}"
        return CaseResult(spec.name, case.dtype, case.label, ok, worst, tol, time.perf_counter() - t0, error)
    except Exception as e:  # noqa: BLE001  (one failing op must not hide the others)
        where = traceback.extract_tb(e.__traceback__)[-1]
        msg = f"{type(e).__name__}: {e} (at {where.filename.rsplit('/', 1)[-1]}:{where.lineno})"
        return CaseResult(spec.name, case.dtype, case.label, False, None, tol, time.perf_counter() - t0, msg)


def cases_of(spec: OpSpec, shapes: str) -> tuple[Case, ...]:
    if SIMULATED:
        return spec.sim_cases
    if shapes == "verify":
        return spec.verify_cases
    if shapes == "bench":
        return spec.bench_cases
    return spec.verify_cases + spec.bench_cases


def run(ops: list[OpSpec], *, shapes: str = "all", seed: int | None = None) -> dict[str, Any]:
    """The verify report (the JSON the fleet reads): ok only if every case of every op passed."""
    seed = secrets.randbits(63) if seed is None else seed
    rng = np.random.default_rng(seed)
    report: dict[str, Any] = {"ok": False, "simulated": SIMULATED, "seed": seed, "shapes": shapes}
    try:
        device.require_device()
        report["device"] = device.describe()
    except Exception as e:  # noqa: BLE001
        report.update({"device": {}, "versions": device.versions(), "results": [], "error": str(e)})
        return report
    report["versions"] = device.versions()
    results = [check_case(spec, case, rng) for spec in ops for case in cases_of(spec, shapes)]
    report["results"] = [r.as_dict() for r in results]
    report["failed_ops"] = sorted({r.op for r in results if not r.ok})
    report["ok"] = bool(results) and all(r.ok for r in results)
    return report

"""`python -m kernels verify`: every op, every case, against its float64 reference.

For each case: fresh random inputs (a new seed each run, reported so a failure can be replayed with
`--seed`), inputs copied to the device, outputs allocated on the device and filled with NaN, one launch, then
every output and in-place input is copied back and must be finite wherever the reference is (so an element
the kernel never wrote fails, as NaN), non-finite exactly where the reference is (NaN where it is NaN, the
same infinity where it is infinite: a swallowed NaN fails), within the op's norm tolerance
||out - ref|| / ||ref|| <= tol, and within its per-element bound max |out - ref| / (|ref| + rms(ref)) <=
elem_tol, which a few wrong elements among millions break although the norm hides them.
Under the simulator only the tiny `sim_cases` run and the report says `"simulated": true`.
"""

from __future__ import annotations

import contextlib
import secrets
import time
import traceback
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
from numba import cuda

from kernels.harness import coverage
from kernels.registry import SPECIALS, Case, OpSpec, Problem, all_ops
from kernels.runtime import arrays, device
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
    tier: str | None = None  # the path's kernels.registry.Choice tier: primary, fallback, simulated
    elem_err: float | None = None
    elem_tol: float | None = None

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
        if self.elem_err is not None:
            d["elem_err"] = self.elem_err
            d["elem_tol"] = self.elem_tol
        if self.path is not None:
            d["path"] = self.path
        if self.tier is not None:
            d["tier"] = self.tier
        if self.error is not None:
            d["error"] = self.error
        return d


def stage(problem: Problem) -> dict[str, Any]:
    """Device arguments of one problem: inputs copied, outputs NaN-poisoned, scalars passed through."""
    args: dict[str, Any] = {k: arrays.to_device(v) for k, v in problem.inputs.items()}
    for name, (shape, dtype) in problem.outputs.items():
        args[name] = arrays.to_device(np.full(shape, np.nan, dtype=dtype))
    args.update(problem.scalars)
    return args


CHUNK = 1 << 22  # elements per slice: float64 temporaries stay in cache-sized pieces at bench shapes


@dataclass(frozen=True)
class Errors:
    """What one output is measured by: `rel` = ||out - ref|| / ||ref|| over the finite reference elements;
    `elem` = max |out - ref| / (|ref| + rms(ref)) (a per-element bound scaled by the reference's magnitude).
    Both measure magnitudes no smaller than the output dtype's smallest normal (`floor_of`): below it a
    correctly rounded value keeps only an absolute precision (fp16: half of 2^-24), so a small output, such
    as the one-element arrays of clip_grad_norm's Llama-3 case, would otherwise fail on a random draw;
    `why`: missing or non-finite outputs where the reference is finite, or finite / other non-finite
    outputs where it is NaN or infinite (None when every element is as it should be)."""

    rel: float
    elem: float
    why: str | None


def floor_of(dt: np.dtype) -> float:
    """The smallest normal of a floating-point output dtype (fp16 6.1e-5; fp32 and bf16 1.2e-38); 0 for
    words (fp8 codes, integers), which are compared exactly."""
    if dt.kind == "f":
        return float(np.finfo(dt).tiny)
    if dt == arrays.BF16:
        return float(ml_dtypes.finfo(dt).tiny)  # type: ignore[no-untyped-call]
    return 0.0


def errors(out: np.ndarray, ref: np.ndarray) -> Errors:
    if out.shape != ref.shape:
        return Errors(float("inf"), float("inf"), f"shape {out.shape}, expected {ref.shape}")
    o_all, r_all = out.reshape(-1), ref.reshape(-1)
    unwritten = wrong_special = 0
    num = den = 0.0
    for s in range(0, o_all.size, CHUNK):
        r = r_all[s : s + CHUNK]
        fin = np.isfinite(r)
        o = o_all[s : s + CHUNK].astype(np.float64)
        unwritten += int(np.count_nonzero(~np.isfinite(o) & fin))
        if not fin.all():
            rs, os_ = r[~fin], o[~fin]
            same = (np.isnan(rs) & np.isnan(os_)) | (rs == os_)
            wrong_special += int(np.count_nonzero(~same))
            o, r = o[fin], r[fin]
        d = o - r
        num += float(np.dot(d, d))
        den += float(np.dot(r, r))
    n_fin = max(1, int(np.count_nonzero(np.isfinite(r_all))))
    if den > 0:  # an all-zero reference keeps the absolute measure
        floor = floor_of(out.dtype)
        den = max(den, n_fin * floor * floor)
    rms = float(np.sqrt(den / n_fin))
    if unwritten:
        return Errors(
            float("nan"), float("nan"), f"{unwritten} of {o_all.size} elements not written or not finite"
        )
    if wrong_special:
        return Errors(float("nan"), float("nan"),
                      f"{wrong_special} of {o_all.size} elements differ where the reference is NaN or "
                      "infinite (a NaN or infinity swallowed or made up)")  # fmt: skip
    elem = 0.0
    for s in range(0, o_all.size, CHUNK):
        r = r_all[s : s + CHUNK]
        fin = np.isfinite(r)
        o = o_all[s : s + CHUNK].astype(np.float64)
        if fin.any():
            e = np.abs(o[fin] - r[fin]) / (np.abs(r[fin]) + rms) if rms > 0 else np.abs(o[fin] - r[fin])
            elem = max(elem, float(e.max()))
    rel = float(np.sqrt(num / den)) if den > 0 else float(np.sqrt(num))
    return Errors(rel, elem, None)


def rel_error(out: np.ndarray, ref: np.ndarray) -> tuple[float, str | None]:
    """||out - ref|| / ||ref|| and the reason when elements are missing or wrongly non-finite (see
    `errors`)."""
    e = errors(out, ref)
    return e.rel, e.why


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """numpy's floating-point warnings off: errstate for this thread (the reference), the warning filter for
    the simulator's threads (errstate is per thread; the filter list is not)."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def check_case(spec: OpSpec, case: Case, rng: np.random.Generator) -> CaseResult:
    res = _check_case(spec, case, rng)
    try:
        choice = spec.choice(case)  # an op with one kernel per dtype: "default", its primary
        res.path, res.tier = choice.path, choice.tier
    except Exception as e:  # noqa: BLE001
        res.path = f"unknown ({type(e).__name__})"
    return res


def _check_case(spec: OpSpec, case: Case, rng: np.random.Generator) -> CaseResult:
    tol = float(spec.tolerance[case.dtype])
    t0 = time.perf_counter()
    try:
        # non-finite inputs make non-finite intermediates by design (the float64 reference, the simulator)
        with _quiet() if case.params.get(SPECIALS) else contextlib.nullcontext():
            problem = spec.make_problem(case, rng)
            args = stage(problem)
            spec.launch(args)
            cuda.synchronize()
        etol = spec.elem_tolerance_of(case.dtype)
        worst = worst_elem = 0.0
        for name, ref in problem.reference.items():
            e = errors(arrays.to_host(args[name]), ref)
            if e.why is not None:
                return CaseResult(spec.name, case.dtype, case.label, False, None, tol,
                                  time.perf_counter() - t0, f"{name}: {e.why}", elem_tol=etol)  # fmt: skip
            worst, worst_elem = max(worst, e.rel), max(worst_elem, e.elem)
        error = None
        if worst > tol:
            error = f"relative error {worst:.3g} exceeds tolerance {tol:.3g}"
        elif worst_elem > etol:
            error = f"per-element error {worst_elem:.3g} exceeds bound {etol:.3g}"
        return CaseResult(spec.name, case.dtype, case.label, error is None, worst, tol,
                          time.perf_counter() - t0, error, elem_err=float(f"{worst_elem:.3g}"),
                          elem_tol=etol)  # fmt: skip
    except Exception as e:  # noqa: BLE001  (one failing op must not hide the others)
        where = traceback.extract_tb(e.__traceback__)[-1]
        msg = f"{type(e).__name__}: {e} (at {where.filename.rsplit('/', 1)[-1]}:{where.lineno})"
        return CaseResult(spec.name, case.dtype, case.label, False, None, tol, time.perf_counter() - t0, msg)


def cases_of(spec: OpSpec, shapes: str) -> tuple[Case, ...]:
    if SIMULATED:
        # the fleet runs this on every deploy: the special cases in the first dtype only (the dtypes differ
        # in loads and stores alone; tests/kernels/test_special_values.py runs them all)
        return spec.sim_cases + tuple(c for c in spec.special_cases if c.dtype == spec.dtypes[0])
    if shapes == "verify":
        return spec.verify_cases + spec.special_cases
    if shapes == "bench":
        return spec.bench_cases
    return spec.verify_cases + spec.special_cases + spec.bench_cases


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
    # what auto runs at every registered op's production shapes here (no launch): the node keeps it with
    # the release, and `solfleet status` reports the ops and dtypes that only have a fallback on the node
    report["coverage"] = coverage.report(list(all_ops().values()))
    report["ok"] = bool(results) and all(r.ok for r in results)
    return report

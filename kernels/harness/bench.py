"""`python -m kernels bench`: time every op at its benchmark shapes on a real GPU.

Method (../.library/device/METHOD.md): inputs drawn at random once per case, then cloned into `SETS`
device-side copies that are used in rotation, so no timed call finds its inputs in L2 from the call before
(every bench case moves >= 256 MB against a 60 MB L2). In-place inputs are restored from a pristine copy
before every call, outside the timed region, followed by a short device-side pause so that the host's
launch of the op happens while the stream is busy (as it does for back-to-back out-of-place calls); host
time per call is measured apart (`--overhead`). Each call is bracketed by its own pair of CUDA events on the
launch stream, after `WARMUP` untimed calls (compilation, module load). Reported: median, p10 and p90 of
the per-call times, achieved TFLOP/s and GB/s from the op's FLOP and byte floors, and SOL = achieved /
binding peak (memory ops: the measured copy bandwidth; compute ops: the fp32 FMA peak, or the dense fp16
tensor-core peak for a case that ran on tensor cores, path "mma").
With `--compare cupy` the op's CuPy provider runs in the same process on the same buffers (wrapped with
no copy), is timed the same way, its result is checked against the same reference, and
`ratio = cupy median / our median` (> 1: ours is faster).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np
from numba import cuda

from kernels.harness.verify import rel_error, stage
from kernels.registry import Case, OpSpec
from kernels.runtime import device
from kernels.runtime.arrays import SIMULATED

SETS = 3
WARMUP = 3
ITERS = 20
REFUSAL = (
    "bench needs a real GPU: under NUMBA_ENABLE_CUDASIM=1 kernels run as Python threads on the CPU, so "
    "timings would mean nothing (use `verify` there)"
)


class SimulatorRefused(RuntimeError):
    pass


def _clone(args: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in args.items():
        if cuda.is_cuda_array(v):
            c = cuda.device_array(v.shape, dtype=v.dtype)
            c.copy_to_device(v)
            out[k] = c
        else:
            out[k] = v
    return out


# Device-side pause before each timed call of an in-place op, in microseconds: long enough to cover the host
# time of any launcher here (tens of us), short against the op.
SPIN_US = 150


@cache
def _spin_kernel() -> Any:
    @cuda.jit
    def spin(us):  # type: ignore[no-untyped-def]
        for _ in range(us):
            cuda.nanosleep(1000)

    return spin


def _time_calls(
    fn: Callable[[dict[str, Any]], None],
    sets: list[dict[str, Any]],
    restore: Callable[[dict[str, Any]], None] | None,
    iters: int,
) -> list[float]:
    """Per-call device times in microseconds, rotating over `sets`.

    Calls of out-of-place ops run back to back, so each call's host work overlaps the previous call's kernels
    and the events measure the device. An in-place op's inputs are restored before every call by a few small
    copies, each issued from Python, so the device drains and the start event would also time the host
    launching the op. A short device-side pause after the restore keeps the stream busy while the host
    launches: the events then measure the device for in-place ops too (ours and CuPy's alike)."""
    spin = _spin_kernel() if restore is not None else None
    events = []
    for i in range(WARMUP + iters):
        args = sets[i % len(sets)]
        if restore is not None:
            restore(args)
        if spin is not None:
            spin[1, 1](SPIN_US)
        a, b = cuda.event(), cuda.event()
        a.record()
        fn(args)
        b.record()
        if i >= WARMUP:
            events.append((a, b))
    cuda.synchronize()
    return [cuda.event_elapsed_time(a, b) * 1e3 for a, b in events]


def _stats(us: list[float]) -> dict[str, float]:
    arr = np.asarray(us)
    return {
        "median_us": round(float(np.median(arr)), 2),
        "p10_us": round(float(np.percentile(arr, 10)), 2),
        "p90_us": round(float(np.percentile(arr, 90)), 2),
    }


def _check(problem_ref: dict[str, np.ndarray], args: dict[str, Any]) -> float | None:
    """Worst relative error of the outputs in `args` (None when some are unwritten)."""
    worst = 0.0
    for name, ref in problem_ref.items():
        err, why = rel_error(args[name].copy_to_host(), ref)
        if why is not None:
            return None
        worst = max(worst, err)
    return worst


def bench_case(
    spec: OpSpec, case: Case, rng: np.random.Generator, peaks: dict[str, Any], *, compare: str | None,
    iters: int = ITERS,
) -> dict[str, Any]:  # fmt: skip
    problem = spec.make_problem(case, rng)
    base = stage(problem)
    sets = [base] + [_clone(base) for _ in range(SETS - 1)]
    pristine = {name: _clone({name: base[name]})[name] for name in problem.inplace}

    def restore(args: dict[str, Any]) -> None:
        for name, src in pristine.items():
            args[name].copy_to_device(src)

    rest = restore if problem.inplace else None
    us = _time_calls(spec.launch, sets, rest, iters)
    flops, nbytes = spec.flops(case), spec.bytes(case)
    st = _stats(us)
    sec = st["median_us"] * 1e-6
    row: dict[str, Any] = {
        "op": spec.name, "dtype": case.dtype, "case": case.label, "bound": spec.bound,
        "flops": flops, "bytes": nbytes, **st,
        "tflops": round(flops / sec / 1e12, 3), "gbs": round(nbytes / sec / 1e9, 1),
    }  # fmt: skip
    if spec.path is not None:
        row["path"] = spec.path(case)
    row["sol"] = _sol(spec, row, peaks)
    last = sets[(WARMUP + iters - 1) % len(sets)]
    err = _check(problem.reference, last)
    row["rel_err"], row["ok"] = err, err is not None and err <= spec.tolerance[case.dtype]
    if compare == "cupy":
        row["cupy"] = _bench_cupy(spec, problem.reference, sets, pristine, iters, flops, nbytes, peaks)
        if row["cupy"].get("median_us"):
            row["ratio_vs_cupy"] = round(row["cupy"]["median_us"] / st["median_us"], 3)
    del sets, base
    cuda.current_context().deallocations.clear()
    return row


def _sol(spec: OpSpec, row: dict[str, Any], peaks: dict[str, Any]) -> float | None:
    if spec.bound == "memory":
        return round(row["gbs"] / peaks["mem_gbs"], 3) if peaks.get("mem_gbs") else None
    # tensor-core cases are scored against the tensor-core peak: against the fp32 FMA peak they would read > 1
    key = "fp16_tensor_tflops" if row.get("path") == "mma" else "fp32_tflops"
    return round(row["tflops"] / peaks[key], 3) if peaks.get(key) else None


def _bench_cupy(
    spec: OpSpec, ref: dict[str, np.ndarray], sets: list[dict[str, Any]], pristine: dict[str, Any],
    iters: int, flops: float, nbytes: float, peaks: dict[str, Any],
) -> dict[str, Any]:  # fmt: skip
    if spec.cupy is None:
        return {"error": "no CuPy equivalent"}
    try:
        import cupy as cp
    except ImportError as e:
        return {"error": f"cupy not importable: {e}"}
    wrap = [{k: cp.asarray(v) if cuda.is_cuda_array(v) else v for k, v in s.items()} for s in sets]
    for s in sets:  # poison the outputs again so the check below sees only what CuPy wrote
        for name in ref:
            if name not in pristine:
                s[name].copy_to_device(np.full(s[name].shape, np.nan, dtype=s[name].dtype))

    def restore(args: dict[str, Any]) -> None:
        for name, src in pristine.items():
            cp.copyto(args[name], cp.asarray(src))

    try:
        us = _time_calls(spec.cupy, wrap, restore if pristine else None, iters)
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}"}
    st = _stats(us)
    sec = st["median_us"] * 1e-6
    out: dict[str, Any] = {**st, "tflops": round(flops / sec / 1e12, 3), "gbs": round(nbytes / sec / 1e9, 1)}
    last = sets[(WARMUP + iters - 1) % len(sets)]
    out["rel_err"] = _check(ref, last)
    del wrap
    cp.get_default_memory_pool().free_all_blocks()
    return out


def run(
    ops: list[OpSpec], *, compare: str | None = None, iters: int = ITERS, seed: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:  # fmt: skip
    if SIMULATED:
        raise SimulatorRefused(REFUSAL)
    device.require_device()
    rng = np.random.default_rng(seed)
    pk = device.peaks()
    report: dict[str, Any] = {
        "simulated": False,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(["python", "-m", "kernels", *sys.argv[1:]]),
        "device": device.describe(),
        "versions": device.versions(),
        "peaks": pk,
        "method": {"sets": SETS, "warmup": WARMUP, "iters": iters, "timer": "cuda events per call"},
        "results": [],
    }
    for spec in ops:
        for case in spec.bench_cases:
            if progress is not None:
                progress(f"{spec.name} {case.dtype} {case.label}")
            try:
                report["results"].append(bench_case(spec, case, rng, pk, compare=compare, iters=iters))
            except Exception as e:  # noqa: BLE001  (report the op, keep benchmarking the rest)
                report["results"].append({"op": spec.name, "dtype": case.dtype, "case": case.label,
                                          "ok": False, "error": f"{type(e).__name__}: {e}"})  # fmt: skip
    return report

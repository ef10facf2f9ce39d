"""`python -m kernels bench`: time every op at its benchmark shapes on a real GPU.

Method (../.library/device/METHOD.md): inputs drawn at random once per case, then cloned into `SETS`
device-side copies that are used in rotation, so no timed call finds its inputs in L2 from the call before
(every bench case moves >= 256 MB against a 60 MB L2). In-place inputs are restored from a pristine copy
before every call, outside the timed region, then L2 is flushed (a write of twice its size: the restore would
otherwise leave the op's inputs in L2). Before every timed call, of every op and every provider, a short
device-side pause keeps the stream busy while the host launches it, so the events time the device, not the
host; host time per call is measured apart (`--overhead`). Each call is bracketed by its own pair of CUDA
events on the launch stream, after `WARMUP` untimed calls (compilation, module load). Reported: median, p10
and p90 of the per-call times, achieved TFLOP/s and GB/s from the op's FLOP and byte floors, and SOL =
achieved / binding peak (memory ops: the measured copy bandwidth; compute ops: the fp32 FMA peak, or the dense
fp16 tensor-core peak for a case that ran on tensor cores, path "mma").
With `--compare cupy` the op's CuPy provider runs in the same process on the same buffers (wrapped with
no copy), is timed the same way with its calls interleaved with ours (call i of ours, then call i of
CuPy's, so clock drift and throttling hit both alike; each timed call of an op without a restore right after
an untimed one of the same provider, so that it starts from L2 as its own op leaves it: `time_interleaved`),
its result is checked against the same reference, and `ratio = cupy median / our median` (> 1: ours is
faster).
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
from kernels.runtime import arrays, device
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


def clone_args(args: dict[str, Any]) -> dict[str, Any]:
    """A device-side copy of every device array in `args` (bf16 included); other values as they are."""
    out: dict[str, Any] = {}
    for k, v in args.items():
        if cuda.is_cuda_array(v):
            c = cuda.device_array(v.shape, dtype=v.dtype)
            arrays.words(c).copy_to_device(arrays.words(v))  # bf16 through its uint16 view
            out[k] = c
        else:
            out[k] = v
    return out


# Device-side pause before each timed call, in microseconds: long enough to cover the host time of any
# launcher here (tens of us: Liger-Kernel's Triton launches are the longest), and never inside the events.
SPIN_US = 150


@cache
def spin_kernel() -> Any:
    @cuda.jit
    def spin(us):  # type: ignore[no-untyped-def]
        for _ in range(us):
            cuda.nanosleep(1000)

    return spin


@cache
def _l2_scratch() -> Any:
    l2 = int(device.describe().get("l2_bytes") or 0) or 64 << 20
    return cuda.device_array(2 * l2, dtype=np.uint8)


def flush_l2() -> None:
    """Write twice L2's size of scratch memory: whatever was cached (a restore's copies) is evicted."""
    buf = _l2_scratch()
    cuda.driver.device_memset(buf, 1, buf.size)


Provider = tuple[
    Callable[[dict[str, Any]], None], list[dict[str, Any]], Callable[[dict[str, Any]], None] | None
]


def _time_calls(
    fn: Callable[[dict[str, Any]], None],
    sets: list[dict[str, Any]],
    restore: Callable[[dict[str, Any]], None] | None,
    iters: int,
) -> list[float]:
    return time_interleaved([(fn, sets, restore)], iters)[0]


def time_interleaved(providers: list[Provider], iters: int) -> list[list[float]]:
    """Per-call device times in microseconds, rotating over `sets`, the providers' calls interleaved call by
    call (ours, then a reference library's: benchmarks/h200_llm.py times torch and Liger-Kernel this way).

    Every call, of every provider, is preceded by a short device-side pause (SPIN_US) that keeps the stream
    busy while the host records the start event and launches the op, so the events measure the device alone.
    Without it the device drains whenever the host's work per round (event records, every provider's launch;
    a restore's copies for in-place ops) outlasts the device's: the start event then fires at once and the
    call is charged for the host launching it. That happened to out-of-place calls interleaved with
    Liger-Kernel's: rmsnorm bf16 at 4096 x 8192 measured 66 us on an H100 where Nsight Compute gives its
    kernel 43 us (benchmarks/PERF.md, "rmsnorm's constant 66 us").

    With several providers, each timed call of a provider without a restore comes right after an untimed
    call of its own (on the set before, in the rotation; none with a single set, whose inputs it would leave
    in L2): it starts from L2 as its own op leaves it, the
    steady state of a loop of that op (as the copy ceiling is measured), never as another library's call
    left it. A call pays for the dirty lines still in L2 when it starts, and ops leave different amounts:
    interleaved plainly (ours, torch, Liger), softmax bf16 at 1024-8192 columns measured 0.95-0.96x Liger,
    and 1.02-1.07x in the reverse order (Liger, torch, ours) on the same buffers in the same process; each
    provider's calls back to back, 0.98-0.99x; under Nsight Compute (L2 flushed before each launch) the
    two kernels took the same time within 3 % (benchmarks/PERF.md, "the bench's call order"). A provider
    with a restore starts every call after the restore and L2 flush, the same state for every provider."""
    spin = spin_kernel()
    events: list[list[Any]] = [[] for _ in providers]
    shape = [(len(sets), restore is not None) for _, sets, restore in providers]
    for i, j, s, timed in call_order(shape, iters):
        fn, sets, restore = providers[j]
        if not timed:
            fn(sets[s])
            continue
        if restore is not None:
            restore(sets[s])
            flush_l2()
        spin[1, 1](SPIN_US)
        a, b = cuda.event(), cuda.event()
        a.record()
        fn(sets[s])
        b.record()
        if i >= WARMUP:
            events[j].append((a, b))
    cuda.synchronize()
    return [[cuda.event_elapsed_time(a, b) * 1e3 for a, b in ev] for ev in events]


def call_order(providers: list[tuple[int, bool]], iters: int) -> list[tuple[int, int, int, bool]]:
    """time_interleaved's calls, in order, as (round, provider, input set, timed?), for providers given as
    (number of input sets, has a restore?): WARMUP + iters rounds, each provider once a round on set round %
    sets; with several providers, a provider without a restore and with more than one set is first called,
    untimed, on the set before (one set: the untimed call would leave the timed call's inputs in L2)."""
    lead = len(providers) > 1
    out: list[tuple[int, int, int, bool]] = []
    for i in range(WARMUP + iters):
        for j, (nsets, restored) in enumerate(providers):
            if lead and not restored and nsets > 1:
                out.append((i, j, (i - 1) % nsets, False))
            out.append((i, j, i % nsets, True))
    return out


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
        err, why = rel_error(arrays.to_host(args[name]), ref)
        if why is not None:
            return None
        worst = max(worst, err)
    return worst


def sm_clock_reader(pci_bus_id: str | None) -> Callable[[], float | None]:
    """A function returning the SM clock (MHz) of the benched GPU now, through NVML; one that returns None
    when NVML is missing or the GPU cannot be found. Read right after a case's timed calls, while the GPU is
    still at its load clock: the regression gate tells a throttled node from a slower release by it."""
    try:
        import pynvml as n

        n.nvmlInit()
        # CUDA's attributes give domain:bus:device; NVML wants the function too
        handle = n.nvmlDeviceGetHandleByPciBusId(f"{pci_bus_id}.0")
    except Exception:  # noqa: BLE001  (no NVML: the figures stay, the clock is unknown)
        return lambda: None

    def read() -> float | None:
        try:
            return float(n.nvmlDeviceGetClockInfo(handle, n.NVML_CLOCK_SM))
        except Exception:  # noqa: BLE001
            return None

    return read


def bench_case(
    spec: OpSpec, case: Case, rng: np.random.Generator, peaks: dict[str, Any], *, compare: str | None,
    iters: int = ITERS, sm_clock: Callable[[], float | None] = lambda: None,
) -> dict[str, Any]:  # fmt: skip
    problem = spec.make_problem(case, rng)
    base = stage(problem)
    sets = [base] + [clone_args(base) for _ in range(SETS - 1)]
    pristine = {name: clone_args({name: base[name]})[name] for name in problem.inplace}

    def restore(args: dict[str, Any]) -> None:
        for name, src in pristine.items():
            arrays.words(args[name]).copy_to_device(arrays.words(src))

    rest = restore if problem.inplace else None
    cupy_us: list[float] | None = None
    cupy_row: dict[str, Any] | None = None
    if compare == "cupy":
        us, cupy_us, cupy_row = _interleave_cupy(spec, problem.reference, sets, pristine, rest, iters)
    else:
        us = _time_calls(spec.launch, sets, rest, iters)
    clock_mhz = sm_clock()
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
    row["sm_clock_mhz"] = clock_mhz
    if cupy_row is not None:  # CuPy wrote last: check ours on fresh NaN-poisoned outputs and restored inputs
        _repoison(sets[0], problem.reference, pristine)
        if rest is not None:
            rest(sets[0])
        spec.launch(sets[0])
        cuda.synchronize()
        last = sets[0]
    else:
        last = sets[(WARMUP + iters - 1) % len(sets)]
    err = _check(problem.reference, last)
    row["rel_err"], row["ok"] = err, err is not None and err <= spec.tolerance[case.dtype]
    if compare == "cupy" and cupy_row is not None:
        if cupy_us:
            cst = _stats(cupy_us)
            csec = cst["median_us"] * 1e-6
            cupy_row.update(cst, tflops=round(flops / csec / 1e12, 3), gbs=round(nbytes / csec / 1e9, 1))
        row["cupy"] = cupy_row
        if cupy_row.get("median_us"):
            row["ratio_vs_cupy"] = round(cupy_row["median_us"] / st["median_us"], 3)
    del sets, base
    cuda.current_context().deallocations.clear()
    return row


def _sol(spec: OpSpec, row: dict[str, Any], peaks: dict[str, Any]) -> float | None:
    if spec.bound == "memory":
        return round(row["gbs"] / peaks["mem_gbs"], 3) if peaks.get("mem_gbs") else None
    # tensor-core cases are scored against the tensor-core peak: against the fp32 FMA peak they would read > 1
    key = "fp16_tensor_tflops" if row.get("path") in ("mma", "wgmma", "wgmma_tma") else "fp32_tflops"
    return round(row["tflops"] / peaks[key], 3) if peaks.get(key) else None


def _repoison(args: dict[str, Any], ref: dict[str, np.ndarray], pristine: dict[str, Any]) -> None:
    for name in ref:
        if name not in pristine:
            nan = np.full(args[name].shape, np.nan, dtype=args[name].dtype)
            arrays.words(args[name]).copy_to_device(arrays.host_words(nan))  # bf16 / fp8 as words


def _interleave_cupy(
    spec: OpSpec, ref: dict[str, np.ndarray], sets: list[dict[str, Any]], pristine: dict[str, Any],
    rest: Callable[[dict[str, Any]], None] | None, iters: int,
) -> tuple[list[float], list[float] | None, dict[str, Any]]:  # fmt: skip
    """Ours and CuPy's calls interleaved: (our times, CuPy's times or None, CuPy's row: its error / rel_err).
    CuPy's result is checked on the last set it wrote, after a NaN poisoning of the outputs before timing."""
    if spec.cupy is None:
        return _time_calls(spec.launch, sets, rest, iters), None, {"error": "no CuPy equivalent"}
    try:
        import cupy as cp
    except ImportError as e:
        return _time_calls(spec.launch, sets, rest, iters), None, {"error": f"cupy not importable: {e}"}
    if any(cuda.is_cuda_array(v) and np.dtype(v.dtype) == arrays.BF16 for v in sets[0].values()):
        # (benchmarks/h200_bf16.py and h200_llm.py compare the bf16 cases with torch instead)
        return _time_calls(spec.launch, sets, rest, iters), None, {"error": "CuPy has no bfloat16"}
    wrap = [{k: cp.asarray(v) if cuda.is_cuda_array(v) else v for k, v in s.items()} for s in sets]

    def cp_restore(args: dict[str, Any]) -> None:
        for name, src in pristine.items():
            cp.copyto(args[name], cp.asarray(src))

    cupy_rest = cp_restore if pristine else None
    try:
        ours, theirs = time_interleaved([(spec.launch, sets, rest), (spec.cupy, wrap, cupy_rest)], iters)
    except Exception as e:  # noqa: BLE001  (a CuPy failure must not lose our figure)
        return _time_calls(spec.launch, sets, rest, iters), None, {"error": f"{type(e).__name__}: {e}"}
    _repoison(sets[0], ref, pristine)  # CuPy once more on poisoned outputs: only what it wrote is checked
    if cupy_rest is not None:
        cupy_rest(wrap[0])
    spec.cupy(wrap[0])
    cp.cuda.get_current_stream().synchronize()
    row: dict[str, Any] = {"rel_err": _check(ref, sets[0])}
    del wrap
    cp.get_default_memory_pool().free_all_blocks()
    return ours, theirs, row


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
        "method": {
            "sets": SETS,
            "warmup": WARMUP,
            "iters": iters,
            "timer": "cuda events per call",
            "l2_flush_after_restore": True,
            "pause_before_each_call_us": SPIN_US,  # fleet.gates compares only figures timed alike
            "interleaved_with_reference": compare is not None,
        },
        "results": [],
    }
    sm_clock = sm_clock_reader(report["device"].get("pci_bus_id"))
    for spec in ops:
        for case in spec.bench_cases:
            if progress is not None:
                progress(f"{spec.name} {case.dtype} {case.label}")
            try:
                report["results"].append(
                    bench_case(spec, case, rng, pk, compare=compare, iters=iters, sm_clock=sm_clock)
                )
            except Exception as e:  # noqa: BLE001  (report the op, keep benchmarking the rest)
                report["results"].append({"op": spec.name, "dtype": case.dtype, "case": case.label,
                                          "ok": False, "error": f"{type(e).__name__}: {e}"})  # fmt: skip
    return report

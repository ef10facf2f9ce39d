"""Execution on the instance's GPU: host arrays in, device, launch, host arrays out; the self-test; the
device state (a device error makes the instance not ready until it is restarted).

Compute runs on a pool of `max_concurrency` threads. Each binds the instance's device in its own context
stack (numba keeps one per thread). Device calls are serialised per instance (`_device_lock`): the
launchers are not safe to enter from two threads (shared parameter blocks, graph capture), and neither is
the CUDA simulator, which swaps module globals while a kernel runs.

Retry rule: only a transient failure before any result exists (the device was out of memory while the
inputs were staged or the outputs allocated) is retried, after freeing numba's deferred deallocations, and
only for ops that do not modify their inputs. Any other device error is fatal for the instance: a CUDA
context that saw an illegal address or a launch failure can hand back wrong results, so nothing is retried
onto it and the instance reports not ready.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import cuda
from numba.cuda.cudadrv.driver import CudaAPIError

try:
    from numba.cuda.cudadrv.error import CudaDriverError
except ImportError:  # the simulator's driver has CudaAPIError only
    CudaDriverError = CudaAPIError

from kernels.registry import OpSpec
from kernels.runtime.arrays import SIMULATED
from kernels.serve.config import Config
from kernels.serve.models import BadInput, Model, Plan, nonfinite_count

log = logging.getLogger("solfleet.serve")
CUDA_ERROR_OUT_OF_MEMORY = 2


class DeviceFailed(RuntimeError):
    """A device error: the instance is no longer trusted (not ready)."""


class Transient(RuntimeError):
    """Out of device memory after every retry allowed: the request fails, the instance stays ready."""


@dataclass
class Result:
    outputs: dict[str, np.ndarray]
    compute_s: float
    retries: int


class Engine:
    def __init__(self, *, cfg: Config) -> None:
        self.cfg = cfg
        self.testing = cfg.service.testing
        self._faults_left = {(f.op, f.kind): f.count for f in self.testing.faults}
        self._fault_lock = threading.Lock()
        # One device call at a time per instance, on a GPU as in the simulator. The launchers keep shared
        # parameter blocks and capture CUDA graphs on repeat calls: two threads in them at once overwrite each
        # other's arguments, and a capture in one thread makes another's cuCtxSynchronize fail with
        # CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (seen on the H200 at concurrency 8, benchmarks/PERF.md).
        # Concurrency still overlaps decoding, admission and copies' host side; the device runs one op.
        self._device_lock = threading.Lock()
        self.failed: str | None = None  # why the device is no longer trusted
        # called with (used, total) bytes at most once a second, from a compute thread
        self.memory_sink: Callable[[int, int], None] | None = None
        self._mem_at = 0.0
        self.pool = ThreadPoolExecutor(
            max_workers=cfg.service.max_concurrency,
            thread_name_prefix="compute",
            initializer=self.bind_thread,
        )

    def bind_thread(self) -> None:
        """Make the instance's device current in this thread. With bind=visible_devices the process sees one
        GPU (CUDA_VISIBLE_DEVICES was set before CUDA started), which is device 0."""
        if SIMULATED:
            return
        cuda.select_device(0 if self.cfg.service.bind == "visible_devices" else self.cfg.device_id)

    def memory_info(self) -> tuple[int, int] | None:
        """(free, total) bytes of the whole GPU, None under the simulator."""
        if SIMULATED:
            return None
        free, total = cuda.current_context().get_memory_info()
        return int(free), int(total)

    # --- one request ----------------------------------------------------------------------------------------

    def run(self, model: Model, plan: Plan, host: dict[str, np.ndarray]) -> Result:
        """Runs on a compute thread. Raises BadInput (NaN where it matters), Transient, DeviceFailed."""
        for name in plan.finite:
            bad = nonfinite_count(host[name])
            if bad:
                raise BadInput(
                    f"input {name!r}: {bad} of {host[name].size} elements are NaN or infinite; "
                    f"{model.name} needs finite values there (one would spread through the result)"
                )
        if self.failed is not None:
            raise DeviceFailed(self.failed)
        retries = 0
        allowed = 0 if model.inplace else self.cfg.retry_count
        while True:
            t0 = time.perf_counter()
            try:
                with self._device_lock:
                    outs = self._once(model.spec, plan, host)
                dt = time.perf_counter() - t0
                self._sample_memory()
                return Result(outs, dt, retries)
            except CudaAPIError as e:
                if _code(e) == CUDA_ERROR_OUT_OF_MEMORY:
                    if retries < allowed:
                        retries += 1
                        _free_deferred()
                        continue
                    why = (
                        "not retried: the op modifies its inputs"
                        if model.inplace
                        else f"after {retries} retries"
                    )
                    raise Transient(f"{model.name}: out of device memory ({why})") from None
                self._fail(model.name, e)
            except CudaDriverError as e:
                self._fail(model.name, e)
            except (TypeError, ValueError) as e:  # the launcher's own argument checks
                raise BadInput(f"{model.name}: {e}") from None

    def _sample_memory(self) -> None:
        now = time.monotonic()
        if self.memory_sink is None or now - self._mem_at < 1.0:
            return
        self._mem_at = now
        info = self.memory_info()
        if info is not None:
            self.memory_sink(info[1] - info[0], info[1])

    def _fail(self, op: str, e: Exception) -> None:
        self.failed = f"device error in {op}: {type(e).__name__}: {e}"
        log.error("instance not ready: %s", self.failed)
        raise DeviceFailed(self.failed) from e

    def _once(self, spec: OpSpec, plan: Plan, host: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        args: dict[str, Any] = {}
        self._fault(spec.name, "stage")
        for name, a in host.items():
            args[name] = cuda.to_device(a)
        for name, (shape, dt) in plan.outputs.items():
            if name not in args:
                args[name] = cuda.device_array(shape, dtype=dt)
        args.update(plan.scalars)
        self._fault(spec.name, "launch")
        t = self.testing
        if t.compute_delay_ms and (not t.delay_ops or spec.name in t.delay_ops):
            time.sleep(self.testing.compute_delay_ms / 1000.0)
        spec.launch(args)
        cuda.synchronize()
        return {name: args[name].copy_to_host() for name in plan.outputs}

    def _fault(self, op: str, where: str) -> None:
        """Test-only (service.testing.faults): raise the driver's own error class where the driver would."""
        kind = "oom" if where == "stage" else "gpu"
        if not self._faults_left.get((op, kind)):
            return
        with self._fault_lock:
            left = self._faults_left.get((op, kind), 0)
            if left <= 0:
                return
            self._faults_left[(op, kind)] = left - 1
        if kind == "oom":
            raise CudaAPIError(
                CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY (injected: service.testing)"
            )
        raise CudaAPIError(700, "CUDA_ERROR_ILLEGAL_ADDRESS (injected: service.testing)")


def _code(e: Exception) -> int | None:
    """The CUDA error code (the simulator's CudaAPIError keeps it only in args)."""
    code = getattr(e, "code", None)
    if code is None and e.args and isinstance(e.args[0], int):
        code = e.args[0]
    return code


def _free_deferred() -> None:
    if not SIMULATED:
        cuda.current_context().deallocations.clear()


# --- self-test ----------------------------------------------------------------------------------------------


@dataclass
class SelfTest:
    ok: bool
    results: list[dict[str, Any]]
    seconds: float

    @property
    def failed(self) -> list[str]:
        return [f"{r['op']} {r['dtype']} {r['case']}: {r.get('error')}" for r in self.results if not r["ok"]]


def self_test(*, ops: list[OpSpec], engine: Engine) -> SelfTest:
    """Verify every served op at its smallest case, on the instance's device, in a compute thread (so the
    device binding is the one requests get). On a GPU each dtype of an op is run once (fp16 and fp32 take
    different kernels); under the simulator only the first case, which costs seconds already."""
    from kernels.harness import verify

    def run() -> list[dict[str, Any]]:
        rng = np.random.default_rng()
        out = []
        for spec in ops:
            cases = spec.sim_cases if SIMULATED else spec.verify_cases
            seen: set[str] = set()
            for case in cases[:1] if SIMULATED else cases:
                if case.dtype in seen:
                    continue
                seen.add(case.dtype)
                out.append(verify.check_case(spec, case, rng).as_dict())
        return out

    t0 = time.perf_counter()
    results = engine.pool.submit(run).result()
    ok = bool(results) and all(r["ok"] for r in results)
    return SelfTest(ok, results, time.perf_counter() - t0)

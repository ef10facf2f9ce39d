"""What the per-op tests share: device gates and one-call helpers (kept small on purpose)."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

from kernels.harness import verify
from kernels.registry import Case, OpSpec
from kernels.runtime.arrays import SIMULATED

ON_GPU = not SIMULATED and cuda.is_available()
needs_device = pytest.mark.skipif(
    not (SIMULATED or ON_GPU), reason="no GPU and not under the simulator (set NUMBA_ENABLE_CUDASIM=1)"
)
needs_gpu = pytest.mark.skipif(not ON_GPU, reason="needs a real CUDA GPU")


def case_id(c: Case) -> str:
    return f"{c.label}-{c.dtype}"


def small_cases(spec: OpSpec) -> tuple[Case, ...]:
    """Simulator: the tiny cases; GPU: the odd verification shapes as well."""
    return spec.sim_cases if SIMULATED else spec.sim_cases + spec.verify_cases


def assert_case_passes(spec: OpSpec, case: Case) -> None:
    """The harness's own check: fresh inputs, NaN-poisoned outputs, every output written, rel_err <= tol."""
    res = verify.check_case(spec, case, np.random.default_rng())
    assert res.ok, f"{spec.name} {case.dtype} {case.label}: {res.error}"


def run_rows(fn, sig: str, grid: int, inputs: tuple[np.ndarray, ...], *scalars, fill: float = np.nan):  # type: ignore[no-untyped-def]
    """Launch the row kernel `fn` (compiled for `sig`) on `grid` blocks of BLOCK threads with `inputs` (host
    arrays, x first), an output of x's shape pre-filled with `fill` (NaN: unwritten elements show), and
    `scalars`; return the output as float64. For the row-kernel factories' tests (make_rows*)."""
    from kernels.primitives.reductions import BLOCK
    from kernels.runtime import arrays
    from kernels.runtime.launch import kernel

    x = inputs[0]
    dev = [cuda.to_device(a) for a in (*inputs, np.full(x.shape, fill, x.dtype))]
    operands = (arrays.operand(f"arg{i}", a) for i, a in enumerate(dev))
    kernel(fn, sig).launch(grid, BLOCK, (*operands, *scalars))
    return dev[-1].copy_to_host().astype(np.float64)


def fake_graph_class(launched: list) -> type:  # type: ignore[type-arg]
    """A stand-in for kernels.runtime.launch.LaunchGraph over a stubbed driver whose launches append to
    `launched`: capturing runs the record callback and moves what it launched into `captured` (a capture runs
    nothing); `replays` counts launches, `closed` tells whether it was freed; every instance lands in
    `made`; `updates` lists the set_kernel_params calls as (launch index, that kernel's parameter block)."""

    class FakeGraph:
        made: list[FakeGraph] = []

        def __init__(self, record, updatable=False):  # type: ignore[no-untyped-def]
            n0 = len(launched)
            record("capture stream")
            self.captured = launched[n0:]
            del launched[n0:]
            self.replays, self.closed, self.updatable = 0, False, updatable
            self.updates: list[tuple[int, list[int]]] = []
            FakeGraph.made.append(self)

        def set_kernel_params(self, i, kern, grid, block, shared=0):  # type: ignore[no-untyped-def]
            assert self.updatable, "set_kernel_params on a graph captured without updatable=True"
            self.updates.append((i, list(kern._block)))

        def launch(self, hs):  # type: ignore[no-untyped-def]
            self.replays += 1

        def close(self):  # type: ignore[no-untyped-def]
            self.closed = True

    return FakeGraph

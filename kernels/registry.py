"""The operator registry: one `OpSpec` per operator, the contract between ops and the verify/bench harness.

Every operator module under `kernels/ops/` defines its kernel(s), a host launcher, a float64 numpy reference,
its FLOP/byte model, tolerance and shapes, and registers one or more `OpSpec`s with `register()`. The harness
(`kernels.harness.verify`, `kernels.harness.bench`) never knows an op by name: it only walks `all_ops()`.

The harness does, for every case:
  1. `problem = spec.make_problem(case, rng)`: fresh random host inputs and the outputs to allocate.
  2. copies inputs to the device, allocates every output on the device filled with NaN (poison),
  3. `spec.launch(dev_args)`: dev_args holds the inputs and the outputs by name; in-place ops modify inputs
     named in `problem.inplace`,
  4. copies outputs (and in-place inputs) back, checks every element is finite where the reference is (and
     NaN / the same infinity where it is not), compares ||out - ref|| / ||ref|| (float64) with
     `spec.tolerance[case.dtype]` and the per-element error with `spec.elem_tolerance_of(case.dtype)`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Case:
    """One problem instance of an op: a label, shape parameters and the input dtype."""

    label: str
    params: Mapping[str, int]
    dtype: str  # "float32" | "float16" | ...


@dataclass
class Problem:
    """Host inputs of one case, the outputs to allocate, and the float64 reference results."""

    inputs: dict[str, np.ndarray]
    outputs: dict[str, tuple[tuple[int, ...], np.dtype]]  # name -> (shape, dtype), poisoned with NaN
    reference: dict[str, np.ndarray]  # name (output or in-place input) -> float64 expected value
    inplace: tuple[str, ...] = ()  # inputs the op modifies; compared with reference after the launch
    scalars: dict[str, Any] = field(default_factory=dict)  # non-array arguments (eps, max_norm, ...)


TIERS = ("primary", "fallback", "simulated")


@dataclass(frozen=True)
class Choice:
    """What an op's "auto" launcher runs for one case on this machine, and why (`kernels info`, verify).
    tier: "primary" (the kernel built for this dtype and device), "fallback" (a slower path taken because
    the primary one cannot run here: no tensor cores for the dtype, rows too long, too many arrays) or
    "simulated" (the CUDA simulator: no speed to speak of)."""

    path: str
    tier: str
    why: str

    def as_dict(self) -> dict[str, str]:
        return {"path": self.path, "tier": self.tier, "why": self.why}


@dataclass(frozen=True)
class OpSpec:
    name: str
    dtypes: tuple[str, ...]
    make_problem: Callable[[Case, np.random.Generator], Problem]
    # launch(args) runs the op on device arrays; args = inputs | outputs | scalars, by name. Returns nothing;
    # results land in the output / in-place arrays.
    launch: Callable[[dict[str, Any]], None]
    flops: Callable[[Case], float]  # floating-point operations of one call
    bytes: Callable[[Case], float]  # fewest bytes one call must move through device memory
    tolerance: Mapping[str, float]  # dtype -> max relative error ||out-ref||/||ref||
    sim_cases: tuple[Case, ...]  # tiny, odd shapes for the CUDA simulator
    verify_cases: tuple[Case, ...]  # odd, non-power-of-two shapes for a real GPU
    bench_cases: tuple[Case, ...]  # benchmark shapes (memory-bound ops move >= 256 MB)
    # the same computation through CuPy (cuBLAS / CuPy elementwise) for `bench --compare cupy`; takes the same
    # args dict with CuPy arrays and returns nothing (writes outputs). None when there is no fair equivalent.
    cupy: Callable[[dict[str, Any]], None] | None = None
    bound: str = "memory"  # "memory" | "compute": which peak SOL is scored against
    # kernels to compile offline to PTX for the artifact manifest: (kernel name, @cuda.jit dispatcher or
    # python function, numba signature string). Kernels that link external CUDA C add a 4th item, their link
    # files (see kernels.runtime.ptx).
    ptx_kernels: tuple[tuple[Any, ...], ...] = ()
    # which implementation the launcher takes for a case on this machine (e.g. "portable" under the
    # simulator, "mma" on tensor cores), for ops with several; verify/bench put it in each result as "path".
    # None: one path.
    path: Callable[[Case], str] | None = None
    # dtype -> per-element bound max |out - ref| / (|ref| + rms(ref)) (kernels.harness.verify); absent dtypes
    # take ELEM_TOLERANCE. Set above the largest error measured (simulator and H200 verify report `elem_err`)
    # and far below the ~1 of a wrong element.
    elem_tolerance: Mapping[str, float] = field(default_factory=dict)
    # small cases whose make_problem puts NaN and infinities into the inputs (params["specials"], see
    # `poison`): every output must be NaN / +inf / -inf exactly where the float64 reference is, and right
    # elsewhere. Verify runs them in the simulator and on the GPU; docs/ops.md states each op's behaviour.
    special_cases: tuple[Case, ...] = ()
    # `path` with its reason and tier (see Choice), for ops whose "auto" picks among several kernels. None:
    # the op has one kernel per dtype, its primary one (`choice` says so).
    choose: Callable[[Case], Choice] | None = None

    def choice(self, case: Case) -> Choice:
        """What "auto" runs for `case` here, and why."""
        if self.choose is not None:
            return self.choose(case)
        from kernels.runtime.arrays import SIMULATED

        path = self.path(case) if self.path is not None else "default"
        if SIMULATED:
            return Choice(path, "simulated", "the CUDA simulator runs the op's kernel")
        return Choice(path, "primary", f"the op's {case.dtype} kernel")

    def elem_tolerance_of(self, dtype: str) -> float:
        return float(self.elem_tolerance.get(dtype, ELEM_TOLERANCE.get(dtype, 1e-2)))


# measured in the simulator at every sim case: fp32 <= 5e-7, fp16 <= 3.6e-4 (under one fp16 ulp, 2^-11); the
# bounds leave room for GPU accumulation orders and fastmath (fp32 ~200x, fp16 ~8 ulps) and stay far below
# the ~1 of a wrong element
ELEM_TOLERANCE: dict[str, float] = {"float32": 1e-4, "float16": 4e-3}


SPECIALS = "specials"  # Case.params key: 1 = NaN, +inf and -inf in the inputs; 2 = +inf only


def poison(x: np.ndarray, kind: int = 1) -> np.ndarray:
    """A copy of `x` with NaN at its first element, +inf at its middle one and -inf at its last (kind 1), or
    +inf at the middle one only (kind 2). In a matrix of 4 rows they land in rows 0, 2 and 3: row 1 stays
    finite (an op may fill it with a special pattern of its own)."""
    y = np.array(x, copy=True)
    flat = y.reshape(-1)
    if kind == 2:
        flat[flat.size // 2] = np.inf
    else:
        flat[[0, flat.size // 2, flat.size - 1]] = [np.nan, np.inf, -np.inf]
    return y


_REGISTRY: dict[str, OpSpec] = {}


def register(spec: OpSpec) -> OpSpec:
    if spec.name in _REGISTRY:
        raise ValueError(f"op {spec.name!r} registered twice")
    _REGISTRY[spec.name] = spec
    return spec


def all_ops() -> dict[str, OpSpec]:
    """Every registered op, by name (importing kernels.ops registers them)."""
    import kernels.ops  # noqa: F401  (registration side effect)

    return dict(_REGISTRY)


def select(names: str | None) -> list[OpSpec]:
    """Parse `--ops a,b`; unknown names raise ValueError naming the allowed ones."""
    ops = all_ops()
    if not names:
        return list(ops.values())
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in ops]
    if unknown:
        raise ValueError(f"unknown op(s) {', '.join(unknown)}; allowed: {', '.join(sorted(ops))}")
    return [ops[n] for n in wanted]

"""gemm: every path against the float64 reference (simulator at tiny odd shapes, GPU at verify and bench
shapes), and the launcher's validation errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from numba import cuda

from kernels.arrays import SIMULATED
from kernels.ops import gemm as g
from kernels.registry import Case

ON_GPU = not SIMULATED and cuda.is_available()
needs_device = pytest.mark.skipif(
    not (SIMULATED or ON_GPU), reason="no GPU and not under the simulator (set NUMBA_ENABLE_CUDASIM=1)"
)
gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not ON_GPU, reason="needs a real CUDA GPU")


def gpu_paths(dtype: str) -> list[str]:
    """Every path that can run `dtype` on this GPU."""
    paths = ["portable", "simt", "simt_wide"]
    if dtype == "float16" and g.mma.available():
        paths.append("mma")
    return paths


def run_case(case: Case, path: str, seed: int) -> float:
    """Fresh inputs, NaN-poisoned device output, one launch; returns ||c - ref|| / ||ref|| after checking
    that every element was written."""
    prob = g.SPEC.make_problem(case, np.random.default_rng(seed))
    a = cuda.to_device(prob.inputs["a"])
    b = cuda.to_device(prob.inputs["b"])
    shape, dt = prob.outputs["c"]
    c = cuda.to_device(np.full(shape, np.nan, dtype=dt))
    g.gemm(a, b, c, path=path)
    got = c.copy_to_host().astype(np.float64)
    assert np.isfinite(got).all(), f"{case.label} {case.dtype} {path}: output not fully written"
    ref = prob.reference["c"]
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


@needs_device
@pytest.mark.parametrize("case", g.SPEC.sim_cases, ids=lambda c: f"{c.label}-{c.dtype}")
def test_sim_cases_auto_path(case: Case) -> None:
    err = run_case(case, "auto", seed=np.random.SeedSequence().entropy % 2**32)
    assert err <= g.SPEC.tolerance[case.dtype], err


@needs_device
def test_numpy_in_numpy_out_and_auto_path_name() -> None:
    rng = np.random.default_rng()
    a = rng.standard_normal((5, 3)).astype(np.float32)
    b = rng.standard_normal((3, 7)).astype(np.float32)
    c = g.gemm(a, b)
    assert isinstance(c, np.ndarray) and c.dtype == np.float32 and c.shape == (5, 7)
    np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
    expected = "portable" if SIMULATED else g.SIMT_DEFAULT
    assert g.path_for(Case("x", {"M": 5, "N": 7, "K": 3}, "float32")) == expected


# --- launcher validation ----------------------------------------------------------------------------------


def _mat(shape: tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
    return np.ones(shape, dtype=dtype)


@needs_device
@pytest.mark.parametrize(
    ("a", "b", "exc", "match"),
    [
        (_mat((4, 3)), _mat((5, 2)), ValueError, r"b: inner dimensions do not match.*K = 3"),
        (_mat((4, 3, 1)), _mat((1, 2)), ValueError, r"a: expected 2 dimensions, got shape \(4, 3, 1\)"),
        (_mat((4, 3)), _mat((3,)), ValueError, r"b: expected 2 dimensions"),
        (_mat((4, 3), np.float64), _mat((3, 2), np.float64), TypeError, r"a: dtype float64 is not supported"),
        (_mat((4, 3), np.int32), _mat((3, 2), np.int32), TypeError, r"a: dtype int32"),
        (_mat((4, 3)), _mat((3, 2), np.float16), TypeError, r"b: dtype float16 must match a's dtype float32"),
        (_mat((4, 6))[:, ::2], _mat((3, 2)), ValueError, r"a: expected a C-contiguous array"),
        (_mat((0, 3)), _mat((3, 2)), ValueError, r"a: expected a non-empty array"),
        ([[1.0]], _mat((1, 1)), TypeError, r"a: expected a numpy array"),
    ],
)
def test_validation_errors(a: Any, b: Any, exc: type[Exception], match: str) -> None:
    with pytest.raises(exc, match=match):
        g.gemm(a, b)


@needs_device
def test_non_contiguous_device_array_rejected() -> None:
    bt = cuda.to_device(_mat((2, 3))).T  # device view with transposed strides
    with pytest.raises(ValueError, match=r"b: expected a C-contiguous array"):
        g.gemm(_mat((4, 3)), bt)


@needs_device
def test_bad_out_and_path() -> None:
    with pytest.raises(ValueError, match=r"out: expected shape \(4, 2\)"):
        g.gemm(_mat((4, 3)), _mat((3, 2)), _mat((4, 3)))
    with pytest.raises(TypeError, match=r"out: dtype float16 is not allowed; expected float32"):
        g.gemm(_mat((4, 3)), _mat((3, 2)), _mat((4, 2), np.float16))
    with pytest.raises(ValueError, match=r"path: 'fast' is not a matmul path; allowed: auto, portable"):
        g.gemm(_mat((4, 3)), _mat((3, 2)), path="fast")
    with pytest.raises(ValueError, match=r"path: 'mma' needs"):
        g.gemm(_mat((4, 3)), _mat((3, 2)), path="mma")  # fp32 inputs (or the simulator): no tensor-core path


# --- real GPU: every path at verify and bench shapes ------------------------------------------------------


@gpu
@needs_gpu
@pytest.mark.parametrize(
    "case", g.SPEC.verify_cases + g.SPEC.bench_cases, ids=lambda c: f"{c.label}-{c.dtype}"
)
def test_gpu_every_path(case: Case) -> None:
    for path in gpu_paths(case.dtype):
        err = run_case(case, path, seed=int(np.random.SeedSequence().entropy % 2**32))
        assert err <= g.SPEC.tolerance[case.dtype], f"{path}: rel err {err:.3g}"

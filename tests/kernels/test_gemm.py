"""gemm: every path against the float64 reference (simulator at tiny odd shapes, GPU at verify and bench
shapes), and the launcher's validation errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from numba import cuda

from kernels.ops import gemm as g
from kernels.registry import Case
from kernels.runtime import arrays
from kernels.runtime.arrays import SIMULATED

ON_GPU = not SIMULATED and cuda.is_available()
needs_device = pytest.mark.skipif(
    not (SIMULATED or ON_GPU), reason="no GPU and not under the simulator (set NUMBA_ENABLE_CUDASIM=1)"
)
gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not ON_GPU, reason="needs a real CUDA GPU")


def gpu_paths(dtype: str) -> list[str]:
    """Every path that can run `dtype` on this GPU."""
    paths = ["portable"] + (["simt"] if dtype == "float32" else [])
    if dtype == "float16" and g.mma.available():
        paths.append("mma")
    if dtype != "float32" and g.wgmma.available():
        paths += list(g.WGMMA_PATHS)
    return paths


def run_case(case: Case, path: str, seed: int) -> float:
    """Fresh inputs, NaN-poisoned device output, one launch; returns ||c - ref|| / ||ref|| after checking
    that every element was written."""
    prob = g.SPEC.make_problem(case, np.random.default_rng(seed))
    a = arrays.to_device(prob.inputs["a"])  # bf16 through its uint16 words
    b = arrays.to_device(prob.inputs["b"])
    shape, dt = prob.outputs["c"]
    c = arrays.to_device(np.full(shape, np.nan, dtype=dt))
    g.gemm(a, b, c, path=path)
    got = arrays.to_host(c).astype(np.float64)
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
    expected = "portable" if SIMULATED else "simt"
    assert g.path_for(Case("x", {"M": 5, "N": 7, "K": 3}, "float32")) == expected


# --- simt: the generated kernel, on the simulator at small shapes that reach every code path ---------------
# (16-byte variant: 128 x 256 tiles, BK 16; 4-byte variant: 128 x 128, BK 16): one partial block; K tails of
# 4, 12 and 1; N, K multiples of 4 (16-byte variant) and not (4-byte variant); 2 x 2 blocks with full
# interior rows/columns and clamped edges


@needs_device
@pytest.mark.parametrize(
    ("m", "n", "k"),
    [(19, 23, 17), (20, 24, 12), (5, 8, 4), (1, 3, 1), (130, 132, 20), (129, 131, 9), (129, 264, 28)],
)
def test_simt_path(m: int, n: int, k: int) -> None:
    case = Case("x", {"M": m, "N": n, "K": k}, "float32")
    err = run_case(case, "simt", seed=int(np.random.SeedSequence().entropy % 2**32))
    assert err <= g.SPEC.tolerance["float32"], err


def _launch_gen(kern: Any, a: np.ndarray, b: np.ndarray, tn: int) -> np.ndarray:
    m, k = a.shape
    n = b.shape[1]
    c = cuda.to_device(np.full((m, n), np.nan, np.float32))
    da, db = cuda.to_device(a.ravel()), cuda.to_device(b.ravel())
    grid = ((m + 127) // 128) * ((n + 16 * tn - 1) // (16 * tn))
    kern[grid, g.simt.THREADS](da, db, c.ravel(), c.ravel(), c.ravel(), m, n, k)
    return c.copy_to_host()


@needs_device
@pytest.mark.parametrize(
    ("params", "shape"),
    [
        ({"bk": 16, "vec": True}, (20, 24, 36)),  # BK 16: two staging parts per slice, K tail of 4
        ({"bk": 16, "vec": False}, (19, 23, 49)),
        ({"bk": 8, "vec": True, "dbuf": False, "layout": "2x16"}, (21, 28, 20)),
        ({"bk": 8, "vec": False, "group": 2}, (300, 140, 9)),  # 3 x 2 blocks in groups of 2 block rows
        ({"bk": 8, "vec": True, "tn": 16}, (20, 260, 12)),  # 128 x 256 tiles: 2 column blocks, K tail
        ({"bk": 16, "vec": False, "tn": 16}, (19, 37, 21)),  # 48 KB of shared memory: unpadded A rows
    ],
)
def test_simt_generator_variants(params: dict[str, Any], shape: tuple[int, int, int]) -> None:
    """The generator's other settings (the tuning space of simt.Config) compute the same."""
    m, n, k = shape
    rng = np.random.default_rng()
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    p = {"group": 8, "dbuf": True, "min_blocks": 2, "layout": "4x8", "tn": 8, **params}
    kern = g.simt.build(
        p["bk"], p["vec"], False, False, p["group"], p["dbuf"], p["min_blocks"], p["layout"], p["tn"]
    )
    got = _launch_gen(kern, a, b, p["tn"]).astype(np.float64)
    assert np.isfinite(got).all(), "output not fully written"
    ref = a.astype(np.float64) @ b
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) <= 2e-5


class _FakeBound:
    def __init__(self) -> None:
        self.calls: list[tuple[tuple[int, ...], int]] = []

    def launch(self, ptrs: tuple[int, ...], stream: int = 0) -> None:
        self.calls.append((tuple(ptrs), stream))


@pytest.mark.parametrize(
    ("has_res", "has_bias", "expected"),
    [
        (False, False, (1, 2, 99, 3, 3)),  # gemm: (a, b, out) -> slots (a, b, bias, res, out)
        (True, False, (1, 2, 99, 4, 3)),  # o_proj: (a, b, out, res)
        (True, True, (1, 2, 5, 4, 3)),  # o_proj with bias: (a, b, out, res, bias)
        (False, True, (1, 2, 4, 3, 3)),
    ],
)
def test_replay_maps_cache_pointers_to_kernel_slots(
    has_res: bool, has_bias: bool, expected: tuple[int, ...]
) -> None:
    fake = _FakeBound()
    rep = g._kernel_replay(fake, 99, has_res, has_bias)
    rep.launch((1, 2, 3, 4, 5)[: 3 + has_res + has_bias], 7)
    assert fake.calls == [(expected, 7)]


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
    # every other column: a strided device view (numba's device `.T` makes a contiguous copy on a GPU)
    b = cuda.to_device(_mat((3, 4)))[:, ::2]
    with pytest.raises(ValueError, match=r"b: expected a C-contiguous array"):
        g.gemm(_mat((4, 3)), b)


@needs_device
def test_bad_out_and_path() -> None:
    with pytest.raises(ValueError, match=r"out: expected shape \(4, 2\)"):
        g.gemm(_mat((4, 3)), _mat((3, 2)), _mat((4, 3)))
    with pytest.raises(TypeError, match=r"out: dtype float16 is not allowed; expected float32"):
        g.gemm(_mat((4, 3)), _mat((3, 2)), _mat((4, 2), np.float16))
    with pytest.raises(ValueError, match=r"path: 'fast' is not a gemm path; allowed: auto, portable"):
        g.gemm(_mat((4, 3)), _mat((3, 2)), path="fast")
    with pytest.raises(ValueError, match=r"path: 'mma' needs"):
        g.gemm(_mat((4, 3)), _mat((3, 2)), path="mma")  # fp32 inputs (or the simulator): no tensor-core path
    with pytest.raises(ValueError, match=r"path: 'simt' needs float32 inputs"):
        g.gemm(_mat((4, 3), np.float16), _mat((3, 2), np.float16), path="simt")
    with pytest.raises(
        ValueError, match=r"path: 'simt2' is not a gemm path; allowed: auto, portable, simt, mma"
    ):
        g.gemm(_mat((4, 3)), _mat((3, 2)), path="simt2")


@needs_device
def test_out_overlapping_an_input_is_refused() -> None:
    # every tile reads a and b while other tiles write C: C over either of them is refused before a launch,
    # the buffer untouched
    buf = np.arange(64, dtype=np.float32)
    before = buf.copy()
    a, b = buf[:12].reshape(4, 3), buf[20:26].reshape(3, 2)
    with pytest.raises(ValueError, match=r"out: must not overlap a \(other tiles still read it while"):
        g.gemm(a, _mat((3, 2)), buf[4:12].reshape(4, 2))
    with pytest.raises(ValueError, match=r"out: must not overlap b "):
        g.gemm(_mat((4, 3)), b, buf[18:26].reshape(4, 2))
    np.testing.assert_array_equal(buf, before)
    out = buf[32:40].reshape(4, 2)  # the same buffer, apart: fine
    g.gemm(a, b, out)
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-6)


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

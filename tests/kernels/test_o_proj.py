"""o_proj (fused attn @ W + bias + residual): every path against the float64 reference, and the launcher's
validation errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from numba import cuda

from kernels.ops import gemm as g
from kernels.ops import o_proj as op
from kernels.registry import Case
from kernels.runtime import arrays
from kernels.runtime.arrays import SIMULATED

ON_GPU = not SIMULATED and cuda.is_available()
needs_device = pytest.mark.skipif(
    not (SIMULATED or ON_GPU), reason="no GPU and not under the simulator (set NUMBA_ENABLE_CUDASIM=1)"
)
needs_gpu = pytest.mark.skipif(not ON_GPU, reason="needs a real CUDA GPU")


def run_case(case: Case, path: str, seed: int) -> float:
    prob = op.SPEC.make_problem(case, np.random.default_rng(seed))
    dev = {k: arrays.to_device(v) for k, v in prob.inputs.items()}  # bf16 through its uint16 words
    shape, dt = prob.outputs["out"]
    out = arrays.to_device(np.full(shape, np.nan, dtype=dt))
    op.o_proj(dev["attn"], dev["w"], dev["residual"], dev.get("bias"), out, path=path)
    got = arrays.to_host(out).astype(np.float64)
    assert np.isfinite(got).all(), f"{case.label} {case.dtype} {path}: output not fully written"
    ref = prob.reference["out"]
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


def _seed() -> int:
    return int(np.random.SeedSequence().entropy % 2**32)


@needs_device
@pytest.mark.parametrize("case", op.SPEC.sim_cases, ids=lambda c: f"{c.label}-{c.dtype}")
def test_sim_cases_auto_path(case: Case) -> None:
    assert run_case(case, "auto", _seed()) <= op.SPEC.tolerance[case.dtype]


@needs_device
@pytest.mark.parametrize(
    ("b", "s", "k", "n", "bias"),
    [(2, 5, 17, 23, 1), (1, 6, 12, 20, 1), (1, 6, 12, 20, 0), (1, 130, 9, 132, 0)],
    ids=["odd+bias-4byte", "aligned+bias-16byte", "aligned-16byte", "2x2-blocks-4byte"],
)
def test_simt_path(b: int, s: int, k: int, n: int, bias: int) -> None:
    """The generated fp32 kernel's fused epilogue (bias, residual) in both load widths, on the simulator."""
    case = Case("x", {"B": b, "S": s, "K": k, "N": n, "bias": bias}, "float32")
    assert run_case(case, "simt", _seed()) <= op.SPEC.tolerance["float32"]


@needs_device
def test_2d_attn_numpy_without_bias() -> None:
    rng = np.random.default_rng()
    attn = rng.standard_normal((6, 5)).astype(np.float32)
    w = rng.standard_normal((5, 3)).astype(np.float32)
    res = rng.standard_normal((6, 3)).astype(np.float32)
    out = op.o_proj(attn, w, res)
    assert isinstance(out, np.ndarray) and out.shape == (6, 3) and out.dtype == np.float32
    np.testing.assert_allclose(out, attn.astype(np.float64) @ w + res, rtol=1e-5, atol=1e-5)


def _t(shape: tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
    return np.ones(shape, dtype=dtype)


@needs_device
@pytest.mark.parametrize(
    ("kw", "exc", "match"),
    [
        ({"w": _t((6, 3))}, ValueError, r"w: inner dimensions do not match: attn has K = 5"),
        ({"attn": _t((5,))}, ValueError, r"attn: expected 2 or 3 dimensions, got shape \(5,\)"),
        ({"residual": _t((2, 4, 4))}, ValueError, r"residual: expected shape \(2, 4, 3\)"),
        ({"bias": _t((4,))}, ValueError, r"bias: expected shape \(3,\)"),
        ({"w": _t((5, 3), np.float16)}, TypeError, r"w: dtype float16 must match attn's dtype float32"),
        ({"residual": _t((2, 4, 3), np.float16)}, TypeError, r"residual: dtype float16 must match"),
        ({"bias": _t((3,), np.float64)}, TypeError, r"bias: dtype float64 must match"),
        (
            {"attn": _t((2, 4, 5), np.float64), "w": _t((5, 3), np.float64)},
            TypeError,
            r"attn: dtype float64 is not supported",
        ),
        ({"residual": _t((2, 4, 6))[:, :, ::2]}, ValueError, r"residual: expected a C-contiguous array"),
        ({"out": _t((2, 4, 3), np.float16)}, TypeError, r"out: dtype float16 is not allowed"),
    ],
)
def test_validation_errors(kw: dict[str, Any], exc: type[Exception], match: str) -> None:
    args: dict[str, Any] = {"attn": _t((2, 4, 5)), "w": _t((5, 3)), "residual": _t((2, 4, 3)), "bias": None}
    args.update(kw)
    with pytest.raises(exc, match=match):
        op.o_proj(args["attn"], args["w"], args["residual"], args["bias"], args.get("out"))


@needs_device
def test_out_may_be_the_residual_itself_and_overlap_nothing_else() -> None:
    # in place over the residual (each element read by the thread that writes it, first) is right; out
    # over the product's inputs or the bias, or over part of the residual, is refused before a launch
    rng = np.random.default_rng(3)
    attn = rng.standard_normal((2, 4, 5)).astype(np.float32)
    w = rng.standard_normal((5, 3)).astype(np.float32)
    bias = rng.standard_normal(3).astype(np.float32)
    res = rng.standard_normal((2, 4, 3)).astype(np.float32)
    want = attn.astype(np.float64) @ w + bias + res
    dres = cuda.to_device(res)  # device arrays: the kernel itself runs in place over the residual
    dattn, dw, dbias = (cuda.to_device(v) for v in (attn, w, bias))
    assert op.o_proj(dattn, dw, dres, dbias, out=dres) is dres
    np.testing.assert_allclose(dres.copy_to_host(), want, rtol=1e-5, atol=1e-5)
    assert op.o_proj(attn, w, res, bias, out=res) is res  # numpy: the same rule, the result copied back
    np.testing.assert_allclose(res, want, rtol=1e-5, atol=1e-5)
    buf = np.zeros(64, np.float32)
    cases = [
        (buf[:40].reshape(2, 4, 5), w, buf[:24], bias, "out: must not overlap attn "),
        (attn, buf[:15].reshape(5, 3), buf[12:36], bias, "out: must not overlap w "),
        (attn, w, buf[:24], buf[20:23], "out: must not overlap bias "),
        (attn, w, buf[3:27], None, r"out: must be residual itself or not overlap it \(each element"),
    ]
    for a, ww, out, b, match in cases:
        r = buf[:24].reshape(2, 4, 3) if "residual" in match else _t((2, 4, 3))
        with pytest.raises(ValueError, match=match):
            op.o_proj(a, ww, r, b, out=out.reshape(2, 4, 3))
    assert not buf.any()  # nothing was written


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize(
    "case", op.SPEC.verify_cases + op.SPEC.bench_cases, ids=lambda c: f"{c.label}-{c.dtype}"
)
def test_gpu_every_path(case: Case) -> None:
    paths = ["portable"] + (["simt"] if case.dtype == "float32" else [])
    if case.dtype == "float16" and g.mma.available():
        paths.append("mma")
    for path in paths:
        err = run_case(case, path, _seed())
        assert err <= op.SPEC.tolerance[case.dtype], f"{path}: rel err {err:.3g}"

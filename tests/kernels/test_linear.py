"""linear (x @ W.T + bias, then an activation, in one kernel): every activation and dtype against the float64
reference, torch's layout and semantics, the selection rule (the Hopper tiles on cc 9.0 alone, a fallback
elsewhere), and bad input refused with one line naming what is allowed."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda
from opcheck import assert_case_passes, case_id, needs_device, needs_gpu, small_cases

from kernels.ops import linear as lin
from kernels.registry import Case
from kernels.runtime import arrays
from kernels.runtime.arrays import BF16

F16 = np.dtype(np.float16)


@needs_device
@pytest.mark.parametrize("case", small_cases(lin.SPEC), ids=case_id)
def test_cases_match_float64(case: Case) -> None:
    assert_case_passes(lin.SPEC, case)


def _problem(dt: np.dtype, m: int, k: int, n: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)).astype(dt)
    w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(dt)
    b = (0.5 * rng.standard_normal(n)).astype(dt)
    return x, w, b


@needs_device
@pytest.mark.parametrize("dt", [F16, BF16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("act", lin.ACTIVATIONS)
def test_each_activation_is_the_one_asked_for(dt: np.dtype, act: str) -> None:
    """The output matches its own activation's reference and not the others' (a swapped epilogue fails)."""
    x, w, b = _problem(dt, 13, 24, 16, seed=3)
    got = np.asarray(lin.linear(x, w, b, activation=act)).astype(np.float64)
    tol = lin.SPEC.tolerance[dt.name]
    errs = {}
    for other in lin.ACTIVATIONS:
        ref = lin.reference(x, w, b, other)
        errs[other] = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
    assert errs[act] <= tol, errs
    assert all(e > 10 * tol for o, e in errs.items() if o != act), errs


@needs_device
def test_torch_layout_and_3d_input_without_bias() -> None:
    """weight is [N, K] (torch's Linear): out[..., j] = sum_k x[..., k] * weight[j, k]; 3-D x keeps its
    leading dimensions."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 7, 16)).astype(F16)
    w = rng.standard_normal((24, 16)).astype(F16) / 4
    out = np.asarray(lin.linear(x, w))
    assert out.shape == (2, 7, 24) and out.dtype == F16
    want = np.einsum("bsk,nk->bsn", x.astype(np.float64), w.astype(np.float64))
    assert np.abs(out - want).max() <= 2e-3 * np.abs(want).max()


@needs_device
def test_device_out_replays_with_new_inputs() -> None:
    """A second call with the same layout (the FastCache replay) computes from the new inputs."""
    x, w, b = _problem(BF16, 16, 32, 24, seed=7)
    dx, dw, db = (arrays.to_device(a) for a in (x, w, b))
    out = arrays.to_device(np.zeros((16, 24), BF16))
    lin.linear(dx, dw, db, out, activation="silu")
    x2 = (2 * x.astype(np.float32)).astype(BF16)
    dx2 = arrays.to_device(x2)
    lin.linear(dx2, dw, db, out, activation="silu")
    got = arrays.to_host(out).astype(np.float64)
    ref = lin.reference(x2, w, b, "silu")
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) <= lin.SPEC.tolerance["bfloat16"]


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (
            lambda x, w, b: lin.linear(x, w, b, activation="relu"),
            "activation: 'relu' is not supported; allowed: none, silu, gelu_tanh",
        ),  # fmt: skip
        (lambda x, w, b: lin.linear(x.astype(np.float32), w.astype(np.float32)), "float32"),
        (lambda x, w, b: lin.linear(x, np.ascontiguousarray(w[:, :-1])), r"weight: shape \(16, 23\) does"),
        (lambda x, w, b: lin.linear(x, w, b[:-1]), "bias"),
        (lambda x, w, b: lin.linear(x, w.astype(BF16)), "weight"),
        (lambda x, w, b: lin.linear(x, w, path="mma"), "allowed: auto, portable, wgmma, wgmma_tma$"),
    ],
    ids=["activation", "fp32", "k-mismatch", "bias-shape", "mixed-dtypes", "path"],
)
def test_bad_input_is_refused_naming_what_is_allowed(call, match) -> None:  # type: ignore[no-untyped-def]
    x, w, b = _problem(F16, 4, 24, 16)
    with pytest.raises((ValueError, TypeError), match=match):
        call(x, w, b)


def test_out_overlapping_an_input_is_refused() -> None:
    # out over x, weight or the bias (read by every tile while others write) is refused before a launch
    x, w, b = _problem(F16, 4, 24, 16)
    buf = np.zeros(512, F16)
    cases = [
        (buf[:96].reshape(4, 24), w, b, buf[32:96], "out: must not overlap x "),
        (x, buf[:384].reshape(16, 24), b, buf[300:364], "out: must not overlap weight "),
        (x, w, buf[400:416], buf[410:474], "out: must not overlap bias "),
        (buf[:96].reshape(4, 24), w, None, buf[64:128], "out: must not overlap x "),  # without a bias
    ]
    for xx, ww, bb, out, match in cases:
        with pytest.raises(ValueError, match=match):
            lin.linear(xx, ww, bb, out.reshape(4, 16))
    assert not buf.any()


@pytest.mark.parametrize(
    ("cc", "want"),
    [
        ((9, 0), "wgmma_tma"),
        ((8, 0), "portable"),
        ((8, 9), "portable"),
        ((10, 0), "portable"),
        (None, "portable"),
    ],  # fmt: skip
)
def test_auto_takes_the_tma_tile_on_cc90_only(cc, want) -> None:  # type: ignore[no-untyped-def]
    for dt in (F16, BF16):
        assert lin.select_path(path="auto", dtype=dt, cc=cc, simulated=False) == want
        assert lin.select_path(path="auto", dtype=dt, cc=(9, 0), simulated=True) == "portable"
    with pytest.raises(ValueError, match="sm_90a"):
        lin.select_path(path="wgmma", dtype=BF16, cc=(8, 0), simulated=False)


def test_explain_names_the_tier_and_why() -> None:
    c = lin.explain(n=14336, k=4096, cc=(9, 0), simulated=False)
    assert (c.path, c.tier) == ("wgmma_tma", "primary")
    c = lin.explain(n=129, k=67, cc=(9, 0), simulated=False)
    assert (c.path, c.tier) == ("portable", "fallback") and "multiples of 8" in c.why
    c = lin.explain(n=14336, k=4096, cc=(8, 0), simulated=False)
    assert (c.path, c.tier) == ("portable", "fallback") and "cc 8.0" in c.why
    assert lin.explain(n=8, k=8, cc=None, simulated=True).tier == "simulated"


@needs_gpu
def test_gpu_auto_path_is_the_tma_tile_on_cc90() -> None:
    """On a cc 9.0 GPU the bench shape runs the sm_90a kernel (the coverage list says so too)."""
    if tuple(cuda.get_current_device().compute_capability) != (9, 0):
        pytest.skip("not a cc 9.0 GPU")
    case = next(c for c in lin.SPEC.bench_cases if c.dtype == "bfloat16")
    assert lin.SPEC.choice(case).path == "wgmma_tma"

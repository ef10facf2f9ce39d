"""NaN and infinities: every op's `special_cases` through the harness (outputs NaN / +-inf exactly where the
float64 reference is, right elsewhere), and the behaviours docs/ops.md defines, checked directly: softmax of
an all -inf row, clip_grad_norm with a NaN or an infinity, cast past fp16's range."""

from __future__ import annotations

import math

import numpy as np
import pytest
from opcheck import case_id, needs_device

from kernels.harness import verify
from kernels.registry import all_ops

pytestmark = [needs_device, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

_CASES = [(spec, case) for spec in all_ops().values() for case in spec.special_cases]


def test_every_op_has_special_cases() -> None:
    assert {s.name for s, _ in _CASES} == set(all_ops())


@pytest.mark.parametrize(("spec", "case"), _CASES, ids=[f"{s.name}-{case_id(c)}" for s, c in _CASES])
def test_special_case_passes(spec, case) -> None:  # type: ignore[no-untyped-def]
    res = verify.check_case(spec, case, np.random.default_rng(3))
    assert res.ok, f"{spec.name} {case.dtype} {case.label}: {res.error}"


@pytest.mark.parametrize("path", ["auto", "scalar"])
@pytest.mark.parametrize("cols", [136, 601])
def test_softmax_rows_with_nan_or_inf_are_nan(path: str, cols: int) -> None:
    from kernels.ops.softmax import softmax

    x = np.random.default_rng(0).standard_normal((5, cols)).astype(np.float32)
    x[0, 0] = np.nan  # the first value a thread sees: the online softmax once dropped it
    x[1] = -np.inf
    x[2, 0] = np.inf
    x[3, -1] = -np.inf  # only exp(-inf) = 0: the row stays finite
    out = softmax(x, path=path)
    assert np.isnan(out[:3]).all()
    assert np.isfinite(out[3:]).all() and out[3, -1] == 0.0
    assert np.allclose(out[3:].sum(axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize("path", ["auto", "per_array"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_clip_grad_norm_non_finite_leaves_gradients(path: str, bad: float) -> None:
    from kernels.ops.clip_grad_norm import clip_grad_norm

    rng = np.random.default_rng(1)
    grads = [rng.standard_normal(n).astype(np.float32) for n in (101, 64, 37)]
    grads[1][5] = bad
    before = [g.copy() for g in grads]
    total = clip_grad_norm(grads, 1e-3, path=path)  # a max_norm that would clip a finite norm hard
    assert math.isnan(total) if math.isnan(bad) else total == math.inf
    for g, b in zip(grads, before, strict=True):
        np.testing.assert_array_equal(g, b)


def test_clip_grad_norm_finite_still_clips() -> None:
    from kernels.ops.clip_grad_norm import clip_grad_norm

    g = np.full(100, 0.5, np.float32)  # norm 5
    total = clip_grad_norm([g], 1.0)
    assert abs(total - 5.0) < 1e-5 and abs(float(np.linalg.norm(g.astype(np.float64))) - 1.0) < 1e-5


def test_cast_past_fp16_range_is_inf() -> None:
    from kernels.ops.cast import cast

    x = np.array([[70000.0, -1e30, 65519.0, np.nan, np.inf, -np.inf, 1.0, 0.0]], np.float32)
    out = cast(x)
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out, x.astype(np.float16))


@pytest.mark.parametrize(
    ("kernel", "dtype"),
    [
        ("stream", "bfloat16"),
        ("stream", "float16"),
        ("stream", "float32"),
        ("on-chip", "bfloat16"),
        ("on-chip", "float16"),
        ("on-chip-mid", "bfloat16"),
        ("on-chip-mid", "float16"),
    ],
)
def test_softmax_long_rows_keep_nan_inf_and_minus_inf(
    kernel: str, dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernels of rows past vector_cols fold a step's values at once (one exp each, the SFU's in 16-bit):
    the 16-byte streaming kernel and the on-chip one (taken here at a width it holds, under its from_cols).
    A NaN or +inf anywhere, in a step or in the tail, makes the row NaN; an all -inf row is NaN; -inf values,
    even a thread's whole first steps, give 0 and leave the rest a distribution."""
    from dataclasses import replace

    from kernels.ops import softmax as mod
    from kernels.ops.rows import ONCHIP_MID_ROWS, chip_fits, vector_cols
    from kernels.runtime.arrays import BF16
    from kernels.runtime.launch import FastCache

    dt = np.dtype(BF16 if dtype == "bfloat16" else dtype)
    cols = (2568 if verify.SIMULATED else 81928) // (2 if dt.itemsize == 4 else 1)  # steps and a tail
    if kernel == "on-chip-mid":  # inside ONCHIP_MID_ROWS' rows (2048 simulated, 32776-65536 on a GPU)
        cols = 2000 if verify.SIMULATED else 49160
    assert cols > vector_cols(dt)
    monkeypatch.setattr(mod, "_FAST", FastCache())
    if kernel == "stream":
        monkeypatch.setattr(mod._K, "chip_k", {})
        monkeypatch.setattr(mod._K, "mid_k", {})
        assert mod._K.pick("vector", dt, True, cols, 7)[0] is mod._K.svec_k[dt]
    elif kernel == "on-chip-mid":
        if not chip_fits(ONCHIP_MID_ROWS):
            pytest.skip("this GPU cannot give a block the on-chip rows' shared memory (they stream here)")
        assert getattr(mod._K.pick("vector", dt, True, cols, 7)[0], "kernel", None) is mod._K.mid_k[dt]
    else:
        if not chip_fits():
            pytest.skip("this GPU cannot give a block the on-chip rows' shared memory (they stream here)")
        monkeypatch.setattr(mod._K, "chip_shape", replace(mod._K.chip_shape, from_cols=0))
        assert getattr(mod._K.pick("vector", dt, True, cols, 7)[0], "kernel", None) is mod._K.chip_k[dt]
    x = np.random.default_rng(1).standard_normal((7, cols)).astype(np.float32)
    x[0, 0] = np.nan  # the first value of a step (on chip: of the register part)
    x[1] = -np.inf  # all -inf: NaN, as the reference's exp(-inf - -inf)
    x[2, cols // 2] = np.inf
    x[3, : 2 * cols // 3] = -np.inf  # whole steps of every thread see only -inf
    x[4, -1] = np.nan  # in the tail
    x[5] = -np.inf
    x[5, 17] = 3.0  # one finite value: it takes all the mass
    x[6, ::5] = -np.inf
    xd = x.astype(dt)
    out = mod.softmax(xd, path="vector").astype(np.float64)
    assert np.isnan(out[[0, 1, 2, 4]]).all()
    assert np.isfinite(out[[3, 5, 6]]).all()
    assert (out[3, : 2 * cols // 3] == 0).all() and (out[6, ::5] == 0).all()
    assert out[5, 17] == 1.0 and np.count_nonzero(out[5]) == 1
    ref = mod.reference(xd[[3, 6]].astype(np.float32))  # of the values the kernel was given
    assert np.abs(out[[3, 6]] - ref).max() <= (2.0**-8 if dt.itemsize == 2 else 1e-6) * ref.max()

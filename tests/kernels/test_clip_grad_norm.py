"""clip_grad_norm: norm and in-place scaling against the float64 reference; the no-clip branch leaves the
arrays bit-identical; validation errors."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda
from opcheck import assert_case_passes, case_id, needs_device, needs_gpu, small_cases

from kernels.ops import clip_grad_norm as op


@needs_device
@pytest.mark.parametrize("case", small_cases(op.SPEC), ids=case_id)
def test_cases(case):  # type: ignore[no-untyped-def]
    assert_case_passes(op.SPEC, case)


@needs_device
def test_numpy_inplace_and_return_value():  # type: ignore[no-untyped-def]
    rng = np.random.default_rng()
    grads = [rng.standard_normal(n).astype(np.float32) for n in (33, 70, 5)]
    before = [g.copy() for g in grads]
    norm, scaled = op.reference(before, 0.5)
    got = op.clip_grad_norm(grads, 0.5)
    assert isinstance(got, float) and abs(got - norm) / norm < 1e-6
    for g, s in zip(grads, scaled, strict=True):
        np.testing.assert_allclose(g, s, rtol=1e-6)


@needs_device
def test_no_clip_leaves_arrays_untouched():  # type: ignore[no-untyped-def]
    rng = np.random.default_rng()
    g = cuda.to_device(rng.standard_normal(300).astype(np.float16))
    before = g.copy_to_host()
    norm_out = cuda.device_array(1, np.float32)
    assert op.clip_grad_norm([g], 1e6, norm_out=norm_out) is norm_out
    np.testing.assert_array_equal(g.copy_to_host(), before)
    ref = np.sqrt(np.sum(before.astype(np.float64) ** 2))
    assert abs(norm_out.copy_to_host()[0] - ref) / ref < 1e-5


@needs_device
def test_validation_errors():  # type: ignore[no-untyped-def]
    g = np.ones(4, np.float32)
    with pytest.raises(ValueError, match="grads: expected a non-empty list of arrays"):
        op.clip_grad_norm([], 1.0)
    with pytest.raises(ValueError, match="max_norm: expected a positive finite number, got 0"):
        op.clip_grad_norm([g], 0)
    with pytest.raises(TypeError, match=r"grads\[1\]: dtype float16 must match grads\[0\]'s dtype float32"):
        op.clip_grad_norm([g, np.ones(4, np.float16)], 1.0)
    with pytest.raises(ValueError, match=r"grads\[0\]: expected a C-contiguous array"):
        op.clip_grad_norm([np.ones((4, 4), np.float32)[:, 1]], 1.0)
    with pytest.raises(ValueError, match=r"norm_out: expected shape \(1,\)"):
        op.clip_grad_norm([g], 1.0, norm_out=cuda.device_array(2, np.float32))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("case", op.SPEC.bench_cases, ids=case_id)
def test_bench_shapes(case):  # type: ignore[no-untyped-def]
    assert_case_passes(op.SPEC, case)


@needs_device
@pytest.mark.parametrize("path", ["split", "fused", "fused_vector", "two", "two_last", "one"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_every_path(path, dtype):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng()
    # odd sizes: scalar tails shorter than a vector, and one array longer than a vector tile (1024 under the
    # simulator)
    grads = [(rng.standard_normal(n) * 0.1).astype(dtype) for n in (101, 7, 1100, 33)]
    before = [g.copy() for g in grads]
    full = float(np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in before)))
    norm, scaled = op.reference(before, full / 3.0)  # clips: scale ~ 1/3, not exact in binary
    got = op.clip_grad_norm(grads, full / 3.0, path=path)
    assert abs(got - norm) / norm < 1e-5
    tol = 1e-6 if dtype == "float32" else 1e-3
    for g, s in zip(grads, scaled, strict=True):
        assert np.linalg.norm(g - s) / np.linalg.norm(s) < tol


@needs_device
def test_fused_state_survives_repeated_calls():  # type: ignore[no-untyped-def]
    # the fused kernel keeps its accumulator and barrier on the device between calls (generation parity):
    # every call must see only its own sum of squares
    g = cuda.to_device(np.full(1000, 0.5, np.float32))
    for k in range(5):
        got = op.clip_grad_norm([g], 1e9, path="fused")
        assert abs(got - np.sqrt(250.0)) < 1e-4, (k, got)


@needs_device
def test_path_selection_and_errors():  # type: ignore[no-untyped-def]
    many = [np.full(3, 1.0, np.float32) for _ in range(op.SLOTS + 1)]
    got = op.clip_grad_norm(many, 1.0)  # auto: more than SLOTS arrays take the split path
    assert abs(got - np.sqrt(3.0 * (op.SLOTS + 1))) < 1e-4
    with pytest.raises(ValueError, match=rf"path: 'fused' cannot run here: {op.SLOTS + 1} arrays \(at most"):
        op.clip_grad_norm(many, 1.0, path="fused")
    ws = cuda.device_array(1, np.float64)
    with pytest.raises(ValueError, match="path: 'fused' cannot run here: a workspace was given"):
        op.clip_grad_norm([np.ones(3, np.float32)], 1.0, workspace=ws, path="fused")
    with pytest.raises(ValueError, match="path: 'fast' is not a path; expected one of: auto, split"):
        op.clip_grad_norm([np.ones(3, np.float32)], 1.0, path="fast")

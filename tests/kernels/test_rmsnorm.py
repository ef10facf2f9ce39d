"""rmsnorm: cases against the float64 reference, N-d inputs, validation errors."""

from __future__ import annotations

import numpy as np
import pytest
from opcheck import assert_case_passes, case_id, needs_device, needs_gpu, small_cases

from kernels.ops import rmsnorm as op


@needs_device
@pytest.mark.parametrize("case", small_cases(op.SPEC), ids=case_id)
def test_cases(case):  # type: ignore[no-untyped-def]
    assert_case_passes(op.SPEC, case)


@needs_device
def test_nd_input_and_eps():  # type: ignore[no-untyped-def]
    rng = np.random.default_rng()
    x = rng.standard_normal((2, 3, 45)).astype(np.float32) * 1e-3  # small values: eps matters
    w = rng.standard_normal(45).astype(np.float32)
    got = op.rmsnorm(x, w, eps=1e-4)
    ref = op.reference(x, w, 1e-4)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-5


@needs_device
def test_validation_errors():  # type: ignore[no-untyped-def]
    x = np.ones((4, 6), np.float32)
    with pytest.raises(ValueError, match=r"weight: expected shape \(6,\) \(x's last dimension\), got \(5,\)"):
        op.rmsnorm(x, np.ones(5, np.float32))
    with pytest.raises(TypeError, match="weight: dtype float16 must match x's dtype float32"):
        op.rmsnorm(x, np.ones(6, np.float16))
    with pytest.raises(TypeError, match="x: dtype int32 is not supported"):
        op.rmsnorm(np.ones((4, 6), np.int32), np.ones(6, np.int32))
    with pytest.raises(ValueError, match="x: expected a C-contiguous array"):
        op.rmsnorm(np.ones((6, 8), np.float32)[:, ::2], np.ones(4, np.float32))
    with pytest.raises(ValueError, match="eps: expected a positive finite number, got -1"):
        op.rmsnorm(x, np.ones(6, np.float32), eps=-1)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("case", op.SPEC.bench_cases, ids=case_id)
def test_bench_shapes(case):  # type: ignore[no-untyped-def]
    assert_case_passes(op.SPEC, case)

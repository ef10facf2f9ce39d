"""Views as operands. Strided views are refused, with one error naming the argument; views whose data starts
one element past an allocation (not 16-byte aligned: the vector kernels' condition fails) are supported and
take the scalar kernels, checked against float64."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from numba import cuda
from opcheck import needs_device

from kernels.ops.cast import cast
from kernels.ops.clip_grad_norm import clip_grad_norm
from kernels.ops.gemm import gemm
from kernels.ops.layernorm import layernorm
from kernels.ops.layernorm import reference as layernorm_ref
from kernels.ops.o_proj import o_proj
from kernels.ops.residual_add import residual_add
from kernels.ops.rmsnorm import reference as rmsnorm_ref
from kernels.ops.rmsnorm import rmsnorm
from kernels.ops.softmax import reference as softmax_ref
from kernels.ops.softmax import softmax

pytestmark = needs_device
F32 = np.float32
_rng = np.random.default_rng(7)


def _a(*shape: int, dt: Any = F32) -> np.ndarray:
    return _rng.standard_normal(shape).astype(dt)


def _cols(*shape: int) -> Any:
    """A device view of `shape` that takes every other column of a wider array (not C-contiguous)."""
    # explicit slices, not `...`: numba's device arrays on a real GPU do not take an Ellipsis index
    every_other = (slice(None),) * (len(shape) - 1) + (slice(None, None, 2),)
    return cuda.to_device(_a(*shape[:-1], 2 * shape[-1]))[every_other]


# (argument named in the error, the call with that argument strided)
_STRIDED: list[tuple[str, Callable[[], Any]]] = [
    ("x", lambda: residual_add(_cols(4, 40), _a(4, 40))),
    ("r", lambda: residual_add(_a(4, 40), _cols(4, 40))),
    ("x", lambda: cast(_cols(4, 40))),
    ("x", lambda: softmax(_cols(4, 40))),
    ("out", lambda: softmax(_a(4, 40), _cols(4, 40))),
    ("x", lambda: rmsnorm(_cols(4, 40), _a(40))),
    ("weight", lambda: rmsnorm(_a(4, 40), _cols(40))),
    ("x", lambda: layernorm(_cols(4, 40), _a(40), _a(40))),
    ("bias", lambda: layernorm(_a(4, 40), _a(40), _cols(40))),
    ("a", lambda: gemm(_cols(8, 40), _a(40, 8))),
    ("b", lambda: gemm(_a(8, 40), _cols(40, 8))),
    ("attn", lambda: o_proj(_cols(8, 40), _a(40, 8), _a(8, 8))),
    ("residual", lambda: o_proj(_a(8, 40), _a(40, 8), _cols(8, 8))),
    ("grads[1]", lambda: clip_grad_norm([cuda.to_device(_a(40)), _cols(40)], 1.0)),
]


@pytest.mark.parametrize(("name", "call"), _STRIDED, ids=[f"{i}-{n}" for i, (n, _) in enumerate(_STRIDED)])
def test_strided_views_are_refused_naming_the_argument(name: str, call: Callable[[], Any]) -> None:
    with pytest.raises(ValueError) as e:
        call()
    assert str(e.value).startswith(f"{name}: expected a C-contiguous array, got strides "), e.value


def _offset(a: np.ndarray) -> Any:
    """A device copy of `a` that starts one element into its allocation: C-contiguous, 16-byte misaligned."""
    flat = np.empty(a.size + 1, a.dtype)
    flat[1:] = a.reshape(-1)
    return cuda.to_device(flat)[1:].reshape(a.shape)


@pytest.mark.parametrize("dt", [np.float32, np.float16])
def test_misaligned_views_are_supported(dt: Any) -> None:
    tol = 2e-3 if dt == np.float16 else 1e-5
    x, r, w, b = _a(5, 136, dt=dt), _a(5, 136, dt=dt), _a(136, dt=dt), _a(136, dt=dt)
    x64 = x.astype(np.float64)

    def near(got: Any, ref: np.ndarray) -> None:
        g = got.copy_to_host().astype(np.float64)
        assert np.linalg.norm(g - ref) <= tol * np.linalg.norm(ref)

    near(residual_add(_offset(x), _offset(r)), x64 + r.astype(np.float64))
    near(softmax(_offset(x)), softmax_ref(x))
    near(rmsnorm(_offset(x), _offset(w)), rmsnorm_ref(x, w, 1e-6))
    near(layernorm(_offset(x), _offset(w), _offset(b)), layernorm_ref(x, w, b, 1e-5))
    if dt == np.float32:
        near(cast(_offset(x)), x.astype(np.float16).astype(np.float64))
    a, m = _a(16, 24, dt=dt), _a(24, 8, dt=dt)
    near(gemm(_offset(a), _offset(m)), a.astype(np.float64) @ m.astype(np.float64))
    g = [_a(101, dt=dt), _a(64, dt=dt)]
    total = clip_grad_norm([_offset(v) for v in g], 1e9)
    want = float(np.sqrt(sum(np.sum(v.astype(np.float64) ** 2) for v in g)))
    assert abs(total - want) <= 1e-5 * want

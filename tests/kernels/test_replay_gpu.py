"""Repeat calls on a real GPU: the second and later calls with the same operand layout take the launchers'
replay path (kernels.runtime.launch.FastCache, mma.bind, clip_grad_norm's _FastPlan), which rewrites only the
data pointers. Each call here gets NEW device arrays holding NEW data, so a replay that kept a stale pointer
or a stale parameter writes the wrong result and fails the float64 comparison."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

from kernels.ops.clip_grad_norm import clip_grad_norm
from kernels.ops.gemm import gemm
from kernels.ops.o_proj import o_proj
from kernels.runtime import launch
from kernels.runtime.arrays import SIMULATED

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(SIMULATED or not cuda.is_available(), reason="needs a real CUDA GPU"),
]
TOL = {np.float32: 1e-5, np.float16: 1e-3}
CALLS = 4


def rel(out: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(out.astype(np.float64) - ref) / np.linalg.norm(ref))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("mnk", [(128, 128, 128), (100, 72, 40), (64, 24, 17)], ids=str)
def test_gemm_repeat_calls_on_new_arrays(dtype: type, mnk: tuple[int, int, int]) -> None:
    m, n, k = mnk
    rng = np.random.default_rng(1)
    for call in range(CALLS):
        a = rng.standard_normal((m, k)).astype(dtype)
        b = rng.standard_normal((k, n)).astype(dtype)
        out = cuda.device_array((m, n), np.float32)
        gemm(cuda.to_device(a), cuda.to_device(b), out)
        err = rel(out.copy_to_host(), a.astype(np.float64) @ b.astype(np.float64))
        assert err <= TOL[dtype], f"call {call}: rel err {err:.3g}"


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
def test_o_proj_repeat_calls_on_new_arrays(dtype: type, with_bias: bool) -> None:
    b_, s, d = 2, 64, 128
    rng = np.random.default_rng(2)
    for call in range(CALLS):
        attn = rng.standard_normal((b_, s, d)).astype(dtype)
        w = (rng.standard_normal((d, d)) / np.sqrt(d)).astype(dtype)
        res = rng.standard_normal((b_, s, d)).astype(dtype)
        bias = rng.standard_normal(d).astype(dtype) if with_bias else None
        out = cuda.device_array((b_, s, d), dtype)
        o_proj(
            cuda.to_device(attn),
            cuda.to_device(w),
            cuda.to_device(res),
            None if bias is None else cuda.to_device(bias),
            out,
        )
        ref = attn.astype(np.float64) @ w.astype(np.float64) + res.astype(np.float64)
        if bias is not None:
            ref = ref + bias.astype(np.float64)
        err = rel(out.copy_to_host(), ref)
        assert err <= TOL[dtype], f"call {call}: rel err {err:.3g}"


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_clip_grad_norm_repeat_calls(dtype: type) -> None:
    """Same array objects with new contents (a training loop), then new arrays: norm and scaling right."""
    rng = np.random.default_rng(3)
    sizes = (4099, 1 << 16)
    grads = [cuda.device_array(n, dtype) for n in sizes]
    norm = cuda.device_array(1, np.float32)
    for call in range(2 * CALLS):
        if call == CALLS:  # second half: fresh arrays, the replay must follow them
            grads = [cuda.device_array(n, dtype) for n in sizes]
        host = [rng.standard_normal(n).astype(dtype) for n in sizes]
        for dev, h in zip(grads, host, strict=True):
            dev.copy_to_device(h)
        total = float(np.sqrt(sum(np.sum(h.astype(np.float64) ** 2) for h in host)))
        max_norm = total / (2.0 + call)  # always clipping, by a different factor each call
        clip_grad_norm(grads, max_norm, norm_out=norm)
        got = float(norm.copy_to_host()[0])
        assert abs(got - total) <= 1e-4 * total, f"call {call}: norm {got} vs {total}"
        coef = max_norm / (total + 1e-6)
        for dev, h in zip(grads, host, strict=True):
            err = rel(dev.copy_to_host(), h.astype(np.float64) * coef)
            assert err <= TOL[dtype], f"call {call}: scaled rel err {err:.3g}"


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_clip_grad_norm_graph_replay(dtype: type) -> None:
    """A training loop's pattern: the same arrays and max_norm on every call, new contents each time. From the
    second call on, the call replays a captured CUDA graph (kernels.runtime.launch.GRAPH_REPLAY); when
    max_norm alone moves, the table call over the same arrays replays its own graph (its scale launch updated
    in place); both clipping and not clipping stay right on every call."""
    from kernels.ops import clip_grad_norm as op

    rng = np.random.default_rng(5)
    sizes = (3001, 1 << 15, 16)
    grads = [cuda.device_array(n, dtype) for n in sizes]
    norm = cuda.device_array(1, np.float32)
    for call, max_norm in enumerate((1.0, 1.0, 1.0, 1.0, 1e9, 1e9, 1e9, 1.0, 1.0)):
        host = [rng.standard_normal(n).astype(dtype) for n in sizes]
        for dev, h in zip(grads, host, strict=True):
            dev.copy_to_device(h)
        total = float(np.sqrt(sum(np.sum(h.astype(np.float64) ** 2) for h in host)))
        clip_grad_norm(grads, max_norm, norm_out=norm)
        got = float(norm.copy_to_host()[0])
        assert abs(got - total) <= 1e-4 * total, f"call {call}: norm {got} vs {total}"
        coef = min(1.0, max_norm / (total + 1e-6))
        for dev, h in zip(grads, host, strict=True):
            out = dev.copy_to_host()
            if coef == 1.0:
                assert (out == h).all(), f"call {call}: an unclipped call changed the arrays"
            else:
                err = rel(out, h.astype(np.float64) * coef)
                assert err <= TOL[dtype], f"call {call}: scaled rel err {err:.3g}"
    plan = op._fast_plans[(launch.context(), np.dtype(dtype))]
    newest = plan._graphs.keys()[-1]  # keys (id(values), max_norm), oldest first
    assert newest[1] == 1.0, f"expected the 1.0 calls' graph, got {newest}"
    # the 1e9 calls (max_norm moved alone) ran the table call over the same arrays, on its own graph
    assert plan._moving is not None and plan._moving[1]._graph is not None


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_clip_grad_norm_table_graph_follows_max_norm(dtype: str) -> None:
    """The table path's lean call (more arrays than two_pass's SLOTS): one graph for the set of arrays from
    the second call on, max_norm new on almost every call (its scale launch updated in place), clipping and
    not clipping, new contents each call: every call right against float64."""
    from kernels.ops import clip_grad_norm as op
    from kernels.runtime import arrays

    dt = np.dtype(arrays.BF16 if dtype == "bfloat16" else dtype)
    tol = {"float32": 1e-5, "bfloat16": 4e-3}[dtype]
    rng = np.random.default_rng(9)
    sizes = [5, 4096, 100003, 1, 777] * 3  # 15 arrays
    grads = [cuda.device_array(n, dt) for n in sizes]
    norm = cuda.device_array(1, np.float32)
    graph = None
    for call, factor in enumerate((0.5, 0.25, 0.3, 2.0, 0.3, 0.7, 0.7, 0.1)):
        host = [rng.standard_normal(n).astype(np.float32).astype(dt) for n in sizes]
        for dev, h in zip(grads, host, strict=True):
            arrays.words(dev).copy_to_device(arrays.host_words(h))
        total = float(np.sqrt(sum(np.sum(h.astype(np.float64) ** 2) for h in host)))
        max_norm = total * factor
        clip_grad_norm(grads, max_norm, norm_out=norm)
        got = float(norm.copy_to_host()[0])
        assert abs(got - total) <= 1e-4 * total, f"call {call}: norm {got} vs {total}"
        coef = min(1.0, max_norm / (total + 1e-6))
        for dev, h in zip(grads, host, strict=True):
            out = arrays.to_host(dev)
            if coef == 1.0:
                assert (out.view(np.uint8) == h.view(np.uint8)).all(), f"call {call}: unclipped, changed"
            else:
                err = rel(out.astype(np.float64), h.astype(np.float64) * coef)
                assert err <= tol, f"call {call}: scaled rel err {err:.3g}"
        (entry, _refs) = op._table_calls[(launch.context(), op.item_ids(grads), id(norm))]
        if call == 0:
            assert entry._graph is None  # the first call launches directly
        else:
            graph = graph or entry._graph
            assert entry._graph is graph is not None, f"call {call}: one graph for the set of arrays"


def test_clip_grad_norm_table_on_a_non_blocking_stream() -> None:
    """A new set of arrays (so a new device table, uploaded first) clipped on a CU_STREAM_NON_BLOCKING stream,
    which does not wait for the legacy stream the upload used: every call right against float64."""
    import ctypes

    from kernels.runtime import launch

    lib = launch._driver()
    s = ctypes.c_void_p()
    assert lib.cuStreamCreate(ctypes.byref(s), 1) == 0  # 1: CU_STREAM_NON_BLOCKING
    rng = np.random.default_rng(11)
    try:
        for trial in range(3):
            sizes = [1000 + 13 * k + trial for k in range(20)]  # new sizes: a new table every trial
            host = [rng.standard_normal(n).astype(np.float32) for n in sizes]
            grads = [cuda.to_device(h) for h in host]
            norm = cuda.device_array(1, np.float32)
            cuda.synchronize()
            total = float(np.sqrt(sum(np.sum(h.astype(np.float64) ** 2) for h in host)))
            clip_grad_norm(grads, total / 4.0, norm_out=norm, stream=s.value)
            assert lib.cuStreamSynchronize(s) == 0
            got = float(norm.copy_to_host()[0])
            assert abs(got - total) <= 1e-5 * total, f"trial {trial}: norm {got} vs {total}"
            coef = (total / 4.0) / (total + 1e-6)
            for dev, h in zip(grads, host, strict=True):
                err = rel(dev.copy_to_host(), h.astype(np.float64) * coef)
                assert err <= 1e-5, f"trial {trial}: scaled rel err {err:.3g}"
    finally:
        lib.cuStreamDestroy_v2(s)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("head_dim", [128, 38], ids=["vector", "scalar"])
def test_rope_repeat_calls(dtype: str, head_dim: int) -> None:
    """rope's FastCache replay: the same arrays again (from the third call a graph replay), then new arrays
    with new data, each call against float64; a replay whose x overlaps cos is refused, not run."""
    from kernels.ops import rope as op
    from kernels.runtime import arrays

    dt = np.dtype(arrays.BF16 if dtype == "bfloat16" else dtype)
    tol = {"float32": 1e-6, "float16": 1e-3, "bfloat16": 8e-3}[dtype]
    rng = np.random.default_rng(12)
    tokens, heads = 9, 4
    x = arrays.to_device(np.zeros((tokens, heads, head_dim), dt))
    cos = cuda.device_array((tokens, head_dim // 2), np.float32)
    sin = cuda.device_array((tokens, head_dim // 2), np.float32)
    for call in range(2 * CALLS):
        if call == CALLS:  # new arrays: the replay must follow their pointers
            x = arrays.to_device(np.zeros((tokens, heads, head_dim), dt))
            cos = cuda.device_array((tokens, head_dim // 2), np.float32)
            sin = cuda.device_array((tokens, head_dim // 2), np.float32)
        xh = rng.standard_normal((tokens, heads, head_dim)).astype(np.float32).astype(dt)
        ch, sh = op.tables(rng.integers(0, 4096, tokens), head_dim)
        arrays.words(x).copy_to_device(arrays.host_words(xh))
        cos.copy_to_device(ch)
        sin.copy_to_device(sh)
        assert op.rope(x, cos, sin) is x
        err = rel(arrays.to_host(x).astype(np.float64), op.reference(xh, ch, sh))
        assert err <= tol, f"call {call}: rel err {err:.3g}"
    assert op._FAST.find((x, cos, sin), "auto")[0] is not None  # the calls above took the cached launch
    # x over cos (a float32 x of cos' own memory, the cached layout and 16-byte alignment): the cached
    # entry's guard refuses it
    if dtype == "float32":
        span, h = tokens * heads * head_dim, head_dim // 2
        pool = cuda.device_array(span + tokens * head_dim, np.float32)
        xa = pool[:span].reshape(tokens, heads, head_dim)
        at = (span - tokens * h) // 4 * 4  # inside x, 16-byte aligned
        cv = pool[at : at + tokens * h].reshape(tokens, h)
        assert op._FAST.find((xa, cv, sin), "auto")[0] is not None
        with pytest.raises(ValueError, match="x: must not overlap cos"):
            op.rope(xa, cv, sin)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_cast_fp8_repeat_calls(dtype: str) -> None:
    """cast_fp8's FastCache replay (its amax and cast launches): the same arrays again, then new arrays, new
    data and a new amax every call, codes and scale bit for bit against the reference."""
    import ml_dtypes

    from kernels.ops import cast_fp8 as op
    from kernels.runtime import arrays

    dt = np.dtype(arrays.BF16 if dtype == "bfloat16" else dtype)
    rng = np.random.default_rng(13)
    shape = (37, 1001)
    x = arrays.to_device(np.zeros(shape, dt))
    out = cuda.device_array(shape, np.uint8)
    scale = cuda.device_array(1, np.float32)
    for call in range(2 * CALLS):
        if call == CALLS:
            x = arrays.to_device(np.zeros(shape, dt))
            out = cuda.device_array(shape, np.uint8)
            scale = cuda.device_array(1, np.float32)
        xh = (rng.standard_normal(shape) * (1.0 + call)).astype(np.float32).astype(dt)
        arrays.words(x).copy_to_device(arrays.host_words(xh))
        op.cast_fp8(x, out, scale)
        want, want_scale = op.reference(xh)
        assert float(scale.copy_to_host()[0]) == float(want_scale), f"call {call}: scale"
        got = out.copy_to_host()
        assert (got == want.view(np.uint8)).all(), f"call {call}: codes differ"
        assert want.dtype == ml_dtypes.float8_e4m3fn
    assert op._FAST.find((x, out, scale), "auto")[0] is not None  # the calls above took the cached launch

"""cast_fp8: bit-exact against ml_dtypes' e4m3fn rounding of x / scale (fp32, fp16, bf16 x); rounding edges
(ties to even, saturation, subnormals, the 2^-10 tie to zero), the scale of a zero tensor, NaN / inf, the
raw-word output, validation errors."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from numba import cuda
from opcheck import assert_case_passes, case_id, needs_device, needs_gpu, small_cases

from kernels.ops import cast_fp8 as op
from kernels.primitives.fp8 import f32_to_e4m3
from kernels.runtime import arrays
from kernels.runtime.arrays import BF16, FP8, SIMULATED

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # inf / inf, NaN compares in numpy


@needs_device
@pytest.mark.parametrize("case", small_cases(op.SPEC) + op.SPEC.special_cases, ids=case_id)
def test_cases(case):  # type: ignore[no-untyped-def]
    assert_case_passes(op.SPEC, case)


def _codes(a: np.ndarray) -> np.ndarray:
    return np.asarray(a).view(np.uint8)


def _all_boundaries() -> np.ndarray:
    """Every finite e4m3fn value, every midpoint between neighbours (the ties), and the fp32 neighbours of
    each, both signs; plus values past 448 and below the smallest subnormal."""
    v = np.arange(256, dtype=np.uint8).view(FP8).astype(np.float32)
    v = np.unique(v[np.isfinite(v)])
    mids = ((v[:-1].astype(np.float64) + v[1:]) / 2).astype(np.float32)
    extra = np.array([448.0, 449.0, 463.9, 464.0, 480.0, 1e9, 3e38, 2**-10, 2**-11, 1e-40, 1e-45], np.float32)
    base = np.concatenate([v, mids, extra])
    up = np.nextafter(base, np.float32(np.inf))
    down = np.nextafter(base, np.float32(-np.inf))
    allv = np.concatenate([base, up, down])
    return np.concatenate([allv, -allv]).astype(np.float32)


@pytest.mark.skipif(
    not SIMULATED,
    reason="the device function runs as Python only under the simulator "
    "(on a GPU, test_kernel_rounding_edges_bitwise runs the same boundaries in the kernel)",
)
def test_conversion_matches_ml_dtypes_at_every_boundary():  # type: ignore[no-untyped-def]
    """The device function on its own (host-callable under the simulator and as a plain Python function):
    every rounding boundary of the format, against ml_dtypes of the value clipped to +-448."""
    f = getattr(f32_to_e4m3, "py_func", f32_to_e4m3)
    x = _all_boundaries()
    got = np.array([int(f(v)) for v in x], np.uint8)
    want = _codes(np.clip(x, -448, 448).astype(FP8))
    bad = np.nonzero(got != want)[0]
    assert bad.size == 0, [(float(x[i]), int(got[i]), int(want[i])) for i in bad[:10]]


@needs_device
@pytest.mark.parametrize("path", ["scalar", "vector"])
def test_kernel_rounding_edges_bitwise(path):  # type: ignore[no-untyped-def]
    """Both kernels (vector: ~6000 values are whole tiles of 8-code groups, then a partial tile; on sm_89+
    GPUs its conversion is the hardware cvt). amax 1792 -> scale exactly 4: x / 4 is exact, so the
    boundaries reach the conversion unchanged."""
    b = _all_boundaries()
    b = b[np.abs(b) <= 448]
    x = np.concatenate([[1792.0], b * 4]).astype(np.float32)
    out, scale = op.cast_fp8(x, path=path)
    assert out.dtype == FP8 and scale.dtype == np.float32 and scale.shape == (1,)
    assert scale[0] == np.float32(4.0)
    q, s = op.reference(x)
    assert s == scale[0]
    np.testing.assert_array_equal(_codes(out), _codes(q))
    # named cases, after the scale 4: ties to even (1.0625 -> 1.0, 1.1875 -> 1.25), subnormal ties (1.5 and
    # 2.5 steps of 2^-9 -> 2 steps), the 2^-10 tie to zero (both signs), signed zero, 448, the smallest
    # normal, the largest subnormal
    y = np.array([448.0 * 4, 1.0625 * 4, 1.1875 * 4, 3 * 2**-8, 5 * 2**-8, 2**-8, -(2**-8), 448 * 4, -0.0,
                  2**-6 * 4, 7 * 2**-7, *([0.0] * 5)], np.float32)  # fmt: skip
    out, _ = op.cast_fp8(y, path=path)  # 16 values: two whole groups (the vector kernel's stores)
    want = np.array([0x7E, 0x38, 0x3A, 0x02, 0x02, 0x00, 0x80, 0x7E, 0x80, 0x08, 0x07, *([0] * 5)], np.uint8)
    np.testing.assert_array_equal(_codes(out), want)


@needs_device
def test_saturation_from_the_scale_division():  # type: ignore[no-untyped-def]
    """amax / 448 rounds in fp32, so amax / scale may land a hair past 448: it saturates to 448, never NaN."""
    rng = np.random.default_rng(7)
    for _ in range(20):
        x = rng.standard_normal(50, dtype=np.float32) * np.float32(rng.uniform(1, 1e4))
        out, scale = op.cast_fp8(x)
        codes = _codes(out)
        assert (codes & 0x7F).max() == 0x7E  # the amax element is +-448
        q, s = op.reference(x)
        assert s == scale[0]
        np.testing.assert_array_equal(codes, _codes(q))


@needs_device
def test_zero_tensor_scale_is_one():  # type: ignore[no-untyped-def]
    x = np.zeros((5, 7), np.float32)
    x[1, 2] = -0.0
    out, scale = op.cast_fp8(x)
    assert scale[0] == np.float32(1.0)
    np.testing.assert_array_equal(_codes(out), _codes(x.astype(FP8)))  # +-0 kept
    tiny = np.array([1e-45, -1e-45, 0.0], np.float32)  # amax / 448 underflows to 0: scale 1, zeros
    out, scale = op.cast_fp8(tiny)
    assert scale[0] == np.float32(1.0)
    np.testing.assert_array_equal(_codes(out), [0x00, 0x80, 0x00])


@needs_device
@pytest.mark.parametrize("path", ["scalar", "vector"])
def test_nan_anywhere_makes_everything_nan(path):  # type: ignore[no-untyped-def]
    x = np.linspace(-3, 3, 2049).astype(np.float32)  # (vector: whole tiles, then a partial one)
    x[17] = np.nan
    out, scale = op.cast_fp8(x, path=path)
    assert np.isnan(scale[0])
    assert set(np.unique(_codes(out) & 0x7F).tolist()) == {0x7F}


@needs_device
@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16], ids=["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("path", ["scalar", "vector"])
def test_inf_makes_scale_inf_zeros_and_nan(dtype, path):  # type: ignore[no-untyped-def]
    x = np.linspace(-3, 3, 2049).astype(np.float32)
    x[[4, 30]] = [np.inf, -np.inf]
    out, scale = op.cast_fp8(x.astype(dtype), path=path)
    assert scale[0] == np.inf
    codes = _codes(out)
    assert (codes[[4, 30]] & 0x7F == 0x7F).all()  # inf / inf: NaN
    rest = np.delete(codes, [4, 30])
    assert ((rest & 0x7F) == 0).all()  # finite / inf: signed zeros
    np.testing.assert_array_equal(rest >> 7, np.delete(np.signbit(x), [4, 30]).astype(np.uint8))


# amax per dtype: scale 4, scales with all mantissa bits set, near the low end of fp8.exact_scale (2e-25:
# scale ~2^-91), and (fp32, bf16) scales outside it, where the kernel divides instead: subnormal (1e-37) and
# past 2^100 (1e34). fp16 cannot hold those amaxes.
AMAXES = {
    np.dtype(np.float32): (1792.0, 3.0e-3, 7.7e5, 2.0e-25, 1.0e-37, 1.0e34),
    np.dtype(np.float16): (1792.0, 3.0e-3, 6.1e4),
    BF16: (1792.0, 3.0e-3, 7.7e5, 2.0e-25, 1.0e-37, 1.0e34),
}


@needs_device
@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16], ids=["float32", "float16", "bfloat16"])
def test_whole_tiles_bitwise_at_midpoints(dtype):  # type: ignore[no-untyped-def]
    """The vector kernel's whole tiles (two, then a partial one), where the quotient is a reciprocal and a
    correction (kernels.primitives.fp8.quotient) on a GPU, bit for bit against numpy's division, at each
    amax of AMAXES. fp32 x sits on and one ulp around every e4m3 rounding midpoint; fp16 / bf16 x cannot
    (their rounding moves it off by far more than an fp32 ulp) and checks the same tiles at those scales."""
    dt = np.dtype(dtype)
    n = 2 * op.THREADS * op.GROUP * op.GROUPS[dt] + 17
    b = _all_boundaries()
    b = b[np.isfinite(b) & (np.abs(b) <= 448)].astype(np.float64)
    for amax in AMAXES[dt]:
        top = float(dt.type(amax))
        scale = np.float32(np.float32(top) / np.float32(448.0))
        assert np.isfinite(top) and top > 0, (dt, amax)
        x = np.resize(np.clip((b * float(scale)).astype(np.float32), -top, top), n).astype(dt)
        x[0] = dt.type(top)
        out, got_scale = op.cast_fp8(x, path="vector")
        q, s = op.reference(x)
        assert s == got_scale[0] == scale, amax
        bad = np.nonzero(_codes(out) != _codes(q))[0]
        assert bad.size == 0, (amax, [(float(x[i]), int(_codes(out)[i]), int(_codes(q)[i])) for i in bad[:5]])


@needs_device
@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("path", ["scalar", "vector"])
@pytest.mark.parametrize("shape", [(7, 33), (37, 101)])  # vector: the partial tile only; whole tiles too
def test_16_bit_inputs_bitwise(dtype, path, shape):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(shape) * np.exp(rng.uniform(-8, 4, shape))).astype(dtype)
    out, scale = op.cast_fp8(x, path=path)
    q, s = op.reference(x)
    assert s == scale[0]
    np.testing.assert_array_equal(_codes(out), _codes(q))


@needs_device
def test_device_arrays_uint8_out_and_workspace():  # type: ignore[no-untyped-def]
    x = np.random.default_rng(5).standard_normal((3, 301)).astype(np.float32)
    q, s = op.reference(x)
    dx = cuda.to_device(x)
    out = cuda.device_array((3, 301), np.uint8)  # raw words (e.g. a torch fp8 tensor's uint8 view)
    sc = cuda.device_array(1, np.float32)
    ws = cuda.device_array(op.parts(), np.uint32)
    got_out, got_sc = op.cast_fp8(dx, out, sc, workspace=ws)
    assert got_out is out and got_sc is sc
    np.testing.assert_array_equal(out.copy_to_host(), _codes(q))
    assert sc.copy_to_host()[0] == s
    # a numpy fp8 out is filled in place
    host = np.zeros((3, 301), FP8)
    op.cast_fp8(x, host)
    np.testing.assert_array_equal(_codes(host), _codes(q))
    # no out: a device fp8 array for device x
    dev_out, dev_sc = op.cast_fp8(dx)
    assert np.dtype(dev_out.dtype) == FP8
    np.testing.assert_array_equal(dev_out.view(np.uint8).copy_to_host(), _codes(q))


@needs_device
def test_validation_errors():  # type: ignore[no-untyped-def]
    x = np.ones(4, np.float32)
    with pytest.raises(TypeError, match="x: dtype float64 is not supported; expected one of: float32"):
        op.cast_fp8(np.ones(4))
    with pytest.raises(TypeError, match="out: dtype float16 is not allowed; expected float8_e4m3fn"):
        op.cast_fp8(x, np.ones(4, np.float16))
    with pytest.raises(ValueError, match=r"out: expected shape \(4,\)"):
        op.cast_fp8(x, np.zeros(5, ml_dtypes.float8_e4m3fn))
    with pytest.raises(TypeError, match="scale_out: dtype float16 is not allowed; expected float32"):
        op.cast_fp8(x, None, np.ones(1, np.float16))
    with pytest.raises(ValueError, match=r"scale_out: expected shape \(1,\)"):
        op.cast_fp8(x, None, np.ones(2, np.float32))
    with pytest.raises(ValueError, match="x: expected a non-empty array"):
        op.cast_fp8(np.ones(0, np.float32))
    with pytest.raises(ValueError, match="x: expected a C-contiguous array"):
        op.cast_fp8(np.ones((4, 6), np.float32)[:, ::2])
    with pytest.raises(ValueError, match="workspace: expected at least"):
        op.cast_fp8(x, workspace=cuda.device_array(1, np.uint32))
    with pytest.raises(TypeError, match="workspace: dtype int32 is not supported; expected one of: uint32"):
        op.cast_fp8(x, workspace=cuda.device_array(op.parts(), np.int32))
    with pytest.raises(ValueError, match="path: 'fast' is not a path; expected one of: auto, scalar, vector"):
        op.cast_fp8(x, path="fast")


@needs_gpu  # the simulator's device views do not carry their offset into the pointer
def test_vector_path_refuses_unaligned_operands_and_auto_falls_back():  # type: ignore[no-untyped-def]
    x = np.random.default_rng(9).standard_normal(4097).astype(np.float16)
    dx = cuda.to_device(x)
    with pytest.raises(ValueError, match="path: 'vector' needs 16-byte aligned pointers"):
        op.cast_fp8(dx[1:], path="vector")
    out, _ = op.cast_fp8(dx[1:])
    np.testing.assert_array_equal(_codes(out.copy_to_host()), _codes(op.reference(x[1:])[0]))


def test_auto_casts_every_dtype_with_the_vector_kernels_on_a_gpu(monkeypatch):  # type: ignore[no-untyped-def]
    """fp32 too (AUTO_CAST), unlike the other ops' AUTO_VECTOR: its scalar cast ran at 0.49-0.62 of copy,
    the vector cast at 0.93 (H200 / H100). What a GPU reports (the simulator flag cleared, so this runs
    everywhere), and the simulator's own scalar kernels."""
    every_dtype = (np.dtype(np.float32), np.dtype(np.float16), BF16)
    assert every_dtype == op.AUTO_CAST
    if SIMULATED:
        assert {op._choose(c).path for c in op.SPEC.bench_cases} == {"scalar"}
    monkeypatch.setattr(op, "SIMULATED", False)
    monkeypatch.setattr(op, "hardware_cvt", lambda ctx=None: True)
    for case in op.SPEC.bench_cases:
        assert op._choose(case).path == "vector", case


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16], ids=["float32", "float16", "bfloat16"])
def test_auto_launches_the_vector_kernels(dtype, monkeypatch):  # type: ignore[no-untyped-def]
    """What `_choose` reports is what the launcher runs: with the scalar kernels made to fail, an aligned
    auto call of every dtype still casts, bit for bit."""
    dt = np.dtype(dtype)

    class Refuse:
        def launch(self, *a, **k):  # type: ignore[no-untyped-def]
            raise AssertionError(f"auto ran the scalar cast_fp8 kernels for {dt}")

    monkeypatch.setitem(op._AMAX, dt, Refuse())
    monkeypatch.setitem(op._CAST, dt, Refuse())
    op._FAST.clear()  # no replay of an earlier call's launches: this call chooses its kernels
    x = np.random.default_rng(5).standard_normal(3 * op.THREADS * op.GROUP * op.GROUPS[dt] + 9).astype(dt)
    out, _ = op.cast_fp8(arrays.to_device(x))
    np.testing.assert_array_equal(_codes(out.copy_to_host()), _codes(op.reference(x)[0]))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("case", op.SPEC.bench_cases, ids=case_id)
def test_bench_shapes(case):  # type: ignore[no-untyped-def]
    assert_case_passes(op.SPEC, case)


def test_out_dtype_is_read_from_the_cuda_array_interface_when_it_is_not_numpy():  # type: ignore[no-untyped-def]
    """A torch tensor's dtype is torch's own (np.dtype refuses it); its __cuda_array_interface__ says
    "|u1" for `fp8.view(torch.uint8)`. The launcher reads that, and refuses another type by name."""
    from kernels.ops.cast_fp8 import _dtype_of

    class TorchLike:
        def __init__(self, typestr: str) -> None:
            self.dtype = object()  # what np.dtype cannot interpret, as torch.uint8
            self.__cuda_array_interface__ = {"typestr": typestr, "shape": (4,), "data": (0, False)}

    assert _dtype_of(TorchLike("|u1")) == np.dtype(np.uint8)
    assert _dtype_of(TorchLike("<f2")) == np.dtype(np.float16)
    assert _dtype_of(np.zeros(3, FP8)) == FP8
    assert _dtype_of(object()) is None


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16], ids=["float32", "float16", "bfloat16"])
def test_integer_conversion_vector_kernel_bitwise_on_this_gpu(dtype):  # type: ignore[no-untyped-def]
    """The vector cast with the integer conversion (fp8.pack8: what GPUs older than sm_89 run; auto takes the
    hardware cvt here), launched directly on this GPU: quotient + f32_to_e4m3 over whole tiles of midpoint
    values, bit for bit against numpy's division."""
    from kernels.runtime.arrays import HostSync

    dt = np.dtype(dtype)
    n = 3 * op.THREADS * op.GROUP * op.GROUPS[dt] + 17
    b = _all_boundaries()
    b = b[np.isfinite(b) & (np.abs(b) <= 448)].astype(np.float64)
    top = dt.type(3.0e-3)
    scale = np.float32(top) / np.float32(448.0)  # the kernel's scale, so x / scale lands at the midpoints
    x = np.resize((b * float(scale)).astype(np.float32), n).astype(dt)
    x[0] = top
    sync = HostSync()
    xo = arrays.operand("x", arrays.to_device(x), sync)
    out = cuda.device_array(n, np.uint8)
    oo = arrays.operand("out", out, sync)
    so = arrays.operand("scale_out", cuda.device_array(1, np.float32), sync)
    g = op.parts()
    wo = arrays.operand("workspace", cuda.device_array(g, np.uint32), sync)
    grid = max(
        1, min(g, (n + op.THREADS * op.GROUP * op.GROUPS[dt] - 1) // (op.THREADS * op.GROUP * op.GROUPS[dt]))
    )
    op._AMAX_VEC[dt].launch(grid, op.THREADS, (xo, wo))
    op._CAST_VEC[(dt, False)].launch(grid, op.THREADS, (xo, wo, grid, oo, so))
    q, _ = op.reference(x)
    np.testing.assert_array_equal(out.copy_to_host(), _codes(q))

"""fused_add_rmsnorm: every case (both kernels, three dtypes, NaN / inf) against the float64 reference, the
in-place residual, out over x, aliasing and validation errors."""

from __future__ import annotations

from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest
from numba import cuda
from opcheck import assert_case_passes, case_id, needs_device, needs_gpu, small_cases

from kernels.ops import fused_add_rmsnorm as op
from kernels.ops import rmsnorm
from kernels.primitives.reductions import BLOCK, PER
from kernels.registry import poison
from kernels.runtime.arrays import SIMULATED

DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16]


@needs_device
@pytest.mark.parametrize("case", small_cases(op.SPEC) + op.SPEC.special_cases, ids=case_id)
def test_cases(case):  # type: ignore[no-untyped-def]
    assert_case_passes(op.SPEC, case)


def _inputs(rows: int, n: int, dt, seed: int = 0):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, n)) * 2 + 0.5).astype(dt)
    r = rng.standard_normal((rows, n)).astype(dt)
    w = (1 + 0.5 * rng.standard_normal(n)).astype(dt)
    return x, r, w


@needs_device
@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("n", [133, BLOCK * PER + 89], ids=["register", "stream"])
def test_residual_in_place_and_out_is_rmsnorm_of_it(dt, n):  # type: ignore[no-untyped-def]
    """residual becomes round(x + residual) in the dtype (bit for bit: one fp32 add, one rounding), and out
    is rmsnorm of that rounded residual, bit for bit the unfused rmsnorm kernel's output."""
    x, r, w = _inputs(3, n, dt)
    want_r = (x.astype(np.float32) + r.astype(np.float32)).astype(dt)
    res = r.copy()
    out = op.fused_add_rmsnorm(x, res, w, eps=1e-6)  # numpy residual: updated in place (copied back)
    assert out.dtype == np.dtype(dt) and out.shape == x.shape
    np.testing.assert_array_equal(res.view(np.uint8), want_r.view(np.uint8))
    np.testing.assert_array_equal(out.view(np.uint8), rmsnorm.rmsnorm(want_r, w, eps=1e-6).view(np.uint8))
    _, ref = op.reference(x, r, w, 1e-6)
    assert (
        np.linalg.norm(out.astype(np.float64) - ref) / np.linalg.norm(ref)
        < op.SPEC.tolerance[np.dtype(dt).name]
    )


def _vector_widths(dt) -> list[int]:  # type: ignore[no-untyped-def]
    """Aligned widths for the vector path: a row shorter than the smallest WIDE_ROWS shape, one that leaves
    most of a block's vectors masked, exactly BLOCK * PER, and (fp16 / bf16) one that takes the widest
    shape (its last vectors masked) and the full rows of every wide shape (their compare-free branches: the
    residual's loads issued together, the weights' ahead of the stores)."""
    from kernels.ops.rows import WideRows, for_machine, vector_cols, wide_for, wide_shapes

    widths = [24, 136, BLOCK * PER]
    if vector_cols(np.dtype(dt)) <= BLOCK * PER:
        return widths
    full = {c.cols for c in map(for_machine, wide_shapes("fused_add_rmsnorm")) if isinstance(c, WideRows)}
    full = {n for n in full if wide_for(np.dtype(dt), n, "fused_add_rmsnorm") is not None}
    return widths + [vector_cols(np.dtype(dt)) - 24] + sorted(full)


@needs_device
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the simulator's numpy on NaN / inf (its threads)
@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: np.dtype(d).name)
def test_vector_path_is_the_rounded_sum_then_rmsnorm_of_it(dt):  # type: ignore[no-untyped-def]
    """path="vector" (the 16-byte kernel, at each row shape it takes): residual is round(x + residual) bit for
    bit, and out is rmsnorm's own vector kernel on that rounded residual, bit for bit: the same sums in the
    same order, so the fusion changes nothing but the memory traffic. Row 1 holds a NaN, an inf and a -inf."""
    for n in _vector_widths(dt):
        _check_rounded_sum_then_rmsnorm(dt, n)


def _check_rounded_sum_then_rmsnorm(dt, n: int, rows: int = 3, scaled: bool = False, big: int | None = None):  # type: ignore[no-untyped-def]
    """fused_add_rmsnorm on path="vector" at `rows` rows of `n`, row 1 holding a NaN, an inf and a -inf:
    residual is round(x + residual), and out is rmsnorm's path="vector" on that rounded residual, both
    compared as values (a GPU's NaN is the canonical one, numpy's keeps x's payload). `scaled`: row i of x
    and residual times 2^(i % 7 - 3), so a row normed with another row's statistics is off by 2x or more.
    `big`: that row times 2^20 more (|x| ~ 1e6, past fp16's range: a bf16 row kept as fp16 halves would
    hold infinities). Returns (x, r, w, out)."""
    x, r, w = _inputs(rows, n, dt, seed=n)
    if scaled or big is not None:
        s = (2.0 ** (np.arange(rows) % 7 - 3 if scaled else np.zeros(rows)))[:, None]
        if big is not None:
            s[big] *= 2.0**20
        x, r = (x.astype(np.float32) * s).astype(dt), (r.astype(np.float32) * s).astype(dt)
    x[1] = poison(x[1:2], 1)[0]
    want_r = (x.astype(np.float32) + r.astype(np.float32)).astype(dt)
    res = r.copy()
    out = op.fused_add_rmsnorm(x, res, w, eps=1e-6, path="vector")
    np.testing.assert_array_equal(res.astype(np.float32), want_r.astype(np.float32), err_msg=f"n={n}")
    want = rmsnorm.rmsnorm(want_r, w, eps=1e-6, path="vector")
    np.testing.assert_array_equal(out.astype(np.float32), want.astype(np.float32), err_msg=f"n={n}")
    assert np.isnan(out[1].astype(np.float32)).all()
    assert np.isfinite(np.delete(out, 1, axis=0).astype(np.float32)).all()
    return x, r, w, out


def _onchip_widths(config, dt) -> list[int]:  # type: ignore[no-untyped-def]
    """Widths the on-chip kernel of `config` (as it runs here) holds that leave every tail of its shared part
    (one vector of each input a step: half the config's vectors): the first past what registers hold, one
    and two steps less one vector, exactly, and plus one vector; its longest; on a GPU Llama-3's vocabulary
    and the round widths past 32768."""
    from kernels.ops.rows import for_machine, vector_cols
    from kernels.primitives.vector import WIDTH

    c = for_machine(config)
    w, head = WIDTH[np.dtype(dt)], c.threads * c.per
    step = c.threads * max(1, c.vectors // 2) * w
    k0 = max(1, (vector_cols(np.dtype(dt)) - head) // step + 1)
    widths = {vector_cols(np.dtype(dt)) + w, c.cols - c.cols % w}
    widths |= {head + k * step + d for k in (k0, k0 + 1) for d in (-w, 0, w)}
    if not SIMULATED:
        widths |= {40960, 65536, 128256, 131072}
    held = replace(c, from_cols=0)
    return sorted(n for n in widths if n > vector_cols(np.dtype(dt)) and held.takes(n))


@needs_device
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the simulator's numpy on NaN / inf (its threads)
@pytest.mark.parametrize("dt", [np.float16, ml_dtypes.bfloat16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", ["vocabulary", "mid"])
def test_onchip_rows_are_the_rounded_sum_then_rmsnorm_on_chip(dt, shape, monkeypatch):  # type: ignore[no-untyped-def]
    """Rows past what registers hold, kept on chip (rmsnorm's on-chip kernel text with the add in front:
    kernels.ops.rmsnorm.make_onchip's `add`), at widths that leave every tail of the shared part and over
    more rows than blocks (each block loads its next row, x and residual, in the write pass; every block
    twice, block 0 three times), each row at its own scale: residual is round(x + residual) bit for bit, out
    is rmsnorm's on-chip kernel of the same shape on that rounded residual, bit for bit (the same sums in the
    same order), and every finite row is within the op's tolerance of float64 on its own (a row normed with
    another's statistics is off by 2x or more). Row 1 holds a NaN, an inf and a -inf."""
    from kernels.ops.rows import ONCHIP_MID_ROWS, ONCHIP_ROWS, WithShared, chip_fits
    from kernels.runtime.launch import FastCache, sm_count

    config = ONCHIP_ROWS if shape == "vocabulary" else ONCHIP_MID_ROWS
    if not chip_fits(config):
        pytest.skip("this GPU cannot give a block the on-chip rows' shared memory (they stream here)")
    attr, other = ("chip", "mid") if shape == "vocabulary" else ("mid", "chip")
    for mod in (op, rmsnorm):  # both ops on this shape alone, from its first width past the registers
        monkeypatch.setattr(mod._K, f"{attr}_shape", replace(getattr(mod._K, f"{attr}_shape"), from_cols=0))
        monkeypatch.setattr(mod._K, f"{other}_k", {})
        monkeypatch.setattr(mod, "_FAST", FastCache())
    held, d = op._K.mid_shape if attr == "mid" else op._K.chip_shape, np.dtype(dt)
    rows = 2 * held.min_blocks * sm_count() + 1
    for n in _onchip_widths(config, dt):
        k, threads, grid = op._K.pick("vector", d, True, n, rows)
        assert isinstance(k, WithShared) and k.kernel is getattr(op._K, f"{attr}_k")[d], n
        assert (threads, grid) == (held.threads, min(rows, held.min_blocks * sm_count()))
        theirs = rmsnorm._K.pick("vector", d, True, n, rows)[0]
        assert isinstance(theirs, WithShared) and theirs.kernel is getattr(rmsnorm._K, f"{attr}_k")[d], n
        x, r, w, out = _check_rounded_sum_then_rmsnorm(dt, n, rows, scaled=True)
        _, ref = op.reference(x, r, w, 1e-6)
        for i in [0, *range(2, rows)]:
            err = np.linalg.norm(out[i].astype(np.float64) - ref[i]) / np.linalg.norm(ref[i])
            assert err < op.SPEC.tolerance[d.name], (n, i, err)


@needs_device
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the simulator's numpy on NaN / inf (its threads)
@pytest.mark.parametrize("dt", [np.float16, ml_dtypes.bfloat16], ids=lambda d: np.dtype(d).name)
def test_packed_rows_are_the_rounded_sum_then_rmsnorm_packed(dt):  # type: ignore[no-untyped-def]
    """The op's packed shapes (kernels.ops.rows.WIDE_PACKED: rmsnorm's packed kernel text with the add in
    front, kernels.ops.rmsnorm._make_packed's `add`), each at its full width and with padding lanes, path
    "vector" picks it; residual is round(x + residual) bit for bit, out is rmsnorm's packed kernel of the same
    threads x values on that rounded residual bit for bit (the same sums in the same order), and every finite
    row, each at its own scale, is within the op's tolerance of float64 on its own. Row 1 holds a NaN, an inf
    and a -inf. Then the same kernel on a grid of two blocks (each loops over rows, alternating its reduction
    halves) gives the same words. bf16 rows are packed as bf16 words (row 4 sits past fp16's range), and a
    row of 5/8 the shape's columns leaves whole vectors of every thread empty."""
    from kernels.ops.rows import WIDE_PACKED, for_machine, wide_for
    from kernels.primitives.vector import WIDTH
    from kernels.runtime import arrays
    from kernels.runtime.arrays import HostSync

    d = np.dtype(dt)
    ran = 0
    for c in WIDE_PACKED["fused_add_rmsnorm"]:
        shape = for_machine(c)
        assert shape.packed, shape  # out cannot tell (the unpacked kernel of a shape sums alike)
        if shape.cols == BLOCK * PER:
            continue  # the simulator's 512 columns tie with the op's own BLOCK x PER kernel, which runs them
        for n in (shape.cols, shape.cols - 3 * WIDTH[d], shape.cols * 5 // 8 + WIDTH[d]):
            assert wide_for(d, n, "fused_add_rmsnorm") == shape
            k, threads, grid = op._K.pick("vector", d, True, n, 5)
            assert k is op._K.wide_k[(d, shape)] and (threads, grid) == (shape.threads, 5), n
            theirs = wide_for(d, n, "rmsnorm")
            assert (
                theirs is not None
                and theirs.packed
                and (theirs.threads, theirs.per) == (shape.threads, shape.per)
            )
            x, r, w, out = _check_rounded_sum_then_rmsnorm(
                dt, n, 5, True, 4 if d == ml_dtypes.bfloat16 else None
            )
            _, ref = op.reference(x, r, w, 1e-6)
            for i in (0, 2, 3, 4):
                err = np.linalg.norm(out[i].astype(np.float64) - ref[i]) / np.linalg.norm(ref[i])
                assert err < op.SPEC.tolerance[d.name], (n, i, err)
            sync, r2, o2 = HostSync(), arrays.to_device(r), arrays.to_device(np.zeros_like(x))
            xo, ro, oo = (arrays.as_rows(arrays.operand(a, b, sync)) for a, b in
                          (("x", arrays.to_device(x)), ("residual", r2), ("out", o2)))  # fmt: skip
            k.launch(2, threads, (xo, ro, arrays.operand("weight", arrays.to_device(w), sync), oo, 1e-6))
            np.testing.assert_array_equal(arrays.to_host(o2).view(np.uint16), out.view(np.uint16), err_msg=n)
            want_r = (x.astype(np.float32) + r.astype(np.float32)).astype(d)
            np.testing.assert_array_equal(arrays.to_host(r2).astype(np.float32), want_r.astype(np.float32))
            ran += 1
    assert ran >= 3  # under the simulator one shape ties with BLOCK x PER; on a GPU 6


def _built(dt, vectors: int) -> int:  # type: ignore[no-untyped-def]
    """The vectors per input make_stream_vec builds from a config of `vectors`: half in fp16 / bf16."""
    return vectors if np.dtype(dt).itemsize == 4 else max(1, vectors // 2)


def _stream_widths(dt, vectors: int, threads: int) -> list[int]:  # type: ignore[no-untyped-def]
    """Aligned widths past what registers hold that leave every tail of the 16-byte streaming kernel (one
    block of `threads`, `vectors` vectors in flight per thread): none past the full steps, one vector, up
    to vectors - 1, and one vector past those."""
    from kernels.ops.rows import vector_cols
    from kernels.primitives.vector import WIDTH

    span = threads * WIDTH[np.dtype(dt)]
    steps = -(-(vector_cols(np.dtype(dt)) + 1) // (vectors * span))
    extras = {0, WIDTH[np.dtype(dt)], (vectors - 1) * span, (vectors - 1) * span + WIDTH[np.dtype(dt)]}
    return [steps * vectors * span + e for e in sorted(extras)]


@needs_device
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the simulator's numpy on NaN / inf (its threads)
@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: np.dtype(d).name)
def test_stream_vector_path_is_the_rounded_sum_then_rmsnorm_of_it(dt, monkeypatch):  # type: ignore[no-untyped-def]
    """Rows past what registers hold (a vocabulary of 128256 in bf16) on path="vector": the 16-byte
    streaming kernel. residual is round(x + residual) bit for bit, and out is rmsnorm's own streaming kernel
    on that rounded residual, bit for bit (the same sums in the same order), at widths that leave every tail.
    Row 1 holds a NaN, an inf and a -inf."""
    from kernels.ops.rows import STREAM_ROWS, for_machine
    from kernels.runtime.launch import FastCache

    cfg = for_machine(STREAM_ROWS)
    # the streaming kernels of both ops, not their on-chip ones (another order of sums)
    for mod in (op, rmsnorm):
        monkeypatch.setattr(mod._K, "chip_k", {})
        monkeypatch.setattr(mod._K, "mid_k", {})
        monkeypatch.setattr(mod, "_FAST", FastCache())
    widths = _stream_widths(dt, _built(dt, cfg.vectors), cfg.threads)
    if np.dtype(dt).itemsize == 2 and not SIMULATED:
        widths.append(128256)  # Llama-3's vocabulary
    for n in widths:
        assert op._K.pick("vector", np.dtype(dt), True, n, 3)[0] is op._K.svec_k[np.dtype(dt)]
        x, r, w, out = _check_rounded_sum_then_rmsnorm(dt, n)
        _, ref = op.reference(x[[0, 2]], r[[0, 2]], w, 1e-6)
        err = np.linalg.norm(out[[0, 2]].astype(np.float64) - ref) / np.linalg.norm(ref)
        assert err < op.SPEC.tolerance[np.dtype(dt).name], (n, err)


@needs_device
@pytest.mark.skipif(not SIMULATED, reason="shapes of the simulator's 32-thread blocks")
@pytest.mark.parametrize("vectors", [1, 2, 3, 4, 6, 8])
def test_stream_vector_kernel_covers_every_column_for_any_vector_count(vectors, monkeypatch):  # type: ignore[no-untyped-def]
    """Every vector count the streaming kernel can be built with (the committed config says 4: 4 per input
    in fp32, 2 in fp16 / bf16), bf16 taking 1 to 4 per input and fp32 1 to 8, at widths that leave every
    tail of the count built: residual bit for bit, out against the scalar streaming kernel on the same
    rounded residual."""
    from kernels.ops.rows import STREAM_ROWS, StreamRows
    from kernels.primitives.vector import WIDTH
    from kernels.runtime.launch import FastCache, kernel

    config = StreamRows(STREAM_ROWS.threads // 32, vectors, 1)
    monkeypatch.setattr(op._K, "svec_shape", config)
    monkeypatch.setattr(op, "_FAST", FastCache())
    for dt in (ml_dtypes.bfloat16, np.float32):
        d = np.dtype(dt)
        monkeypatch.setitem(op._K.svec_k, d, kernel(op.make_stream_vec(config, WIDTH[d]), op._K.sigs[d]))
        for n in _stream_widths(dt, _built(dt, vectors), config.threads):
            x, r, w = _inputs(2, n, dt, seed=n)
            want_r = (x.astype(np.float32) + r.astype(np.float32)).astype(dt)
            res = r.copy()
            out = op.fused_add_rmsnorm(x, res, w, eps=1e-6, path="vector").astype(np.float64)
            np.testing.assert_array_equal(res.view(np.uint8), want_r.view(np.uint8), err_msg=f"{d} n={n}")
            want = rmsnorm.rmsnorm(want_r, w, eps=1e-6, path="scalar").astype(np.float64)
            tol = 2.0**-7 if d.itemsize == 2 else 1e-5
            assert np.abs(out - want).max() <= tol * np.abs(want).max(), (d, n)


@needs_device
def test_vector_path_refuses_rows_it_cannot_hold_without_a_streaming_kernel(monkeypatch):  # type: ignore[no-untyped-def]
    """The guard for a dtype with no 16-byte streaming kernel: path="vector" past what registers hold is
    refused with one line naming the limit, never run on another kernel."""
    from kernels.ops.rows import vector_cols

    monkeypatch.delitem(op._K.svec_k, np.dtype(np.float16))
    monkeypatch.setattr(op._K, "chip_k", {})  # and no on-chip kernel for the row either
    monkeypatch.setattr(op._K, "mid_k", {})
    n = vector_cols(np.dtype(np.float16)) + 8
    x, r, w = _inputs(1, n, np.float16)
    with pytest.raises(ValueError, match=f"path: 'vector' holds rows of up to {n - 8} columns in float16"):
        op.fused_add_rmsnorm(x, r, w, path="vector")


@needs_device
def test_device_arrays_out_over_x_and_nd():  # type: ignore[no-untyped-def]
    x, r, w = _inputs(6, 45, np.float16, seed=1)
    want_r = (x.astype(np.float32) + r.astype(np.float32)).astype(np.float16)
    want_out = rmsnorm.rmsnorm(want_r, w, eps=1e-5)
    dx, dr, dw = cuda.to_device(x.reshape(2, 3, 45)), cuda.to_device(r.reshape(2, 3, 45)), cuda.to_device(w)
    assert op.fused_add_rmsnorm(dx, dr, dw, dx, eps=1e-5) is dx  # vLLM's layout: the normed rows over x
    np.testing.assert_array_equal(dr.copy_to_host().reshape(6, 45), want_r)
    np.testing.assert_array_equal(dx.copy_to_host().reshape(6, 45), want_out)


@needs_device
@pytest.mark.parametrize("kernel", ["stream-vector", "on-chip"])
def test_rows_past_the_registers_write_out_over_x(kernel, monkeypatch):  # type: ignore[no-untyped-def]
    """vLLM's layout (out is x) past what registers hold, over more rows than blocks: on the 16-byte
    streaming kernel each row's x is read in pass 1, before that row of out is written in pass 2; on chip a
    block loads its next row's x while it writes this row's out (another row, never one it has not read)."""
    from kernels.ops.rows import WithShared, chip_fits, vector_cols
    from kernels.runtime.launch import FastCache, sm_count

    n = vector_cols(np.dtype(np.float16)) + 2 * 8 * 32  # past the registers
    if kernel == "stream-vector":
        monkeypatch.setattr(op._K, "chip_k", {})
        monkeypatch.setattr(op._K, "mid_k", {})
    else:
        if not chip_fits(op._K.mid_shape):
            pytest.skip("this GPU cannot give a block the on-chip rows' shared memory (they stream here)")
        monkeypatch.setattr(op._K, "mid_shape", replace(op._K.mid_shape, from_cols=0))
        n = max(n, 40960 if not SIMULATED else n)
    monkeypatch.setattr(op, "_FAST", FastCache())
    rows = 2 * 2 * sm_count() + 1  # every block of the mid shape (2 per SM) loops, block 0 twice
    x, r, w = _inputs(rows, n, np.float16, seed=3)
    want_r = (x.astype(np.float32) + r.astype(np.float32)).astype(np.float16)
    want_out = op.fused_add_rmsnorm(x, r.copy(), w, eps=1e-5, path="vector")
    dx, dr, dw = cuda.to_device(x), cuda.to_device(r), cuda.to_device(w)
    k = op._K.pick("vector", np.dtype(np.float16), True, n, x.shape[0])[0]
    if kernel == "stream-vector":
        assert k is op._K.svec_k[np.dtype(np.float16)]
    else:
        assert isinstance(k, WithShared) and k.kernel is op._K.mid_k[np.dtype(np.float16)]
    assert op.fused_add_rmsnorm(dx, dr, dw, dx, eps=1e-5, path="vector") is dx
    np.testing.assert_array_equal(dr.copy_to_host(), want_r)
    np.testing.assert_array_equal(dx.copy_to_host(), want_out)


@needs_device
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the simulator's numpy on NaN / inf (its threads)
@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: np.dtype(d).name)
def test_nan_and_inf(dt):  # type: ignore[no-untyped-def]
    """Rows 0, 2, 3 hold NaN, +inf, -inf in x: the residual is IEEE x + r there; out's NaN row is all NaN, an
    infinite row is 0 at its finite elements and NaN at the infinite one (r / sqrt(inf) and inf * 0)."""
    x, r, w = _inputs(4, 40, dt, seed=2)
    x = poison(x)
    res = r.copy()
    out = op.fused_add_rmsnorm(x, res, w).astype(np.float64)
    res64 = res.astype(np.float64)
    assert np.isnan(res64[0, 0]) and res64[2, 0] == np.inf and res64[3, -1] == -np.inf
    assert np.isfinite(res64).sum() == res64.size - 3
    assert np.isnan(out[0]).all()
    for row, col in ((2, 0), (3, -1)):
        assert np.isnan(out[row, col])
        finite = np.delete(out[row], col)
        assert np.all(finite == 0.0)
    assert np.isfinite(out[1]).all()


@needs_device
def test_validation_errors():  # type: ignore[no-untyped-def]
    x, r, w = _inputs(4, 6, np.float32)
    f = op.fused_add_rmsnorm
    with pytest.raises(TypeError, match="x: dtype int32 is not supported"):
        f(np.ones((4, 6), np.int32), np.ones((4, 6), np.int32), np.ones(6, np.int32))
    with pytest.raises(TypeError, match="residual: dtype float16 must match x's dtype float32"):
        f(x, r.astype(np.float16), w)
    with pytest.raises(ValueError, match=r"residual: expected shape \(4, 6\) \(same as x\), got \(4, 5\)"):
        f(x, np.ones((4, 5), np.float32), w)
    with pytest.raises(ValueError, match=r"weight: expected shape \(6,\) \(x's last dimension\), got \(5,\)"):
        f(x, r, np.ones(5, np.float32))
    with pytest.raises(TypeError, match="weight: dtype float16 must match x's dtype float32"):
        f(x, r, w.astype(np.float16))
    with pytest.raises(ValueError, match="x: expected a C-contiguous array"):
        f(np.ones((4, 12), np.float32)[:, ::2], r, w)
    with pytest.raises(ValueError, match="residual: expected a C-contiguous array"):
        f(x, cuda.to_device(np.ones((4, 12), np.float32))[:, ::2], w)
    with pytest.raises(ValueError, match="x: expected a non-empty array"):
        f(np.ones((0, 6), np.float32), np.ones((0, 6), np.float32), w)
    with pytest.raises(ValueError, match="eps: expected a positive finite number, got -1"):
        f(x, r, w, eps=-1)
    with pytest.raises(ValueError, match=r"out: expected shape \(4, 6\)"):
        f(x, r, w, np.empty((4, 7), np.float32))
    with pytest.raises(TypeError, match="out: dtype float16 is not allowed; expected float32"):
        f(x, r, w, np.empty((4, 6), np.float16))
    with pytest.raises(ValueError, match="path: 'vector' needs 16-byte aligned pointers"):
        f(x, r, w, path="vector")  # rows of 24 bytes


@needs_device
def test_aliasing_errors():  # type: ignore[no-untyped-def]
    x, r, w = _inputs(4, 8, np.float32)
    f = op.fused_add_rmsnorm
    with pytest.raises(ValueError, match=r"residual: must not overlap x \(residual is updated in place"):
        f(x, x, w)
    buf = cuda.to_device(np.concatenate([x.ravel(), r.ravel()]))
    dx, dr = buf[:32].reshape(4, 8), buf[32:].reshape(4, 8)
    with pytest.raises(
        ValueError, match=r"residual: must not overlap out \(residual and out are two results\)"
    ):
        f(dx, dr, w, dr)
    shifted = buf[8:40].reshape(4, 8)  # rows 1-3 of x and row 0 of r
    with pytest.raises(ValueError, match="out: must be x itself or not overlap it"):
        f(dx, cuda.to_device(r), w, shifted)
    wbuf = cuda.to_device(np.ones(32, np.float32))  # weight = its last 8: the last row of the other operand
    with pytest.raises(ValueError, match="weight: must not overlap residual"):
        f(dx, wbuf.reshape(4, 8), wbuf[24:], dr)
    with pytest.raises(ValueError, match="weight: must not overlap out"):
        f(dx, dr, wbuf[24:], wbuf.reshape(4, 8))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("case", op.SPEC.bench_cases, ids=case_id)
def test_bench_shapes(case):  # type: ignore[no-untyped-def]
    assert_case_passes(op.SPEC, case)

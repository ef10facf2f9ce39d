"""bf16 as raw words (kernels.primitives.bf16) through the launchers, in the simulator and on a GPU alike:
fp32 -> bf16 rounding bit-exact against ml_dtypes on ties, subnormals, overflow and NaN; residual_add and
gemm on numpy bf16 arrays against float64; the row ops (rmsnorm, layernorm, softmax) rounding their fp32
results to nearest even, and a deliberately broken bf16 store (truncating, or swallowing NaN) failing."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from numba import cuda, uint16, uint32
from opcheck import needs_device

from kernels.harness import verify
from kernels.ops import fused_add_rmsnorm as fused_mod
from kernels.ops import layernorm, rmsnorm, softmax
from kernels.ops.cast import cast
from kernels.ops.gemm import gemm
from kernels.ops.o_proj import o_proj
from kernels.ops.residual_add import residual_add
from kernels.ops.rows import (
    ONCHIP_MID_ROWS,
    ONCHIP_ROWS,
    STREAM_ROWS,
    STREAM_VECTOR_AUTO,
    STREAM_VECTOR_AUTO_FROM,
    WIDE_PACKED,
    WIDE_ROWS,
    OnChipRows,
    RowIO,
    StreamRows,
    WithShared,
    chip_fits,
    for_machine,
    onchip_pairs,
    row_path_of,
    stream_vector_auto,
    vector_cols,
    wide_for,
    wide_shapes,
)
from kernels.primitives.bf16 import bf16_to_f32, f32_bits, f32_to_bf16
from kernels.primitives.reductions import BLOCK, PER
from kernels.primitives.vector import WIDTH
from kernels.registry import Case
from kernels.runtime import arrays
from kernels.runtime.arrays import BF16, HostSync
from kernels.runtime.launch import FastCache, kernel, sm_count


def test_cast_rounds_like_ml_dtypes_bit_for_bit():  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(7)
    # ties (low half exactly 0x8000, both parities), one below / above a tie, the overflow edge, subnormals
    hi = rng.integers(0, 0x10000, 40, dtype=np.uint32) << 16
    bits = np.concatenate([hi | 0x8000, hi | 0x7FFF, hi | 0x8001, hi,
                           np.array([0x7F7F8000, 0x7F7F7FFF, 0xFF7F8000, 0x00000001, 0x80008000, 0x7FC00001,
                                     0x7F800001, 0xFF800000, 0x7F800000], dtype=np.uint32)])  # fmt: skip
    x = bits.view(np.float32)
    got = cast(x, dtype=BF16)
    with np.errstate(invalid="ignore"):  # numpy warns on casting NaN
        want = x.astype(BF16)
    g, w = got.view(np.uint16), want.view(np.uint16)
    nan = (w & 0x7FFF) > 0x7F80  # NaN payloads may differ; NaN-ness may not
    assert nan.sum() >= 2 and np.array_equal((g & 0x7FFF) > 0x7F80, nan)
    assert np.array_equal(g[~nan], w[~nan])


def test_residual_add_bf16_matches_float64():  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(8)
    x = rng.standard_normal((3, 41)).astype(BF16)
    r = rng.standard_normal((3, 41)).astype(BF16)
    out = residual_add(x, r)
    assert out.dtype == BF16
    ref = (x.astype(np.float64) + r.astype(np.float64)).astype(BF16)  # one rounding of the exact sum
    assert np.array_equal(out.view(np.uint16), ref.view(np.uint16))


def test_gemm_and_o_proj_bf16_match_float64():  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(9)
    a = rng.standard_normal((9, 19)).astype(BF16)
    b = rng.standard_normal((19, 13)).astype(BF16)
    c = gemm(a, b)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert c.dtype == np.float32
    assert np.abs(c - ref).max() <= 1e-5 * np.abs(ref).max()
    res = rng.standard_normal((9, 13)).astype(BF16)
    out = o_proj(a, b, res)
    assert out.dtype == BF16
    want = ref + res.astype(np.float64)
    assert np.abs(out.astype(np.float64) - want).max() <= 2**-8 * np.abs(want).max()


# --- the row ops ------------------------------------------------------------------------------------------

ROW_OPS = {"rmsnorm": rmsnorm, "layernorm": layernorm, "softmax": softmax}


def _row_problem(
    op: str, rows: int, cols: int, seed: int, dtype: str = "bfloat16"
) -> tuple[tuple[Any, ...], np.ndarray]:
    """(arguments, float64 reference) of the op's own registry problem (bf16 unless `dtype`)."""
    mod = ROW_OPS[op]
    case = Case("odd", {"rows": rows, "cols": cols}, dtype)
    prob = mod.SPEC.make_problem(case, np.random.default_rng(seed))
    return tuple(prob.inputs.values()), prob.reference["out"]


def _call(op: str, args: tuple[Any, ...], **kw: Any) -> np.ndarray:
    out: np.ndarray = getattr(ROW_OPS[op], op)(*args, **kw)
    return out


def _rounded_share(out: np.ndarray, ref: np.ndarray) -> float:
    """The share of elements whose bf16 word is the round to nearest even of the float64 result."""
    return float(np.mean(out.view(np.uint16) == ref.astype(BF16).view(np.uint16)))


@needs_device
@pytest.mark.parametrize("op", sorted(ROW_OPS))
@pytest.mark.parametrize(("rows", "cols"), [(3, 37), (2, 601)])  # registers; streaming in the simulator
def test_row_ops_bf16_round_the_float64_result(op: str, rows: int, cols: int) -> None:
    args, ref = _row_problem(op, rows, cols, seed=rows * cols)
    out = _call(op, args)
    assert out.dtype == BF16 and out.shape == ref.shape
    o = out.astype(np.float64)
    # fp32 arithmetic then one rounding: the nearest bf16 of the exact result, but for the rare element whose
    # fp32 value sits on the other side of a rounding boundary (measured: >= 99.9% exact)
    assert _rounded_share(out, ref) >= 0.99
    assert np.linalg.norm(o - ref) / np.linalg.norm(ref) <= 2.0**-8
    assert np.abs(o - ref).max() <= 2.0**-8 * np.abs(ref).max()
    np.testing.assert_array_equal(_call(op, args, path="scalar").view(np.uint16), out.view(np.uint16))


# bf16 rows of every vector shape this machine runs (kernels.ops.rows.wide_for). Under the simulator: 32 /
# 64 / 160 / 256 / 512 / 1024 columns a block (1/32 of their threads, as many values per thread; the op's
# own BLOCK x PER kernel holds 512): 24 -> 32 x 32, 56 -> 64 x 32, 152 -> 160 x 32, 200 -> 256 x 32, 384 ->
# the op's own (512 x 32 ties with it, so the simulator never runs that one), 1000 -> 1024 x 32. On a GPU
# the same shapes at 32 times the threads (the op's own holds 4096): 768, 1600, 4800, 6400, 4096 (the op's
# own), 12288 (512 x 32, which only a GPU runs), 32000.
# The third field: the index of the shape in WIDE_ROWS and in the op's wide_shapes (the same widths), None
# for the op's own. rmsnorm's and softmax's shapes of 8192 columns and more hold the row as packed pairs
# (rows.WIDE_PACKED): 200 and 1000 (6400, 12288 and 32000 on a GPU) run them, with padding lanes.
VECTOR_SHAPES = (
    [(3, 24, 0), (2, 56, 1), (2, 152, 2), (2, 200, 3), (2, 384, None), (2, 1000, 5)]
    if verify.SIMULATED
    else [(3, 768, 0), (2, 1600, 1), (2, 4800, 2), (2, 6400, 3), (2, 4096, None), (2, 12288, 4)]
    + [(2, 32000, 5)]
)


@needs_device
@pytest.mark.parametrize("op", sorted(ROW_OPS))
@pytest.mark.parametrize(("rows", "cols", "shape"), VECTOR_SHAPES)
def test_row_ops_bf16_vector_rounds_the_float64_result(op: str, rows: int, cols: int, shape: Any) -> None:
    assert wide_for(BF16, cols, op) == (None if shape is None else for_machine(wide_shapes(op)[shape]))
    assert shape is None or wide_shapes(op)[shape].cols == WIDE_ROWS[shape].cols
    args, ref = _row_problem(op, rows, cols, seed=rows + cols)
    out = _call(op, args, path="vector")
    o = out.astype(np.float64)
    assert _rounded_share(out, ref) >= 0.99
    assert np.linalg.norm(o - ref) / np.linalg.norm(ref) <= 2.0**-8
    assert np.abs(o - ref).max() <= 2.0**-8 * np.abs(ref).max()
    same = np.mean(_call(op, args, path="scalar").view(np.uint16) == out.view(np.uint16))
    assert same >= 0.99  # fp32 sums in another order: a rare word one ulp apart


# Full rows: every WIDE_ROWS width (as it runs here) and the op's own BLOCK x PER. The vector kernels take a
# compare-free branch there (the weight loads, and layernorm's bias loads, ahead of the stores they feed),
# which VECTOR_SHAPES' rows with padding lanes never reach.
FULL_COLS = sorted(
    {c.cols for c in map(for_machine, WIDE_ROWS) if isinstance(c, type(WIDE_ROWS[0]))} | {BLOCK * PER}
)


@needs_device
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("op", sorted(ROW_OPS))
@pytest.mark.parametrize("cols", FULL_COLS)
def test_row_ops_vector_full_rows_round_the_float64_result(op: str, dtype: str, cols: int) -> None:
    dt = np.dtype(BF16 if dtype == "bfloat16" else dtype)
    args, ref = _row_problem(op, 3, cols, seed=cols, dtype=dtype)
    out = _call(op, args, path="vector")
    assert out.dtype == dt and out.shape == ref.shape
    # fp32 arithmetic rounded once, but for layernorm's fp16 BLOCK x PER rows: the half2 kernel
    # (layernorm.make_rows_half2) applies weight and bias as fp16 FMAs, a second rounding (its own tests)
    half2 = op == "layernorm" and dt == np.float16 and wide_for(dt, cols, op) is None
    if not half2:
        assert np.mean(out.view(np.uint16) == ref.astype(dt).view(np.uint16)) >= 0.99
    assert np.abs(out.astype(np.float64) - ref).max() <= 2.0**-8 * np.abs(ref).max()


@needs_device
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("shape", range(len(WIDE_PACKED["rmsnorm"])))
def test_packed_rmsnorm_equals_its_unpacked_shape_bit_for_bit(dtype: str, shape: int) -> None:
    """rmsnorm's packed shapes (rows.WIDE_PACKED) keep WIDE_ROWS' threads x values: the same sums in the same
    order, so the same words as the unpacked kernel of that shape, in fp16 and bf16, at a full row and one
    with padding lanes; and the launcher runs the packed kernel at that width."""
    dt = np.dtype(BF16 if dtype == "bfloat16" else dtype)
    packed = for_machine(WIDE_PACKED["rmsnorm"][shape])
    assert isinstance(packed, type(WIDE_ROWS[0])) and packed.packed
    plain = replace(packed, packed=False)
    kp = kernel(rmsnorm._row_kernel(packed, WIDTH[dt], word=dt == BF16)[0], rmsnorm._K.sigs[dt])
    ku = kernel(rmsnorm._row_kernel(plain, WIDTH[dt], word=dt == BF16)[0], rmsnorm._K.sigs[dt])
    rng = np.random.default_rng(shape)
    for n in (packed.cols, packed.cols - 3 * WIDTH[dt]):
        x = (rng.standard_normal((3, n)) * 3).astype(dt)
        w = (1 + 0.5 * rng.standard_normal(n)).astype(dt)
        got = []
        for k in (kp, ku):
            sync = HostSync()
            xo = arrays.as_rows(arrays.operand("x", arrays.to_device(x), sync))
            wo = arrays.operand("weight", arrays.to_device(w), sync)
            out = arrays.to_device(np.zeros((3, n), dt))
            oo = arrays.as_rows(arrays.operand("out", out, sync))
            k.launch(2, packed.threads, (xo, wo, oo, 1e-6))  # 2 blocks, 3 rows: block 0 strides to row 2
            got.append(arrays.to_host(out).view(np.uint16))
        np.testing.assert_array_equal(got[0], got[1])
        ref = rmsnorm.reference(x.astype(np.float64), w.astype(np.float64), 1e-6)
        assert np.abs(got[0].view(dt).astype(np.float64) - ref).max() <= 2.0**-7 * np.abs(ref).max()
    k, threads, _ = rmsnorm._K.pick("vector", dt, True, packed.cols, 3)
    if packed.cols != BLOCK * PER:
        assert k is rmsnorm._K.wide_k[(dt, packed)] and threads == packed.threads
    else:  # the simulator's 16 x 32 ties with the op's own BLOCK x PER kernel, which runs those rows
        assert wide_for(dt, packed.cols, "rmsnorm") is None and k is rmsnorm._K.vec[dt]


@needs_device
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # a wrong packing makes infinities (simulator warns)
@pytest.mark.parametrize("op", sorted(set(WIDE_PACKED) & set(ROW_OPS)))  # fused_add_rmsnorm: its own file
def test_packed_bf16_keeps_values_past_fp16s_range(op: str) -> None:
    """bf16 rows are packed as bf16 words, not as fp16 halves: a bf16 value inside fp16's normal range
    survives either packing, so these rows sit past it (|x| ~ 1e6 for rmsnorm, whose result does not depend
    on the scale; a row of 70144s for softmax, whose result is 1 / n), where fp16 would hold infinities."""
    for c in WIDE_PACKED[op]:
        shape = for_machine(c)
        if shape.cols == BLOCK * PER:
            continue  # the simulator's 512 columns tie with the op's own kernel, which runs them
        n = shape.cols - 3 * WIDTH[BF16]
        rng = np.random.default_rng(n)
        if op == "rmsnorm":
            x = (rng.standard_normal((2, n)) * 1e6).astype(BF16)
            w = (1 + 0.5 * rng.standard_normal(n)).astype(BF16)
            ref = rmsnorm.reference(x.astype(np.float64), w.astype(np.float64), 1e-6)
            out = rmsnorm.rmsnorm(x, w, path="vector").astype(np.float64)
        else:
            x = np.full((2, n), 70144.0, np.float32).astype(BF16)
            ref = softmax.reference(x.astype(np.float64))
            out = softmax.softmax(x, path="vector").astype(np.float64)
        assert np.isfinite(out).all(), f"{op} {shape.label}: values past fp16's range became infinities"
        assert np.abs(out - ref).max() <= 2.0**-8 * np.abs(ref).max()


@needs_device
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the simulator's threads warn on NaN arithmetic
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("op", sorted(set(WIDE_PACKED) & set(ROW_OPS)))  # fused_add_rmsnorm: its own file
def test_packed_shapes_round_the_float64_result_with_specials(op: str, dtype: str) -> None:
    """Every packed shape of every op, fp16 and bf16, at a row with padding lanes: the float64 result within
    one rounding, and a softmax row holding a NaN, a +inf or only -inf comes out NaN as the reference's."""
    dt = np.dtype(BF16 if dtype == "bfloat16" else dtype)
    for c in WIDE_PACKED[op]:
        shape = for_machine(c)
        n = shape.cols - 5 * WIDTH[dt]
        if shape.cols == BLOCK * PER:
            continue  # the simulator's 512 columns tie with the op's own kernel, which runs them
        assert wide_for(dt, n, op) == shape
        args, ref = _row_problem(op, 4, n, seed=n, dtype=dtype)
        if op == "softmax":  # near 0: at the registry's 40, a padding lane's exp(0 - max) is 0 anyway
            x = (np.random.default_rng(n).standard_normal((4, n)) * 2).astype(dt)
            x[1, 7], x[2, n - 1], x[3, :] = np.nan, np.inf, -np.inf
            args = (x,)
            ref = softmax.reference(x.astype(np.float64))
        out = _call(op, args, path="vector").astype(np.float64)
        finite = np.isfinite(ref).all(axis=1)
        assert np.array_equal(np.isnan(out[~finite]), np.isnan(ref[~finite]))
        err = np.abs(out[finite] - ref[finite]).max() / np.abs(ref[finite]).max()
        assert err <= 2.0**-8 if dt == BF16 else err <= 2.0**-10


# Rows past vector_cols (1024 bf16 columns under the simulator, 32768 on a GPU) stream with 16-byte loads
# on path="vector" (rows.STREAM_ROWS; "auto" in the rows.STREAM_VECTOR_AUTO dtypes on a GPU): under the
# simulator 2568 columns are 2 steps of 4 vectors x 32 threads x 8 words, then a tail of 2 vectors per thread
# and a third for thread 0 alone; on a GPU 81928 columns, 2 steps of 4 x 1024 x 8 and the same tail. fp32
# rows take half the columns: the same steps at 4 words a vector.
STREAM_COLS = 2568 if verify.SIMULATED else 81928


@needs_device
@pytest.mark.parametrize("op", sorted(ROW_OPS))
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_row_ops_stream_vector_rounds_the_float64_result(
    op: str, dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    mod, dt = ROW_OPS[op], np.dtype(BF16 if dtype == "bfloat16" else dtype)
    monkeypatch.setattr(mod._K, "chip_k", {})  # the streaming kernel, not the on-chip ones (tested below)
    monkeypatch.setattr(mod._K, "mid_k", {})
    cols = STREAM_COLS if dt.itemsize == 2 else STREAM_COLS // 2  # fp32: past 4096 (512 simulated) too
    assert cols > vector_cols(dt) and (cols * dt.itemsize) % 16 == 0
    k, threads, grid = mod._K.pick("vector", dt, True, cols, 2)
    assert (k, threads, grid) == (mod._K.svec_k[dt], mod._K.svec_shape.threads, 2)
    args, ref = _row_problem(op, 2, cols, seed=cols, dtype=dtype)
    out = _call(op, args, path="vector")
    o = out.astype(np.float64)
    err = np.linalg.norm(o - ref) / np.linalg.norm(ref)
    if dt == BF16:
        assert _rounded_share(out, ref) >= 0.99
        assert err <= 2.0**-8 and np.abs(o - ref).max() <= 2.0**-8 * np.abs(ref).max()
    else:
        assert err <= (1e-3 if dt.itemsize == 2 else 1e-5), err
    scalar = _call(op, args, path="scalar")  # the scalar streaming kernel: fp32 sums in another order
    assert (
        np.abs(scalar.astype(np.float64) - o).max()
        <= (2.0**-7 if dt.itemsize == 2 else 1e-5) * np.abs(o).max()
    )


@needs_device
def test_auto_takes_the_stream_vector_kernel_only_where_it_is_listed() -> None:
    for name, mod in {**ROW_OPS, "fused_add_rmsnorm": fused_mod}.items():
        for dt in (BF16, np.dtype(np.float16), np.dtype(np.float32)):
            for long in (vector_cols(dt) + 16, 16384 if dt.itemsize == 4 else 65536):
                from_ = STREAM_VECTOR_AUTO_FROM.get((name, dt), 0)
                listed = dt in STREAM_VECTOR_AUTO and long >= from_ and not verify.SIMULATED
                assert stream_vector_auto(name, dt, long) is listed
                mid = dt in mod._K.mid_k and mod._K.mid_shape.takes(long) and chip_fits(ONCHIP_MID_ROWS)
                chip = dt in mod._K.chip_k and mod._K.chip_shape.takes(long) and chip_fits()
                auto = _unwrap(mod._K.pick("auto", dt, True, long, 4)[0])
                fast = mod._K.mid_k[dt] if mid else mod._K.chip_k[dt] if chip else mod._K.svec_k[dt]
                assert auto is (fast if listed else mod._K.plain[dt]), (name, dt, long)
                assert mod._K.pick("auto", dt, False, long, 4)[0] is mod._K.plain[dt]  # unaligned: scalar
                assert mod._K.pick("scalar", dt, True, long, 4)[0] is mod._K.plain[dt]
                assert _unwrap(mod._K.pick("vector", dt, True, long, 4)[0]) is fast
    if not verify.SIMULATED:  # the rule as measured: every dtype, fp32 from 8192 (softmax 16384) columns
        f32 = np.dtype(np.float32)
        assert set(STREAM_VECTOR_AUTO) == {BF16, np.dtype(np.float16), f32}
        assert not stream_vector_auto("softmax", f32, 8192) and stream_vector_auto("softmax", f32, 16384)
        assert not stream_vector_auto("rmsnorm", f32, 5120) and stream_vector_auto("rmsnorm", f32, 8192)
        assert not stream_vector_auto("fused_add_rmsnorm", f32, 5120)
        assert stream_vector_auto("fused_add_rmsnorm", f32, 8192)
        # the path verify and bench record is the kernel pick runs
        for name, mod in {**ROW_OPS, "fused_add_rmsnorm": fused_mod}.items():
            for dt in (BF16, f32):
                for n in (4112, 5120, 8192, 16384, 32776, 65536, 128256):
                    runs = _unwrap(mod._K.pick("auto", dt, True, n, 4)[0])
                    path = row_path_of(name)(Case("c", {"rows": 4, "cols": n}, dt.name))
                    assert (path == "stream-vector") is (runs is mod._K.svec_k[dt]), (name, dt, n, path)
                    on_chip = any(runs is k.get(dt) for k in (mod._K.chip_k, mod._K.mid_k))
                    assert (path == "on-chip") is on_chip, (name, dt, n, path)


def _unwrap(k: Any) -> Any:
    """The Kernel behind a pick: an on-chip kernel comes wrapped with its shared-memory size."""
    return k.kernel if isinstance(k, WithShared) else k


ONCHIP_OPS = {"rmsnorm": rmsnorm, "layernorm": layernorm, "softmax": softmax}


def _onchip_widths(
    dt: np.dtype, vectors: int, every_tail: bool = False, shape: OnChipRows = ONCHIP_ROWS
) -> list[int]:
    """Widths an on-chip kernel (of `shape`) holds that leave every tail of its shared part (threads x
    vectors vectors a step): the first past the registers' rows; one and two steps less one vector, exactly,
    and plus one vector (widths at or under what registers hold drop out: under the simulator the first
    step's); and its longest."""
    c = for_machine(shape)
    assert isinstance(c, OnChipRows)
    head, w = c.threads * c.per, WIDTH[dt]
    step = c.threads * vectors * w
    widths = {vector_cols(dt) + w, c.cols - c.cols % w}
    k0 = max(1, (vector_cols(dt) - head) // step + 1)  # the first whole step past what registers hold
    widths |= {head + k * step + d for k in (k0, k0 + 1) for d in (-w, 0, w)}
    if not verify.SIMULATED:
        widths |= {65536, 128256, 131072}
    held = replace(c, from_cols=0) if every_tail else c
    return sorted(n for n in widths if vector_cols(dt) < n and held.takes(n))


@needs_device
@pytest.mark.parametrize("op", sorted(ONCHIP_OPS))
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("shape", ["vocabulary", "mid"])
def test_onchip_rows_round_the_float64_result(
    op: str, dtype: str, shape: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows past what registers hold, up to ONCHIP_ROWS.cols (a vocabulary of 128256) or ONCHIP_MID_ROWS.cols
    (65536, two blocks per SM): the on-chip kernel of that shape (the row's head in registers, the rest in
    the thread's own shared-memory slots; the other shape's kernels taken away), at widths that leave every
    tail (taken from the first width past the registers here, where "auto" starts at from_cols), over more
    rows than blocks (a block's second row reuses its slots and the other reduction half), against float64
    and against the scalar kernel's result (the same values, fp32 sums in another order)."""
    config = ONCHIP_ROWS if shape == "vocabulary" else ONCHIP_MID_ROWS
    if not chip_fits(config):
        pytest.skip("this GPU cannot give a block the on-chip rows' shared memory (they stream here)")
    mod, dt = ONCHIP_OPS[op], np.dtype(BF16 if dtype == "bfloat16" else dtype)
    attr, other = ("chip", "mid") if shape == "vocabulary" else ("mid", "chip")
    held = replace(getattr(mod._K, f"{attr}_shape"), from_cols=0)
    monkeypatch.setattr(mod._K, f"{attr}_shape", held)
    monkeypatch.setattr(mod._K, f"{other}_k", {})
    monkeypatch.setattr(mod, "_FAST", FastCache())
    rows = 2 * sm_count() + 1
    for cols in _onchip_widths(dt, held.vectors, every_tail=True, shape=config):
        k, threads, grid = mod._K.pick("vector", dt, True, cols, rows)
        assert isinstance(k, WithShared) and k.kernel is getattr(mod._K, f"{attr}_k")[dt], cols
        assert (threads, grid) == (held.threads, min(rows, held.min_blocks * sm_count()))
        assert k.shared == (cols - held.threads * held.per) * dt.itemsize
        args, ref = _row_problem(op, rows, cols, seed=cols, dtype=dtype)
        out = _call(op, args, path="vector")
        o = out.astype(np.float64)
        err = np.linalg.norm(o - ref) / np.linalg.norm(ref)
        if dt == BF16:
            assert _rounded_share(out, ref) >= 0.99, cols
            assert err <= 2.0**-8 and np.abs(o - ref).max() <= 2.0**-8 * np.abs(ref).max(), cols
        else:
            assert err <= 1e-3, (cols, err)
        scalar = _call(op, args, path="scalar").astype(np.float64)
        assert np.abs(scalar - o).max() <= 2.0**-7 * np.abs(o).max(), cols


@needs_device
@pytest.mark.parametrize("op", sorted(ONCHIP_OPS))
def test_onchip_rows_end_where_shared_memory_does(op: str) -> None:
    """One vector past ONCHIP_ROWS.cols, or short of its from_cols (on a GPU: where the streaming kernel
    was measured faster), the streaming kernel takes the row; the same around ONCHIP_MID_ROWS (a GPU: 32776
    to 65536, every aligned row past what registers hold); the narrower shape takes a row both hold; fp32
    never runs on chip."""
    if not chip_fits():
        pytest.skip("this GPU cannot give a block the on-chip rows' shared memory (they stream here)")
    mod, c, mid = ONCHIP_OPS[op], for_machine(ONCHIP_ROWS), for_machine(ONCHIP_MID_ROWS)
    assert isinstance(c, OnChipRows) and isinstance(mid, OnChipRows) and mid.cols < c.cols

    def runs(n: int, path: str = "vector") -> Any:
        return _unwrap(mod._K.pick(path, BF16, True, n, 2)[0])

    longest, mid_longest = c.cols - c.cols % 8, mid.cols - mid.cols % 8
    assert runs(longest) is mod._K.chip_k[BF16] and runs(longest + 8) is mod._K.svec_k[BF16]
    assert runs(mid_longest) is mod._K.mid_k[BF16]
    if verify.SIMULATED:  # every row past vector_cols on chip: the mid shape's, then the vocabulary one's
        assert runs(mid_longest + 8) is mod._K.chip_k[BF16]
    else:
        assert c.from_cols == 128256 and runs(128256, "auto") is mod._K.chip_k[BF16]
        assert (mid.from_cols, mid.cols) == (32776, 65536) and runs(65536, "auto") is mod._K.mid_k[BF16]
        # no aligned row past the registers' streams short of 65536: from_cols is the first one
        assert runs(32776, "auto") is mod._K.mid_k[BF16] and mid.from_cols == vector_cols(BF16) + 8
        assert runs(65544, "auto") is mod._K.svec_k[BF16] and runs(128248, "auto") is mod._K.svec_k[BF16]
    f32 = np.dtype(np.float32)
    assert f32 not in mod._K.chip_k
    assert mod._K.pick("vector", f32, True, vector_cols(f32) + 4, 2)[0] is mod._K.svec_k[f32]
    # the artifact lists the on-chip kernels by name (fp16 and bf16)
    names = {entry[0] for entry in mod.SPEC.ptx_kernels}
    assert {f"{op}_on-chip{s}_{dt}" for s in ("", "-mid") for dt in ("float16", "bfloat16")} <= names


def _pairs_kernels(word: bool) -> tuple[Any, Any]:
    """(pack kernel, unpack kernel): two launches, so that the unpack reads the uint32 back from memory (in
    one kernel LLVM forwards the packed halves and folds the unpack away)."""
    pack, unpack_lo, unpack_hi = onchip_pairs(word)

    @cuda.jit
    def packs(a, b, packed):  # type: ignore[no-untyped-def]
        i = cuda.grid(1)
        while i < a.size:
            packed[i] = pack(a[i], b[i])
            i += cuda.gridsize(1)

    @cuda.jit
    def unpacks(packed, ra, rb):  # type: ignore[no-untyped-def]
        i = cuda.grid(1)
        while i < packed.size:
            p = packed[i]
            ra[i] = unpack_lo(p)
            rb[i] = unpack_hi(p)
            i += cuda.gridsize(1)

    return packs, unpacks


@needs_device
@pytest.mark.parametrize("word", [True, False], ids=["bfloat16", "float16"])
def test_onchip_pairs_give_back_every_value_bit_for_bit(word: bool) -> None:
    """rows.onchip_pairs, the on-chip rows' shared part: every 16-bit pattern of the dtype (fp16: every
    finite value, +-0, subnormals, +-inf, NaNs; bf16 the same), widened to fp32 as a load gives it, packed
    beside another (each value once low, once high) comes back bit for bit, NaN as a NaN; and the uint32
    holds lo's 16 bits in its low half, hi's in its high half."""
    words = np.arange(1 << 16, dtype=np.uint32)
    if word:
        a = (words << 16).view(np.float32)
    else:
        a = words.astype(np.uint16).view(np.float16).astype(np.float32)
    b = a[::-1].copy()  # 0xffff - w: a NaN beside a finite value, +0 beside a NaN, ...
    packed = np.zeros(a.size, np.uint32)
    ra, rb = np.zeros_like(a), np.zeros_like(a)
    da, db, dp, dra, drb = (cuda.to_device(v) for v in (a, b, packed, ra, rb))
    packs, unpacks = _pairs_kernels(word)
    packs[8, 128](da, db, dp)
    unpacks[8, 128](dp, dra, drb)
    packed, ra, rb = dp.copy_to_host(), dra.copy_to_host(), drb.copy_to_host()
    for src, got, half in ((a, ra, packed & 0xFFFF), (b, rb, packed >> 16)):
        nan = np.isnan(src)
        assert nan.sum() == (254 if word else 2046)
        np.testing.assert_array_equal(np.isnan(got), nan)
        np.testing.assert_array_equal(got[~nan].view(np.uint32), src[~nan].view(np.uint32))
        want = (src.view(np.uint32) >> 16) if word else src.astype(np.float16).view(np.uint16)
        np.testing.assert_array_equal(half[~nan], want[~nan])
        assert np.all((half[nan] & 0x7FFF) > (0x7F80 if word else 0x7C00))  # a NaN's word is a NaN


# Every vector count the kernel can be built with (the committed one is 4), at widths that leave every
# tail: no vector past the steps, one, up to vectors - 1, and a row one vector past a step, in bf16 and fp32.
@needs_device
@pytest.mark.skipif(not verify.SIMULATED, reason="shapes of the simulator's 32-thread blocks")
@pytest.mark.parametrize("op", sorted(ROW_OPS))
@pytest.mark.parametrize("vectors", [1, 2, 3, 4])
def test_stream_vector_kernel_covers_every_column_for_any_vector_count(
    op: str, vectors: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    mod = ROW_OPS[op]
    monkeypatch.setattr(mod._K, "chip_k", {})  # the streaming kernel at every width
    monkeypatch.setattr(mod._K, "mid_k", {})
    config = StreamRows(STREAM_ROWS.threads // 32, vectors, 1)
    for dtype in ("bfloat16", "float32"):
        dt = np.dtype(BF16 if dtype == "bfloat16" else dtype)
        span = config.threads * WIDTH[dt]
        k = kernel(mod.make_stream_vec(config, WIDTH[dt]), mod._K.sigs[dt])
        monkeypatch.setitem(mod._K.svec_k, dt, k)
        monkeypatch.setattr(mod._K, "svec_shape", config)
        steps = -(-(vector_cols(dt) + 1) // (vectors * span))  # full steps past what registers hold
        for extra in sorted({0, WIDTH[dt], (vectors - 1) * span, (vectors - 1) * span + WIDTH[dt]}):
            cols = steps * vectors * span + extra
            args, _ = _row_problem(op, 2, cols, seed=cols, dtype=dtype)
            out = _call(op, args, path="vector").astype(np.float64)
            ref = _call(op, args, path="scalar").astype(np.float64)
            tol = 2.0**-7 if dt.itemsize == 2 else 1e-5
            assert np.abs(out - ref).max() <= tol * np.abs(ref).max(), (dtype, cols)


@needs_device
@pytest.mark.parametrize("op", sorted(ROW_OPS))
# past-registers: the 16-byte streaming kernel on a GPU; under the simulator, in fp16 / bf16, the on-chip
# kernel (it takes every row it holds there). softmax's streaming kernel is taken by name in
# tests/kernels/test_special_values.py.
@pytest.mark.parametrize("cols", [200, STREAM_COLS], ids=["registers", "past-registers"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the simulator's threads warn on NaN arithmetic
def test_row_ops_vector_path_keeps_nan_and_inf(op: str, cols: int, dtype: str) -> None:
    args, _ = _row_problem(op, 4, cols, seed=5, dtype=dtype)
    x = args[0].copy()
    x[0, 3] = np.nan
    x[1, 7] = np.inf
    x[1, cols - 9] = np.inf  # in the on-chip kernels' shared part too, past registers
    x[2, cols - 5] = -np.inf  # near the row's end: another thread than thread 0
    x[3, :] = -np.inf  # a row of -inf alone
    out = _call(op, (x, *args[1:]), path="vector").astype(np.float64)
    ref = _call(op, (x, *args[1:]), path="scalar").astype(np.float64)
    assert np.isnan(out[0]).all() and np.isnan(out[1]).any()  # the NaN row; the inf row where inf meets inf
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    fin = ~np.isnan(ref)
    np.testing.assert_allclose(out[fin], ref[fin], rtol=2.0**-7, atol=0)


@needs_device
def test_residual_add_bf16_vector_path_rounds_once() -> None:
    rng = np.random.default_rng(11)
    # (3, 200): one full vector tile (32 threads x 2 vectors x 8 words under the simulator) and a scalar tail
    x = rng.standard_normal((3, 200)).astype(BF16)
    r = rng.standard_normal((3, 200)).astype(BF16)
    x[0, 0], x[0, 1], r[0, 2] = np.nan, np.inf, -np.inf
    x[1, 0], r[1, 0] = 1.0, 2.0**-8  # a tie: 1 + 2^-8 rounds to even, 1.0
    x[1, 1], r[1, 1] = 1.0 + 2.0**-7, 2.0**-8  # a tie to the odd side: up to 1 + 2^-6
    out = residual_add(x, r, path="vector")
    with np.errstate(invalid="ignore"):
        ref = (x.astype(np.float64) + r.astype(np.float64)).astype(BF16)
    nan = np.isnan(ref.astype(np.float32))
    assert np.array_equal(np.isnan(out.astype(np.float32)), nan)
    assert np.array_equal(out.view(np.uint16)[~nan], ref.view(np.uint16)[~nan])
    assert out[1, 0] == 1.0 and out[1, 1] == 1.0 + 2.0**-6


@needs_device
def test_row_ops_bf16_vector_path_refusals() -> None:
    args, _ = _row_problem("softmax", 2, 37, seed=0)  # 74-byte rows: not a multiple of 16
    with pytest.raises(ValueError, match="path: 'vector' needs 16-byte aligned pointers"):
        softmax.softmax(*args, path="vector")
    with pytest.raises(TypeError, match="weight: dtype float16 must match x's dtype bfloat16"):
        rmsnorm.rmsnorm(np.ones((2, 8), BF16), np.ones(8, np.float16))


@cuda.jit(device=True, inline="always")
def _truncate(x):  # type: ignore[no-untyped-def]
    return uint16(f32_bits(x) >> uint32(16))  # type: ignore[no-untyped-call]


@cuda.jit(device=True, inline="always")
def _swallow_nan(x):  # type: ignore[no-untyped-def]
    return f32_to_bf16(x) if x == x else uint16(0)


def _break_store(monkeypatch: pytest.MonkeyPatch, op: str, store: Any) -> None:
    """The op's bf16 register and streaming kernels rebuilt from their bodies with `store` as the store, and
    the only bf16 kernels "auto" can take."""
    mod = ROW_OPS[op]
    io = RowIO("broken", bf16_to_f32, store)
    ks = mod._K
    # "auto" takes the vector kernels for bf16 on a GPU: without them it takes the rebuilt ones everywhere;
    # and a fresh launch cache, so that no launch validated before (the good kernels) is replayed
    monkeypatch.delitem(ks.vec, BF16, raising=False)
    monkeypatch.delitem(ks.svec_k, BF16, raising=False)
    monkeypatch.setattr(mod, "_FAST", FastCache())
    monkeypatch.setitem(ks.reg, BF16, kernel(mod._make_reg(io), ks.sigs[BF16]))
    monkeypatch.setitem(ks.plain, BF16, kernel(mod._make_stream(io), ks.sigs[BF16]))


@needs_device
@pytest.mark.parametrize("op", sorted(ROW_OPS))
def test_a_truncating_bf16_store_fails(op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    args, ref = _row_problem(op, 3, 37, seed=1)
    assert _rounded_share(_call(op, args), ref) >= 0.99
    _break_store(monkeypatch, op, _truncate)
    assert _rounded_share(_call(op, args), ref) < 0.8  # about half the elements round up


@needs_device
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("op", sorted(ROW_OPS))
def test_a_bf16_store_swallowing_nan_fails_verify(op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = ROW_OPS[op].SPEC
    case = next(c for c in spec.special_cases if c.dtype == "bfloat16")
    assert verify.check_case(spec, case, np.random.default_rng(2)).ok
    _break_store(monkeypatch, op, _swallow_nan)
    res = verify.check_case(spec, case, np.random.default_rng(2))
    assert not res.ok and "NaN or infinite" in str(res.error)


_CVT_PTX = """
import json
from numba import cuda
from kernels.ops import rmsnorm
from kernels.runtime.arrays import BF16
out = {}
for cc in ((7, 5), (8, 0), (9, 0)):
    vec, _ = cuda.compile_ptx(rmsnorm._K.vec_fns[BF16], rmsnorm._K.sigs[BF16], cc=cc)
    out[f"{cc[0]}.{cc[1]}"] = vec.count("cvt.rn.bf16x2.f32")
print(json.dumps(out))
"""


def test_bf16_stores_round_in_hardware_only_where_the_target_has_it() -> None:
    """kernels.primitives.bf16.round_pair: PTX compiled for sm_80 / sm_90 rounds with cvt.rn.bf16x2.f32 (one
    per two values of a 16-byte store), PTX for sm_75 has none (integer rounding): NVVM's __nvvm_reflect
    decides at compile time. Offline, in a process without the simulator (numba-cuda's compile_ptx)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    p = subprocess.run([sys.executable, "-c", _CVT_PTX], cwd=Path(__file__).resolve().parents[2], env=env,
                       capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    counts = json.loads(p.stdout.strip().splitlines()[-1])
    assert counts["7.5"] == 0, counts
    assert counts["8.0"] >= 8 and counts["9.0"] == counts["8.0"], counts  # 2 vectors x 8 words / 2 per cvt

"""layernorm: cases against the float64 reference, a large mean offset, validation errors."""

from __future__ import annotations

import numpy as np
import pytest
from opcheck import assert_case_passes, case_id, needs_device, needs_gpu, run_rows, small_cases

from kernels.ops import layernorm as op
from kernels.ops.rows import OnChipRows


@needs_device
@pytest.mark.parametrize("case", small_cases(op.SPEC), ids=case_id)
def test_cases(case):  # type: ignore[no-untyped-def]
    assert_case_passes(op.SPEC, case)


@needs_device
def test_large_mean_small_spread():  # type: ignore[no-untyped-def]
    # |mean| / std = 1e4: the unshifted one-pass E[x^2] - E[x]^2 would lose every digit in fp32
    rng = np.random.default_rng()
    x = (1000.0 + 0.1 * rng.standard_normal((3, 200))).astype(np.float32)
    w = np.ones(200, np.float32)
    b = np.zeros(200, np.float32)
    got = op.layernorm(x, w, b)
    ref = op.reference(x, w, b, 1e-5)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-3


@needs_device
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_onchip_rows_hold_a_large_mean(dtype):  # type: ignore[no-untyped-def]
    # the on-chip kernel (make_onchip) shifts by the row's first element as make_stream_vec does: fp16 rows
    # at |mean| / std = 500 (1000 + 2 N(0, 1), resolved by fp16's 0.5 spacing there) lose ~1 % of the
    # variance to fp32 cancellation unshifted; bf16 cannot resolve such a spread, its rows test the path
    from kernels.ops.rows import BF16_TOL, ONCHIP_ROWS, WithShared, chip_fits, for_machine, vector_cols
    from kernels.runtime.arrays import BF16, SIMULATED

    if not chip_fits():
        pytest.skip("this GPU cannot give a block the on-chip rows' shared memory (they stream here)")
    dt = np.dtype(BF16 if dtype == "bfloat16" else dtype)
    c = for_machine(ONCHIP_ROWS)
    assert isinstance(c, OnChipRows)
    rng = np.random.default_rng(13)
    # the simulator's first width is ONCHIP_MID_ROWS' (two blocks per SM), as 65536 is on a GPU
    widths = {vector_cols(dt) + 8, c.cols - c.cols % 8} if SIMULATED else {65536, 128256, c.cols - c.cols % 8}
    tol = BF16_TOL if dt == BF16 else 2e-3
    for cols in sorted(widths):
        k = op._K.pick("vector", dt, True, cols, 3)[0]
        # the narrower shape where it holds the row (ONCHIP_MID_ROWS), ONCHIP_ROWS' beyond
        want = op._K.mid_k[dt] if op._K.mid_shape.takes(cols) else op._K.chip_k[dt]
        assert isinstance(k, WithShared) and k.kernel is want, cols
        x = np.stack([1000.0 + 2.0 * rng.standard_normal(cols), -7.0 + 0.5 * rng.standard_normal(cols),
                      1000.0 + 2.0 * rng.standard_normal(cols)]).astype(dt)  # fmt: skip
        w = (1.0 + 0.5 * rng.standard_normal(cols)).astype(dt)
        b = (0.5 * rng.standard_normal(cols)).astype(dt)
        got = op.layernorm(x, w, b, path="vector").astype(np.float64)
        ref = op.reference(x, w, b, 1e-5)
        for r in range(3):
            assert np.linalg.norm(got[r] - ref[r]) / np.linalg.norm(ref[r]) < tol, (cols, r)


@needs_device
def test_validation_errors():  # type: ignore[no-untyped-def]
    x = np.ones((4, 6), np.float32)
    w = np.ones(6, np.float32)
    with pytest.raises(ValueError, match=r"bias: expected shape \(6,\) \(x's last dimension\), got \(7,\)"):
        op.layernorm(x, w, np.ones(7, np.float32))
    with pytest.raises(TypeError, match="bias: dtype float16 must match x's dtype float32"):
        op.layernorm(x, w, np.ones(6, np.float16))
    with pytest.raises(ValueError, match="x: expected a C-contiguous array"):
        op.layernorm(np.ones((6, 4), np.float32).T, w, w)
    with pytest.raises(TypeError, match="out: dtype float16 is not allowed; expected float32"):
        op.layernorm(x, w, w, np.ones((4, 6), np.float16))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("case", op.SPEC.bench_cases, ids=case_id)
def test_bench_shapes(case):  # type: ignore[no-untyped-def]
    assert_case_passes(op.SPEC, case)


# make_rows_half2 (fp16, half2 output stage, this thread's weight / bias loads batched ahead of its stores;
# wb_early: issued before the reduction's barrier, the row kept as packed halves). One block per row or
# grid-stride (grid < rows); 136 columns leave vectors past the row's end (the checked body, whose missing
# lanes must not carry a previous row's words), 256 = 32 x 8 and 512 = 32 x 16 take the full-row body;
# group 1 / 2 = the weight / bias of 1 / 2 vectors per batch.
@needs_device
@pytest.mark.parametrize(("wb_early", "group"), [(False, 0), (False, 1), (True, 0)])
@pytest.mark.parametrize(("per", "full_rows", "rows", "cols", "grid"),
                         [(16, True, 5, 136, 5), (16, True, 5, 136, 2), (8, True, 7, 256, 3),
                          (16, True, 3, 512, 2), (16, False, 3, 512, 3), (32, True, 2, 1024, 1),
                          (16, True, 1, 8, 1)])  # fmt: skip
def test_make_rows_half2_variants(wb_early, group, per, full_rows, rows, cols, grid):  # type: ignore[no-untyped-def]
    from kernels.primitives.reductions import BLOCK

    rng = np.random.default_rng()
    dt = np.dtype(np.float16)
    x = (rng.standard_normal((rows, cols)) * 2 + 3).astype(dt)
    if rows > 1:
        x[1] = 1000.0 + 0.1 * rng.standard_normal(cols)  # |mean| / std = 1e4: the shift must hold
        x[-1] = -7.0 + 0.5 * rng.standard_normal(cols)
    w = (1 + 0.5 * rng.standard_normal(cols)).astype(dt)
    b = (0.5 * rng.standard_normal(cols)).astype(dt)
    fn = op.make_rows_half2(BLOCK, per, 1, full_rows, wb_early, group)
    got = run_rows(fn, op._SIGS[dt], grid, (x, w, b), 1e-5)
    ref = op.reference(x, w, b, 1e-5)
    assert np.isfinite(got).all()
    for r in range(rows):
        assert np.linalg.norm(got[r] - ref[r]) / np.linalg.norm(ref[r]) < 2e-3, r


def test_make_rows_half2_group_must_divide():  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="group 3 does not divide 4"):
        op.make_rows_half2(128, 32, 8, True, False, 3)


@needs_device
def test_half2_row_spec_builds():  # type: ignore[no-untyped-def]
    # a ROW_KERNELS entry of the fp16 kind
    from kernels.ops.rows import Half2Rows, for_machine

    config = Half2Rows(threads=128, per=32, min_blocks=8, full_rows=True, wb_early=False, group=0)
    fn, threads, persistent = op._row_kernel(for_machine(config), 8, word=False)
    assert not persistent and threads >= 32
    with pytest.raises(ValueError, match="half2 row kernels are for float16"):
        op._row_kernel(config, 4, word=False)


@needs_device
def test_version_paths_rejected():  # type: ignore[no-untyped-def]
    # paths are strategies: the fp16 row kernel runs under "auto", no version number names a path
    x = np.ones((3, 136), np.float16)
    w = np.ones(136, np.float16)
    for path in ("v6", "v6b", "v7"):
        with pytest.raises(
            ValueError, match=f"path: '{path}' is not a path; expected one of: auto, scalar, vector$"
        ):
            op.layernorm(x, w, w, path=path)


@needs_device
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the simulator's threads warn on NaN arithmetic
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_wb_shared_rows_equal_their_register_shape_bit_for_bit(dtype):  # type: ignore[no-untyped-def]
    """The wb_shared shape (rows.WIDE_WB_SHARED: weight and bias copied into shared memory by cp.async, read
    back in the write pass) runs the plain WIDE_ROWS kernel's arithmetic in its order: the same words, at a
    full row (its compare-free write pass in the plain kernel), at one with padding lanes, and with NaN and
    infinities in x, weight and bias; with more rows than blocks (a block strides, its part copied once)."""
    from kernels.ops.rows import (
        BF16,
        WIDE_WB_SHARED,
        WIDTH,
        WithShared,
        for_machine,
        plain_shape,
        wb_shared_fits,
    )
    from kernels.runtime import arrays
    from kernels.runtime.arrays import HostSync

    dt = np.dtype(BF16 if dtype == "bfloat16" else dtype)
    shape = for_machine(WIDE_WB_SHARED["layernorm"][0])
    if not wb_shared_fits(shape, dt):
        pytest.skip("this GPU cannot give 2 blocks an SM the wb_shared shape's shared memory: plain runs")
    plain = plain_shape(shape)
    assert shape.wb_shared and not plain.wb_shared
    assert (plain.threads, plain.per, plain.min_blocks) == (shape.threads, shape.per, shape.min_blocks)
    # the kernels the op built (the wb_shared one raises its dynamic shared-memory limit when it loads)
    ks, kp = op._K.wide_k[(dt, shape)], op._K.wide_k[(dt, plain)]
    rng = np.random.default_rng(41)
    for n in (shape.cols, shape.cols - 3 * WIDTH[dt], shape.cols - 37 * WIDTH[dt]):  # 16-byte rows only
        x = (rng.standard_normal((5, n)) * 3 + 0.5).astype(dt)
        w = (1 + 0.5 * rng.standard_normal(n)).astype(dt)
        b = (0.5 * rng.standard_normal(n)).astype(dt)
        x[1, 7], x[2, n - 1], w[3], b[n - 2] = np.nan, np.inf, np.inf, -np.inf
        got = []
        for k in (WithShared(ks, shape.wb_shared_bytes(dt.itemsize)), kp):
            sync = HostSync()
            xo = arrays.as_rows(arrays.operand("x", arrays.to_device(x), sync))
            wo = arrays.operand("weight", arrays.to_device(w), sync)
            bo = arrays.operand("bias", arrays.to_device(b), sync)
            out = arrays.to_device(np.zeros((5, n), dt))
            oo = arrays.as_rows(arrays.operand("out", out, sync))
            k.launch(2, shape.threads, (xo, wo, bo, oo, np.float32(1e-5)))  # block 0 strides to rows 2, 4
            got.append(arrays.to_host(out).view(np.uint16))
        np.testing.assert_array_equal(got[0], got[1], err_msg=f"{dtype} rows of {n}")
        clean = [0, 3, 4]  # rows without specials: within one rounding of float64, but where weight is inf
        ref = op.reference(x[clean].astype(np.float64), w.astype(np.float64), b.astype(np.float64), 1e-5)
        o = got[0].view(dt)[clean].astype(np.float64)
        cols = np.isfinite(ref).all(axis=0)
        assert np.abs(o[:, cols] - ref[:, cols]).max() <= 2.0**-7 * np.abs(ref[:, cols]).max()


def test_wb_shared_runs_only_where_the_device_holds_its_blocks(monkeypatch):  # type: ignore[no-untyped-def]
    """A wb_shared shape runs where min_blocks blocks of its weight and bias and static bytes fit what a
    block may opt in to (on a GPU 2 x 65 KB: sm_90's 227 KB and sm_80's 163 KB hold them), the WIDE_ROWS
    shape of its width where they do not (sm_86 / sm_89's 99 KB, and no GPU: 0); on a GPU, layernorm's rows
    of that width and the narrowest it takes run it through wide_here, RowKernels.pick launches it with its
    bytes of dynamic shared memory, and row_path_of names the shape that runs (without the simulator: its
    512 columns tie with the op's own BLOCK x PER kernel, which runs those rows)."""
    from kernels.ops import rows
    from kernels.ops.rows import (
        BF16,
        WIDE_WB_SHARED,
        WithShared,
        for_machine,
        plain_shape,
        run_here,
        wb_shared_fits,
    )
    from kernels.registry import Case

    shape = for_machine(WIDE_WB_SHARED["layernorm"][0])
    plain = plain_shape(shape)
    # the narrowest row it takes: one vector past the next narrower WIDE_ROWS shape (8200 on a GPU)
    narrowest = max(c.cols for c in map(for_machine, rows.WIDE_ROWS) if c.cols < shape.cols) + 8
    for dt in (np.dtype(np.float16), np.dtype(BF16)):
        need = shape.min_blocks * (shape.wb_shared_bytes(dt.itemsize) + rows.WB_SHARED_STATIC_BYTES)
        assert rows.SIMULATED or need == 2 * (64 + 1) * 1024
        for optin in (need + 1, need, need - 1, 0):
            monkeypatch.setattr(rows, "smem_optin", lambda optin=optin: optin)
            fits = optin >= need
            assert wb_shared_fits(shape, dt) is fits, optin
            assert run_here(shape, dt) == (shape if fits else plain), optin
            assert run_here(plain, dt) == plain
            for n in (shape.cols, narrowest):
                if rows.wide_for(dt, n, "layernorm") is None:
                    assert rows.SIMULATED  # the tie above
                    continue
                assert rows.wide_here(dt, n, "layernorm") == run_here(shape, dt)
                assert not rows.wide_here(dt, n, "rmsnorm").wb_shared  # no other op has the shape
                label = rows.row_path_of("layernorm")(Case("c", {"rows": 2, "cols": n}, dt.name))
                assert label == run_here(shape, dt).label
                k, threads, grid = op._K.pick("vector", dt, True, n, 3)
                assert (threads, grid) == (shape.threads, 3)
                if fits:  # launched with the weight and bias part as its dynamic shared memory
                    assert isinstance(k, WithShared) and k.kernel is op._K.wide_k[(dt, shape)]
                    assert k.shared == shape.wb_shared_bytes(dt.itemsize)
                else:
                    assert k is op._K.wide_k[(dt, plain)]

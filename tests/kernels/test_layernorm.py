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

"""kernels.primitives.vector: the dispatch rule (when the 16-byte paths may run), every op's explicit vector
path against the float64 reference (the simulator runs the intrinsics' element-by-element twins, so the
kernels' indexing, tails and masks are what is tested there), and the PTX the GPU gets (16-byte
instructions)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from numba import cuda
from opcheck import needs_device, needs_gpu

from kernels.ops import layernorm, residual_add, rmsnorm, softmax
from kernels.ops.rows import BlockedRows, VectorRows
from kernels.primitives import vector
from kernels.runtime.arrays import BF16, SIMULATED

REPO = Path(__file__).resolve().parents[2]
F16, F32 = np.dtype(np.float16), np.dtype(np.float32)


def test_vector_ok_needs_aligned_pointers_and_rows():  # type: ignore[no-untyped-def]
    assert vector.vector_ok((0, 256, 4096), 0)
    assert vector.vector_ok((512,), 4096 * 2)
    assert not vector.vector_ok((0, 258), 0)  # one pointer 2 bytes off
    assert not vector.vector_ok((0,), 1001 * 2)  # rows of 2002 bytes: row 1 starts misaligned
    assert vector.vector_ok((0,), 1000 * 2)


def test_choose_paths_and_errors():  # type: ignore[no-untyped-def]
    assert vector.choose("scalar", F16, True) is False
    assert vector.choose("vector", F32, True) is True
    # auto: vector only on a GPU, only for the AUTO_VECTOR dtypes, only when aligned
    assert vector.choose("auto", F16, True) is (not SIMULATED)
    assert vector.choose("auto", F16, False) is False
    assert vector.choose("auto", F32, True) is (not SIMULATED and F32 in vector.AUTO_VECTOR)
    with pytest.raises(ValueError, match="path: 'vector' needs 16-byte aligned pointers"):
        vector.choose("vector", F16, False)
    with pytest.raises(ValueError, match="path: 'wide' is not a path; expected one of: auto, scalar, vector"):
        vector.choose("wide", F16, True)


def test_an_ops_own_auto_dtypes_decide_auto_on_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """cast_fp8 adds fp32 (AUTO_CAST): an op's own auto dtypes alone decide "auto" on a GPU (the simulator
    flag cleared, so this runs everywhere), never an explicit path."""
    monkeypatch.setattr(vector, "SIMULATED", False)
    assert vector.choose("auto", F32, True) is (F32 in vector.AUTO_VECTOR)
    assert vector.choose("auto", F32, True, (F32, F16)) is True
    assert vector.choose("auto", F16, True, (F32,)) is False
    assert vector.choose("auto", F32, False, (F32,)) is False
    assert vector.choose("vector", F16, True, (F32,)) is True
    assert vector.choose("scalar", F32, True, (F32,)) is False


def _rel(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(got.astype(np.float64) - ref) / np.linalg.norm(ref))


@needs_device
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_residual_add_vector_path(dtype):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng()
    # 2 x 33 x 31 = 2046 elements: full vector tiles, then a scalar tail that is not a whole vector
    x = rng.standard_normal((2, 33, 31)).astype(dtype)
    r = rng.standard_normal((2, 33, 31)).astype(dtype)
    ref = (x.astype(np.float64) + r).astype(dtype)
    np.testing.assert_array_equal(residual_add.residual_add(x, r, path="vector"), ref)


# rows: 136 (a partial last vector group per thread, most of a warp masked), a full row (no masks)
_COLS = (136, 512 if SIMULATED else 4096)  # the last: BLOCK * PER


@needs_device
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("cols", _COLS)
def test_row_ops_vector_path(dtype, cols):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng()
    tol = 1e-5 if dtype == "float32" else 2e-3
    x = (rng.standard_normal((3, cols)) * 4.0 + 3.0).astype(dtype)
    w = (1.0 + 0.5 * rng.standard_normal(cols)).astype(dtype)
    b = (0.5 * rng.standard_normal(cols)).astype(dtype)
    assert _rel(rmsnorm.rmsnorm(x, w, path="vector"), rmsnorm.reference(x, w, 1e-6)) < tol
    assert _rel(layernorm.layernorm(x, w, b, path="vector"), layernorm.reference(x, w, b, 1e-5)) < tol
    assert _rel(softmax.softmax(x, path="vector"), softmax.reference(x)) < tol


@needs_device
def test_row_ops_vector_path_refuses_unaligned_rows():  # type: ignore[no-untyped-def]
    x = np.ones((2, 1001), np.float16)  # 2002-byte rows: the second row starts off a 16-byte boundary
    with pytest.raises(ValueError, match="path: 'vector' needs 16-byte aligned"):
        softmax.softmax(x, path="vector")
    got = softmax.softmax(x)  # auto falls back to the scalar register kernel
    np.testing.assert_allclose(got.astype(np.float64), 1.0 / 1001, rtol=2e-3)


@needs_gpu
def test_misaligned_device_views_fall_back_to_scalar():  # type: ignore[no-untyped-def]
    rng = np.random.default_rng()
    x = cuda.to_device(rng.standard_normal(4097).astype(np.float16))
    r = cuda.to_device(rng.standard_normal(4097).astype(np.float16))
    xs, rs = x[1:], r[1:]  # 2 bytes past a 256-byte aligned allocation
    out = residual_add.residual_add(xs, rs)
    ref = (xs.copy_to_host().astype(np.float64) + rs.copy_to_host()).astype(np.float16)
    np.testing.assert_array_equal(out.copy_to_host(), ref)
    with pytest.raises(ValueError, match="path: 'vector' needs 16-byte aligned"):
        residual_add.residual_add(xs, rs, path="vector")


PTX_CODE = """
import re
from kernels.runtime.ptx import compile_one
from kernels.ops import fused_add_rmsnorm, residual_add, softmax, swiglu
specs = (residual_add, softmax, swiglu, fused_add_rmsnorm)
for name, fn, sig in (k for m in specs for k in m.SPEC.ptx_kernels):
    if name.endswith("float16") and ("_vec_" in name or name == "residual_add_float16"):
        ptx = compile_one(fn, sig, (9, 0))
        print(name, sorted(set(re.findall(r"(?:ld|st)\\.global\\.v4\\.\\w+", ptx))), ".local" in ptx)
"""


def test_vector_kernels_emit_16_byte_global_accesses():  # type: ignore[no-untyped-def]
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    p = subprocess.run([sys.executable, "-c", PTX_CODE], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=300, check=False)  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    lines = {ln.split(" ", 1)[0]: ln for ln in p.stdout.strip().splitlines()}
    both = "['ld.global.v4.b32', 'st.global.v4.b32'] False"
    assert lines["residual_add_vec_float16"].endswith(both), lines
    assert lines["softmax_vec_float16"].endswith(both), lines
    assert lines["swiglu_vec_float16"].endswith(both), lines
    assert lines["fused_add_rmsnorm_vec_float16"].endswith(both), lines
    assert lines["residual_add_float16"].endswith("[] False"), lines  # the scalar kernel: no vectors


# kernels.ops.rows.ROW_KERNELS: every kind of entry a row op can be configured with, through the op's own
# launcher (path="vector"; under the simulator a blocked kernel takes BLOCK x PER and one block per row)
_ROW_SPECS = [
    ("layernorm", VectorRows(fastmath=True)),
    ("softmax", VectorRows(fastmath=True)),
    ("softmax", BlockedRows(threads=256, per=16, min_blocks=6, fastmath=True)),
    ("rmsnorm", VectorRows(fastmath=True)),
]


def test_row_config_must_cover_a_row() -> None:
    from kernels.ops.rows import for_machine

    with pytest.raises(ValueError, match="threads x per must cover"):
        for_machine(BlockedRows(threads=32, per=8, min_blocks=1, fastmath=False))


@needs_device
@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize(("opname", "spec"), _ROW_SPECS)
def test_row_kernel_specs_through_launchers(monkeypatch, opname, spec, dtype):  # type: ignore[no-untyped-def]
    from kernels.ops.rows import for_machine
    from kernels.runtime.launch import kernel

    mod = {"layernorm": layernorm, "softmax": softmax, "rmsnorm": rmsnorm}[opname]
    dt = np.dtype(dtype)
    row = mod._row_kernel(for_machine(spec), vector.WIDTH[dt], word=dt == BF16)
    monkeypatch.setitem(mod._K.row, dt, row)
    monkeypatch.setitem(mod._K.row_k, dt, kernel(row[0], mod._SIGS[dt]))
    monkeypatch.setattr(mod, "_FAST", type(mod._FAST)())
    rng = np.random.default_rng()
    x = (rng.standard_normal((7, 136)) * 2 + 3).astype(dt)
    w = (1 + 0.5 * rng.standard_normal(136)).astype(dt)
    b = (0.5 * rng.standard_normal(136)).astype(dt)
    if opname == "layernorm":
        got, ref = mod.layernorm(x, w, b, path="vector"), mod.reference(x, w, b, 1e-5)
    elif opname == "softmax":
        got, ref = mod.softmax(x, path="vector"), mod.reference(x)
    else:
        got, ref = mod.rmsnorm(x, w, path="vector"), mod.reference(x, w, 1e-6)
    assert _rel(got, ref) < (2e-3 if dt == F16 else 1e-5)

"""The wgmma strategy: gemm's selection rule (a pure function of compute capability and dtype: sm_90a code
is picked on cc 9.0 alone, never under the simulator), the artifact's listing of the sm_90a kernels, and an
offline build of the production kernels through the same pipeline numba runs on the H200 (the numba kernel
through NVVM and wgmma.cu through NVRTC, both to LTO-IR, linked by nvJitLink for sm_90a, then ptxas).
The device run is benchmarks/h200_bf16.sh."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kernels.ops.gemm import fallback_path, select_path, shape_path, wgmma
from kernels.runtime.arrays import BF16

REPO = Path(__file__).resolve().parents[2]
F32, F16 = np.dtype(np.float32), np.dtype(np.float16)


@pytest.mark.parametrize(
    ("cc", "dtype", "want"),
    [
        ((9, 0), BF16, "wgmma_tma"),
        ((9, 0), F16, "wgmma_tma"),
        ((9, 0), F32, "simt"),
        ((8, 0), F16, "mma"),
        ((8, 9), F16, "mma"),
        ((10, 0), F16, "mma"),  # sm_90a code does not run on Blackwell: mma.sync does
        ((12, 0), BF16, "portable"),
        ((8, 0), BF16, "portable"),
        ((7, 5), F16, "portable"),
        ((7, 5), F32, "simt"),
    ],
)
def test_auto_picks_a_hopper_tile_on_cc90_only(cc, dtype, want):  # type: ignore[no-untyped-def]
    assert select_path(path="auto", dtype=dtype, cc=cc, simulated=False) == want


@pytest.mark.parametrize("dtype", [F32, F16, BF16])
def test_simulator_always_portable(dtype):  # type: ignore[no-untyped-def]
    assert select_path(path="auto", dtype=dtype, cc=(9, 0), simulated=True) == "portable"
    with pytest.raises(ValueError, match="under the simulator"):
        select_path(path="wgmma", dtype=dtype, cc=(9, 0), simulated=True)


def test_explicit_wgmma_refused_off_cc90():  # type: ignore[no-untyped-def]
    for cc in ((8, 0), (10, 0), (12, 0), None):
        with pytest.raises(ValueError, match="sm_90a"):
            select_path(path="wgmma", dtype=BF16, cc=cc, simulated=False)
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        select_path(path="wgmma", dtype=F32, cc=(9, 0), simulated=False)
    with pytest.raises(ValueError, match="needs float16 inputs"):
        select_path(path="mma", dtype=BF16, cc=(9, 0), simulated=False)
    assert select_path(path="wgmma", dtype=F16, cc=(9, 0), simulated=False) == "wgmma"
    with pytest.raises(ValueError, match="allowed: auto, portable, simt, mma, wgmma"):
        select_path(path="tma", dtype=F16, cc=(9, 0), simulated=False)


def test_operands_the_tile_cannot_take_fall_back():  # type: ignore[no-untyped-def]
    assert wgmma.fits(520, 392, 264, (0, 256, 4096))
    assert not wgmma.fits(257, 129, 64, ())  # N % 8
    assert not wgmma.fits(256, 128, 67, ())  # K % 8
    assert not wgmma.fits(256, 128, 64, (256, 8))  # an 8-byte aligned pointer
    assert shape_path("wgmma", F16, 129, 67) == fallback_path(F16, (9, 0)) == "mma"
    assert shape_path("wgmma", BF16, 129, 67) == "portable"
    assert shape_path("wgmma", BF16, 392, 264) == "wgmma"


def test_supported_is_cc90_only():  # type: ignore[no-untyped-def]
    assert wgmma.supported((9, 0)) and wgmma.supported((9, 0, "a"))
    assert not any(wgmma.supported(cc) for cc in ((8, 0), (8, 9), (9, 1), (10, 0), (12, 0), None))
    if not wgmma.available():  # this machine has no cc 9.0 GPU: nothing may be compiled or loaded
        with pytest.raises(RuntimeError, match="sm_90a"):
            wgmma._kernel(wgmma.key_of(BF16, False, False, False), wgmma.DEFAULT)


def _run(code: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=1800, check=False)  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout.strip().splitlines()[-1]


LISTING = """
import json
from kernels.runtime.ptx import compile_all
out = {}
for cc in ((9, 0), (8, 0)):
    res = compile_all(cc, ops=("gemm", "o_proj"))
    out[f"{cc[0]}.{cc[1]}"] = {k: {"arch": v["arch"], "target": [l for l in (v["ptx"] or "").splitlines()
                               if l.startswith(".target")], "error": v["error"], "link": v["link"]}
                               for k, v in res.items() if v["op"] in ("gemm", "o_proj")}
print(json.dumps(out))
"""


@pytest.mark.slow
def test_artifact_lists_sm90a_kernels_as_arch_specific():  # type: ignore[no-untyped-def]
    res = json.loads(_run(LISTING))
    h200, a100 = res["9.0"], res["8.0"]
    wg = {k: v for k, v in h200.items() if "wgmma" in k}
    assert set(wg) == {
        f"{op}_{tile}_sm90a_{dt}"
        for op in ("gemm", "o_proj")
        for tile in ("wgmma", "wgmma_tma")
        for dt in ("float16", "bfloat16")
    }
    for name, info in wg.items():
        assert info["error"] is None and info["arch"] == "sm_90a", (name, info)
        assert info["target"] == [".target sm_90a"], (name, info)
        cu = "wgmma_tma.cu" if "_wgmma_tma_" in name else "wgmma.cu"
        assert [Path(p).name for p in info["link"]] == [cu], (name, info)
    for name, info in h200.items():
        if name not in wg:
            assert info["arch"] is None and info["target"] == [".target sm_90"], (name, info)
    assert not any("wgmma" in k for k in a100), sorted(a100)  # never shipped for another GPU


BUILD = """
import json, re, shutil, subprocess, tempfile, warnings
warnings.filterwarnings("error", message="NVRTC log messages")  # a warning of the CUDA C fails the build
from pathlib import Path
from numba import cuda
from numba.cuda.cudadrv import driver
from kernels.ops.gemm import wgmma, wgmma_tma
from kernels.runtime.arrays import BF16
import numpy as np
F16 = np.dtype(np.float16)
rows = {}
builds = [(wgmma, wgmma.key_of(*args), wgmma.source(wgmma.key_of(*args), wgmma.DEFAULT), "wgmma.cu")
          for args in ((BF16, False, False, False, False, "none"), (F16, True, True, True, False, "none"),
                       (BF16, True, True, False, True, "gelu_tanh"))]  # the last: linear's
# the TMA tile: gemm's, o_proj's (residual; with a bias), an NT one, and linear's bias + activation epilogues
builds += [(wgmma_tma, wgmma.key_of(*args), wgmma_tma.source(wgmma.key_of(*args)), "wgmma_tma.cu")
           for args in ((BF16, False, False, False), (F16, True, False, True),
                        (BF16, True, False, False, True), (BF16, True, True, True),
                        (BF16, True, True, False, True, "silu"), (F16, True, True, False, True, "gelu_tanh"))]
for mod, key, src, cu in builds:
    d = mod.dispatcher(key)
    ltoir, _ = cuda.compile(d.py_func, mod.KERNEL_SIG, device=False, cc=mod.ARCH, output="ltoir",
                            abi="numba", launch_bounds=(mod.THREADS, 1))
    link = driver._Linker(cc=mod.ARCH, lto=True, additional_flags=["-ptx"])
    link.add_ltoir(ltoir, name="kernel.ltoir")
    link.add_cu(src, name=cu)
    ptx = link.get_linked_ptx().decode().rstrip("\\x00")
    row = {"wgmma": ptx.count("wgmma.mma_async"), "local": ptx.count(".local"),
           "tma": ptx.count("cp.async.bulk.tensor"), "setmaxnreg": ptx.count("setmaxnreg")}
    if shutil.which("ptxas"):
        ptx = re.sub(r"^\\.version \\d+\\.\\d+", ".version 9.0", ptx, count=1, flags=re.M)
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "k.ptx").write_text(ptx)
            p = subprocess.run(["ptxas", "-v", "-arch=sm_90a", str(Path(tmp) / "k.ptx"), "-o",
                                str(Path(tmp) / "k.cubin")], capture_output=True, text=True, check=False)
        text = p.stdout + p.stderr
        m = re.search(r"Used (\\d+) registers", text)
        s = re.search(r"(\\d+) bytes spill stores", text)
        row.update(rc=p.returncode, registers=int(m.group(1)) if m else None,
                   spill=int(s.group(1)) if s else 0, warn=[l for l in text.splitlines() if "arning" in l])
    rows[f"{cu[:-3]}:{key.tag}"] = row
print(json.dumps(rows))
"""


@pytest.mark.slow
def test_production_kernels_link_offline_for_sm90a():  # type: ignore[no-untyped-def]
    rows = json.loads(_run(BUILD))
    print(json.dumps(rows, indent=1))  # registers and spills per kernel (pytest -s)
    assert len(rows) == 9, sorted(rows)
    for tag, row in rows.items():
        assert row["wgmma"] >= 4 and row["local"] == 0, (tag, row)
        tma = tag.startswith("wgmma_tma:")
        if tma:  # a TMA producer warpgroup that gives its registers to the two consumers
            assert row["tma"] >= 2 and row["setmaxnreg"] == 2, (tag, row)
        if shutil.which("ptxas"):
            assert row["rc"] == 0 and row["spill"] == 0 and not row["warn"], (tag, row)
            # the TMA tile: launch_bounds (384, 1) caps it at 65536 / 384 = 168 at entry (setmaxnreg moves
            # them between warpgroups); a lower count would mean the cap or the reallocation was lost
            assert (row["registers"] == 168) if tma else (100 < row["registers"] <= 255), (tag, row)

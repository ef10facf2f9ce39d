"""SASS of a Hopper gemm tile's epilogue, offline: which global loads (bias, R) wait on the stores before
them.
Builds the kernel of a `wgmma.Key` (the TMA tile, or with --tile cp the cp.async tile) as test_wgmma's offline
build does (numba LTO-IR + wgmma_tma.cu, linked PTX,
ptxas sm_90a), disassembles it with cuobjdump (CUOBJDUMP, from the nvidia-cuda-cuobjdump wheel) and prints
the order of LDG / STG instructions after the last wgmma wait, with their count.

    PATH=$PATH:/usr/local/cuda/bin CUOBJDUMP=/path/cuobjdump NUMBA_ENABLE_CUDASIM=0 \
        .venv/bin/python lab/tma_sass.py [--tile tma|cp] [--key bf16,out16,bias,res,bt,act] \
        [--define WS_EPI_J=16] [--dump FILE]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
from pathlib import Path

import numpy as np
from numba import cuda
from numba.cuda.cudadrv import driver

from kernels.ops.gemm import wgmma, wgmma_tma
from kernels.runtime.arrays import BF16


def build(key: wgmma.Key, define: dict[str, int] | None = None, tile: str = "tma") -> tuple[str, str]:
    mod = wgmma_tma if tile == "tma" else wgmma
    d = mod.dispatcher(key)
    ltoir, _ = cuda.compile(d.py_func, mod.KERNEL_SIG, device=False, cc=wgmma.ARCH, output="ltoir",
                            abi="numba", launch_bounds=(mod.THREADS, 1))
    src = wgmma_tma.source(key) if tile == "tma" else wgmma.source(key, wgmma.DEFAULT)
    for k, v in (define or {}).items():
        src = f"#define {k} {v}\n" + src
    link = driver._Linker(cc=wgmma.ARCH, lto=True, additional_flags=["-ptx"])
    link.add_ltoir(ltoir, name="kernel.ltoir")
    link.add_cu(src, name=f"{mod.CU_FILE.name}")
    ptx = link.get_linked_ptx().decode().rstrip("\x00")
    ptx = re.sub(r"^\.version \d+\.\d+", ".version 9.0", ptx, count=1, flags=re.M)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "k.ptx").write_text(ptx)
        p = subprocess.run(["ptxas", "-v", "-arch=sm_90a", f"{tmp}/k.ptx", "-o", f"{tmp}/k.cubin"],
                           capture_output=True, text=True, check=True)
        sass = subprocess.run([os.environ.get("CUOBJDUMP", "cuobjdump"), "-sass", f"{tmp}/k.cubin"],
                              capture_output=True, text=True, check=True).stdout
    return p.stdout + p.stderr, sass


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--key", default="bf16,1,0,1,0,none", help="dtype,out16,bias,res,bt,act (o_proj's)")
    ap.add_argument("--tile", choices=("tma", "cp"), default="tma")
    ap.add_argument("--dump")
    ap.add_argument("--define", action="append", default=[],
                    help="NAME=VALUE in front of the source (WS_EPI_J=16; WG_EPI_J for --tile cp)")
    a = ap.parse_args()
    dt, out16, bias, res, bt, act = a.key.split(",")
    key = wgmma.key_of(BF16 if dt == "bf16" else np.dtype(np.float16), out16 == "1", bias == "1", res == "1",
                       bt == "1", act)
    info, sass = build(key, dict(d.split("=", 1) for d in a.define), a.tile)
    print(re.findall(r"Used \d+ registers.*|\d+ bytes spill.*", info))
    lines = [l for l in sass.splitlines() if re.search(r"/\*[0-9a-f]{4,}\*/", l)]
    last_wait = max(i for i, l in enumerate(lines) if "WARPGROUP.DEPBAR" in l)  # the main loop's last wgmma wait
    epi = [re.sub(r"\s+", " ", l.split("*/", 1)[1]).strip() for l in lines[last_wait:]]
    seq = "".join("L" if re.search(r"\bLDG\b", e) else "S" if re.search(r"\bSTG\b", e) else "" for e in epi)
    print("epilogue LDG/STG order:", seq, f"({seq.count('L')} LDG, {seq.count('S')} STG)")
    if a.dump:
        Path(a.dump).write_text(sass)


if __name__ == "__main__":
    main()

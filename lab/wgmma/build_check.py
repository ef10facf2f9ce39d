"""Offline build check of the wgmma kernels (no GPU): the same pipeline numba runs on the H200 — the numba
kernel to LTO-IR through NVVM, gemm_wgmma.cu to LTO-IR through NVRTC, both linked by nvJitLink for sm_90a —
then ptxas -v on the linked PTX for registers, spills, shared memory and wgmma warnings.

    PYTHONPATH=$PWD /work/main/.venv/bin/python lab/wgmma/build_check.py [--json out.json] [--all]

Needs numba-cuda[cu13] (nvrtc / nvvm / nvjitlink wheels) and a ptxas that knows sm_90a.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from numba import cuda
from numba.cuda.cudadrv import driver

sys.path.insert(0, str(Path(__file__).parent))
import wgmma  # noqa: E402

CC = (9, 0, "a")
_TOO_NEW = re.compile(r"Unsupported \.version (\d+\.\d+); current version is '(\d+\.\d+)'")


def linked_ptx(v: wgmma.Variant) -> str:
    fn = wgmma.device_function(v)
    ltoir, _ = cuda.compile(
        wgmma.py_kernel(fn),
        wgmma.KERNEL_SIG,
        device=False,
        cc=CC,
        output="ltoir",
        abi="numba",
        launch_bounds=(wgmma.THREADS, 1),
    )
    linker = driver._Linker(cc=CC, lto=True, additional_flags=["-ptx"])
    linker.add_ltoir(ltoir, name="kernel.ltoir")
    linker.add_cu(wgmma.source(v), name=f"{v.name}.cu")  # NVRTC, to LTO-IR since lto=True
    return str(linker.get_linked_ptx().decode()).rstrip("\x00")


def ptxas(ptx: str) -> dict[str, Any]:
    exe = shutil.which("ptxas")
    if exe is None:
        return {"ptxas": "not found"}
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        for _ in range(2):
            src.write_text(ptx)
            cmd = [exe, "-v", "-arch=sm_90a", str(src), "-o", str(Path(tmp) / "k.cubin")]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
            text = p.stdout + p.stderr
            m = _TOO_NEW.search(text)
            if not m:
                break
            # newer NVVM stamps a newer PTX ISA than the local ptxas knows; nothing here needs it
            ptx = ptx.replace(f".version {m.group(1)}", f".version {m.group(2)}", 1)
        cubin = (Path(tmp) / "k.cubin").read_bytes() if p.returncode == 0 else b""

    def num(pat: str) -> int | None:
        mm = re.search(pat, text)
        return int(mm.group(1)) if mm else None

    return {
        "rc": p.returncode,
        "registers": num(r"Used (\d+) registers"),
        "spill_stores": num(r"(\d+) bytes spill stores"),
        "spill_loads": num(r"(\d+) bytes spill loads"),
        "stack_frame": num(r"(\d+) bytes stack frame"),
        "static_smem": num(r"(\d+) bytes smem") or 0,
        "warnings": [ln.strip() for ln in text.splitlines() if "warning" in ln.lower()],
        "cubin_bytes": len(cubin),
    }


def variants(everything: bool) -> list[wgmma.Variant]:
    out = []
    for dt in wgmma.DTYPES:
        out += [
            wgmma.Variant(dtype=dt),
            wgmma.Variant(dtype=dt, out16=True),
            wgmma.Variant(dtype=dt, out16=True, res=True),
            wgmma.Variant(dtype=dt, out16=True, layout="nt"),
        ]
    out += [
        wgmma.Variant(out16=True, inflight=0),
        wgmma.Variant(out16=True, bn=128, stages=6),
        wgmma.Variant(out16=True, bn=128, stages=4, inflight=0),
    ]
    return out if everything else out[:4] + out[8:]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path)
    ap.add_argument("--all", action="store_true", help="fp16 variants too")
    args = ap.parse_args()
    rows = []
    ok = True
    for v in variants(args.all):
        try:
            ptx = linked_ptx(v)
            info = ptxas(ptx)
            info["wgmma_in_ptx"] = ptx.count("wgmma.mma_async")
            info["local_in_ptx"] = ptx.count("ld.local") + ptx.count("st.local")
        except Exception as e:  # noqa: BLE001
            info = {"error": f"{type(e).__name__}: {str(e).strip().splitlines()[:3]}"}
        info["variant"] = v.tag
        info["dynamic_smem"] = v.smem_bytes
        rows.append(info)
        bad = "error" in info or info.get("rc") != 0 or info.get("spill_stores") or info.get("warnings")
        ok &= not bad
        print(
            f"{v.tag:34s} regs {info.get('registers')}"
            f" spill {info.get('spill_stores')}/{info.get('spill_loads')}"
            f" stack {info.get('stack_frame')} smem dyn {v.smem_bytes} static {info.get('static_smem')}"
            f" wgmma {info.get('wgmma_in_ptx')} local {info.get('local_in_ptx')}"
            f" {info.get('warnings') or ''} {info.get('error', '')}"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

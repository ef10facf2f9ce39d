"""Offline build check of the warp-specialized kernels (no GPU): the numba kernel (launch_bounds (384, 1)) to
LTO-IR through NVVM, wgmma_tma.cu (kernels/ops/gemm) to LTO-IR through NVRTC, nvJitLink for sm_90a, then ptxas -v (lab/wgmma's
`ptxas` helper) on the linked PTX: registers, spills, stack, warnings (C7508 = setmaxnreg ignored).

    PYTHONPATH=$PWD /work/main/.venv/bin/python lab/wgmma_ws/build_check.py [--ptx-dir DIR] | tee lab/wgmma_ws/build_check.txt
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from pathlib import Path

from numba import cuda
from numba.cuda.cudadrv import driver

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import ws  # noqa: E402

CC = (9, 0, "a")


def _lab_build_check():  # lab/wgmma/build_check.py's ptxas() (imported by path: both dirs have no package)
    spec = importlib.util.spec_from_file_location("wg_build_check", HERE.parent / "wgmma" / "build_check.py")
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(HERE.parent / "wgmma"))
    spec.loader.exec_module(mod)
    return mod


def linked_ptx(v: ws.Variant) -> str:
    fn = ws.device_function(v)
    ltoir, _ = cuda.compile(
        ws.py_kernel(fn), ws.KERNEL_SIG, device=False, cc=CC, output="ltoir", abi="numba",
        launch_bounds=(ws.THREADS, 1),
    )
    linker = driver._Linker(cc=CC, lto=True, additional_flags=["-ptx"])
    linker.add_ltoir(ltoir, name="kernel.ltoir")
    linker.add_cu(ws.source(v), name=f"{v.name}.cu")
    return str(linker.get_linked_ptx().decode()).rstrip("\x00")


def variants() -> list[ws.Variant]:
    return [
        ws.Variant(out16=True),
        ws.Variant(out16=False),
        ws.Variant(out16=True, res=True),
        ws.Variant(out16=True, persist=True),
        ws.Variant(out16=False, persist=True),
        ws.Variant(out16=True, res=True, persist=True),
        ws.Variant(out16=True, bn=128, stages=7, persist=True),
        ws.Variant(out16=True, layout="nt", persist=True),
        ws.Variant(dtype="f16", out16=True, persist=True),
        ws.Variant(out16=True, cluster=2),
        ws.Variant(out16=False, cluster=2),
        ws.Variant(out16=True, res=True, cluster=2),
    ]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ptx-dir", type=Path)
    args = ap.parse_args()
    bc = _lab_build_check()
    ok = True
    for v in variants():
        try:
            ptx = linked_ptx(v)
            if args.ptx_dir:
                args.ptx_dir.mkdir(parents=True, exist_ok=True)
                (args.ptx_dir / f"{v.tag}.ptx").write_text(ptx)
            info = bc.ptxas(ptx)
            facts = {
                "wgmma": ptx.count("wgmma.mma_async"),
                "tma": ptx.count("cp.async.bulk.tensor"),
                "setmaxnreg": ptx.count("setmaxnreg"),
                "local": ptx.count("ld.local") + ptx.count("st.local"),
                "maxntid": (re.findall(r"\.maxntid\s+([\d, ]+)", ptx) or ["-"])[0].strip(),
                "minnctapersm": (re.findall(r"\.minnctapersm\s+(\d+)", ptx) or ["-"])[0],
            }
        except Exception as e:  # noqa: BLE001
            info, facts = {"error": f"{type(e).__name__}: {str(e).strip().splitlines()[:6]}"}, {}
        bad = ("error" in info or info.get("rc") != 0 or info.get("spill_stores") or info.get("spill_loads")
               or info.get("stack_frame") or info.get("warnings") or facts.get("local"))
        ok &= not bad
        print(f"{v.tag:40s} smem {v.smem_bytes} regs {info.get('registers')} "
              f"spill {info.get('spill_stores')}/{info.get('spill_loads')} stack {info.get('stack_frame')} "
              f"{facts} warnings {info.get('warnings')} {info.get('error', '')} {'BAD' if bad else 'ok'}",
              flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

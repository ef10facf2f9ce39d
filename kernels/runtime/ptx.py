"""Offline PTX for the artifact manifest: every OpSpec's `ptx_kernels`, compiled for one compute capability
with no GPU present (`cuda.compile_ptx` through NVVM from the numba-cuda[cu13] wheels, FACTS.md), with the
register use ptxas reports for each kernel.

ptx_kernels entries are (name, dispatcher or Python function, signature) or, for kernels that link CUDA C
device functions, (name, function, signature, link files): those compile to PTX with unresolved externs, so
ptxas runs in relocatable mode (-c) and the link files are listed in the entry. An arch-specific kernel adds
a 5th item, its one target, e.g. (9, 0, "a") for wgmma: it is listed only for that compute capability,
compiled for that target (`.target sm_90a` in its PTX) and recorded with "arch": "sm_90a"; every other entry
has "arch": None (PTX for the plain target, which later GPUs can JIT). Like every kernel linking CUDA C, its
CUDA C half is compiled by NVRTC on the node ("link"); numba-cuda picks the sm_90a target there by itself.
ptxas is optional: where it is missing or fails, "registers" is None and "ptxas" says why; never an error.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from numba import cuda

from kernels.registry import all_ops

_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_TOO_NEW = re.compile(r"Unsupported \.version (\d+\.\d+); current version is '(\d+\.\d+)'")


def _sm(cc: tuple[Any, ...]) -> str:
    return f"sm_{cc[0]}{cc[1]}{cc[2] if len(cc) > 2 else ''}"


def _ptxas(ptx: str, cc: tuple[Any, ...], relocatable: bool) -> dict[str, Any]:
    """Register report of one PTX module. NVVM from newer CUDA wheels may stamp a PTX ISA version the local
    ptxas does not know (here 9.5 against ptxas 13.0's 9.0); these kernels use nothing newer, so the report
    is taken from a copy with the older version line, and says so ("ptx_version_lowered")."""
    res = _ptxas_once(ptx, cc, relocatable)
    m = _TOO_NEW.search(str(res.get("ptxas", "")))
    if m:
        res = _ptxas_once(ptx.replace(f".version {m.group(1)}", f".version {m.group(2)}", 1), cc, relocatable)
        res["ptx_version_lowered"] = f"{m.group(1)} -> {m.group(2)}"
    return res


def _ptxas_once(ptx: str, cc: tuple[Any, ...], relocatable: bool) -> dict[str, Any]:
    exe = shutil.which("ptxas")
    if exe is None:
        return {"registers": None, "ptxas": "ptxas not found on PATH"}
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        cmd = [exe, "-v", f"-arch={_sm(cc)}", str(src), "-o", str(Path(tmp) / "k.cubin")]
        if relocatable:
            cmd.insert(1, "-c")
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            return {"registers": None, "ptxas": f"ptxas did not run: {e}"}
    text = p.stdout + p.stderr
    if p.returncode != 0:
        first = text.strip().splitlines()[:1]
        return {"registers": None, "ptxas": f"ptxas exit {p.returncode}: {first[0] if first else ''}"}
    used = _USED.search(text)
    smem = _SMEM.search(text)
    spill = _SPILL.search(text)
    return {
        "registers": int(used.group(1)) if used else None,
        "shared_bytes": int(smem.group(1)) if smem else 0,
        "spill_bytes": (int(spill.group(1)) + int(spill.group(2))) if spill else 0,
        "ptxas": "ok",
    }


def compile_one(fn: Any, sig: str, cc: tuple[Any, ...]) -> str:
    py = getattr(fn, "py_func", fn)
    # a dispatcher's launch_bounds change register allocation: compile with the same ones
    opts = getattr(fn, "targetoptions", {})
    lb = opts.get("launch_bounds")
    # and the same fastmath flag (approximate exp / division / sqrt change the code)
    ptx, _ = cuda.compile_ptx(py, sig, cc=cc, launch_bounds=lb, fastmath=bool(opts.get("fastmath", False)))
    return str(ptx)


def compile_all(cc: tuple[int, int], ops: tuple[str, ...] | None = None) -> dict[str, dict[str, Any]]:
    """kernel name -> {"op", "signature", "cc", "arch", "ptx", "registers", "shared_bytes", "spill_bytes",
    "ptxas", "link", "error"}. A kernel that does not compile gets "ptx": None and "error" (one line): the
    caller (the artifact builder) decides whether that stops the build; one op's failure never hides the
    others'. `ops`: only these ops' kernels (default: every op)."""
    out: dict[str, dict[str, Any]] = {}
    for spec in all_ops().values():
        if ops is not None and spec.name not in ops:
            continue
        for entry in spec.ptx_kernels:
            name, fn, sig = entry[0], entry[1], entry[2]
            link = [str(p) for p in entry[3]] if len(entry) > 3 else []
            target = tuple(entry[4]) if len(entry) > 4 else tuple(cc)
            if target[:2] != tuple(cc[:2]):
                continue  # arch-specific code for another GPU: never shipped to, or loaded on, this one
            info: dict[str, Any] = {"op": spec.name, "signature": sig, "cc": f"{cc[0]}.{cc[1]}", "link": link,
                                    "arch": _sm(target) if len(entry) > 4 else None}  # fmt: skip
            try:
                ptx = compile_one(fn, sig, target)
            except Exception as e:  # noqa: BLE001
                last = str(e).strip().splitlines()
                info.update(ptx=None, registers=None, error=f"{type(e).__name__}: {last[0] if last else ''}")
                out[name] = info
                continue
            info["ptx"] = ptx
            info["error"] = None
            info.update(_ptxas(ptx, target, relocatable=bool(link)))
            out[name] = info
    return out

"""The refactor gate: the production PTX and SASS of every kernel `auto` can pick, recorded in one tree and
compared with another. Run from a tree's root:

    PYTHONPATH=$PWD python lab/ptx_gate.py record --out /tmp/gate-before.json      # on the old tree
    PYTHONPATH=$PWD python lab/ptx_gate.py record --out /tmp/gate-after.json       # on the new tree
    python lab/ptx_gate.py compare /tmp/gate-before.json /tmp/gate-after.json [--rename old=new ...]

What is compared, per kernel (cc 9.0, numba-cuda's offline `cuda.compile_ptx`, ptxas sm_90):
  - "ptx": the PTX text with every mangled symbol (`_Z...`) replaced by its order of first appearance.
    numba mangles the defining module and qualified name into the symbol, so a moved or renamed kernel
    changes its name and nothing else; the raw hash is recorded too.
  - "sass": the cubin ptxas makes from that normalised PTX (relocatable for kernels linking CUDA C).
  - "link": the sha256 of each linked CUDA C file (its PTX comes from NVRTC on the node, from this text).
`record --fresh` compiles every kernel in its own process: numba's PTX text can depend on what the process
compiled before (seen on clip_grad_norm's kernels: same SASS, other PTX), so the trees are compared from the
same state. The kernel set is every OpSpec's `ptx_kernels` (what the artifact ships) plus EXTRA below:
variants auto takes that an older tree did not list there.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

CC = (9, 0)
_SYM = re.compile(r"_Z[A-Za-z0-9_$]+")
_TOO_NEW = re.compile(r"Unsupported \.version (\d+\.\d+); current version is '(\d+\.\d+)'")

# Kernels auto picks that the tree at 45c50bf did not list in ptx_kernels: (gate name, op, module, kernel
# expression, signature expression, linked file expression or None), evaluated in that module's namespace.
EXTRA_OLD = (
    ("gemm_simt2_scalar_float32", "gemm", "kernels.ops.gemm", "_simt2_prod(False, False, False)",
     "SIG_FLAT", None),
    ("o_proj_simt2_scalar_float32", "o_proj", "kernels.ops.gemm", "_simt2_prod(False, False, True)",
     "SIG_FLAT", None),
    ("gemm_mma_unaligned_float16", "gemm", "kernels.ops.cuda.mma", "dispatchers(DEFAULT)[(False, False)]",
     "KERNEL_SIG", "CU_FILE"),
    ("o_proj_mma_unaligned_float16", "o_proj", "kernels.ops.cuda.mma", "dispatchers(DEFAULT)[(True, False)]",
     "KERNEL_SIG", "CU_FILE"),
)  # fmt: skip


# Kernels the tree at 45c50bf listed that this one no longer ships (auto does not take them on the H200) but
# still runs elsewhere: gemm / o_proj portable (the simulator; fp16 without tensor cores).
EXTRA_NEW = (
    ("gemm_portable_float32", "gemm", "kernels.ops.gemm", "portable.make_kernel(False, False)",
     "_sig(F32, F32)", None),
    ("gemm_portable_float16", "gemm", "kernels.ops.gemm", "portable.make_kernel(False, False)",
     "_sig(F16, F32)", None),
    ("o_proj_portable_float32", "o_proj", "kernels.ops.gemm", "portable.make_kernel(False, True)",
     "_sig(F32, F32)", None),
    ("o_proj_portable_float16", "o_proj", "kernels.ops.gemm", "portable.make_kernel(False, True)",
     "_sig(F16, F16)", None),
)  # fmt: skip


def _sha(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def normalise(ptx: str) -> str:
    names: dict[str, str] = {}

    def sub(m: re.Match[str]) -> str:
        return names.setdefault(m.group(0), f"_SYM{len(names)}")

    return _SYM.sub(sub, ptx)


def _cubin(ptx: str, relocatable: bool) -> tuple[str | None, str]:
    exe = shutil.which("ptxas")
    if exe is None:
        return None, "ptxas not on PATH"
    for _ in range(2):
        with tempfile.TemporaryDirectory() as tmp:
            src, dst = Path(tmp) / "k.ptx", Path(tmp) / "k.cubin"
            src.write_text(ptx)
            cmd = [exe, f"-arch=sm_{CC[0]}{CC[1]}", str(src), "-o", str(dst)] + (
                ["-c"] if relocatable else []
            )
            p = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if p.returncode == 0:
                return _sha(dst.read_bytes()), "ok"
            m = _TOO_NEW.search(p.stderr)
            if not m:
                return None, p.stderr.strip().splitlines()[0] if p.stderr.strip() else f"exit {p.returncode}"
            ptx = ptx.replace(f".version {m.group(1)}", f".version {m.group(2)}", 1)
    return None, "ptx version"


def _entries() -> list[tuple[str, str, Any, str, list[str]]]:
    from kernels.registry import all_ops

    out = []
    for spec in all_ops().values():
        for e in spec.ptx_kernels:
            out.append((e[0], spec.name, e[1], e[2], [str(p) for p in e[3]] if len(e) > 3 else []))
    import kernels

    old = (Path(kernels.__file__).parent / "ptx.py").exists()  # the layout of 45c50bf
    for name, op, mod, expr, sig, link in EXTRA_OLD if old else EXTRA_NEW:
        ns = vars(importlib.import_module(mod))
        files = [str(eval(link, ns))] if link else []
        out.append((name, op, eval(expr, ns), eval(sig, ns), files))
    return out


def _compile_one(fn: Any, sig: str) -> str:
    try:
        from kernels.runtime.ptx import compile_one
    except ImportError:
        from kernels.ptx import compile_one  # type: ignore[no-redef]
    return compile_one(fn, sig, CC)


def record(out: Path, only: str | None = None, dump: Path | None = None) -> None:
    rows: dict[str, dict[str, Any]] = {}
    for name, op, fn, sig, link in _entries():
        if only and only != name:
            continue
        ptx = _compile_one(fn, sig)
        norm = normalise(ptx)
        if dump is not None:
            dump.mkdir(parents=True, exist_ok=True)
            (dump / f"{name}.ptx").write_text(norm)
        sass, why = _cubin(norm, relocatable=bool(link))
        rows[name] = {
            "op": op,
            "signature": sig,
            "ptx_raw": _sha(ptx),
            "ptx": _sha(norm),
            "sass": sass,
            "ptxas": why,
            "link": {Path(p).name: _sha(Path(p).read_bytes()) for p in link},
            "symbols": sorted(set(_SYM.findall(ptx))),
        }
        print(f"{name:<44} ptx {rows[name]['ptx'][:12]}  sass {str(sass)[:12]}", file=sys.stderr)
    out.write_text(json.dumps(rows, indent=1, sort_keys=True))


def record_fresh(out: Path, dump: Path | None) -> None:
    """`record`, one process per kernel: numba's PTX for a kernel can differ with what the process compiled
    before it (the SASS does not), so both trees are compared kernel by kernel from the same fresh state."""
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, *_ in _entries():
            part = Path(tmp) / "one.json"
            cmd = [sys.executable, __file__, "record", "--only", name, "--out", str(part)]
            subprocess.run(cmd + (["--dump", str(dump)] if dump else []), check=True)
            rows.update(json.loads(part.read_text()))
    out.write_text(json.dumps(rows, indent=1, sort_keys=True))


def compare(before: Path, after: Path, renames: list[str]) -> int:
    old = json.loads(before.read_text())
    new = json.loads(after.read_text())
    mapping = dict(r.split("=", 1) for r in renames)
    bad = 0
    print(f"{'before':<40}{'after':<40}{'ptx':>6}{'sass':>6}{'link':>6}")
    seen = set()
    for name in sorted(old):
        target = mapping.get(name, name)
        if target == "-" or target not in new:
            print(f"{name:<40}{'(removed)':<40}")
            continue
        seen.add(target)
        o, n = old[name], new[target]
        same = [
            o["ptx"] == n["ptx"],
            o["sass"] == n["sass"] and o["sass"] is not None,
            sorted(o["link"].values()) == sorted(n["link"].values()),  # by content
        ]
        bad += not all(same)
        print(f"{name:<40}{target:<40}" + "".join(f"{'same' if s else 'DIFF':>6}" for s in same))
    for name in sorted(set(new) - seen):
        print(f"{'(new)':<40}{name:<40}")
    print(f"{'IDENTICAL' if bad == 0 else f'{bad} DIFFERENT'}: {len(seen)} kernels compared")
    return 1 if bad else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--only", help="record only the kernel of this name")
    r.add_argument("--fresh", action="store_true", help="compile each kernel in a new process (see above)")
    r.add_argument("--dump", type=Path, help="also write each normalised PTX to this folder")
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    c.add_argument("--rename", action="append", default=[], help="old=new ('-': removed on purpose)")
    a = p.parse_args()
    if a.cmd == "record":
        if a.fresh:
            record_fresh(a.out, a.dump)
        else:
            record(a.out, a.only, a.dump)
        return 0
    return compare(a.before, a.after, a.rename)


if __name__ == "__main__":
    sys.exit(main())

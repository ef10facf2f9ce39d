"""Child process of `solfleet build`: `python -m fleet.ptx_export 9.0` prints a JSON list of
{op, kernel, signature, ptx, registers, shared_bytes, spill_bytes, ptxas, link} for every kernel that
kernels.runtime.ptx.compile_all compiles offline for that compute capability.

Run with cwd = the tree being packaged. Exit 3 (reason on stdout) when that tree has no
kernels/runtime/ptx.py, so a build can still package the kernels and record that PTX was unavailable; any
other failure (a kernel that does not compile) is a build error."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any


def _records(result: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for name, info in sorted(result.items()):
        regs = info.get("registers")
        out.append(
            {
                "op": str(info["op"]),
                "kernel": str(name),
                "signature": str(info.get("signature", "")),
                "ptx": str(info["ptx"]),
                "registers": None if regs is None else int(regs),
                "shared_bytes": info.get("shared_bytes"),
                "spill_bytes": info.get("spill_bytes"),
                "ptxas": info.get("ptxas"),
                "link": [Path(p).name for p in info.get("link") or []],
                # "sm_90a" for a kernel that runs on that architecture alone (wgmma); None: any of its cc
                "arch": info.get("arch"),
            }
        )
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1 or len(argv[0].split(".")) != 2:
        print("usage: python -m fleet.ptx_export MAJOR.MINOR", file=sys.stderr)
        return 2
    cc = tuple(int(x) for x in argv[0].split("."))
    try:
        ptx = importlib.import_module("kernels.runtime.ptx")
    except ModuleNotFoundError as exc:
        if exc.name in ("kernels.runtime", "kernels.runtime.ptx"):  # a tree without kernels/runtime/ too
            print("kernels/runtime/ptx.py not present in this tree")
            return 3
        raise
    # an editable install can resolve kernels.runtime.ptx from another checkout: PTX must match this tree
    if not Path(ptx.__file__ or "").resolve().is_relative_to(Path.cwd().resolve()):
        print(f"kernels/runtime/ptx.py not present in this tree (found only {ptx.__file__})")
        return 3
    try:
        records = _records(ptx.compile_all(cc))
    except Exception as exc:  # a kernel that does not compile: one line for the build error, then the detail
        first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")
        print(
            f"{type(exc).__name__}: {first} (run `python -m fleet.ptx_export {argv[0]}` for the traceback)",
            file=sys.stderr,
        )
        if sys.stderr.isatty():
            raise
        return 1
    print(json.dumps(records))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

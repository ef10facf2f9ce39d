"""Child process of `solfleet build`: `python -m fleet.ptx_export 9.0` prints a JSON list of
{op, kernel, ptx, registers} for every kernel compiled offline by kernels.ptx for that compute capability.

Exit 3 (with the reason on stdout) when kernels.ptx does not exist, so a build can still package the
kernels and record that PTX was unavailable; any other failure is a real build error."""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any


def _records(result: Any) -> list[dict[str, Any]]:
    """Accept what kernels.ptx.compile_all returns: a list of records (dicts or objects) with op, kernel,
    ptx and registers."""
    items = result.values() if isinstance(result, dict) else result
    out = []
    for item in items:
        get = item.get if isinstance(item, dict) else lambda k, item=item: getattr(item, k)
        regs: Any = get("registers")
        out.append(
            {
                "op": str(get("op")),
                "kernel": str(get("kernel")),
                "ptx": str(get("ptx")),
                "registers": None if regs is None else int(regs),
            }
        )
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m fleet.ptx_export CC", file=sys.stderr)
        return 2
    try:
        ptx = importlib.import_module("kernels.ptx")
    except ModuleNotFoundError as exc:
        if exc.name == "kernels.ptx":
            print("kernels.ptx not present in this tree")
            return 3
        raise
    print(json.dumps(_records(ptx.compile_all(argv[0]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

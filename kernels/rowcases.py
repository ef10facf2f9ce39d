"""Shapes shared by the row operators (rmsnorm, layernorm, softmax): one table, so they stay comparable."""

from __future__ import annotations

from typing import Any

import numpy as np

from kernels.arrays import SIMULATED
from kernels.reduce import BLOCK, PER
from kernels.registry import Case
from kernels.vector import AUTO_VECTOR, VEC_BYTES

_DTYPES = ("float32", "float16")


def _cases(shapes: list[tuple[str, int, int]]) -> tuple[Case, ...]:
    return tuple(Case(label, {"rows": m, "cols": n}, dt) for label, m, n in shapes for dt in _DTYPES)


def row_cases() -> dict[str, tuple[Case, ...]]:
    """sim: 3 rows of 133 (register path: <= 32 threads x PER), 2 rows of 601 (streaming path, its
    4-wide unrolled loop and its tail); verify: odd widths on both paths (1001 and 64: registers, 5003:
    streaming);
    bench: 16384 x 4096, 537 MB (fp32) / 268 MB (fp16) moved."""
    return {
        "sim_cases": _cases([("tiny-odd", 3, 133), ("long-odd", 2, 601)]),
        "verify_cases": _cases([("odd", 37, 1001), ("wide-odd", 129, 5003), ("narrow", 1031, 64)]),
        "bench_cases": _cases([("16384x4096", 16384, 4096)]),
    }


def row_path(case: Case) -> str:
    """The kernel a row op's "auto" launcher takes for `case` on this machine (verify/bench record it):
    "vector" (16-byte loads; device allocations are 256-byte aligned, so only the row length decides),
    "register" (rows of <= BLOCK * PER, scalar loads) or "stream" (longer rows)."""
    n = case.params["cols"]
    dt = np.dtype(case.dtype)
    if n > BLOCK * PER:
        return "stream"
    if not SIMULATED and dt in AUTO_VECTOR and (n * dt.itemsize) % VEC_BYTES == 0:
        return "vector"
    return "register"


def row_ptx_kernels(
    name: str, reg: Any, stream: Any, vec: dict[Any, Any], sigs: dict[Any, str]
) -> tuple[tuple[str, Any, str], ...]:
    """The offline-PTX list of a row op: its register-row, streaming and vector kernels for every dtype."""
    kinds = (("reg", lambda dt: reg), ("stream", lambda dt: stream), ("vec", lambda dt: vec[dt]))
    return tuple(
        (f"{name}_{kind}_{dt.name}", fn(dt), sig) for kind, fn in kinds for dt, sig in sigs.items()
    )

"""Shapes shared by the row operators (rmsnorm, layernorm, softmax): one table, so they stay comparable."""

from __future__ import annotations

from typing import Any

import numpy as np

from kernels.arrays import SIMULATED
from kernels.launch import Kernel, sm_count
from kernels.reduce import BLOCK, PER
from kernels.registry import Case
from kernels.vector import AUTO_VECTOR, VEC_BYTES

_DTYPES = ("float32", "float16")
F32, F16 = np.dtype(np.float32), np.dtype(np.float16)
MAX_GRID = 2**31 - 1

# v4 row kernels (make_rows in each row op): which dtypes of which op take one on the vector path, and its
# shape: (threads per block, values per thread, launch_bounds blocks per SM, prefetch the next row, keep the
# prefetched row as packed halves). Chosen from the side-by-side H200 timings (benchmarks/notes-memory.md,
# "v4"); a dtype that is absent keeps the v3 vector kernel. threads x values must cover BLOCK x PER.
# Round 1 (2026-11-30, notes-memory.md "v4 outcome"): every v4 shape was slower than v3's vector kernel
# (layernorm fp16 89-163 us vs 76, softmax 102-186 vs 83, rmsnorm 71-77 vs 70), so no op takes one.
V4_CONFIG: dict[str, dict[np.dtype, tuple[int, int, int, bool, bool]]] = {
    "layernorm": {},
    "softmax": {},
    "rmsnorm": {},
}


def v4_shape(op: str, dt: np.dtype) -> tuple[int, int, int, bool, bool]:
    """The make_rows arguments after width for `op` at `dt`. Under the simulator: BLOCK threads x PER values
    (the same longest row as the v3 kernels there), one block per SM, the same prefetch mode."""
    t, p, b, pf, raw = V4_CONFIG[op][dt]
    assert t * p >= BLOCK * PER, (op, dt)
    return (BLOCK, PER, 1, pf, raw) if SIMULATED else (t, p, b, pf, raw)


def v4_launch_shape(k: Kernel, shape: tuple[int, int, int, bool, bool], rows: int) -> tuple[int, int]:
    """(block, grid) for a v4 kernel: one block per row, or for the prefetching kernels a persistent grid of
    every block the SMs hold at once (never more blocks than rows)."""
    threads, prefetch = shape[0], shape[3]
    if prefetch:
        return threads, min(rows, sm_count() * k.resident_blocks(threads))
    return threads, min(rows, MAX_GRID)


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


def row_path_of(op: str) -> Any:
    """row_path for `op`, naming its v4 kernel ("v4") where V4_CONFIG gives `op` one for the case's dtype."""

    def path(case: Case) -> str:
        p = row_path(case)
        return "v4" if p == "vector" and np.dtype(case.dtype) in V4_CONFIG[op] else p

    return path


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
    name: str,
    reg: Any,
    stream: Any,
    vec: dict[Any, Any],
    sigs: dict[Any, str],
    v4: dict[Any, Any] | None = None,
) -> tuple[tuple[str, Any, str], ...]:
    """The offline-PTX list of a row op: its register-row, streaming and vector kernels for every dtype, and
    its v4 kernels (`v4`: dtype -> function) for the dtypes that have one."""
    kinds = (("reg", lambda dt: reg), ("stream", lambda dt: stream), ("vec", lambda dt: vec[dt]))
    out = [(f"{name}_{kind}_{dt.name}", fn(dt), sig) for kind, fn in kinds for dt, sig in sigs.items()]
    out += [(f"{name}_v4_{dt.name}", fn, sigs[dt]) for dt, fn in (v4 or {}).items()]
    return tuple(out)

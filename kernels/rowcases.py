"""Shapes shared by the row operators (rmsnorm, layernorm, softmax): one table, so they stay comparable."""

from __future__ import annotations

from kernels.registry import Case

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

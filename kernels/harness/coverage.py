"""Operator coverage on this machine: for every op, dtype and production shape (the op's bench cases), the
kernel "auto" runs, its tier and why (kernels.registry.Choice), and the ops and dtypes that only have a
fallback here. Nothing is launched: the answer comes from each op's selection rule and the device's compute
capability, so `python -m kernels info` and every verify report carry it, and a mixed fleet shows at a
glance (`solfleet status`) which nodes run slow paths."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kernels.registry import TIERS, OpSpec


def rows(ops: Iterable[OpSpec]) -> list[dict[str, Any]]:
    """One row per op, dtype and bench case: op, dtype, case, path, tier, why. A selection rule that raises,
    or answers a tier outside TIERS, is a row of tier "fallback" whose `why` names the error: coverage never
    hides an op, and never fails the verify report that carries it."""
    out: list[dict[str, Any]] = []
    for spec in ops:
        for case in spec.bench_cases:
            try:
                choice = spec.choice(case).as_dict()
            except Exception as e:  # noqa: BLE001  (one op's broken rule must not hide the others)
                choice = {"path": "unknown", "tier": "fallback", "why": f"{type(e).__name__}: {e}"}
            if choice["tier"] not in TIERS:  # a rule's bug, reported as such rather than trusted
                why = f"tier {choice['tier']!r} is not one of {', '.join(TIERS)} ({choice['why']})"
                choice = {**choice, "tier": "fallback", "why": why}
            out.append({"op": spec.name, "dtype": case.dtype, "case": case.label, **choice})
    return out


def report(ops: Iterable[OpSpec]) -> dict[str, Any]:
    """`rows`, plus `fallback_only`: "op dtype" for every op and dtype whose every production shape takes a
    fallback here, and `fallback_cases`: "op dtype case" for each one that does."""
    table = rows(ops)
    by_key: dict[str, list[str]] = {}
    for r in table:
        by_key.setdefault(f"{r['op']} {r['dtype']}", []).append(r["tier"])
    return {
        "rows": table,
        "fallback_only": sorted(k for k, tiers in by_key.items() if all(t == "fallback" for t in tiers)),
        "fallback_cases": [f"{r['op']} {r['dtype']} {r['case']}" for r in table if r["tier"] == "fallback"],
    }


def table(rep: dict[str, Any]) -> str:
    """The coverage as text: one line per op, dtype and path, the cases that take it."""
    lines = [f"{'op':<19} {'dtype':<9} {'path':<16} {'tier':<9} why"]
    seen: dict[tuple[str, str, str, str, str], list[str]] = {}
    for r in rep["rows"]:
        seen.setdefault((r["op"], r["dtype"], r["path"], r["tier"], r["why"]), []).append(r["case"])
    for (op, dtype, path, tier, why), cases in seen.items():
        lines.append(f"{op:<19} {dtype:<9} {path:<16} {tier:<9} {why} [{', '.join(cases)}]")
    if rep["fallback_only"]:
        lines.append(f"only a fallback here: {', '.join(rep['fallback_only'])}")
    return "\n".join(lines)

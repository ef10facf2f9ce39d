"""Performance gates: a node's bench of the new release against the spec's minimum SOL and against the same
node's figures for its previous release. Pure: figures in, verdicts out, no I/O.

Verdicts:
  passed          the figure meets the gate;
  failed          it does not (the result carries the figures), or a real node has no figure to judge;
  not_evaluated   the node is simulated: timings under the CUDA simulator mean nothing, so never passed;
  throttled       slower than the gate allows, but the SM clock during the run was well below the previous
                  run's (or the GPU's maximum, for min_sol): the node, not the release, is slow;
  no_baseline     no previous figure for the same op, dtype, shape and device, timed the same way (a bench
                  from before 2026-12-05 timed without a pause before each call: `timing_of`).

Noise: every figure is the median of many timed calls, and the bench records the p10 and p90 of those calls.
Half the p10-p90 range, relative to the median, is the run's spread; the regression gate widens its
threshold by the larger spread of the two runs, so a slowdown within the measurement noise is not called a
regression.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SIMULATED = "not_evaluated (simulated)"
# a run whose SM clock is more than this fraction below the reference clock counts as throttled
THROTTLE_FRACTION = 0.05

MinSol = Mapping[str, float | Mapping[str, float]]  # op -> SOL, or op -> {dtype: SOL}


class Verdict(enum.Enum):
    PASSED = "passed"
    FAILED = "failed"
    NOT_EVALUATED = "not_evaluated"
    THROTTLED = "throttled"
    NO_BASELINE = "no_baseline"


@dataclass(frozen=True)
class Figure:
    """One bench case of one release on one node."""

    op: str
    dtype: str
    case: str  # the shape label, e.g. "4096^3"
    device: str  # name and PCI bus id: the same GPU, not only the same model
    median_s: float | None  # None: the case errored
    sol: float | None = None
    p10_s: float | None = None
    p90_s: float | None = None
    sm_clock_mhz: float | None = None  # during the run
    sm_clock_max_mhz: float | None = None  # the GPU's maximum
    timing: str = ""  # how the bench timed it (timing_of): figures timed differently are not compared

    @property
    def key(self) -> tuple[str, str, str, str, str]:
        return (self.op, self.dtype, self.case, self.device, self.timing)

    @property
    def spread(self) -> float:
        """Half the p10-p90 range relative to the median (0 when not recorded)."""
        if self.median_s is None or self.p10_s is None or self.p90_s is None or self.median_s <= 0:
            return 0.0
        return max(0.0, (self.p90_s - self.p10_s) / 2 / self.median_s)


@dataclass(frozen=True)
class GateResult:
    gate: str  # "min_sol" | "max_regression_vs_previous"
    op: str
    dtype: str  # "*": every dtype
    case: str  # "*": every shape
    verdict: Verdict
    detail: str
    figures: Mapping[str, float | str | None]

    def as_dict(self) -> dict[str, Any]:
        return {
            "gate": self.gate, "op": self.op, "dtype": self.dtype, "case": self.case,
            "verdict": self.verdict.value, "detail": self.detail, "figures": dict(self.figures),
        }  # fmt: skip


def timing_of(report: Mapping[str, Any]) -> str:
    """The bench's timing method as recorded in its report: with a device-side pause of N us before every
    call (the bench since 2026-12-05), or without one, when out-of-place calls could be charged for the
    host's launch (kernels.harness.bench.time_interleaved)."""
    pause = (report.get("method") or {}).get("pause_before_each_call_us")
    return f"device time (a {pause} us pause before each call)" if pause else "events with no pause"


def figures_from_bench(report: Mapping[str, Any]) -> list[Figure]:
    """Figures from a `python -m kernels bench --json` report. The SM clock during a case is read from the
    row's `sm_clock_mhz` where the bench recorded it; the maximum from the report's device."""
    dev = report.get("device") or {}
    device = f"{dev.get('name', '?')} {dev.get('pci_bus_id', '?')}"
    timing = timing_of(report)
    max_clock = _opt_float(dev.get("clock_mhz"))
    out = []
    for r in report.get("results", []):
        us = r.get("median_us")
        out.append(
            Figure(
                op=str(r["op"]), dtype=str(r["dtype"]), case=str(r.get("case", "")), device=device,
                median_s=None if us is None else float(us) * 1e-6,
                sol=_opt_float(r.get("sol")),
                p10_s=None if r.get("p10_us") is None else float(r["p10_us"]) * 1e-6,
                p90_s=None if r.get("p90_us") is None else float(r["p90_us"]) * 1e-6,
                sm_clock_mhz=_opt_float(r.get("sm_clock_mhz")),
                sm_clock_max_mhz=max_clock,
                timing=timing,
            )
        )  # fmt: skip
    return out


def _opt_float(v: Any) -> float | None:
    return None if v is None else float(v)


def _sol_thresholds(min_sol: MinSol) -> list[tuple[str, str, float]]:
    """(op, dtype or "*", threshold) for every entry of min_sol."""
    out: list[tuple[str, str, float]] = []
    for op, v in sorted(min_sol.items()):
        if isinstance(v, Mapping):
            out += [(op, dt, float(t)) for dt, t in sorted(v.items())]
        else:
            out.append((op, "*", float(v)))
    return out


def _throttled(clock: float | None, reference: float | None) -> bool:
    return clock is not None and reference is not None and clock < reference * (1 - THROTTLE_FRACTION)


def _clock_text(clock: float | None, reference: float | None, what: str) -> str:
    return f"SM clock {clock:.0f} MHz against {what} {reference:.0f} MHz" if clock and reference else ""


def evaluate(
    *,
    new: Sequence[Figure],
    previous: Sequence[Figure] | None,
    min_sol: MinSol,
    max_regression: float | None,
    simulated: bool,
) -> list[GateResult]:
    """Every gate verdict for one node: min_sol per op (and dtype), then the regression gate per benched case.

    `previous` is the node's figures for the release it ran before (None: it had none)."""
    out: list[GateResult] = []
    thresholds = _sol_thresholds(min_sol)
    if simulated:
        out += [GateResult("min_sol", op, dt, "*", Verdict.NOT_EVALUATED, SIMULATED, {"min_sol": t})
                for op, dt, t in thresholds]  # fmt: skip
        if max_regression is not None:
            figs = {"max_regression": max_regression}
            gate = "max_regression_vs_previous"
            out.append(GateResult(gate, "*", "*", "*", Verdict.NOT_EVALUATED, SIMULATED, figs))
        return out

    for op, dt, t in thresholds:
        rows = [f for f in new if f.op == op and dt in ("*", f.dtype)]
        if not rows:
            out.append(GateResult("min_sol", op, dt, "*", Verdict.FAILED,
                                  f"no bench figure for {op} {dt} on this node", {"min_sol": t}))  # fmt: skip
        for f in rows:
            out.append(_min_sol(f, t))

    if max_regression is not None:
        before = {f.key: f for f in previous or ()}
        timed = {f.key[:4]: f.timing for f in previous or ()}  # how each previous figure was timed
        for f in new:
            p = before.get(f.key)
            other = timed.get(f.key[:4]) if p is None else None
            out.append(_regression(f, p, max_regression, previous is not None, other))
    return out


def _min_sol(f: Figure, threshold: float) -> GateResult:
    figs: dict[str, float | str | None] = {
        "sol": f.sol, "min_sol": threshold, "median_s": f.median_s, "sm_clock_mhz": f.sm_clock_mhz,
        "device": f.device,
    }  # fmt: skip
    if f.sol is None:
        why = "the case errored" if f.median_s is None else "the bench recorded no SOL"
        return GateResult("min_sol", f.op, f.dtype, f.case, Verdict.FAILED, why, figs)
    if f.sol >= threshold:
        return GateResult(
            "min_sol", f.op, f.dtype, f.case, Verdict.PASSED, f"SOL {f.sol:.3f} >= {threshold:g}", figs
        )
    detail = f"SOL {f.sol:.3f} < {threshold:g}"
    if _throttled(f.sm_clock_mhz, f.sm_clock_max_mhz):
        detail += f"; {_clock_text(f.sm_clock_mhz, f.sm_clock_max_mhz, 'max')}"
        return GateResult("min_sol", f.op, f.dtype, f.case, Verdict.THROTTLED, detail, figs)
    return GateResult("min_sol", f.op, f.dtype, f.case, Verdict.FAILED, detail, figs)


def _regression(
    f: Figure, p: Figure | None, limit: float, had_previous: bool, other_timing: str | None = None
) -> GateResult:
    """The regression verdict of `f` against `p`, its previous figure (None: none timed alike;
    `other_timing`: how the previous release timed that same case, when it did but differently)."""
    gate = "max_regression_vs_previous"
    figs: dict[str, float | str | None] = {
        "median_s": f.median_s, "previous_median_s": None if p is None else p.median_s,
        "max_regression": limit, "device": f.device,
        "sm_clock_mhz": f.sm_clock_mhz, "previous_sm_clock_mhz": None if p is None else p.sm_clock_mhz,
    }  # fmt: skip
    if f.median_s is None:
        return GateResult(gate, f.op, f.dtype, f.case, Verdict.FAILED, "the case errored", figs)
    if p is None or p.median_s is None:
        what = f"{f.op} {f.dtype} {f.case} on {f.device}"
        if not had_previous:
            why = "no previous release on this node"
        elif other_timing is not None:
            why = f"not compared: the previous release timed {what} as {other_timing}, this one as {f.timing}"
        else:
            why = f"the previous release has no figure for {what}"
        return GateResult(gate, f.op, f.dtype, f.case, Verdict.NO_BASELINE, why, figs)
    slowdown = f.median_s / p.median_s - 1
    tolerance = max(f.spread, p.spread)
    figs |= {"slowdown": round(slowdown, 4), "noise_tolerance": round(tolerance, 4)}
    detail = (
        f"median {f.median_s * 1e6:.2f} us against {p.median_s * 1e6:.2f} us: {slowdown:+.1%} "
        f"(limit {limit:.0%} + noise {tolerance:.1%})"
    )
    if slowdown <= limit + tolerance:
        return GateResult(gate, f.op, f.dtype, f.case, Verdict.PASSED, detail, figs)
    if _throttled(f.sm_clock_mhz, p.sm_clock_mhz):
        detail += f"; {_clock_text(f.sm_clock_mhz, p.sm_clock_mhz, 'previously')}"
        return GateResult(gate, f.op, f.dtype, f.case, Verdict.THROTTLED, detail, figs)
    return GateResult(gate, f.op, f.dtype, f.case, Verdict.FAILED, detail, figs)


def unknown_gate_ops(*, min_sol: MinSol, known_ops: Iterable[str]) -> str | None:
    """None when every op in min_sol is a registered op; else one line naming the unknown and allowed ops
    (the caller passes `kernels.registry.all_ops()`'s names, so fleet/ does not import the kernels)."""
    known = sorted(set(known_ops))
    unknown = sorted(set(min_sol) - set(known))
    if not unknown:
        return None
    names = ", ".join(unknown)
    return (
        f"gates.min_sol: unknown op{'s' if len(unknown) > 1 else ''} {names}; allowed ops: {', '.join(known)}"
    )


def blocking(results: Iterable[GateResult]) -> list[GateResult]:
    """The results that stop the host: failed ones. Throttled ones are the node's health, not the release's
    speed: the caller reports them and applies its unhealthy-node policy."""
    return [r for r in results if r.verdict is Verdict.FAILED]

"""Performance gates in a rollout: what the deploy asks of the nodes, how one host's answer is judged, and
where the verdicts are kept. fleet/gates.py is the pure judge; this module joins it to the spec, the node
module's result and the ledger.

Flow: with gates set, the deploy's extra vars ask every node to bench the gated ops after a passing verify
(`solfleet_bench`, `solfleet_bench_ops`). A real node keeps the report in `releases/V/verify/bench.json` and
returns it as `bench`, with the same file of the release it ran before as `bench_previous`. The controller
then calls `evaluate_host` on each host's `solfleet` result: a host with a failed gate is a failed host
(`failed_phase` "gate", the message naming op, dtype, case and figures), and the batch's failure policy
applies as for any failure. A simulated node never benches: each of its gates is `not_evaluated
(simulated)`, in the plan, the ledger and the report, never passed.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fleet.gates import SIMULATED, GateResult, Verdict, blocking, evaluate, figures_from_bench
from fleet.ledger import HostRecord
from fleet.operation import StepResult
from fleet.policy import Gates
from fleet.spec import Node

GATE_PHASE = "gate"
MESSAGE_RESULTS_SHOWN = 3

SCHEMA = """
CREATE TABLE IF NOT EXISTS gate_results (
    operation_id TEXT NOT NULL,
    host TEXT NOT NULL,
    gate TEXT NOT NULL,
    op TEXT NOT NULL,
    dtype TEXT NOT NULL,
    "case" TEXT NOT NULL,
    verdict TEXT NOT NULL,
    detail TEXT NOT NULL,
    figures TEXT NOT NULL,
    recorded TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%SZ', 'now'))
);
CREATE INDEX IF NOT EXISTS gate_results_op ON gate_results (operation_id, host);
"""


def deploy_extravars(gates: Gates) -> dict[str, Any]:
    """Extra vars of a deploy run: bench only when a performance gate is set (simulated nodes never do)."""
    return {"solfleet_bench": gates.enabled, "solfleet_bench_ops": gates.bench_ops}


def planned(gates: Gates, nodes: Sequence[Node]) -> list[dict[str, Any]]:
    """The gates as the plan shows them, per node: `not_evaluated (simulated)` or `pending` (judged on the
    node's bench figures after its verify)."""
    if not gates.enabled:
        return []
    what = gates.describe()
    return [
        {
            "host": n.name,
            "gates": what,
            "verdict": Verdict.NOT_EVALUATED.value if n.simulated else "pending",
            "detail": SIMULATED if n.simulated else f"bench {gates.bench_ops or 'every op'} after verify",
        }
        for n in nodes
    ]


@dataclass(frozen=True)
class HostGates:
    host: str
    simulated: bool
    results: tuple[GateResult, ...]

    @property
    def blocking(self) -> list[GateResult]:
        return blocking(self.results)

    @property
    def failed(self) -> bool:
        return bool(self.blocking)

    @property
    def throttled(self) -> list[GateResult]:
        return [r for r in self.results if r.verdict is Verdict.THROTTLED]

    def message(self) -> str:
        """One line naming each failing gate's op, dtype, case and figures (the first few, then a count)."""
        bad = self.blocking
        parts = [f"{r.gate} {r.op} {r.dtype} {r.case}: {r.detail}" for r in bad[:MESSAGE_RESULTS_SHOWN]]
        more = f" (+{len(bad) - MESSAGE_RESULTS_SHOWN} more)" if len(bad) > MESSAGE_RESULTS_SHOWN else ""
        return f"{len(bad)} gate(s) failed: " + "; ".join(parts) + more if bad else "every gate passed"

    def as_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "simulated": self.simulated,
            "failed": self.failed,
            "results": [r.as_dict() for r in self.results],
        }


def evaluate_host(*, host: str, solfleet: Mapping[str, Any], gates: Gates, simulated: bool) -> HostGates:
    """Judge one host's node-module result. A real node that returned no bench (it could not run, or timed
    out) has no figures, so each min_sol gate fails naming why; the regression gate has nothing to compare."""
    bench = solfleet.get("bench") if isinstance(solfleet.get("bench"), Mapping) else None
    prev = solfleet.get("bench_previous") if isinstance(solfleet.get("bench_previous"), Mapping) else None
    results = evaluate(
        new=figures_from_bench(bench) if bench else [],
        previous=figures_from_bench(prev) if prev else None,
        min_sol=gates.min_sol,
        max_regression=gates.max_regression_vs_previous,
        simulated=simulated,
    )
    if not simulated and bench is None and solfleet.get("bench_error"):
        why = str(solfleet["bench_error"])
        results = [
            GateResult(r.gate, r.op, r.dtype, r.case, r.verdict, f"{r.detail}: {why}", r.figures)
            if r.verdict is Verdict.FAILED
            else r
            for r in results
        ]
    return HostGates(host=host, simulated=simulated, results=tuple(results))


def gate_failure(host: HostGates) -> dict[str, str] | None:
    """The fields a failed gate sets on the host's outcome (`failed_phase`, `outcome`, `message`); None when
    no gate blocks. The rollout records the host as failed with these and applies its failure policy."""
    if not host.failed:
        return None
    return {"failed_phase": GATE_PHASE, "outcome": GATE_FAILED, "message": host.message()}


GATE_FAILED = "gate_failed"
JUDGED_OUTCOMES = ("activated", "staged")  # hosts whose module verified (and benched) the new release


def judge_step(
    step: StepResult, *, gates: Gates, simulated: Mapping[str, bool]
) -> tuple[StepResult, list[HostGates], list[HostRecord]]:
    """Judge every host of a deploy step that verified the release: (the step with gate-failed hosts'
    records turned into failures, every host's verdicts, the records that changed). The caller records the
    changed records in host_outcomes (under the same step) and the verdicts with `record`; a gate-failed
    host then counts against max_failures and is undone by the failure policy like any failed host (its
    version_after is the new release, so the undo moves it back to its baseline)."""
    if not gates.enabled:
        return step, [], []
    judged: list[HostGates] = []
    changed: list[HostRecord] = []
    records = []
    for r in step.records:
        if r.outcome not in JUDGED_OUTCOMES:
            records.append(r)
            continue
        hp = step.ok_hosts.get(r.host)
        host = evaluate_host(
            host=r.host,
            solfleet=hp.solfleet if hp is not None else {},
            gates=gates,
            simulated=bool(r.simulated) if r.simulated is not None else simulated.get(r.host, False),
        )
        judged.append(host)
        failure = gate_failure(host)
        if failure is None:
            records.append(r)
            continue
        new = replace(r, outcome=GATE_FAILED, failed_phase=GATE_PHASE, message=failure["message"])
        records.append(new)
        changed.append(new)
    return replace(step, records=tuple(records)), judged, changed


# ---- the ledger ------------------------------------------------------------------------------------------


def record(ledger_path: Path, operation_id: str, hosts: Iterable[HostGates]) -> None:
    """Append each host's verdicts to the ledger's `gate_results` table (created when absent)."""
    db = sqlite3.connect(str(ledger_path), timeout=30)
    try:
        db.executescript(SCHEMA)
        with db:
            db.executemany(
                "INSERT INTO gate_results"
                ' (operation_id, host, gate, op, dtype, "case", verdict, detail, figures)'
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        operation_id,
                        h.host,
                        r.gate,
                        r.op,
                        r.dtype,
                        r.case,
                        r.verdict.value,
                        r.detail,
                        json.dumps(dict(r.figures), sort_keys=True),
                    )  # fmt: skip
                    for h in hosts
                    for r in h.results
                ],
            )
    finally:
        db.close()


def recorded(ledger_path: Path, operation_id: str) -> list[dict[str, Any]]:
    """Every verdict the ledger holds for one operation, in the order recorded."""
    if not ledger_path.exists():
        return []
    db = sqlite3.connect(str(ledger_path), timeout=30)
    db.row_factory = sqlite3.Row
    try:
        db.executescript(SCHEMA)
        rows = db.execute(
            "SELECT * FROM gate_results WHERE operation_id = ? ORDER BY rowid", (operation_id,)
        ).fetchall()
    finally:
        db.close()
    return [{**dict(r), "figures": json.loads(r["figures"])} for r in rows]

"""Everything the CLI shows: the plan, the live per-host table, operation reports, status and history.
The only module besides cli.py that prints."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from rich.console import Console
from rich.live import Live
from rich.table import Table

from fleet.ledger import HostRecord, Operation
from fleet.plan import Plan
from fleet.rollout import FAILED_OUTCOMES, PHASES, OperationReport, ProgressFactory
from fleet.runner import HostProgress, HostStatus, ProgressSink
from fleet.status import NodeStatus

_DONE = {HostStatus.OK, HostStatus.CHANGED, HostStatus.FAILED, HostStatus.UNREACHABLE, HostStatus.NOT_RUN}
_STYLE = {
    HostStatus.OK: "green",
    HostStatus.CHANGED: "yellow",
    HostStatus.FAILED: "red",
    HostStatus.UNREACHABLE: "magenta",
    HostStatus.RUNNING: "cyan",
}


def console(stream: TextIO | None = None) -> Console:
    stream = stream or sys.stdout
    # piped output (CI logs, tests) gets a wide fixed width instead of rich's 80-column fallback
    width = None if stream.isatty() else 200
    return Console(file=stream, highlight=False, width=width)


class LiveTable:
    """Per-host progress of one ansible-runner run, redrawn in place on a terminal (stderr, so stdout stays
    clean for `--json`). Started on the first update, stopped once every host is done."""

    def __init__(self, title: str, hosts: list[str]) -> None:
        self.title = title
        self.hosts = hosts
        self._live: Live | None = None
        self._console = Console(file=sys.stderr, highlight=False)

    def _table(self, state: Mapping[str, HostProgress]) -> Table:
        t = Table(title=self.title, title_justify="left", expand=False)
        for col in ("host", "status", "task / phase", "ok", "changed", "failed", "unreachable"):
            t.add_column(col)
        for h in self.hosts:
            p = state[h]
            style = _STYLE.get(p.status, "")
            t.add_row(
                h,
                f"[{style}]{p.status.value}[/]" if style else p.status.value,
                p.task or p.message[:60],
                str(p.ok),
                str(p.changed),
                str(p.failed),
                str(p.unreachable),
            )
        return t

    def update(self, state: Mapping[str, HostProgress]) -> None:
        if self._live is None:
            self._live = Live(self._table(state), console=self._console, auto_refresh=False, transient=False)
            self._live.start()
        self._live.update(self._table(state), refresh=True)
        if all(state[h].status in _DONE for h in self.hosts):
            self._live.stop()


def live_factory(enabled: bool) -> ProgressFactory:
    """A LiveTable per runner run when drawing is wanted (stderr is a terminal), else no progress sink."""

    def make(title: str, hosts: list[str]) -> ProgressSink | None:
        return LiveTable(title, hosts) if enabled else None

    return make


def print_plan(out: Console, plan: Plan, *, fleet: str, header: str, notes: Sequence[str] = ()) -> None:
    out.print(f"plan: {header}")
    width = max(len(b.name) for b in plan.batches)
    for b in plan.batches:
        out.print(f"  {b.name:<{width}}  {', '.join(b.hosts)}  (fails when > {b.max_failures} host(s) fail)")
    if plan.kind == "rollback":
        out.print(f"  target: {plan.version or 'each node`s previous release'}; fleet {fleet}")
    else:
        out.print(
            f"  on failure: {plan.on_failure}; unreachable: {plan.unreachable}; keep_releases: "
            f"{plan.keep_releases}; fleet {fleet}"
        )
    for note in notes:
        out.print(f"  [yellow]note:[/] {note}")


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _versions(r: HostRecord) -> str:
    before, after = r.version_before or "-", r.version_after or "-"
    return after if before == after else f"{before} -> {after}"


def print_operation(out: Console, report: OperationReport) -> None:
    """Per host: outcome, versions and phase timings in one compact table; messages of hosts that did not
    end where asked below it (a success message would only repeat the outcome); then per-step wall time."""
    colour = {"succeeded": "green", "rolled_back": "yellow"}.get(report.status.value, "red")
    title = " ".join(x for x in (report.kind, report.version or "", f"({report.op_id}):") if x)
    out.print(f"{title} [{colour}]{report.status.value}[/]")
    t = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    for col in (
        "step",
        "host",
        "outcome",
        "version",
        *(p.replace("unpack_check", "unpack+check") for p in PHASES),
    ):
        t.add_column(col, justify="right" if col in PHASES or col == "unpack+check" else "left")
    notes = []
    for r in report.records:
        host = r.host + (" (sim)" if r.simulated else "")
        ok = r.outcome not in FAILED_OUTCOMES | {"unreachable", "kept"}
        outcome = r.outcome if ok else f"[red]{r.outcome}[/]"
        t.add_row(r.step, host, outcome, _versions(r), *(_fmt(r.phases.get(p)) for p in PHASES))
        if not ok:
            notes.append(f"  {r.host} [{r.step}]: {r.failed_phase or r.outcome}: {r.message}")
    out.print(t)
    for note in notes:
        out.print(note, markup=False)
    for step in report.steps:
        agg = {p: [r.phases[p] for r in step.records if p in r.phases] for p in PHASES}
        fast = ", ".join(
            f"{p.replace('unpack_check', 'unpack+check')} max {max(agg[p]):.2f}s"
            for p in ("push", "unpack_check", "activate", "health")
            if agg[p]
        )
        timings = fast or "no phase timings"
        out.print(f"  {step.step}: {len(step.records)} host(s), {step.seconds:.1f}s wall; {timings}")
        if agg["verify"]:
            out.print(f"  {step.step}: verify max {max(agg['verify']):.2f}s, min {min(agg['verify']):.2f}s")
    if report.message:
        out.print(f"[{colour}]{report.message}[/]")
    if report.artifacts:
        out.print(f"  run artifacts: {report.artifacts}")


def print_status(out: Console, nodes: Sequence[NodeStatus]) -> None:
    t = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    for col in ("node", "current", "previous", "releases", "last event", "desired", "drift"):
        t.add_column(col, overflow="fold")
    for n in nodes:
        ev = n.last_event or {}
        last = f"{ev.get('event', '')} {ev.get('version', '')} {ev.get('time', '')}".strip() or "-"
        drift = {
            "in_sync": "[green]in_sync[/]",
            "drift": "[red]drift[/]",
            "unverified": "[red]unverified[/]",
            "tampered": "[red]tampered[/]",
        }.get(n.drift, n.drift)
        if n.drift == "tampered" and n.current_check:
            drift += f": {n.current_check}"
        current = n.current or ("-" if n.reachable else f"[magenta]unreachable: {n.error}[/]")
        sim = " (simulated)" if n.simulated else ""
        t.add_row(
            n.name + sim,
            current,
            n.previous or "-",
            ", ".join(n.releases) or "-",
            last,
            n.desired or "-",
            drift,
        )
    out.print(t)


def status_json(nodes: Sequence[NodeStatus]) -> str:
    return json.dumps({"nodes": [n.to_json() for n in nodes]}, indent=1, sort_keys=True)


def _host_json(r: HostRecord) -> dict[str, Any]:
    return {
        "step": r.step,
        "host": r.host,
        "outcome": r.outcome,
        "changed": r.changed,
        "version_before": r.version_before,
        "version_after": r.version_after,
        "failed_phase": r.failed_phase,
        "message": r.message,
        "phases": dict(r.phases),
    }


def history_json(ops: Sequence[tuple[Operation, list[HostRecord]]]) -> str:
    return json.dumps(
        {
            "operations": [
                {
                    "id": op.id,
                    "kind": op.kind,
                    "version": op.version,
                    "fleet": op.fleet,
                    "started": op.started,
                    "finished": op.finished,
                    "status": op.status,
                    "message": op.message,
                    "plan": op.plan,
                    "hosts": [_host_json(r) for r in hosts],
                }
                for op, hosts in ops
            ]
        },
        indent=1,
        sort_keys=True,
    )


def print_history(out: Console, ops: Sequence[tuple[Operation, list[HostRecord]]]) -> None:
    if not ops:
        out.print("no deploys or rollbacks recorded for this fleet yet")
        return
    t = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    for col in ("operation", "kind", "version", "status", "started", "finished", "hosts", "message"):
        t.add_column(col, overflow="fold")
    for op, hosts in ops:
        counts: dict[str, int] = {}
        for r in hosts:
            counts[r.outcome] = counts.get(r.outcome, 0) + 1
        summary = ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "-"
        t.add_row(
            op.id,
            op.kind,
            op.version or "(previous)",
            op.status,
            op.started,
            op.finished or "-",
            summary,
            op.message,
        )
    out.print(t)

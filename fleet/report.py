"""Everything the CLI shows: the plan, the live per-host table, operation reports, status and history.
The only module besides cli.py that prints."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from fleet.errors import ExitCode
from fleet.health import FleetHealth
from fleet.ledger import HostRecord, Operation
from fleet.operation import FAILED_OUTCOMES, PHASES, OperationReport, ProgressFactory
from fleet.plan import Plan
from fleet.recovery import LeaseState
from fleet.runner import HostProgress, HostStatus, ProgressSink
from fleet.status import FleetStatus, NodeStatus

# Every string that comes from a spec, a node or the ledger goes through escape(): rich would read a `[/]`
# in a node path or a message as markup and crash the report (and every later `history`).

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
                escape(h),
                f"[{style}]{p.status.value}[/]" if style else p.status.value,
                escape(p.task or p.message[:60]),
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
    out.print(f"plan: {escape(header)}")
    width = max(len(b.name) for b in plan.batches)
    for b in plan.batches:
        hosts = escape(", ".join(b.hosts))
        out.print(f"  {b.name:<{width}}  {hosts}  (fails when > {b.max_failures} host(s) fail)")
    if plan.kind in ("rollback", "reconcile"):
        out.print(
            f"  target: {escape(plan.version or 'each node`s previous release')}; fleet {escape(fleet)}"
        )
    else:
        out.print(
            f"  on failure: {plan.on_failure}; unreachable: {plan.unreachable}; keep_releases: "
            f"{plan.keep_releases}; fleet {escape(fleet)}"
        )
    if plan.pauses:
        out.print(
            "  pauses after the canary: `solfleet promote ID` runs the other batches, `solfleet abort ID`"
            " applies on_failure"
        )
    if plan.batch_deadline_s is not None and plan.kind != "rollback":
        out.print(f"  batch deadline: {plan.batch_deadline_s} s (a batch still running then has failed)")
    for note in notes:
        out.print(f"  [yellow]note:[/] {escape(note)}")


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _versions(r: HostRecord) -> str:
    before, after = r.version_before or "-", r.version_after or "-"
    return after if before == after else f"{before} -> {after}"


def print_operation(out: Console, report: OperationReport) -> None:
    """Per host: outcome, versions and phase timings in one compact table; messages of hosts that did not
    end where asked below it (a success message would only repeat the outcome); then per-step wall time."""
    colour = {"succeeded": "green", "rolled_back": "yellow", "paused": "yellow", "aborted": "yellow"}.get(
        report.status.value, "red"
    )
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
        outcome = escape(r.outcome) if ok else f"[red]{escape(r.outcome)}[/]"
        t.add_row(
            escape(r.step),
            escape(host),
            outcome,
            escape(_versions(r)),
            *(_fmt(r.phases.get(p)) for p in PHASES),
        )
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
        name = escape(step.step)
        out.print(f"  {name}: {len(step.records)} host(s), {step.seconds:.1f}s wall; {timings}")
        if agg["verify"]:
            out.print(f"  {name}: verify max {max(agg['verify']):.2f}s, min {min(agg['verify']):.2f}s")
    if report.message:
        out.print(f"[{colour}]{escape(report.message)}[/]")
    if report.artifacts:
        out.print(f"  run artifacts: {escape(str(report.artifacts))}")


def _stack_cell(n: NodeStatus) -> str:
    """current's stack id; marked when it is not the spec's (a deploy of another stack's artifact, or a spec
    whose pins moved since), and when the node has provisioned runtimes but none for it (a node that was
    never provisioned, with its own `python`, has none at all and is not marked)."""
    if not n.stack_id:
        return "-"
    cell = escape(n.stack_id[:12])
    if n.spec_stack_id and n.stack_id != n.spec_stack_id:
        cell += f" [yellow](spec {escape(n.spec_stack_id[:12])})[/]"
    if n.runtimes and n.stack_id not in n.runtimes:
        cell += " [yellow](no runtime)[/]"
    return cell


def print_status(out: Console, fleet: FleetStatus) -> None:
    t = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    for col in ("node", "current", "sha", "stack", "previous", "releases", "last event", "desired", "drift"):
        t.add_column(col, overflow="fold")
    for n in fleet.nodes:
        ev = n.last_event or {}
        last = f"{ev.get('event', '')} {ev.get('version', '')} {ev.get('time', '')}".strip() or "-"
        colour = "green" if n.drift == "in_sync" else "yellow" if n.drift == "no_record" else "red"
        drift = f"[{colour}]{escape(n.drift)}[/]"
        detail = {"tampered": n.current_check, "suspect": n.suspect}.get(n.drift)
        if n.drift == "other_bytes":
            detail = f"ledger has {(n.expected_sha or '')[:12]}"
        if n.drift in ("health_failed", "unconfirmed"):
            detail = n.detail
        if detail:
            drift += f": {escape(detail)}"
        if not n.reachable:
            current = f"[magenta]unreachable: {escape(n.error)}[/]"
        elif n.error:  # it answered, but with no state (its status task failed or timed out): say why
            current = f"[red]no state: {escape(n.error)}[/]"
        else:
            current = escape(n.current or "-")
        sim = " (simulated)" if n.simulated else ""
        t.add_row(
            escape(n.name + sim),
            current,
            escape((n.current_sha or "-")[:12]),
            _stack_cell(n),
            escape(n.previous or "-"),
            escape(", ".join(n.releases) or "-"),
            escape(last),
            escape(n.desired or "-"),
            drift,
        )
    out.print(t)
    for n in fleet.nodes:
        if n.fallback_only:
            out.print(
                f"[yellow]{escape(n.name)}[/]: {escape(n.current or '-')} runs only a fallback kernel for "
                f"{escape(', '.join(n.fallback_only))} (`python -m kernels info` on the node says why)"
            )
    for n in fleet.nodes:
        if n.lease:
            out.print(lease_line(n.name, n.lease, fleet))
    for op_id in fleet.running:
        out.print(
            f"[cyan]rollout {escape(op_id)} is running now[/] from this work dir: its nodes may be between"
            " batches; status again once it ends"
        )
    for op_id in fleet.unfinished:
        out.print(
            f"[red]unfinished rollout {escape(op_id)}[/]: its hosts are owed a return to its baseline;"
            " run `solfleet reconcile` (the next deploy or rollback does it first)"
        )
    for op_id in fleet.paused:
        out.print(
            f"[yellow]paused rollout {escape(op_id)}[/]: stopped after its canary; `solfleet promote"
            f" {escape(op_id)}` continues it, `solfleet abort {escape(op_id)}` applies its on_failure"
        )
    out.print(f"status: exit {int(fleet.exit_code)} ({verdict(fleet.exit_code)})")


def print_health(out: Console, fleet: FleetHealth) -> None:
    colours = {"passed": "green", "failed": "red", "skipped": "yellow"}
    for n in fleet.nodes:
        sim = " (simulated)" if n.simulated else ""
        if not n.reachable:
            out.print(f"[magenta]{escape(n.name)}{sim}: unreachable: {escape(n.error)}[/]")
            continue
        head = "[green]healthy[/]" if n.ok else "[red]UNHEALTHY[/]"
        out.print(f"{escape(n.name)}{sim} on {escape(n.current or '-')}: {head}")
        for c in n.checks:
            colour = colours.get(c["status"], "red")
            out.print(f"  [{colour}]{c['status']:<8}[/] {escape(c['name'])}: {escape(c['detail'])}")
        if n.journal_error:  # status keeps reading the journal's older verdict for this node
            out.print(f"  [yellow]note[/]: {escape(n.journal_error)}")
    code = fleet.exit_code
    out.print(f"health: {code.name.lower()} (exit {int(code)})")


def health_json(fleet: FleetHealth) -> str:
    """{"nodes": [{"name", "ok", "checks": [{"name", "status", "detail"}], ...}], "exit_code", "verdict"}"""
    return json.dumps(
        {
            "nodes": [n.to_json() for n in fleet.nodes],
            "exit_code": int(fleet.exit_code),
            "verdict": fleet.exit_code.name.lower(),
        },
        indent=1,
        sort_keys=True,
    )


def lease_line(node: str, lease: Mapping[str, Any], fleet: FleetStatus, now: float | None = None) -> str:
    """One line on a node's rollout lease: who holds it, until when, and what that means for the next deploy
    from this work dir (docs/node-contract.md, lease.json)."""
    rid = str(lease.get("rollout_id") or "?")
    head = f"{escape(node)}: lease of rollout {escape(rid)} ({escape(str(lease.get('controller') or '?'))})"
    try:
        expires = float(lease.get("expires") or 0)
    except (TypeError, ValueError):
        bad = escape(repr(lease.get("expires")))
        return f"[red]{head}: its expiry is not a time ({bad})[/]; see lease.json"
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expires))
    if expires <= (time.time() if now is None else now):
        return f"{head} expired {when}: the next deploy takes it"
    if rid in fleet.running:
        return f"{head} until {when}: that rollout is running now"
    if rid in fleet.paused:
        return f"{head} until {when}: the paused rollout's; promote or abort it"
    if lease.get("state") == LeaseState.PAUSED and rid not in fleet.takeover:
        return (
            f"[yellow]{head} until {when}[/]: another work dir's rollout, paused after its canary; a deploy"
            " from here is refused (exit 5) until `solfleet promote` or `solfleet abort` there ends it, or it"
            " expires"
        )
    # this work dir's rollout still owed a return: whatever its lease file says (a node dark at the rollout's
    # end keeps the lease it had, never re-marked unfinished)
    owed_here = rid in fleet.unfinished
    if lease.get("state") == LeaseState.UNFINISHED or owed_here:
        # kept by a rollout that ended owing its hosts a return to its baseline (fleet/recovery.py); a
        # reconcile or rollback that could not finish it renews them under that rollout's id
        # (takeover lists this ledger's recent operations only: an older owed rollout is still ours)
        if rid in fleet.takeover or owed_here:
            if owed_here:  # else nothing is owed any more: the plain takeover line below
                return (
                    f"{head} until {when}: kept by this work dir's unfinished rollout; `solfleet reconcile`"
                    " from here returns its hosts to their baseline and drops it"
                )
        else:
            return (
                f"[yellow]{head} until {when}[/]: kept by another work dir's unfinished rollout; a deploy"
                " from here is refused (exit 5) until `solfleet reconcile` from that work dir finishes it, or"
                " it expires"
            )
    if rid in fleet.takeover:
        # with nothing unfinished, reconcile has nothing to do and leaves it: a deploy or rollback takes it
        which = "deploy, rollback or reconcile" if fleet.unfinished else "deploy or rollback"
        return (
            f"{head} until {when}: this work dir's own (it ended, or its controller is gone); the next"
            f" {which} from here takes it over"
        )
    return (
        f"[yellow]{head} until {when}[/]: another controller's; a deploy from here is refused (exit 5)"
        " until it ends or expires"
    )


def verdict(code: ExitCode) -> str:
    """The word `status` prints beside its exit code (docs/cli.md, "Status exit codes"). Exit 1 there means a
    node gave no answer status could judge, not a failed operation: `error`."""
    return "error" if code is ExitCode.OPERATION_FAILED else code.name.lower()


def status_json(fleet: FleetStatus) -> str:
    return json.dumps(
        {
            "nodes": [n.to_json() for n in fleet.nodes],
            "unfinished": fleet.unfinished,
            "paused": fleet.paused,
            "running": fleet.running,
            "exit_code": int(fleet.exit_code),
            "verdict": verdict(fleet.exit_code),
        },
        indent=1,
        sort_keys=True,
    )


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
                    "recovered_by": op.recovered_by,
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
        status = op.status + (
            f" (recovered by {op.recovered_by})" if op.recovered_by not in (None, op.id) else ""
        )
        t.add_row(
            *(
                escape(x)
                for x in (
                    op.id,
                    op.kind,
                    op.version or "(previous)",
                    status,
                    op.started,
                    op.finished or "-",
                    summary,
                    op.message,
                )
            )
        )
    out.print(t)

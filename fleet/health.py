"""`solfleet health`: run `python -m kernels health` in every node's current release (health.yml) and say
which nodes are healthy. Read-only on the nodes apart from the metrics file and the Xid state that every
health run refreshes, the suspect record a failed `release.integrity` of current leaves (status says
`suspect` until a deploy or rollback replaces current), and one journal line with the result (`healthy` or
`failed`, what status reads as the node's health since the last move), written under the node's lock and
only when current did not move while health ran; no ledger row is written. Bounded by `timeouts.status_s`
per task.

Exit codes (docs/cli.md, "Health exit codes"): 0 every node answered and no check failed; 9 some node is
unhealthy (a failed check, no current release, or a health run that returned no report); 3 the only problem
is nodes that did not answer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from fleet import runner
from fleet.errors import ExitCode
from fleet.inventory import write_private_data_dir
from fleet.ledger import new_operation_id
from fleet.runner import HostStatus, ProgressSink
from fleet.spec import FleetSpec, Node
from fleet.workdir import prune_runs, run_dir

HEALTH_PLAYBOOK = "health.yml"
HEALTH_RUNS_KEPT = 10
STATUSES = ("passed", "failed", "skipped")


@dataclass(frozen=True)
class NodeHealth:
    name: str
    ok: bool
    reachable: bool
    simulated: bool
    current: str | None
    checks: list[dict[str, str]] = field(default_factory=list)  # {"name", "status", "detail"}
    error: str = ""  # why there is no report (unreachable, no current, the run itself failed)
    # why the result was not recorded in the node journal (a move while it ran, a full disk); "" when it was
    journal_error: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class FleetHealth:
    nodes: list[NodeHealth]

    @property
    def exit_code(self) -> ExitCode:
        return health_exit_code(self.nodes)


def health_exit_code(nodes: Sequence[NodeHealth]) -> ExitCode:
    """Unhealthy is worse than unreachable: a node that answered and is sick needs action now."""
    if any(n.reachable and not n.ok for n in nodes):
        return ExitCode.UNHEALTHY
    if any(not n.reachable for n in nodes):
        return ExitCode.UNREACHABLE
    return ExitCode.OK


def checks_of(report: Mapping[str, Any] | None) -> list[dict[str, str]]:
    """The checks of a `kernels health --json` report as {"name", "status", "detail"}. A report from a
    release older than the status field (`ok: bool` per check) maps to passed/failed."""
    out = []
    for c in (report or {}).get("checks") or []:
        if not isinstance(c, Mapping):
            continue
        status = c.get("status")
        if status not in STATUSES:
            status = "passed" if c.get("ok") is True else "failed"
        out.append({"name": str(c.get("name")), "status": str(status), "detail": str(c.get("detail", ""))})
    return out


def node_health(node: Node, hp: runner.HostProgress) -> NodeHealth:
    sf = hp.solfleet
    reachable = hp.status is not HostStatus.UNREACHABLE
    report = sf.get("health") if isinstance(sf.get("health"), Mapping) else None
    checks = checks_of(report)
    current = sf.get("current") if sf else None
    error = ""
    if not reachable:
        error = hp.message or "unreachable"
    elif report is None:
        # no report at all: no current release, a health run that crashed or timed out
        error = hp.message or f"no health report ({hp.status.value})"
        checks.append({"name": "health.report", "status": "failed", "detail": error})
    ok = reachable and report is not None and report.get("ok") is True and hp.status is HostStatus.OK
    ok = ok and all(c["status"] != "failed" for c in checks)
    return NodeHealth(
        name=node.name,
        ok=ok,
        reachable=reachable,
        simulated=bool(sf.get("simulated", node.simulated)),
        current=current if isinstance(current, str) else None,
        checks=checks,
        error=error,
        journal_error=str(sf.get("health_journal_error") or ""),
    )


def fleet_health(spec: FleetSpec, nodes: list[Node], *, progress: ProgressSink | None = None) -> FleetHealth:
    run_id = "h-" + new_operation_id()[2:]
    pdd = run_dir(spec, run_id)
    write_private_data_dir(spec, pdd)
    limit = spec.timeouts.status_s
    result = runner.run_playbook(
        private_data_dir=pdd,
        playbook=HEALTH_PLAYBOOK,
        hosts=[n.name for n in nodes],
        # the module's own timeout of the health run, inside the task's; the result goes to the node
        # journal, so that status's health verdict follows this check (a deploy's preflight leaves it out)
        extravars={"solfleet_health_timeout_s": max(limit - 5, 1), "solfleet_health_journal": True},
        ident="00-health",
        timeout_s=limit * 2 + spec.timeouts.connect_s,
        task_timeout_s=limit,
        progress=progress,
    )
    prune_runs(spec, prefix="h-", keep=HEALTH_RUNS_KEPT)
    return FleetHealth(nodes=[node_health(n, result.hosts[n.name]) for n in nodes])

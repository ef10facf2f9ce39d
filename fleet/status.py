"""`solfleet status`: read every node's state back (status.yml) and compare it with what the ledger says
each node should run. Read-only on the nodes; no ledger row is written."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from fleet import runner
from fleet.errors import ExitCode
from fleet.inventory import write_private_data_dir
from fleet.ledger import Ledger, new_operation_id
from fleet.runner import HostStatus, ProgressSink
from fleet.spec import FleetSpec, Node
from fleet.workdir import ledger_path, prune_runs, run_dir

STATUS_PLAYBOOK = "status.yml"
STATUS_RUNS_KEPT = 10  # status runs change nothing; keep a few for debugging, not one per call forever


@dataclass(frozen=True)
class NodeStatus:
    name: str
    reachable: bool
    current: str | None
    previous: str | None
    releases: list[str]
    last_event: Mapping[str, Any] | None
    simulated: bool
    desired: str | None  # from the ledger: where the last deploy/rollback left (or should have left) it
    # tampered (--deep: current's files no longer match its MANIFEST) | unverified (current is not a verified
    # release on the node) | in_sync | drift | no_record (ledger knows nothing) | unknown (node unreachable
    # or no state)
    drift: str
    error: str
    current_verified: bool | None = None  # the node's answer; None when it gave none
    # --deep only: every file of current re-hashed against its MANIFEST just now; None when not checked
    current_intact: bool | None = None
    current_check: str | None = None  # what the re-hash found ("N files match ..." or the first mismatch)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def drift_of(
    current: str | None,
    desired: str | None,
    *,
    reachable: bool,
    current_verified: bool | None = None,
    current_intact: bool | None = None,
) -> str:
    if not reachable:
        return "unknown"
    if current and current_intact is False:
        # Bytes on disk differ from what was verified: the verify record no longer describes what runs.
        return "tampered"
    if current and current_verified is not True:
        # Whatever the ledger says, a current release that is not verified (never was, or failed after
        # activation) is the first thing an operator must hear. An answer without the field counts as not
        # verified: the node module always sends it.
        return "unverified"
    if desired is None:
        return "no_record"
    return "in_sync" if current == desired else "drift"


def status_exit_code(nodes: list[NodeStatus]) -> ExitCode:
    """1 when a reachable node returned no state (its status task failed: the answer is missing, not "in
    sync") or runs an unverified or (--deep) tampered current; 3 when the only problem is unreachable
    nodes; else 0. Same precedence as deploy's exit codes."""
    if any(n.reachable and (n.error or n.drift in ("unverified", "tampered")) for n in nodes):
        return ExitCode.OPERATION_FAILED
    if any(not n.reachable for n in nodes):
        return ExitCode.UNREACHABLE
    return ExitCode.OK


def fleet_status(
    spec: FleetSpec, nodes: list[Node], *, deep: bool = False, progress: ProgressSink | None = None
) -> list[NodeStatus]:
    """Every node's state; `deep` also has each node re-hash its current release (reads the whole release,
    so it is opt-in)."""
    run_id = "s-" + new_operation_id()[2:]
    pdd = run_dir(spec, run_id)
    write_private_data_dir(spec, pdd)
    result = runner.run_playbook(
        private_data_dir=pdd,
        playbook=STATUS_PLAYBOOK,
        hosts=[n.name for n in nodes],
        extravars={"solfleet_status_deep": deep},
        ident="00-status",
        timeout_s=spec.timeouts.run_s,
        progress=progress,
    )
    prune_runs(spec, prefix="s-", keep=STATUS_RUNS_KEPT)
    with Ledger(ledger_path(spec)) as ledger:
        desired = ledger.desired_versions()
    out = []
    for node in nodes:
        hp = result.hosts[node.name]
        sf = hp.solfleet
        reachable = hp.status is not HostStatus.UNREACHABLE
        ok = reachable and bool(sf)
        current = sf.get("current") if ok else None
        verified = sf.get("current_verified") if ok else None
        intact = sf.get("current_intact") if ok else None
        intact = intact if isinstance(intact, bool) else None
        out.append(
            NodeStatus(
                name=node.name,
                reachable=reachable,
                current=current,
                previous=sf.get("previous") if ok else None,
                releases=list(sf.get("releases") or []) if ok else [],
                last_event=sf.get("last_event") if ok else None,
                simulated=bool(sf.get("simulated", node.simulated)),
                desired=desired.get(node.name),
                drift=drift_of(
                    current,
                    desired.get(node.name),
                    reachable=ok,
                    current_verified=verified,
                    current_intact=intact,
                ),
                error="" if ok else (hp.message or f"no state returned ({hp.status.value})"),
                current_verified=verified if isinstance(verified, bool) else None,
                current_intact=intact,
                current_check=sf.get("current_check") if ok else None,
            )
        )
    return out

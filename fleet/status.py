"""`solfleet status`: read every node's state back (status.yml) and compare it with what the ledger says
each node should run. Read-only on the nodes; no ledger row is written."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from fleet import runner
from fleet.errors import ExitCode
from fleet.inventory import write_private_data_dir
from fleet.ledger import Ledger, new_operation_id
from fleet.runner import HostStatus, ProgressSink
from fleet.spec import FleetSpec, Node, embedded_fleet, resolve_work_dir
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
    # tampered (--deep: current's files no longer match its MANIFEST) | suspect (a re-check of current failed
    # during a deploy, remembered on the node until a good deploy or rollback replaces it) | other_bytes
    # (current came from another artifact than the ledger's for that version) | unverified (current is not
    # a verified release on the node) | health_failed (the last health check after the last move failed:
    # the node stays on that release, or it runs none because its first release failed) | unconfirmed (the
    # journal's last switch has no confirmation, or its health never ran) | in_sync | drift | no_record
    # (ledger knows nothing) | unknown (no answer)
    drift: str
    error: str
    current_verified: bool | None = None  # the node's answer; None when it gave none
    # --deep only: every file of current re-hashed against its MANIFEST just now; None when not checked
    current_intact: bool | None = None
    current_check: str | None = None  # what the re-hash found ("N files match ..." or the first mismatch)
    current_sha: str | None = None  # sha256 of the artifact current came from (node's record)
    expected_sha: str | None = None  # the ledger's sha256 for that version
    suspect: str | None = None  # why current is suspect (a failed re-check)
    lease: Mapping[str, Any] | None = None  # the rollout lease the node holds now, if any
    stack_id: str | None = None  # the stack current was built for (its MANIFEST); None when no answer
    runtimes: list[str] | None = None  # stack ids of the runtimes provisioned on the node
    spec_stack_id: str | None = None  # the spec's stack id, for comparison (informational: nodes check pins)
    # "op dtype" that current runs only on a fallback kernel on this node (its verify record's coverage:
    # e.g. bf16 gemm off cc 9.0); None when unknown (no answer, or a release verified before coverage)
    fallback_only: list[str] | None = None
    # why the node is health_failed or unconfirmed, from its journal, with what finishes it; None otherwise
    detail: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


SUSPECT_STATES = ("tampered", "suspect", "other_bytes", "unverified", "health_failed", "unconfirmed")


def drift_of(
    current: str | None,
    desired: str | None,
    *,
    reachable: bool,
    current_verified: bool | None = None,
    current_intact: bool | None = None,
    suspect: str | None = None,
    sha_matches: bool | None = None,
    unconfirmed: bool = False,
    health_failed: bool = False,
) -> str:
    if not reachable:
        return "unknown"
    if current and current_intact is False:
        # Bytes on disk differ from what was verified: the verify record no longer describes what runs.
        return "tampered"
    if current and suspect:
        return "suspect"
    if current and sha_matches is False:
        return "other_bytes"
    if current and current_verified is not True:
        # Whatever the ledger says, a current release that is not verified (never was, or failed after
        # activation) is the first thing an operator must hear. An answer without the field counts as not
        # verified: the node module always sends it.
        return "unverified"
    if health_failed:
        return "health_failed"
    if unconfirmed:
        return "unconfirmed"
    if desired is None:
        return "no_record"
    return "in_sync" if current == desired else "drift"


def status_exit_code(nodes: list[NodeStatus], *, unfinished: bool = False, paused: bool = False) -> ExitCode:
    """0 only when every node answered, is on the ledger's desired release, verified, intact and confirmed,
    and no rollout is unfinished or paused. Otherwise the most severe of: 1 a reachable node returned no
    state; 7 suspect (unverified, tampered, failed re-check, other bytes, health failed after the last move,
    unconfirmed move); 6 drift (a node not on its desired release, a node running a release this ledger
    never put there, or an unfinished rollout); 10 paused (a rollout stopped after its canary, waiting for
    promote or abort: the split it leaves is expected); 8 split (every node where the ledger wants it, but
    not all on one release); 3 unreachable. A node with no release and no record (never deployed) is not a
    fault."""
    if any(n.reachable and n.error for n in nodes):
        return ExitCode.OPERATION_FAILED
    if any(n.reachable and n.drift in SUSPECT_STATES for n in nodes):
        return ExitCode.SUSPECT
    unknown_release = any(n.reachable and n.drift == "no_record" and n.current for n in nodes)
    if unfinished or unknown_release or any(n.reachable and n.drift == "drift" for n in nodes):
        return ExitCode.DRIFT
    if paused:
        return ExitCode.PAUSED
    if len({n.current for n in nodes if n.reachable}) > 1:
        return ExitCode.SPLIT
    if any(not n.reachable for n in nodes):
        return ExitCode.UNREACHABLE
    return ExitCode.OK


@dataclass(frozen=True)
class FleetStatus:
    nodes: list[NodeStatus]
    unfinished: list[str]  # operations owed a return to their baseline (`solfleet reconcile`)
    paused: list[str] = field(default_factory=list)  # rollouts stopped after their canary (promote / abort)
    # this ledger's rollouts whose controller process runs now: nodes may be between batches (informational)
    running: list[str] = field(default_factory=list)
    # this ledger's rollouts whose node leases its next deploy, rollback or reconcile takes over
    # (Ledger.own_stale_rollouts): a lease of any other rollout refuses it (exit 5) until it expires
    takeover: frozenset[str] = frozenset()

    @property
    def exit_code(self) -> ExitCode:
        return status_exit_code(self.nodes, unfinished=bool(self.unfinished), paused=bool(self.paused))


def fleet_status(
    spec: FleetSpec, nodes: list[Node], *, deep: bool = False, progress: ProgressSink | None = None
) -> FleetStatus:
    """Every node's state; `deep` also has each node re-hash its current release (reads the whole release,
    so it is opt-in). Bounded by `timeouts.status_s` per task, so one hung node cannot hold the answer."""
    run_id = "s-" + new_operation_id()[2:]
    pdd = run_dir(spec, run_id)
    write_private_data_dir(spec, pdd)
    limit = spec.timeouts.status_s
    result = runner.run_playbook(
        private_data_dir=pdd,
        playbook=STATUS_PLAYBOOK,
        hosts=[n.name for n in nodes],
        extravars={"solfleet_status_deep": deep},
        ident="00-status",
        # --deep reads every file of a release: give it the deploy's task limit, not the short one
        timeout_s=spec.timeouts.run_s if deep else limit * 2 + spec.timeouts.connect_s,
        task_timeout_s=None if deep else limit,
        progress=progress,
    )
    prune_runs(spec, prefix="s-", keep=STATUS_RUNS_KEPT)
    with Ledger(ledger_path(spec)) as ledger:
        desired = ledger.desired_versions()
        shas = ledger.artifact_shas()
        unfinished = [op.id for op in ledger.unfinished()]
        paused = [op.id for op in ledger.paused()]
        running = [op.id for op in ledger.running()]
        takeover = frozenset(ledger.own_stale_rollouts())
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
        current_sha = sf.get("current_sha") if ok else None
        expected = shas.get(current) if current else None
        sha_matches = None if not (current_sha and expected) else current_sha == expected
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
                    suspect=sf.get("current_suspect") if ok else None,
                    sha_matches=sha_matches,
                    unconfirmed=bool(ok and (sf.get("unconfirmed") or sf.get("health_pending"))),
                    health_failed=bool(ok and (_line(sf, "health_failed") or _line(sf, "deactivated"))),
                ),
                error="" if ok else (hp.message or f"no state returned ({hp.status.value})"),
                current_verified=verified if isinstance(verified, bool) else None,
                current_intact=intact,
                current_check=sf.get("current_check") if ok else None,
                current_sha=current_sha,
                expected_sha=expected,
                suspect=sf.get("current_suspect") if ok else None,
                lease=sf.get("lease") if ok else None,
                stack_id=sf.get("current_stack_id") if ok else None,
                runtimes=list(sf.get("runtimes") or []) if ok else None,
                spec_stack_id=spec.stack_id,
                fallback_only=_str_list(sf.get("current_fallback_only")) if ok else None,
                # a command is offered only for a verified current (the node refuses it otherwise)
                detail=_move_detail(sf, current if verified is True else None, _cmd(spec), node.name)
                if ok
                else None,
            )
        )
    return FleetStatus(nodes=out, unfinished=unfinished, paused=paused, running=running, takeover=takeover)


def _line(sf: Mapping[str, Any], key: str) -> Mapping[str, Any] | None:
    """A journal line the node's state carries under `key` (move_state), or None."""
    value = sf.get(key)
    return value if isinstance(value, Mapping) else None


def _cmd(spec: FleetSpec) -> str:
    """`solfleet` with the flags that name this spec and work dir where they are not the defaults, so a
    command printed for the operator acts on this fleet."""
    parts = ["solfleet"]
    if spec.source.resolve() != embedded_fleet().resolve():
        parts += ["--fleet", shlex.quote(str(spec.source))]
    if spec.work_dir.resolve() != resolve_work_dir(None).resolve():
        parts += ["--work-dir", shlex.quote(str(spec.work_dir))]
    return " ".join(parts)


def _move_detail(sf: Mapping[str, Any], current: str | None, cmd: str, node: str) -> str | None:
    """What the node's journal says is unfinished or failed about its last move, and what finishes it (a
    command for this node alone: `rollback` without `--limit` selects every node). `current`: None when
    the node has no verified current release (no command is offered then)."""
    fix = f"`{cmd} rollback --to {current} --limit {node}`" if current else ""
    if (line := _line(sf, "deactivated")) is not None:
        when = line.get("time", "?")
        return f"{line.get('detail') or 'current removed'} ({when}); a deploy that passes fixes it"
    if (line := _line(sf, "health_failed")) is not None:
        why = line.get("detail") or "health failed"
        # `solfleet health` journals its result too (fleet/health.py): a pass on current clears this, but
        # only where the journal's last move is to current (else it journals nothing: the rollback does)
        health = f" or `{cmd} health --limit {node}`" if sf.get("moved_to") == current else ""
        again = f"; {fix}{health} checks it again" if fix else ""
        return f"{line.get('version', '?')}: {why} ({line.get('time', '?')}){again}"
    if sf.get("unconfirmed"):
        intent = _line(sf, "intent") or {}
        then = f"{fix} confirms it and runs health" if fix else "a deploy that passes ends it"
        return (
            f"a switch was journaled and never confirmed ({intent.get('detail') or 'no detail'},"
            f" {intent.get('time', '?')}); current is {sf.get('current') or 'none'}: {then}"
        )
    if sf.get("health_pending") and fix:
        moved_to = sf.get("moved_to")
        if moved_to and moved_to != current:  # the confirmation of the move to current was lost (a full disk)
            return (
                f"the journal's last move names {moved_to}, not current {current}, and health never ran"
                f" after it: {fix} confirms {current} and runs health"
            )
        again = f"`{cmd} health --limit {node}`"  # it journals a pass on current (fleet/health.py)
        return f"health never ran after the last move to {current}: {fix} or {again} runs it"
    return None


def _str_list(value: Any) -> list[str] | None:
    return [str(v) for v in value] if isinstance(value, list) else None

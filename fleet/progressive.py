"""Progressive steps: a deploy that stops after its canary has passed (`rollout.pause_after_canary`), and the
two ways on from there, from any later controller process, since the state lives in the ledger:

- `promote`: check that every node is still where the pause left it (the canary on the new version, the rest
  on their baseline), then run the remaining batches of the stored plan with the stored node variables and
  gates, under the same failure policy, exactly as the pausing process would have.
- `abort`: apply the rollout's `on_failure` as if its next batch had failed (the canary goes back to its
  baseline under rollback_fleet / rollback_batch; halt leaves it), and record it as `aborted`.

Both continue the paused operation under its own id (one ledger row, one run dir, one rollout id in the
node journals and leases). The lease rule (docs/cli.md, "Progressive rollouts"): the pause renews every
node's lease, marked paused, for another lease period, so a second controller is refused (exit 5) naming
the paused rollout; a deploy or rollback from this work dir is refused by the ledger (exit 2). Promote and
abort renew the leases first; when they had expired and another rollout took a node, they refuse (exit 5),
and a node moved meanwhile makes promote refuse (exit 2): nothing is changed and the rollout stays paused.
At their end they drop the leases, or keep them marked unfinished while the rollout still owes its hosts a
return to the baseline (fleet/recovery.py conclude_leases).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fleet import artifact
from fleet.errors import ExitCode, Interrupted, UsageError
from fleet.ledger import Baseline, HostRecord, Ledger, OpStatus
from fleet.operation import (
    FAILED_OUTCOMES,
    Operation,
    OperationReport,
    ProgressFactory,
    StepAborted,
    StillPaused,
)
from fleet.plan import Plan
from fleet.policy import Gates
from fleet.recovery import (
    LeaseHeld,
    LeaseState,
    conclude_leases,
    describe_where,
    keep_leases,
    read_states,
    restore,
    take_baseline,
)
from fleet.rollout import conclude_deploy, run_batches, undo_targets
from fleet.spec import FleetSpec
from fleet.workdir import ledger_path


@dataclass(frozen=True)
class PausedRollout:
    """A paused deploy as the ledger holds it: its plan, baseline, where the pause left each host, and what
    its remaining batches need (node variables, gates)."""

    id: str
    plan: Plan
    baseline: Mapping[str, Baseline]
    at_pause: Mapping[str, str | None]  # canary host -> the current its canary step left it on
    extravars: Mapping[str, Any]
    gates: Gates
    earlier: tuple[HostRecord, ...]  # the canary's failed hosts (within max_failures), for the final message

    @property
    def canary(self) -> tuple[str, ...]:
        return self.plan.batches[0].hosts


def find_paused(spec: FleetSpec, op_id: str | None, *, command: str) -> PausedRollout:
    """The paused rollout `op_id` (default: the only one) of this fleet's ledger; a one-line UsageError
    (exit 2) when there is none, it is unknown or it is not paused. Reads only."""
    path = ledger_path(spec)
    if not path.exists():
        raise UsageError(f"{command}: fleet {spec.name} has no ledger yet, so no paused rollout")
    with Ledger(path) as ledger:
        paused = ledger.paused()
        ids = ", ".join(op.id for op in paused) or "none"
        if op_id is None:
            if not paused:
                raise UsageError(
                    f"{command}: fleet {spec.name} has no paused rollout; `solfleet history` lists its"
                    " rollouts"
                )
            if len(paused) > 1:
                raise UsageError(f"{command}: {len(paused)} rollouts are paused ({ids}); name one")
            op_id = paused[0].id
        row = ledger.operation(op_id)
        if row is None:
            raise UsageError(
                f"{command}: {op_id!r} is not a rollout of fleet {spec.name}; paused rollouts: {ids}"
            )
        if row.status != OpStatus.PAUSED.value:
            raise UsageError(
                f"{command}: {op_id} is {row.status}, not paused; only a paused rollout can be promoted or"
                f" aborted (paused rollouts: {ids})"
            )
        data = ledger.resume_data(op_id)
        plan = Plan.from_json(row.plan)
        records = ledger.host_outcomes(op_id)
        baseline = ledger.baseline(op_id)
    if not data:
        raise UsageError(f"{command}: {op_id} holds no resume record; abort it or roll back by hand")
    canary = plan.batches[0]
    at_pause: dict[str, str | None] = {}
    for r in records:
        if r.step == canary.name and r.host in canary.hosts:
            base = baseline.get(r.host)
            at_pause[r.host] = r.version_after or (base.current if base else None)
    missing = [h for h in plan.hosts if h not in {n.name for n in spec.nodes}]
    if missing:
        raise UsageError(
            f"{command}: {op_id} targets {', '.join(missing)}, which the fleet spec no longer names; restore"
            " the spec's nodes first"
        )
    gates = data.get("gates") or {}
    return PausedRollout(
        id=op_id,
        plan=plan,
        baseline=baseline,
        at_pause=at_pause,
        extravars=dict(data.get("extravars") or {}),
        gates=Gates(
            correctness=str(gates.get("correctness", "required")),
            min_sol=dict(gates.get("min_sol") or {}),
            max_regression_vs_previous=gates.get("max_regression_vs_previous"),
        ),
        earlier=tuple(r for r in records if r.outcome in FAILED_OUTCOMES | {"unreachable", "quarantined"}),
    )


def misplaced(
    paused: PausedRollout, now: Mapping[str, Baseline], *, unreachable_ok: bool = False
) -> list[str]:
    """Hosts not where the pause left them, one line each: a canary host not on the release its canary step
    left it on, any other host not on its baseline (current and previous). An unreachable host is one too,
    unless `unreachable_ok` (rollout.unreachable: skip) and it is not a canary host. Pure."""
    out = []
    for host in paused.plan.hosts:
        state, base = now.get(host), paused.baseline.get(host)
        if state is None or not state.reachable:
            if not (unreachable_ok and host not in paused.canary):
                out.append(f"{host}: no answer, so it cannot be confirmed where the pause left it")
            continue
        if host in paused.canary:
            want = paused.at_pause.get(host)
            if state.current != want:
                out.append(
                    f"{host}: current is {state.current or 'none'}, the pause left it on {want or 'none'}"
                )
            continue
        if base is None or not base.reachable:
            continue  # no baseline to compare with (it did not answer before the rollout)
        if (state.current, state.previous) != (base.current, base.previous):
            out.append(
                f"{host}: current {state.current or 'none'}, previous {state.previous or 'none'}; its"
                f" baseline is current {base.current or 'none'}, previous {base.previous or 'none'}"
            )
    return out


def _before_any_move(op: Operation, ledger: Ledger, command: str, *, lease: bool) -> dict[str, Baseline]:
    """Read every node (`lease`: and renew the paused rollout's leases under this process, in the same
    node-side step). Whatever stops it leaves the rollout paused, its leases as they were."""
    hosts = list(op.plan.hosts)
    try:
        if lease:
            return take_baseline(op, ledger, hosts, take_over=[], record=False, drop_on_refusal=False)
        return {
            h: Baseline(h, s.reachable, s.current, s.current_sha, s.previous)
            for h, s in read_states(op, ledger, hosts).items()
        }
    except Interrupted as exc:
        raise StillPaused(
            f"{command} {op.op_id} interrupted before anything moved; it is still paused ({exc})",
            exit_code=ExitCode.INTERRUPTED,
        ) from None
    except LeaseHeld as exc:
        # the leases this call renewed (take_baseline marks them running) go back to paused
        keep_leases(op, ledger, hosts, LeaseState.PAUSED)
        raise StillPaused(
            f"{command} {op.op_id} refused, it stays paused: {exc}", exit_code=ExitCode.LOCKED
        ) from None
    except StepAborted as exc:
        raise StillPaused(
            f"{command} {op.op_id} could not read the nodes, it stays paused: {exc}",
            exit_code=ExitCode.RUNNER,
        ) from None


def check_artifact_file(paused: PausedRollout) -> None:
    """The remaining batches push the same bytes: the artifact must still be there, unchanged."""
    path = Path(str(paused.extravars.get("solfleet_artifact", "")))
    want = str(paused.extravars.get("solfleet_artifact_sha256", ""))
    if not path.is_file():
        raise UsageError(f"promote: {path}: the artifact of {paused.id} is gone; nothing was changed")
    if artifact.sha256_file(path) != want:
        raise UsageError(
            f"promote: {path} is no longer the artifact {want[:12]}.. that {paused.id} deployed; nothing was"
            " changed"
        )


def promote(
    spec: FleetSpec, paused: PausedRollout, *, progress: ProgressFactory | None = None
) -> OperationReport:
    """Continue `paused` with its remaining batches, judged by the gates it started with."""
    check_artifact_file(paused)
    spec = replace(spec, gates=paused.gates)
    plan = paused.plan
    op = Operation(spec, plan, progress=progress, resume_id=paused.id)

    def body(ledger: Ledger) -> None:
        hosts = list(plan.hosts)
        # first a plain read, so that a refusal changes nothing at all (not even a lease); then the same
        # check again under the renewed leases, in case a node moved in between
        for lease in (False, True):
            now = _before_any_move(op, ledger, "promote", lease=lease)
            bad = misplaced(paused, now, unreachable_ok=plan.unreachable == "skip")
            if bad:
                if lease:  # this pass renewed the leases as this process's: they go back to paused
                    keep_leases(op, ledger, hosts, LeaseState.PAUSED)
                more = f"; and {len(bad) - 1} more" if len(bad) > 1 else ""
                raise StillPaused(f"promote {paused.id} refused, nothing was changed: {bad[0]}{more}")
        # a host that did not answer the rollout's first lease call has no baseline to return to: it is
        # never deployed by this rollout, whether or not it answers the promote's (fleet/rollout.py preflight)
        for host in hosts:
            if host not in paused.baseline or not paused.baseline[host].reachable:
                why = f"did not answer {paused.id}'s first lease call"
                op.unleased.setdefault(host, ("unreachable", why))
        try:
            run = run_batches(op, ledger, plan, paused.extravars, start=1)
            conclude_deploy(
                op,
                ledger,
                plan,
                paused.baseline,
                run.failure,
                [*paused.earlier, *run.failed],
                done=paused.canary,
            )
        finally:
            conclude_leases(op, ledger, hosts)  # kept, marked unfinished, while it owes a return

    return op.execute(body)


def abort(
    spec: FleetSpec, paused: PausedRollout, *, progress: ProgressFactory | None = None
) -> OperationReport:
    """Apply `paused`'s on_failure, as if its next batch had failed, and record the rollout as aborted."""
    plan = paused.plan
    op = Operation(spec, plan, progress=progress, resume_id=paused.id)

    def body(ledger: Ledger) -> None:
        hosts = list(plan.hosts)
        _before_any_move(op, ledger, "abort", lease=True)
        report = op.report
        policy = plan.on_failure
        try:
            targets = undo_targets(policy, hosts, plan.batches[0])
            if not targets:
                ledger.mark_recovered(op.op_id, by=op.op_id)  # halt: nothing is owed
                report.status, report.exit_code = OpStatus.ABORTED, ExitCode.OK
                report.message = f"aborted after the canary; on_failure={policy}: hosts left where they are"
                return
            result = restore(op, ledger, paused.baseline, targets)
            if result.final:
                ledger.mark_recovered(op.op_id, by=op.op_id)
        finally:
            conclude_leases(op, ledger, hosts)  # kept, marked unfinished, while it owes a return
        report.status = OpStatus.ABORTED
        report.exit_code = ExitCode.OK if result.ok or result.final else ExitCode.OPERATION_FAILED
        if result.ok:
            done = f"returned {len(result.moved)} host(s) to the baseline"
        elif result.final:
            done = (
                f"returned {len(result.moved)} host(s) to the baseline; the others had no release before it"
            )
        else:
            done = "could not return every host to the baseline (run `solfleet reconcile`)"
        report.message = (
            f"aborted after the canary; on_failure={policy}: {done}; now: {describe_where(result.where)}"
        )

    return op.execute(body)

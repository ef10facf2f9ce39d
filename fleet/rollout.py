"""Deploy, rollback and reconcile: run the plan batch by batch through the runner, record every host outcome
in the ledger, and apply the failure policy. Prints nothing: the CLI renders the returned report.

Failure policy (docs/cli.md): before anything moves, every targeted node is leased and its baseline recorded
(fleet/recovery.py). Batches run in order; the first batch must get at least one host through verify and
activation (the canary is never skipped, whatever `unreachable` says), and a batch whose failures exceed
its `max_failures` stops scheduling. `rollback_fleet` then returns every targeted host to the baseline,
`rollback_batch` only the failing batch's hosts, `halt` none. An interrupted deploy (Ctrl-C, SIGTERM,
SIGHUP) applies the same policy before it exits 130; a deploy that died without it (SIGKILL, a lost
machine) is returned to its baseline by the next deploy, rollback or `solfleet reconcile`. A batch that
ansible-runner stops (job timeout) is recorded host by host and counts as failed, so the policy runs before
the exit 4; one still running at `rollout.batch_deadline_s` (its job timeout then) is failed the same way,
exit 1. A plan that `pauses` stops after its passing canary with the leases kept (fleet/progressive.py
continues or aborts it). A deploy that ends still owing a return to its baseline (its undo interrupted, or
unable to reach every host) keeps its leases too, marked unfinished, until `reconcile` returns its hosts."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from fleet import gating
from fleet.errors import ExitCode, Interrupted, RunnerError, UsageError
from fleet.health import HEALTH_PLAYBOOK, node_health
from fleet.ledger import Baseline, HostRecord, Ledger, OpStatus
from fleet.operation import (
    DEPLOY_PLAYBOOK,
    ROLLBACK_PLAYBOOK,
    Operation,
    OperationReport,
    ProgressFactory,
    StepAborted,
    StepResult,
    _interrupted_record,
)
from fleet.plan import Batch, Plan
from fleet.policy import UnhealthyPolicy, UnreachablePolicy
from fleet.recovery import (
    LeaseHeld,
    LeaseState,
    conclude_leases,
    conclude_recovery,
    conclude_rollback_leases,
    describe_where,
    end_leases,
    lease_seconds,
    recover,
    renew_leases,
    restore,
    take_baseline,
)
from fleet.runner import HostProgress, HostStatus
from fleet.spec import FleetSpec
from fleet.workdir import ledger_path

# what a first-batch host must reach for the canary to count as passed
CANARY_PASSED = {"deploy": ("activated", "already_current"), "stage": ("staged",)}


def _counted_failures(step: StepResult, policy: UnreachablePolicy) -> list[HostRecord]:
    failed = step.failures
    if policy is UnreachablePolicy.FAIL:
        failed = failed + step.unreachable
    return failed


@dataclass(frozen=True)
class BatchFailure:
    """Why scheduling stopped: `failed` are the batch's counted failures; `runner_error` is set when
    ansible-runner stopped the batch before its end; `reason` when a rule rather than a count failed it."""

    batch: Batch
    failed: list[HostRecord]
    runner_error: str = ""
    reason: str = ""
    interrupted: bool = False


@dataclass(frozen=True)
class ArtifactInfo:
    path: Path
    sha256: str
    git_commit: str | None = None
    dirty: bool = False


def check_artifact(ledger: Ledger, version: str, sha256: str) -> None:
    """One version string is one artifact, fleet-wide: refuse other bytes under a known version."""
    known = ledger.artifact_sha(version)
    if known is not None and known != sha256:
        raise UsageError(
            f"version {version} was deployed as artifact {known[:12]}.., this artifact is {sha256[:12]}..:"
            " a version is immutable, build a new version"
        )


def deploy(
    spec: FleetSpec,
    plan: Plan,
    *,
    artifact: ArtifactInfo,
    progress: ProgressFactory | None = None,
    verify_ops: str = "",
) -> OperationReport:
    op = Operation(spec, plan, progress=progress)
    version = plan.version or ""
    extravars = {
        "solfleet_version": plan.version,
        "solfleet_artifact": str(artifact.path.resolve()),
        "solfleet_artifact_sha256": artifact.sha256,
        "solfleet_rollout_id": op.op_id,
        "solfleet_keep_releases": plan.keep_releases,
        "solfleet_activate": plan.kind != "stage",
        "solfleet_verify_timeout_s": spec.timeouts.verify_s,
        "solfleet_verify_ops": verify_ops,
        **gating.deploy_extravars(spec.gates),
    }

    def body(ledger: Ledger) -> None:
        hosts = list(plan.hosts)
        # the first batch's preflight health runs in its hosts' lease calls: one playbook run fewer
        first = plan.batches[0].hosts if plan.batches and spec.rollout.preflight_health else ()
        try:
            baseline = take_baseline(
                op, ledger, hosts, version=version, artifact_sha256=artifact.sha256, health_hosts=first
            )
        except Interrupted:
            end_leases(op, ledger, hosts)  # nothing moved yet: leave no lease behind
            raise
        ledger.record_artifact(
            version=version,
            sha256=artifact.sha256,
            git_commit=artifact.git_commit,
            dirty=artifact.dirty,
            op_id=op.op_id,
        )
        if plan.pauses:
            ledger.record_resume(op.op_id, resume_record(op.spec, extravars))
        run = BatchRun(None, [], paused=False)
        try:
            run = run_batches(op, ledger, plan, extravars)
            if run.paused:
                conclude_pause(op, plan)
            else:
                conclude_deploy(op, ledger, plan, baseline, run.failure, run.failed)
        finally:
            # a paused rollout keeps its (renewed) leases: docs/cli.md "Progressive"; an unfinished one keeps
            # them too, marked so, until `reconcile` returns its hosts (conclude_leases)
            if not run.paused:
                conclude_leases(op, ledger, hosts)

    def precheck(ledger: Ledger) -> None:
        refuse_if_paused(ledger)
        check_artifact(ledger, version, artifact.sha256)

    return op.execute(body, precheck=precheck)


def refuse_if_paused(ledger: Ledger) -> None:
    """While a rollout of this ledger is paused, no other deploy or rollback starts from it: one line naming
    the paused rollout and the two ways out (exit 2, nothing touched)."""
    for op in ledger.paused():
        raise UsageError(
            f"rollout {op.id} ({op.kind} {op.version or ''}) is paused after its canary: run `solfleet "
            f"promote {op.id}` to continue it or `solfleet abort {op.id}` to apply its on_failure; "
            "nothing was changed"
        )


def resume_record(spec: FleetSpec, extravars: Mapping[str, object]) -> dict[str, object]:
    """What a promote from another process needs to continue this rollout unchanged: the node variables of
    every batch (artifact, verify ops, gates' bench) and the gates its batches are judged by."""
    return {"extravars": dict(extravars), "gates": asdict(spec.gates)}


@dataclass(frozen=True)
class BatchRun:
    """How the batches ended: `failure` when one stopped scheduling; `failed` every failed host of every
    batch run; `paused` when the plan stops after its passing canary."""

    failure: BatchFailure | None
    failed: list[HostRecord]
    paused: bool = False


def preflight(op: Operation, ledger: Ledger, batch: Batch) -> tuple[list[str], list[HostRecord]]:
    """GPU health of a batch's hosts before anything is pushed to them: the checks of `solfleet health`
    (health.yml) in each node's current release. Returns the hosts to deploy and the records of those left
    out: `unhealthy` (rollout.unhealthy: fail, a failure of the batch) or `quarantined` (skip: excluded,
    reported, never counted deployed). A node with no release yet has nothing to check here (its health
    runs after activation); an unreachable one is left to the deploy step, which meets the unreachable
    policy."""
    # A host whose lease call failed (no answer, or the node's own failure) holds no lease of this rollout
    # and has no baseline to return to: it is never deployed by it (it may answer now, mid-rollout). No
    # answer counts as unreachable (rollout.unreachable decides), a failure as a failed host.
    unleased = [
        HostRecord(
            step=batch.name,
            host=host,
            outcome=op.unleased[host][0],
            changed=False,
            version_before=None,
            version_after=None,
            failed_phase="lease",
            message=f"{op.unleased[host][1]}: not deployed (no lease, no baseline)",
            phases={},
        )
        for host in batch.hosts
        if host in op.unleased
    ]
    if unleased:
        ledger.record_hosts(op.op_id, unleased)
    hosts = [h for h in batch.hosts if h not in op.unleased]
    if not op.spec.rollout.preflight_health or not hosts:
        return hosts, unleased
    answers: Mapping[str, HostProgress | None]
    if all(h in op.lease_health for h in hosts):
        # the first batch: its hosts ran the checks in their lease call, moments ago (take_baseline)
        answers = {h: _lease_answer(h, op.lease_health[h]) for h in hosts}
    else:
        # the deploy's own health limit (the role's solfleet_health_timeout_s), not status_s: a slow but
        # healthy node (a cold numba cache, many GPUs) must not read as unhealthy
        step = op.run_step(ledger, f"{batch.name} preflight", hosts, HEALTH_PLAYBOOK, {}, record=False)
        answers = step.ok_hosts
    nodes = {n.name: n for n in op.spec.nodes}
    outcome = "quarantined" if op.spec.rollout.unhealthy is UnhealthyPolicy.SKIP else "unhealthy"
    keep, left_out = [], []
    for host in hosts:
        hp = answers.get(host)
        if hp is None:
            keep.append(host)
            continue
        health = node_health(nodes[host], hp)
        if health.ok or not health.reachable or health.current is None:
            keep.append(host)
            continue
        bad = [f"{c['name']}: {c['detail']}" for c in health.checks if c["status"] == "failed"]
        left_out.append(
            HostRecord(
                step=batch.name,
                host=host,
                outcome=outcome,
                changed=False,
                version_before=health.current,
                version_after=None,  # nothing moved: the ledger keeps wanting what it wanted before
                failed_phase="preflight_health",
                message=f"preflight health failed on {health.current}: " + "; ".join(bad or [health.error]),
                phases={},
                simulated=health.simulated,
            )
        )
    if left_out:
        ledger.record_hosts(op.op_id, left_out)
    return keep, unleased + left_out


def _lease_answer(host: str, hp: HostProgress | None) -> HostProgress | None:
    """A lease call's health answer as a health run's: a check that could not run (`health_error`) is the
    failed run health.yml's module would have made, naming why."""
    if hp is None or not hp.solfleet.get("health_error"):
        return hp
    why = f"solfleet: {host}: health: {hp.solfleet['health_error']}"
    return replace(hp, status=HostStatus.FAILED, message=why)


def run_batches(
    op: Operation, ledger: Ledger, plan: Plan, extravars: Mapping[str, object], *, start: int = 0
) -> BatchRun:
    """Run `plan.batches[start:]` in order (a promote starts after the canary). The canary rule holds for
    the plan's first batch, whoever runs it; a plan that `pauses` stops after that batch has passed."""
    all_failed: list[HostRecord] = []
    for index, batch in list(enumerate(plan.batches))[start:]:
        runner_error, deadline = "", None
        try:
            hosts, left_out = preflight(op, ledger, batch)
        except Interrupted as exc:
            return BatchRun(
                BatchFailure(batch=batch, failed=[], reason=str(exc), interrupted=True), all_failed
            )
        except RunnerError as exc:  # StepAborted included: the preflight never finished; nothing pushed
            why = f"preflight health did not finish: {exc}"
            return BatchRun(BatchFailure(batch=batch, failed=[], runner_error=why), all_failed)
        unhealthy = [r for r in left_out if r.outcome == "unhealthy"]
        all_failed += left_out
        if len(unhealthy) > batch.max_failures:
            # more sick nodes than the batch may lose: stop before anything is pushed to any of them
            op.report.steps.append(
                StepResult(step=batch.name, hosts=batch.hosts, records=tuple(left_out), seconds=0.0)
            )
            why = f"{batch.name}: preflight health failed on {len(unhealthy)} host(s), more than max_failures"
            return BatchRun(
                BatchFailure(batch=batch, failed=unhealthy, reason=f"{why} {batch.max_failures}"), all_failed
            )
        try:
            if hosts:
                step = op.run_step(
                    ledger, batch.name, hosts, DEPLOY_PLAYBOOK, extravars, deadline_s=plan.batch_deadline_s
                )
            else:  # every host of the batch was left out
                step = StepResult(step=batch.name, hosts=(), records=(), seconds=0.0)
                op.report.steps.append(step)
        except StepAborted as exc:  # a stopped batch is a failed one: the failure policy still runs
            step, runner_error, deadline = exc.step, str(exc), exc.deadline
        except Interrupted as exc:
            # each host as the interrupted run left it: its module's answer, or `interrupted` (mid-step: its
            # node module runs on under the node's lock and may still activate, so its undo waits for it)
            cut = [_interrupted_record(batch.name, exc.progress.get(h), h) for h in hosts]
            return BatchRun(
                BatchFailure(batch=batch, failed=cut, reason=str(exc), interrupted=True), all_failed
            )
        if left_out:
            # one step per batch in the report: the hosts it deployed and those its preflight left out
            merged = StepResult(
                step=batch.name,
                hosts=batch.hosts,
                records=step.records + tuple(left_out),
                seconds=step.seconds,
                ok_hosts=step.ok_hosts,
            )
            if op.report.steps and op.report.steps[-1] is step:
                op.report.steps[-1] = merged
            step = merged
        # performance gates: a host that verified but misses min_sol or regressed against its own previous
        # release becomes a failure of this batch (simulated nodes: not_evaluated, never passed)
        step, judged, changed = gating.judge_step(
            step, gates=op.spec.gates, simulated={n.name: n.simulated for n in op.spec.nodes}
        )
        if changed:
            ledger.record_hosts(op.op_id, changed)
        if judged:
            gating.record(ledger.path, op.op_id, judged)
        counted = _counted_failures(step, op.spec.rollout.unreachable)
        all_failed += [r for r in step.failures + step.unreachable if r not in left_out]
        if deadline is not None:
            # the batch did not finish in time: a failed batch whatever max_failures says (its cut-off hosts
            # are `not_finished`, "batch deadline N s passed"), and the failure policy applies
            why = f"{batch.name}: batch deadline {deadline} s passed"
            return BatchRun(BatchFailure(batch=batch, failed=counted, reason=why), all_failed)
        if runner_error or len(counted) > batch.max_failures:
            return BatchRun(BatchFailure(batch=batch, failed=counted, runner_error=runner_error), all_failed)
        passed = CANARY_PASSED.get(plan.kind, ("activated",))
        if index == 0 and not any(r.outcome in passed for r in step.records):
            # The first batch proves the release before it goes wider. With `unreachable: skip` an
            # unreachable canary is not a counted failure, but it proved nothing either.
            why = "; ".join(f"{r.host}: {r.outcome}" for r in step.records)
            return BatchRun(
                BatchFailure(
                    batch=batch,
                    failed=step.failures + step.unreachable,
                    reason=f"{batch.name}: no host completed verify and activation ({why})",
                ),
                all_failed,
            )
        if index == 0 and plan.pauses:
            try:
                # the leases stay with this rollout, marked paused, for another lease period from now
                renew_leases(op, ledger, list(plan.hosts), state=LeaseState.PAUSED)
            except Interrupted as exc:
                return BatchRun(
                    BatchFailure(batch=batch, failed=[], reason=str(exc), interrupted=True), all_failed
                )
            return BatchRun(None, all_failed, paused=True)
    return BatchRun(None, all_failed)


def conclude_pause(op: Operation, plan: Plan) -> None:
    report = op.report
    canary, rest = plan.batches[0], plan.batches[1:]
    expires = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + lease_seconds(op)))
    report.status, report.exit_code = OpStatus.PAUSED, ExitCode.PAUSED
    more = sum(len(b.hosts) for b in rest)
    report.message = (
        f"paused after the canary ({', '.join(canary.hosts)} on {plan.version}); `solfleet promote"
        f" {op.op_id}` continues with {', '.join(b.name for b in rest)} ({more} host(s)),"
        f" `solfleet abort {op.op_id}` applies on_failure={plan.on_failure}; the nodes stay leased to"
        f" {op.op_id} until {expires}"
    )


def _describe(records: list[HostRecord]) -> str:
    return "; ".join(f"{r.host}: {r.failed_phase or r.outcome}: {r.message}" for r in records[:5]) + (
        f"; and {len(records) - 5} more" if len(records) > 5 else ""
    )


def conclude_deploy(
    op: Operation,
    ledger: Ledger,
    plan: Plan,
    baseline: Mapping[str, Baseline],
    failure: BatchFailure | None,
    failed: list[HostRecord],
    *,
    done: Iterable[str] = (),
) -> None:
    """`failed`: every failure of every batch run (for the within-max_failures message); the reason a batch
    stopped scheduling names only that batch's own failures. `done`: hosts an earlier process of this
    rollout already scheduled (a promote's canary)."""
    report = op.report
    if failure is None:
        ledger.mark_recovered(op.op_id, by=op.op_id)  # nothing left to finish
        if not failed:
            report.status, report.exit_code = OpStatus.SUCCEEDED, ExitCode.OK
            return
        only_unreachable = all(r.outcome == "unreachable" for r in failed)
        only_quarantined = all(r.outcome == "quarantined" for r in failed)
        report.status = OpStatus.FAILED
        report.exit_code = (
            ExitCode.UNREACHABLE
            if only_unreachable
            else ExitCode.UNHEALTHY
            if only_quarantined
            else ExitCode.OPERATION_FAILED
        )
        what = "were quarantined (rollout.unhealthy: skip), not deployed" if only_quarantined else "did not"
        report.message = (
            f"completed within max_failures, but {len(failed)} host(s) {what}: {_describe(failed)}"
        )
        return
    scheduled = {h for s in report.steps for h in s.hosts} | set(done)
    skipped = [h for h in plan.hosts if h not in scheduled]
    failed_batch, batch_failed = failure.batch, failure.failed
    if failure.interrupted:
        reason = f"interrupted during {failed_batch.name}"
        report.exit_code = ExitCode.INTERRUPTED
    elif failure.runner_error:
        reason = f"{failed_batch.name} failed: {failure.runner_error}"
        reason += f"; {_describe(batch_failed)}" if batch_failed else ""
        report.exit_code = ExitCode.RUNNER  # docs/cli.md: exit 4, after the failure policy has run
    elif failure.reason:
        reason = failure.reason
        reason += f"; {_describe(batch_failed)}" if batch_failed else ""
        report.exit_code = ExitCode.OPERATION_FAILED
    else:
        limit = failed_batch.max_failures
        reason = f"{failed_batch.name} failed ({len(batch_failed)} > max_failures {limit}): "
        reason += _describe(batch_failed)
        only_unreachable = all(r.outcome == "unreachable" for r in batch_failed)
        report.exit_code = ExitCode.UNREACHABLE if only_unreachable else ExitCode.OPERATION_FAILED
    if skipped:
        reason += f"; not scheduled: {', '.join(skipped)}"
    policy = plan.on_failure
    targets = undo_targets(policy, list(plan.hosts), failed_batch)
    final = OpStatus.INTERRUPTED if failure.interrupted else OpStatus.FAILED
    if not targets:
        report.status = final
        report.message = reason + f"; on_failure={policy}: hosts left where they are"
        ledger.mark_recovered(op.op_id, by=op.op_id)  # halt is the policy: nothing left to finish
        return
    # hosts that ansible-runner cut off mid-step (job timeout, batch deadline): their node-side step runs on
    # under the node's lock and may still activate, so their undo waits for that lock instead of trusting a
    # state read taken while it runs
    pending = [r.host for r in batch_failed if r.outcome in ("not_finished", "interrupted")]
    try:
        result = restore(op, ledger, baseline, targets, pending=pending)
    except Interrupted:
        report.status, report.exit_code = OpStatus.INTERRUPTED, ExitCode.INTERRUPTED
        report.message = reason + (
            f"; on_failure={policy} was interrupted too: run `solfleet reconcile` to return the fleet to"
            " its baseline"
        )
        return
    if result.final:
        ledger.mark_recovered(op.op_id, by=op.op_id)
    if result.ok:
        report.status = OpStatus.INTERRUPTED if failure.interrupted else OpStatus.ROLLED_BACK
        done = f"returned {len(result.moved)} host(s) to the baseline"
    elif result.final:
        report.status = final
        done = f"returned {len(result.moved)} host(s) to the baseline; the others had no release before it"
    else:
        report.status = final
        done = "could not return every host to the baseline (run `solfleet reconcile`)"
    report.message = f"{reason}; on_failure={policy}: {done}; now: {describe_where(result.where)}"


def undo_targets(policy: str, hosts: list[str], failed_batch: Batch) -> list[str]:
    """Which targeted hosts go back to the baseline: every one (rollback_fleet), only the failed batch's
    (rollback_batch), none (halt). Hosts already on their baseline are left alone by `restore`."""
    if policy == "rollback_fleet":
        return list(hosts)
    if policy == "rollback_batch":
        return [h for h in hosts if h in failed_batch.hosts]
    return []


def rollback(spec: FleetSpec, plan: Plan, *, progress: ProgressFactory | None = None) -> OperationReport:
    op = Operation(spec, plan, progress=progress)

    def body(ledger: Ledger) -> None:
        hosts = list(plan.batches[0].hosts)
        try:
            take_baseline(op, ledger, hosts, drop_on_refusal=False)
        except LeaseHeld:
            # refused on some node: nothing moved, but the leases it took over from an older unfinished
            # rollout on hosts still owed stay that rollout's (every other one it took is dropped)
            conclude_rollback_leases(op, ledger, hosts, (), moved=False)
            raise
        # a rollback is the escape hatch, not something to undo: whatever it did, interrupted or failed, is
        # its end state, so it owes nothing from here on (a later run must never return its hosts forward)
        ledger.mark_recovered(op.op_id, by=op.op_id)
        records: tuple[HostRecord, ...] = ()
        owed: dict[str, list[str]] = {}
        try:
            step = op.run_step(
                ledger,
                "rollback",
                hosts,
                ROLLBACK_PLAYBOOK,
                {"solfleet_rollback_to": plan.version or "", "solfleet_rollout_id": op.op_id},
            )
            records = step.records
        finally:
            # an older rollout left unfinished (its reconcile, run first, could not finish it): concluded
            # when this rollback leaves none of its hosts owed, else its owed hosts stay leased to it
            owed = conclude_rollback_leases(op, ledger, hosts, records)
        busy = {h for h, read in op.lease_read.items() if read.busy}
        notes = [_owed_note(rid, owed_hosts, hosts, busy) for rid, owed_hosts in owed.items()]
        bad = [r for r in records if r.outcome not in ("rolled_back", "unchanged")]
        if not bad:
            op.report.status, op.report.exit_code = OpStatus.SUCCEEDED, ExitCode.OK
            op.report.message = "; ".join(notes)
            return
        op.report.status = OpStatus.FAILED
        op.report.exit_code = (
            ExitCode.UNREACHABLE
            if all(r.outcome == "unreachable" for r in bad)
            else ExitCode.OPERATION_FAILED
        )
        op.report.message = "; ".join([f"{len(bad)} host(s) not rolled back: {_describe(bad)}", *notes])

    return op.execute(body, precheck=refuse_if_paused)


def _owed_note(rollout_id: str, owed: list[str], selected: list[str], busy: set[str]) -> str:
    """One line on an older unfinished rollout after a rollback: concluded by it, or what it still owes (a
    host this rollback did not select is not known to owe nothing, so it counts), naming the owed hosts
    whose lease read found a node step still running (`busy`)."""
    if not owed:
        return f"unfinished {rollout_id} is concluded by this rollback"
    here = [h for h in owed if h in selected]
    parts = [f"still owes {', '.join(here)} a return to its baseline"] if here else []
    running = [h for h in here if h in busy]
    if running:
        parts.append(
            f"{', '.join(running)}: a node step was running there at this rollback's lease read"
            " (its deploy lock was held)"
        )
    if len(here) < len(owed):
        parts.append(f"{', '.join(h for h in owed if h not in selected)} not selected by this rollback")
    return f"unfinished {rollout_id} stays unfinished ({'; '.join(parts)}): `solfleet reconcile` finishes it"


def unfinished_operations(spec: FleetSpec) -> list[str]:
    """Ids of operations owed a return to their baseline. Reads only: no ledger file is created."""
    path = ledger_path(spec)
    if not path.exists():
        return []
    with Ledger(path) as ledger:
        return [op.id for op in ledger.unfinished()]


def reconcile(
    spec: FleetSpec, plan: Plan, unfinished_id: str, *, progress: ProgressFactory | None = None
) -> OperationReport:
    """Return the hosts of an unfinished operation to its baseline (its default policy after a crash)."""
    op = Operation(spec, plan, progress=progress)

    def body(ledger: Ledger) -> None:
        conclude_recovery(op, unfinished_id, recover(op, ledger, unfinished_id))

    return op.execute(body)

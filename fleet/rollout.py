"""Deploy and rollback operations: run the plan batch by batch through the runner, record every host
outcome in the ledger, and apply the failure policy. Prints nothing: the CLI renders the returned report.

Failure policy (docs/cli.md): batches run in order; a batch whose failures exceed its `max_failures` stops
scheduling. `rollback_fleet` then returns every host this rollout activated to the version it had before
(recorded per host from the node's own answer, so hosts on different prior versions each go back to theirs);
`rollback_batch` does that for the failing batch only; `halt` leaves them. A batch that ansible-runner stops
(job timeout) is recorded host by host and counts as failed, so the policy runs before the exit 4."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet import runner
from fleet.errors import ExitCode, FleetError, Interrupted, RunnerError
from fleet.inventory import write_private_data_dir
from fleet.ledger import HostRecord, Ledger, OpStatus, new_operation_id
from fleet.plan import Batch, Plan
from fleet.policy import UnreachablePolicy
from fleet.runner import HostProgress, HostStatus, ProgressSink
from fleet.spec import FleetSpec
from fleet.workdir import controller_lock, ledger_path, run_dir

DEPLOY_PLAYBOOK = "deploy.yml"
ROLLBACK_PLAYBOOK = "rollback.yml"
# node-module outcomes that mean "this host did not end where it was asked to"; `not_finished`: ansible-runner
# stopped the run (job timeout) while the host was mid-step, before its module answered
FAILED_OUTCOMES = {"refused", "verify_failed", "health_failed", "failed", "not_run", "not_finished"}
PHASES = ("push", "unpack_check", "verify", "activate", "health")

ProgressFactory = Callable[[str, list[str]], ProgressSink | None]


@dataclass(frozen=True)
class StepResult:
    step: str
    hosts: tuple[str, ...]
    records: tuple[HostRecord, ...]
    seconds: float
    ok_hosts: Mapping[str, HostProgress] = field(default_factory=dict)

    @property
    def failures(self) -> list[HostRecord]:
        return [r for r in self.records if r.outcome in FAILED_OUTCOMES]

    @property
    def unreachable(self) -> list[HostRecord]:
        return [r for r in self.records if r.outcome == "unreachable"]


@dataclass
class OperationReport:
    op_id: str
    kind: str
    version: str | None
    status: OpStatus = OpStatus.RUNNING
    steps: list[StepResult] = field(default_factory=list)
    message: str = ""
    exit_code: ExitCode = ExitCode.OK
    artifacts: Path | None = None

    @property
    def records(self) -> list[HostRecord]:
        return [r for s in self.steps for r in s.records]


def host_record(step: str, hp: HostProgress) -> HostRecord:
    """One host's outcome from its folded events: the node module's `solfleet` result when there is one,
    else what the events say (unreachable, failed before the module ran, never ran)."""
    sf: Mapping[str, Any] = hp.solfleet
    outcome = str(sf.get("outcome") or "")
    if hp.status is HostStatus.UNREACHABLE:
        outcome = "unreachable"
    elif not outcome:
        outcome = {HostStatus.FAILED: "failed", HostStatus.NOT_RUN: "not_run"}.get(hp.status, "ok")
    elif hp.status is HostStatus.FAILED and outcome not in FAILED_OUTCOMES:
        outcome = "failed"  # the module succeeded but a later task (health, journal, prune) failed
    current = sf.get("current")
    before: str | None
    if outcome in ("activated", "rolled_back"):
        # The node's own `prior_current` (None: it had no current, or a dangling one), not `previous`: when
        # current was missing before the switch, `previous` is an older release this host was not running.
        # A result without the key predates it (the recorded runs in tests/fleet/data): `previous` there.
        before = sf["prior_current"] if "prior_current" in sf else sf.get("previous")
    elif outcome == "unreachable" or not sf:
        before = None
    else:
        before = current
    phases = {k: float(val) for k, val in (sf.get("phases") or {}).items() if isinstance(val, int | float)}
    if hp.push_s is not None:
        phases["push"] = hp.push_s
    failed_phase = sf.get("failed_phase")
    if outcome in FAILED_OUTCOMES | {"unreachable"} and not failed_phase:
        failed_phase = _phase_of_task(hp.failed_task) if outcome != "unreachable" else "connect"
    # the module's one-line message; the failed task's msg when the module never answered
    message = str(sf.get("message") or "") or hp.message
    return HostRecord(
        step=step,
        host=hp.host,
        outcome=outcome,
        changed=hp.changed > 0,
        version_before=before,
        version_after=current if outcome != "unreachable" and sf else None,
        failed_phase=failed_phase if outcome in FAILED_OUTCOMES | {"unreachable"} else None,
        message=message,
        phases=phases,
        simulated=None if "simulated" not in sf else bool(sf["simulated"]),
    )


def _interrupted_record(
    step: str, hp: HostProgress | None, host: str, *, outcome: str = "interrupted"
) -> HostRecord:
    """A host of a run cut short (Ctrl-C: `interrupted`; stopped by ansible-runner: `not_finished`): its
    module's answer when it gave one, else where it was."""
    if hp is not None and hp.solfleet.get("outcome"):
        return host_record(step, hp)
    task = hp.task if hp is not None else ""
    ended = hp is not None and hp.status in (HostStatus.FAILED, HostStatus.UNREACHABLE)
    if outcome != "interrupted" and hp is not None and ended:
        return host_record(step, hp)  # its events already said how it ended
    if not task:
        outcome = "interrupted" if outcome == "interrupted" else "not_run"
    what = outcome.replace("_", " ")
    return HostRecord(
        step=step,
        host=host,
        outcome=outcome,
        changed=False,
        version_before=None,
        version_after=None,
        failed_phase=_phase_of_task(task) if task else "not_started",
        message=f"{what} in {task!r}; the node journal says how far it got" if task else "not started",
        phases={},
    )


def _phase_of_task(task: str | None) -> str:
    """`solfleet | Push artifact` -> `push`: a failure before the node module ran still names a phase."""
    if not task:
        return "unknown"
    name = task.split("|")[-1].strip().lower()
    return "push" if "push" in name else re.sub(r"[^a-z0-9]+", "_", name).strip("_") or "unknown"


def _counted_failures(step: StepResult, policy: UnreachablePolicy) -> list[HostRecord]:
    failed = step.failures
    if policy is UnreachablePolicy.FAIL:
        failed = failed + step.unreachable
    return failed


class StepAborted(RunnerError):
    """ansible-runner stopped a step (job timeout, runner error): each host is already in the ledger, and
    `step` holds those records so deploy can apply its failure policy to what did happen."""

    def __init__(self, message: str, *, step: StepResult) -> None:
        super().__init__(message)
        self.step = step


@dataclass(frozen=True)
class BatchFailure:
    """Why scheduling stopped: `failed` are the batch's counted failures; `runner_error` is set when
    ansible-runner stopped the batch before its end."""

    batch: Batch
    failed: list[HostRecord]
    runner_error: str = ""


class Operation:
    """One deploy/stage/rollback: owns its run dir, its ledger row and the controller lock."""

    def __init__(self, spec: FleetSpec, plan: Plan, *, progress: ProgressFactory | None = None) -> None:
        self.spec = spec
        self.plan = plan
        self.progress = progress or (lambda _name, _hosts: None)
        self.op_id = new_operation_id()
        self.pdd = run_dir(spec, self.op_id)
        self.report = OperationReport(
            op_id=self.op_id, kind=plan.kind, version=plan.version, artifacts=self.pdd
        )

    def run_step(
        self, ledger: Ledger, step: str, hosts: list[str], playbook: str, extravars: Mapping[str, Any]
    ) -> StepResult:
        ident = f"{len(self.report.steps):02d}-{re.sub(r'[^a-z0-9]+', '-', step.lower()).strip('-')}"
        started = time.monotonic()
        try:
            result = runner.run_playbook(
                private_data_dir=self.pdd,
                playbook=playbook,
                hosts=hosts,
                extravars=extravars,
                ident=ident,
                timeout_s=self.spec.timeouts.run_s,
                progress=self.progress(f"{self.plan.kind} {self.plan.version or ''} {step}".strip(), hosts),
            )
        except Interrupted as exc:
            # Ansible is stopped, but a node-side module already running finishes its step under its lock
            # (the node journal is the truth); the ledger says which hosts were mid-step, and in what.
            ledger.record_hosts(
                self.op_id, [_interrupted_record(step, exc.progress.get(h), h) for h in hosts]
            )
            raise
        except RunnerError as exc:
            # A timed-out batch still did things: hosts that answered (activated) before the run was
            # stopped are recorded with that answer, so the failure policy can act on them.
            cut = tuple(
                _interrupted_record(step, exc.progress.get(h), h, outcome="not_finished") for h in hosts
            )
            ledger.record_hosts(self.op_id, list(cut))
            seconds = time.monotonic() - started
            aborted = StepResult(step=step, hosts=tuple(hosts), records=cut, seconds=seconds)
            self.report.steps.append(aborted)
            raise StepAborted(str(exc), step=aborted) from exc
        records = tuple(host_record(step, result.hosts[h]) for h in hosts)
        ledger.record_hosts(self.op_id, list(records))  # committed per step: a crash later loses nothing
        out = StepResult(step=step, hosts=tuple(hosts), records=records, seconds=time.monotonic() - started)
        self.report.steps.append(out)
        return out

    def execute(self, body: Callable[[Ledger], None]) -> OperationReport:
        with controller_lock(self.spec), Ledger(ledger_path(self.spec)) as ledger:
            write_private_data_dir(self.spec, self.pdd)
            ledger.begin(
                op_id=self.op_id,
                kind=self.plan.kind,
                version=self.plan.version,
                fleet=self.spec.name,
                plan=self.plan.to_json(),
            )
            try:
                body(ledger)
            except Interrupted as exc:
                ledger.finish(self.op_id, OpStatus.INTERRUPTED, str(exc))
                raise
            except KeyboardInterrupt:
                ledger.finish(self.op_id, OpStatus.INTERRUPTED, "interrupted")
                raise Interrupted(f"{self.op_id} interrupted; the ledger marks it interrupted") from None
            except FleetError as exc:
                ledger.finish(self.op_id, OpStatus.FAILED, str(exc))
                raise
            except BaseException as exc:
                ledger.finish(self.op_id, OpStatus.FAILED, f"controller error: {exc!r}")
                raise
            if self.report.status is OpStatus.RUNNING:  # a body that forgot to conclude is a bug, not success
                self.report.status, self.report.exit_code = OpStatus.FAILED, ExitCode.RUNNER
                self.report.message = "operation ended without a conclusion (controller bug)"
            ledger.finish(self.op_id, self.report.status, self.report.message)
        return self.report


def deploy(
    spec: FleetSpec,
    plan: Plan,
    *,
    artifact: Path,
    artifact_sha256: str,
    progress: ProgressFactory | None = None,
    verify_ops: str = "",
) -> OperationReport:
    op = Operation(spec, plan, progress=progress)
    extravars = {
        "solfleet_version": plan.version,
        "solfleet_artifact": str(artifact.resolve()),
        "solfleet_artifact_sha256": artifact_sha256,
        "solfleet_rollout_id": op.op_id,
        "solfleet_keep_releases": plan.keep_releases,
        "solfleet_activate": plan.kind != "stage",
        "solfleet_verify_timeout_s": spec.timeouts.verify_s,
        "solfleet_verify_ops": verify_ops,
    }

    def body(ledger: Ledger) -> None:
        activated: dict[str, str | None] = {}  # host -> the version it had before this rollout
        failure: BatchFailure | None = None
        all_failed: list[HostRecord] = []
        for batch in plan.batches:
            runner_error = ""
            try:
                step = op.run_step(ledger, batch.name, list(batch.hosts), DEPLOY_PLAYBOOK, extravars)
            except StepAborted as exc:  # a stopped batch is a failed one: the failure policy still runs
                step, runner_error = exc.step, str(exc)
            for r in step.records:
                if r.outcome == "activated":
                    activated[r.host] = r.version_before
            counted = _counted_failures(step, spec.rollout.unreachable)
            all_failed += step.failures + step.unreachable
            if runner_error or len(counted) > batch.max_failures:
                failure = BatchFailure(batch=batch, failed=counted, runner_error=runner_error)
                break
        _conclude_deploy(op, ledger, plan, activated, failure, all_failed)

    return op.execute(body)


def _describe(records: list[HostRecord]) -> str:
    return "; ".join(f"{r.host}: {r.failed_phase or r.outcome}: {r.message}" for r in records[:5]) + (
        f"; and {len(records) - 5} more" if len(records) > 5 else ""
    )


def _conclude_deploy(
    op: Operation,
    ledger: Ledger,
    plan: Plan,
    activated: dict[str, str | None],
    failure: BatchFailure | None,
    failed: list[HostRecord],
) -> None:
    """`failed`: every failure of every batch run (for the within-max_failures message); the reason a batch
    stopped scheduling names only that batch's own failures."""
    report = op.report
    if failure is None:
        if not failed:
            report.status, report.exit_code = OpStatus.SUCCEEDED, ExitCode.OK
            return
        only_unreachable = all(r.outcome == "unreachable" for r in failed)
        report.status = OpStatus.FAILED
        report.exit_code = ExitCode.UNREACHABLE if only_unreachable else ExitCode.OPERATION_FAILED
        report.message = (
            f"completed within max_failures, but {len(failed)} host(s) did not: {_describe(failed)}"
        )
        return
    scheduled = {h for s in report.steps for h in s.hosts}
    skipped = [h for h in plan.hosts if h not in scheduled]
    failed_batch, batch_failed = failure.batch, failure.failed
    if failure.runner_error:
        reason = f"{failed_batch.name} failed: {failure.runner_error}"
        reason += f"; {_describe(batch_failed)}" if batch_failed else ""
        report.exit_code = ExitCode.RUNNER  # docs/cli.md: exit 4, after the failure policy has run
    else:
        limit = failed_batch.max_failures
        reason = f"{failed_batch.name} failed ({len(batch_failed)} > max_failures {limit}): "
        reason += _describe(batch_failed)
        only_unreachable = all(r.outcome == "unreachable" for r in batch_failed)
        report.exit_code = ExitCode.UNREACHABLE if only_unreachable else ExitCode.OPERATION_FAILED
    if skipped:
        reason += f"; not scheduled: {', '.join(skipped)}"
    policy = plan.on_failure
    undo = undo_targets(policy, activated, failed_batch)
    kept = len(activated) - len(undo)
    if not undo:
        report.status = OpStatus.FAILED
        report.message = reason + (f"; on_failure={policy} left {kept} activated host(s)" if kept else "")
        return
    undone = _undo(op, ledger, undo)
    report.status = OpStatus.ROLLED_BACK if undone else OpStatus.FAILED
    report.message = reason + f"; on_failure={policy}: "
    report.message += (
        f"returned {len(undo)} host(s) to their prior versions" if undone else "could not return every host"
    )
    if kept:
        report.message += f"; {kept} host(s) of earlier batches stay on {plan.version}"


def undo_targets(
    policy: str, activated: Mapping[str, str | None], failed_batch: Batch
) -> dict[str, str | None]:
    """Which activated hosts go back, each to the version it had before: every one (rollback_fleet), only
    the failed batch's (rollback_batch), none (halt)."""
    if policy == "rollback_fleet":
        return dict(activated)
    if policy == "rollback_batch":
        return {h: v for h, v in activated.items() if h in failed_batch.hosts}
    return {}


def _undo(op: Operation, ledger: Ledger, hosts: dict[str, str | None]) -> bool:
    """Roll each host back to its own prior version: one rollback run per distinct prior version."""
    groups: dict[str, list[str]] = {}
    no_prior: list[str] = []
    for host, prior in hosts.items():
        if prior is None:
            no_prior.append(host)
        else:
            groups.setdefault(prior, []).append(host)
    all_ok = True
    if no_prior:
        # A first deploy has nothing to return to; say so in the ledger instead of pretending.
        ledger.record_hosts(
            op.op_id,
            [
                HostRecord(
                    step="undo",
                    host=h,
                    outcome="kept",
                    changed=False,
                    version_before=op.plan.version,
                    version_after=op.plan.version,
                    failed_phase="rollback",
                    message="no prior release on this node to return to",
                    phases={},
                )
                for h in no_prior
            ],
        )
        all_ok = False
    for prior, members in sorted(groups.items()):
        try:
            step = op.run_step(
                ledger,
                f"undo to {prior}",
                members,
                ROLLBACK_PLAYBOOK,
                {"solfleet_rollback_to": prior, "solfleet_rollout_id": op.op_id},
            )
        except StepAborted as exc:  # recorded; the other prior versions still get their undo run
            step = exc.step
        if any(r.outcome not in ("rolled_back", "unchanged") for r in step.records):
            all_ok = False
    return all_ok


def rollback(spec: FleetSpec, plan: Plan, *, progress: ProgressFactory | None = None) -> OperationReport:
    op = Operation(spec, plan, progress=progress)

    def body(ledger: Ledger) -> None:
        batch = plan.batches[0]
        step = op.run_step(
            ledger,
            "rollback",
            list(batch.hosts),
            ROLLBACK_PLAYBOOK,
            {"solfleet_rollback_to": plan.version or "", "solfleet_rollout_id": op.op_id},
        )
        bad = [r for r in step.records if r.outcome not in ("rolled_back", "unchanged")]
        if not bad:
            op.report.status, op.report.exit_code = OpStatus.SUCCEEDED, ExitCode.OK
            return
        op.report.status = OpStatus.FAILED
        op.report.exit_code = (
            ExitCode.UNREACHABLE
            if all(r.outcome == "unreachable" for r in bad)
            else ExitCode.OPERATION_FAILED
        )
        op.report.message = f"{len(bad)} host(s) not rolled back: {_describe(bad)}"

    return op.execute(body)

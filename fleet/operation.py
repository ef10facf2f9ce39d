"""One operation on the fleet (deploy, stage, rollback, reconcile): its run dir, its ledger row, the
controller lock, and each step it runs through ansible-runner, recorded host by host as soon as the step
ends. Prints nothing: the CLI renders the returned report.

Signals: SIGINT, SIGTERM and SIGHUP all arrive as KeyboardInterrupt (fleet/cli.py); the runner cancels the
running step and raises `Interrupted`, and the operation's body decides what to do about it (deploy applies
its failure policy). ansible-playbook never outlives the controller (fleet/runner.py)."""

from __future__ import annotations

import getpass
import os
import re
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fleet import runner
from fleet.errors import ControllerError, ExitCode, FleetError, Interrupted, RunnerError
from fleet.inventory import write_private_data_dir
from fleet.ledger import Baseline, HostRecord, Ledger, OpStatus, new_operation_id
from fleet.plan import Plan
from fleet.runner import HostProgress, HostStatus, ProgressSink
from fleet.spec import FleetSpec
from fleet.workdir import controller_lock, ledger_path, run_dir

DEPLOY_PLAYBOOK = "deploy.yml"
ROLLBACK_PLAYBOOK = "rollback.yml"
STATUS_PLAYBOOK = "status.yml"
LEASE_PLAYBOOK = "lease.yml"
LEASE_END_PLAYBOOK = "lease_end.yml"
# node-module outcomes that mean "this host did not end where it was asked to"; `not_finished`: ansible-runner
# stopped the run (job timeout) while the host was mid-step, before its module answered, or (an `undo` row)
# restore left a host owed because a node step held its lock (recovery.BUSY_NOTE)
FAILED_OUTCOMES = {"refused", "verify_failed", "health_failed", "failed", "not_run", "not_finished"}
FAILED_OUTCOMES.add("unhealthy")  # fleet/rollout.py: its preflight health failed (rollout.unhealthy: fail)
FAILED_OUTCOMES.add("gate_failed")  # fleet/gating.py: verified and activated, but a performance gate failed
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
    if name == "push artifact":  # the separate push task of runs recorded before the module took the push
        return "push"
    return re.sub(r"[^a-z0-9]+", "_", name).strip("_") or "unknown"


class StepAborted(RunnerError):
    """ansible-runner stopped a step (job timeout, runner error): each host is already in the ledger, and
    `step` holds those records so deploy can apply its failure policy to what did happen. `deadline`: the
    step's own deadline (rollout.batch_deadline_s) stopped it, not the runner's `timeouts.run_s`."""

    def __init__(self, message: str, *, step: StepResult, deadline: int | None = None) -> None:
        super().__init__(message)
        self.step = step
        self.deadline = deadline


class StillPaused(FleetError):
    """A promote or abort refused before it moved anything (a node not where the pause left it, another
    lease, an interrupt during the check): its paused row goes back to `paused`, as it was."""

    def __init__(self, message: str, *, exit_code: ExitCode = ExitCode.USAGE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _deadline_record(record: HostRecord, deadline_s: int) -> HostRecord:
    """A host cut off by the batch deadline is a failed host, and its record says why."""
    if record.outcome not in ("not_finished", "not_run"):
        return record
    where = f" ({record.message})" if record.message else ""
    return replace(
        record,
        outcome="not_finished",
        failed_phase=record.failed_phase or "not_started",
        message=f"batch deadline {deadline_s} s passed{where}",
    )


class Operation:
    """One deploy/stage/rollback/reconcile: owns its run dir, its ledger row and the controller lock."""

    def __init__(
        self,
        spec: FleetSpec,
        plan: Plan,
        *,
        progress: ProgressFactory | None = None,
        resume_id: str | None = None,
    ) -> None:
        """`resume_id`: continue that paused operation (promote, abort) under its own id, run dir and row,
        so its node journals and leases name one rollout from its canary to its end."""
        self.spec = spec
        self.plan = plan
        self.progress = progress or (lambda _name, _hosts: None)
        self.resumed = resume_id is not None
        self.op_id = resume_id or new_operation_id()
        # named in every node lease this operation takes, so a refused second operator learns who holds it
        self.controller = f"{getpass.getuser()}@{socket.gethostname()}:{os.getpid()}"
        self.pdd = run_dir(spec, self.op_id)
        # a resumed run numbers its steps after the ones already kept in artifacts/
        arts = self.pdd / "artifacts"
        self._first_step = sum(1 for _ in arts.iterdir()) if self.resumed and arts.is_dir() else 0
        self.report = OperationReport(
            op_id=self.op_id, kind=plan.kind, version=plan.version, artifacts=self.pdd
        )
        # hosts whose lease call also ran the health check (fleet/recovery.py take_baseline, health_hosts):
        # their answer, which a deploy's first batch takes as its preflight (fleet/rollout.py preflight)
        self.lease_health: dict[str, HostProgress | None] = {}
        # hosts whose lease call this operation could not complete (no answer, or a failure: no lease, no
        # baseline): host -> (outcome, why). Never deployed by this operation (fleet/rollout.py preflight).
        self.unleased: dict[str, tuple[str, str]] = {}
        # where each host was at this operation's lease read (fleet/recovery.py take_baseline), set before
        # any refusal; and the hosts its return to a baseline found or put there, or that owe that baseline
        # nothing (fleet/recovery.py restore): an unfinished end keeps leases only on the others
        self.lease_read: dict[str, Baseline] = {}
        self.settled: set[str] = set()

    def run_step(
        self,
        ledger: Ledger,
        step: str,
        hosts: list[str],
        playbook: str,
        extravars: Mapping[str, Any],
        *,
        record: bool = True,
        timeout_s: int | None = None,
        deadline_s: int | None = None,
    ) -> StepResult:
        """One ansible-runner run over `hosts`. `record=False` for steps that read or lease and move no
        release (their answers land in the baselines table or nowhere, not in host_outcomes). `timeout_s`:
        a short per-task limit for such reads (the run gets twice that plus the connect timeout).
        `deadline_s`: a deploy batch's wall-clock bound (rollout.batch_deadline_s), enforced as the run's
        job timeout when it is shorter than `timeouts.run_s`; hosts it cuts off are `not_finished` with the
        reason "batch deadline N s passed", and StepAborted says `deadline`."""
        number = self._first_step + len(self.report.steps)
        ident = f"{number:02d}-{re.sub(r'[^a-z0-9]+', '-', step.lower()).strip('-')}"
        job_timeout = (
            (timeout_s * 2 + self.spec.timeouts.connect_s) if timeout_s else self.spec.timeouts.run_s
        )
        by_deadline = deadline_s is not None and deadline_s < job_timeout
        if by_deadline and deadline_s is not None:
            job_timeout = deadline_s
        started = time.monotonic()
        try:
            result = runner.run_playbook(
                private_data_dir=self.pdd,
                playbook=playbook,
                hosts=hosts,
                extravars=extravars,
                ident=ident,
                timeout_s=job_timeout,
                task_timeout_s=timeout_s,
                progress=self.progress(f"{self.plan.kind} {self.plan.version or ''} {step}".strip(), hosts),
            )
        except Interrupted as exc:
            # Ansible is stopped, but a node-side module already running finishes its step under its lock
            # (the node journal is the truth); the ledger says which hosts were mid-step, and in what.
            if record:
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
            deadline = deadline_s if by_deadline and exc.status == "timeout" else None
            message = str(exc)
            if deadline is not None:
                cut = tuple(_deadline_record(r, deadline) for r in cut)
                late = [r.host for r in cut if r.outcome == "not_finished"]
                message = f"batch deadline {deadline} s passed; not finished: {', '.join(late) or 'none'}"
            if record:
                ledger.record_hosts(self.op_id, list(cut))
            seconds = time.monotonic() - started
            aborted = StepResult(step=step, hosts=tuple(hosts), records=cut, seconds=seconds)
            if record:
                self.report.steps.append(aborted)
            raise StepAborted(message, step=aborted, deadline=deadline) from exc
        records = tuple(host_record(step, result.hosts[h]) for h in hosts)
        if record:
            ledger.record_hosts(self.op_id, list(records))  # committed per step: a crash later loses nothing
        out = StepResult(
            step=step,
            hosts=tuple(hosts),
            records=records,
            seconds=time.monotonic() - started,
            ok_hosts=dict(result.hosts),
        )
        if record:
            self.report.steps.append(out)
        return out

    def execute(
        self, body: Callable[[Ledger], None], *, precheck: Callable[[Ledger], None] | None = None
    ) -> OperationReport:
        """`precheck` runs under the lock before the ledger row exists: a refusal there (a version that is
        another artifact) leaves no row and touches nothing."""
        with controller_lock(self.spec), Ledger(ledger_path(self.spec)) as ledger:
            if precheck is not None:
                precheck(ledger)
            write_private_data_dir(self.spec, self.pdd)
            paused_message = ""
            if self.resumed:
                row = ledger.operation(self.op_id)
                paused_message = row.message if row is not None else ""
                ledger.resume(self.op_id)
            else:
                ledger.begin(
                    op_id=self.op_id,
                    kind=self.plan.kind,
                    version=self.plan.version,
                    fleet=self.spec.name,
                    plan=self.plan.to_json(),
                )
            try:
                body(ledger)
            except StillPaused:
                ledger.finish(self.op_id, OpStatus.PAUSED, paused_message)  # nothing moved: as it was
                raise
            except Interrupted as exc:
                ledger.finish(self.op_id, OpStatus.INTERRUPTED, str(exc))
                raise
            except KeyboardInterrupt:
                ledger.finish(self.op_id, OpStatus.INTERRUPTED, "interrupted")
                raise Interrupted(f"{self.op_id} interrupted; the ledger marks it interrupted") from None
            except FleetError as exc:
                ledger.finish(self.op_id, OpStatus.FAILED, str(exc))
                raise
            except Exception as exc:
                # An error of the controller itself mid-operation (a full disk under the work dir, an
                # OSError from the runner's files): the row is `failed` and, not recovered by itself, is
                # unfinished, so the next deploy, rollback or reconcile finishes its failure policy. One
                # line for the operator, exit 1 (not 2: hosts may have moved).
                what = f"controller error: {_one_line(exc)}"
                try:
                    ledger.finish(self.op_id, OpStatus.FAILED, what)
                except Exception as again:  # the ledger's own disk: the row stays `running`, its process dead
                    what += f" (the ledger could not record it either: {_one_line(again)})"
                raise ControllerError(
                    f"{self.op_id} ({self.plan.kind}) stopped by a {what}; `solfleet status` shows where the"
                    " nodes are, and the next deploy, rollback or `solfleet reconcile` returns an unfinished"
                    " rollout to its baseline"
                ) from exc
            except BaseException as exc:
                ledger.finish(self.op_id, OpStatus.FAILED, f"controller error: {exc!r}")
                raise
            if self.report.status is OpStatus.RUNNING:  # a body that forgot to conclude is a bug, not success
                self.report.status, self.report.exit_code = OpStatus.FAILED, ExitCode.RUNNER
                self.report.message = "operation ended without a conclusion (controller bug)"
            ledger.finish(self.op_id, self.report.status, self.report.message)
        return self.report


def _one_line(exc: BaseException) -> str:
    """`OSError: [Errno 28] No space left on device: '/path'` as one line, whatever the exception holds."""
    text = " ".join(str(exc).split()) or repr(exc)
    return f"{type(exc).__name__}: {text}"

"""The only module that imports ansible_runner. One `run_playbook` call = one ansible-runner run (one batch):
explicit timeouts, a non-blocking event handler (it only queues events), per-host progress folded from those
events on the calling thread, and per-host outcomes from events + `playbook_on_stats`.

Run artifacts stay under <private_data_dir>/artifacts/<ident>/ (stdout, job_events/, status, rc)."""

from __future__ import annotations

import os
import queue
import shutil
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

import ansible_runner

from fleet.errors import Interrupted, RunnerError

PUSH_TASK_SUFFIX = "push artifact"  # contract: task `solfleet | Push artifact`; its duration = push time


class HostStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    OK = "ok"
    CHANGED = "changed"
    FAILED = "failed"
    UNREACHABLE = "unreachable"
    NOT_RUN = "not_run"  # in the limit but no task ran (e.g. the play failed to start)


@dataclass
class HostProgress:
    """What the live table shows for one host; also the raw material of its outcome."""

    host: str
    status: HostStatus = HostStatus.PENDING
    task: str = ""
    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    message: str = ""
    failed_task: str | None = None
    push_s: float | None = None
    solfleet: dict[str, Any] = field(default_factory=dict)  # merged `solfleet` results of node modules


@dataclass(frozen=True)
class RunResult:
    ident: str
    playbook: str
    status: str  # ansible-runner's: successful | failed | timeout | canceled | error
    rc: int | None
    hosts: Mapping[str, HostProgress]
    artifacts: Path
    seconds: float


class ProgressSink(Protocol):
    def update(self, hosts: Mapping[str, HostProgress]) -> None: ...


def _task_name(data: Mapping[str, Any]) -> str:
    return str(data.get("task") or data.get("name") or "")


def fold_event(hosts: dict[str, HostProgress], event: Mapping[str, Any]) -> None:
    """Apply one ansible-runner event to the per-host progress. Pure state update (unit-tested with a
    recorded event stream)."""
    kind = event.get("event", "")
    data: Mapping[str, Any] = event.get("event_data") or {}
    host = data.get("host")
    if kind == "playbook_on_stats":
        _fold_stats(hosts, data)
        return
    if not host or host not in hosts:
        return
    hp = hosts[host]
    task = _task_name(data)
    res: Mapping[str, Any] = data.get("res") or {}
    if isinstance(res.get("solfleet"), Mapping):
        merged = dict(hp.solfleet)
        phases = {**merged.get("phases", {}), **(res["solfleet"].get("phases") or {})}
        merged.update(res["solfleet"])
        merged["phases"] = phases
        hp.solfleet = merged
    if kind == "runner_on_start":
        hp.task = task
        if hp.status is HostStatus.PENDING:
            hp.status = HostStatus.RUNNING
    elif kind == "runner_on_ok":
        hp.ok += 1
        if res.get("changed"):
            hp.changed += 1
        if task.lower().endswith(PUSH_TASK_SUFFIX) and data.get("duration") is not None:
            hp.push_s = float(data["duration"])
    elif kind == "runner_on_skipped":
        if task.lower().endswith(PUSH_TASK_SUFFIX):
            hp.push_s = 0.0
    elif kind == "runner_on_failed":
        if data.get("ignore_errors"):
            return
        hp.failed += 1
        # the first failed task names the phase; a rescue's re-raise comes later and only summarises it
        hp.failed_task = hp.failed_task or task
        hp.message = _one_line(res.get("msg") or res.get("stderr") or res.get("reason") or "task failed")
        hp.status = HostStatus.FAILED
    elif kind == "runner_on_unreachable":
        hp.unreachable += 1
        hp.failed_task = hp.failed_task or task
        hp.message = _one_line(res.get("msg") or "unreachable")
        hp.status = HostStatus.UNREACHABLE


def _fold_stats(hosts: dict[str, HostProgress], stats: Mapping[str, Any]) -> None:
    """`playbook_on_stats` is the final word per host; events above only fill in the detail. A failure
    that a `rescue` handled and re-raised shows in `failures`; one it swallowed does not (the outcome in
    the node module's result still says so, and rollout.py reads it)."""

    def count(key: str, host: str) -> int:
        table = stats.get(key) or {}
        return int(table.get(host, 0))

    for host, hp in hosts.items():
        if count("dark", host):
            hp.status = HostStatus.UNREACHABLE
            hp.unreachable = max(hp.unreachable, count("dark", host))
        elif count("failures", host):
            hp.status = HostStatus.FAILED
            hp.failed = max(hp.failed, count("failures", host))
        elif count("changed", host):
            hp.status = HostStatus.CHANGED
        elif count("ok", host) or count("skipped", host) or count("rescued", host):
            hp.status = HostStatus.OK
        else:
            hp.status = HostStatus.NOT_RUN
        hp.ok = max(hp.ok, count("ok", host))
        hp.changed = max(hp.changed, count("changed", host))
        hp.task = ""


def _one_line(text: object) -> str:
    """First non-empty line of a module `msg` (the node side makes it one line already)."""
    line = next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")
    return line if len(line) <= 300 else line[:297] + "..."


# ansible-runner starts ansible-playbook through pexpect in a new session, so nothing ties it to this
# process: a controller killed with SIGKILL would leave it running, activating hosts no ledger row names.
# The run dir gets this `ansible-playbook` in front of the real one on PATH. It asks the kernel to send it
# SIGTERM when the controller thread that started it dies (PR_SET_PDEATHSIG), runs the real one as its child
# in the process group pexpect made for it, and on SIGTERM kills that whole group the way ansible-runner's
# own cancel does (killpg, SIGKILL), so no worker is left behind. Otherwise it exits with the real one's
# status.
_REAPER = """#!{python}
# Written by solfleet (fleet/runner.py) for one run: ansible-playbook dies with the controller.
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
if os.getppid() != {controller}:  # the controller died before prctl took effect
    sys.exit(143)
child = os.fork()
if child == 0:
    os.execv({real!r}, [{real!r}] + sys.argv[1:])
def stop(signum, frame):
    os.killpg(os.getpgrp(), signal.SIGKILL)  # this process group: the reaper, ansible-playbook, its workers
for sig in (signal.SIGTERM, signal.SIGHUP):
    signal.signal(sig, stop)
_, status = os.waitpid(child, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def _real_ansible_playbook() -> str:
    """This interpreter's ansible-playbook (the venv's), else the one on PATH."""
    beside = Path(sys.executable).parent / "ansible-playbook"
    found = str(beside) if beside.exists() else shutil.which("ansible-playbook")
    if not found:
        raise RunnerError(
            "ansible-playbook not found next to the interpreter or on PATH; install ansible-core"
        )
    return found


def _path_env(private_data_dir: Path) -> dict[str, str]:
    """PATH for the run: the reaper first, then this interpreter's bin dir (the venv), so `.venv/bin/solfleet`
    finds the matching ansible-playbook without an activated venv. (ansible-runner's `binary=` would switch
    it to raw mode.)"""
    reaper_dir = private_data_dir / "bin"
    reaper_dir.mkdir(parents=True, exist_ok=True)
    reaper = reaper_dir / "ansible-playbook"
    tmp = reaper.with_suffix(".tmp")
    tmp.write_text(
        _REAPER.format(python=sys.executable, controller=os.getpid(), real=_real_ansible_playbook()),
        encoding="utf-8",
    )
    tmp.chmod(0o755)
    os.replace(tmp, reaper)
    bin_dir = str(Path(sys.executable).parent)
    return {"PATH": os.pathsep.join([str(reaper_dir), bin_dir, os.environ.get("PATH", "")])}


def run_playbook(
    *,
    private_data_dir: Path,
    playbook: str,
    hosts: list[str],
    extravars: Mapping[str, Any],
    ident: str,
    timeout_s: int,
    progress: ProgressSink | None = None,
    refresh_s: float = 0.2,
    task_timeout_s: int | None = None,
) -> RunResult:
    """`timeout_s` bounds the whole run (ansible-runner's job timeout); `task_timeout_s`, when given,
    replaces the rendered ANSIBLE_TASK_TIMEOUT for this run (short reads: status, leases)."""
    project = private_data_dir / "project"
    if not (project / playbook).is_file():
        raise RunnerError(f"playbook {project / playbook} does not exist (playbooks/ is the node side's)")
    state = {h: HostProgress(host=h) for h in hosts}
    events: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
    cancel = threading.Event()

    def on_event(event: dict[str, Any]) -> bool:
        events.put(event)  # never blocks: SimpleQueue is unbounded
        return True  # keep writing job_events/ (the run's artifacts)

    started = time.monotonic()
    thread, runner = ansible_runner.run_async(
        private_data_dir=str(private_data_dir),
        project_dir=str(project),
        playbook=playbook,
        limit=",".join(hosts),
        extravars=dict(extravars),
        ident=ident,
        envvars=_path_env(private_data_dir)
        | ({"ANSIBLE_TASK_TIMEOUT": str(task_timeout_s)} if task_timeout_s else {}),
        event_handler=on_event,
        cancel_callback=cancel.is_set,
        quiet=True,
        timeout=timeout_s,
    )
    try:
        _pump(thread, events, state, progress, refresh_s)
    except KeyboardInterrupt:
        cancel.set()
        thread.join(timeout=30)
        raise Interrupted(
            f"interrupted during {playbook}; hosts may be mid-step (see the node journals)",
            progress=state,
        ) from None
    status = str(runner.status)
    stopped = status in ("timeout", "error")
    if not stopped and all(h.status in (HostStatus.PENDING, HostStatus.RUNNING) for h in state.values()):
        # no playbook_on_stats and no host event: ansible-playbook itself failed (bad syntax, bad args)
        raise RunnerError(
            f"{playbook} did not run (ansible-runner {status}, rc {runner.rc}); "
            f"see {private_data_dir / 'artifacts' / ident / 'stdout'}"
        )
    for h in state.values():
        if h.status in (HostStatus.PENDING, HostStatus.RUNNING):
            h.status = HostStatus.NOT_RUN  # the run ended without a final word on this host
    if stopped:
        # checked before "did not run": a stopped run has no playbook_on_stats either, yet hosts may have
        # answered (activated) before it was stopped, and the caller records them from `progress`
        raise RunnerError(
            f"ansible-runner {status} running {playbook} on {', '.join(hosts)} "
            f"(limit {timeout_s}s); artifacts: {private_data_dir / 'artifacts' / ident}",
            progress=state,
            status=status,
        )
    return RunResult(
        ident=ident,
        playbook=playbook,
        status=status,
        rc=runner.rc,
        hosts=state,
        artifacts=private_data_dir / "artifacts" / ident,
        seconds=time.monotonic() - started,
    )


def _pump(
    thread: threading.Thread,
    events: queue.SimpleQueue[dict[str, Any]],
    state: dict[str, HostProgress],
    progress: ProgressSink | None,
    refresh_s: float,
) -> None:
    def drain() -> None:
        while True:
            try:
                fold_event(state, events.get_nowait())
            except queue.Empty:
                return

    update: Callable[[Mapping[str, HostProgress]], None] = progress.update if progress else lambda _s: None
    while thread.is_alive():
        thread.join(timeout=refresh_s)
        drain()
        update(state)
    drain()
    update(state)

"""The only module that imports ansible_runner. One `run_playbook` call = one ansible-runner run (one batch):
explicit timeouts, a non-blocking event handler (it only queues events), per-host progress folded from those
events on the calling thread, and per-host outcomes from events + `playbook_on_stats`.

Run artifacts stay under <private_data_dir>/artifacts/<ident>/ (stdout, job_events/, status, rc).

Two ways to run one (`execution.mode` in the spec, rendered into <private_data_dir>/execution.yml):
- local: `ansible_runner.run_async`; ansible-playbook is started from this process.
- streaming: ansible-runner's streaming interface, the one Receptor and AWX use. `transmit` packs the job
  (its kwargs and a private_data_dir) into a stream, an `ansible-runner worker` process (here a subprocess
  standing in for a remote execution node; the stream goes over its stdin/stdout pipes, as Receptor would
  carry it) runs it, and `process` consumes the worker's output stream here, firing the same event handler
  and unpacking the worker's artifacts into the same artifacts/<ident>/. The worker's own
  private_data_dir is kept under <private_data_dir>/streaming/<ident>/worker/."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

import ansible_runner
import yaml

from fleet import rolespec
from fleet.errors import Interrupted, RunnerError
from fleet.spec import ExecutionMode

EXECUTION_FILE = "execution.yml"  # rendered from the spec's `execution` (fleet/inventory.py)
# Runs recorded before the node module took the push (tests/fleet/data) had a task `solfleet | Push artifact`,
# whose event duration is the push phase; the module now reports `push` in its own phases.
PUSH_TASK_SUFFIX = "push artifact"


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
# SIGTERM when the thread that started it dies (PR_SET_PDEATHSIG), runs the real one as its child in the
# process group pexpect made for it, and on SIGTERM (or SIGHUP, the pty's hangup) kills every descendant,
# then that whole group the way ansible-runner's own cancel does (killpg, SIGKILL), so no worker is left.
# ansible-core's per-host workers put themselves in sessions of their own (os.setsid), so only the parent
# links find them; and ansible-playbook can die before the reaper's handler runs (the same hangup reaches
# it; seen under load), which would hand its workers to init. So the reaper is a child subreaper
# (PR_SET_CHILD_SUBREAPER): every orphan of the tree is re-parented to it, and it kills by parent links
# until no live descendant is left (a process forked during one sweep is found by the next). A process a node
# module starts on purpose to outlive the run (the operator service's instances on a `connection: local`
# node, library/solfleet_serve.py) carries SOLFLEET_DETACHED=1 in its environment: the sweep leaves it and
# its subtree alone, as init would have.
# Otherwise it exits with the real one's status.
# `parent` is the controller's pid in local mode; in streaming mode the worker starts it, so the reaper
# reads its parent before prctl and checks it after (the worker, in turn, dies with the controller).
_REAPER = """#!{python}
# Written by solfleet (fleet/runner.py) for one run: ansible-playbook dies with the process that started it.
import ctypes, os, signal, sys, time
parent = {parent}
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
libc.prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: orphans of ansible-playbook's tree come here, not to init
if os.getppid() != parent or parent == 1:  # the starter died before prctl took effect
    sys.exit(143)
child = os.fork()
if child == 0:
    os.execv({real!r}, [{real!r}] + sys.argv[1:])
def detached(pid):
    try:
        with open(f"/proc/{{pid}}/environ", "rb") as fh:
            return b"SOLFLEET_DETACHED=1" in fh.read().split(b"\\0")
    except OSError:
        return False
def live_descendants(root):
    kids = {{}}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{{entry}}/stat", "rb") as fh:
                    fields = fh.read().rsplit(b")", 1)[1].split()
                kids.setdefault(int(fields[1]), []).append((int(entry), fields[0] == b"Z"))
            except (OSError, ValueError, IndexError):
                continue
    found, todo = [], [root]
    while todo:
        for pid, zombie in kids.get(todo.pop(), []):
            if zombie:
                todo.append(pid)
            elif not detached(pid):
                found.append(pid)
                todo.append(pid)
    return found
def stop(signum, frame):
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # one sweep: the pty's hangup follows the parent's death
    try:
        os.kill(child, signal.SIGSTOP)  # ansible-playbook starts no new worker while the sweep runs
    except OSError:
        pass
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = live_descendants(os.getpid())
        if not found:
            break
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:  # reap what died here, so the next sweep skips it
                pass
        except ChildProcessError:
            pass
        time.sleep(0.01)
    os.killpg(os.getpgrp(), signal.SIGKILL)  # this process group: the reaper, ansible-playbook, the rest
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


def _write_reaper(bin_dir: Path, *, parent: str) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    reaper = bin_dir / "ansible-playbook"
    tmp = reaper.with_suffix(".tmp")
    tmp.write_text(
        _REAPER.format(python=sys.executable, parent=parent, real=_real_ansible_playbook()), encoding="utf-8"
    )
    tmp.chmod(0o755)
    os.replace(tmp, reaper)


def _path_env(reaper_dir: Path) -> dict[str, str]:
    """PATH for the run: the reaper first, then this interpreter's bin dir (the venv), so `.venv/bin/solfleet`
    finds the matching ansible-playbook without an activated venv. (ansible-runner's `binary=` would switch
    it to raw mode.)"""
    bin_dir = str(Path(sys.executable).parent)
    return {"PATH": os.pathsep.join([str(reaper_dir), bin_dir, os.environ.get("PATH", "")])}


def execution_mode(private_data_dir: Path) -> ExecutionMode:
    """The mode rendered from the spec (fleet/inventory.py). A private_data_dir without the file predates
    the option: local, the default."""
    path = private_data_dir / EXECUTION_FILE
    if not path.exists():
        return ExecutionMode.LOCAL
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    mode = str(data.get("mode")) if isinstance(data, Mapping) else ""
    try:
        return ExecutionMode(mode)
    except ValueError:
        allowed = ", ".join(m.value for m in ExecutionMode)
        raise RunnerError(f"{path}: mode {mode!r} is not one of {allowed}; re-render it") from None


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
    if not hosts:
        # an empty --limit is no limit at all to Ansible: the playbook would run on every inventory host
        raise RunnerError(f"{playbook}: no hosts to run on (a controller bug: an empty limit is all hosts)")
    # the role's argument spec, once here for all hosts, where the playbook turns Ansible's per-host check off
    rolespec.check(project, playbook, private_data_dir / "inventory", hosts, extravars)
    state = {h: HostProgress(host=h) for h in hosts}
    events: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()

    def on_event(event: dict[str, Any]) -> bool:
        events.put(event)  # never blocks: SimpleQueue is unbounded
        return True  # keep writing job_events/ (the run's artifacts)

    job = _Job(
        playbook=playbook,
        limit=",".join(hosts),
        extravars=dict(extravars),
        ident=ident,
        timeout_s=timeout_s,
        env={"ANSIBLE_TASK_TIMEOUT": str(task_timeout_s)} if task_timeout_s else {},
    )
    run = _run_streaming if execution_mode(private_data_dir) is ExecutionMode.STREAMING else _run_local
    started = time.monotonic()
    try:
        status, rc = run(
            private_data_dir, job, on_event, lambda t: _pump(t, events, state, progress, refresh_s)
        )
    except KeyboardInterrupt:
        raise Interrupted(
            f"interrupted during {playbook}; hosts may be mid-step (see the node journals)",
            progress=state,
        ) from None
    # canceled: only a run this process did not cancel gets here (a worker signalled by someone else)
    stopped = status in ("timeout", "error", "canceled")
    if not stopped and all(h.status in (HostStatus.PENDING, HostStatus.RUNNING) for h in state.values()):
        # no playbook_on_stats and no host event: ansible-playbook itself failed (bad syntax, bad args)
        raise RunnerError(
            f"{playbook} did not run (ansible-runner {status}, rc {rc}); "
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
        rc=rc,
        hosts=state,
        artifacts=private_data_dir / "artifacts" / ident,
        seconds=time.monotonic() - started,
    )


@dataclass(frozen=True)
class _Job:
    """One run's ansible-runner arguments, the same in both modes."""

    playbook: str
    limit: str
    extravars: dict[str, Any]
    ident: str
    timeout_s: int
    env: dict[str, str]  # added to the rendered env/envvars

    def kwargs(self) -> dict[str, Any]:
        return {
            "playbook": self.playbook,
            "limit": self.limit,
            "extravars": self.extravars,
            "ident": self.ident,
            "timeout": self.timeout_s,
            "quiet": True,
        }


Pump = Callable[[threading.Thread], None]
EventHandler = Callable[[dict[str, Any]], bool]


def _run_local(
    private_data_dir: Path, job: _Job, on_event: EventHandler, pump: Pump
) -> tuple[str, int | None]:
    cancel = threading.Event()
    _write_reaper(private_data_dir / "bin", parent=str(os.getpid()))
    # ansible-runner dumps the extravars of the FIRST run in a private_data_dir to env/extravars and passes
    # that file to every later run as `-e @env/extravars` before the run's own: a key an earlier step set
    # and a later one does not would leak into it at extra-vars precedence. Each run gets only its own.
    (private_data_dir / "env" / "extravars").unlink(missing_ok=True)
    thread, runner = ansible_runner.run_async(
        private_data_dir=str(private_data_dir),
        project_dir=str(private_data_dir / "project"),
        envvars=_path_env(private_data_dir / "bin") | job.env,
        event_handler=on_event,
        cancel_callback=cancel.is_set,
        **job.kwargs(),
    )
    try:
        pump(thread)
    except KeyboardInterrupt:
        cancel.set()  # ansible-runner kills ansible-playbook's process group at its next poll
        thread.join(timeout=30)
        raise
    return str(runner.status), runner.rc


# -- streaming: transmit -> worker -> process -------------------------------------------------------------

# The worker is started through this, so that it dies with the controller thread that starts it (SIGTERM:
# its ansible-runner then cancels the run and kills ansible-playbook's process group; the reaper in front of
# ansible-playbook covers a worker killed outright). argv: controller pid, then `ansible-runner` arguments.
_WORKER_LAUNCH = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(143)\n"
    "os.execv(sys.executable, [sys.executable, '-m', 'ansible_runner', *sys.argv[2:]])\n"
)
# beyond the job's own limit (which the worker enforces, status `timeout`), how long the controller waits
# for the worker's stream to end before it stops the worker itself: a wedged node must not hang a rollout
WORKER_GRACE_S = 60
WORKER_STOP_S = 30  # SIGTERM (the worker cancels its run and reports it), then SIGKILL


def _stage_job(private_data_dir: Path, job_dir: Path) -> None:
    """The private_data_dir that transmit packs: the rendered inventory/ and env/ and the project link,
    copied. Not the artifacts of earlier runs, the ssh control sockets (cp/, which zipfile cannot pack) or
    the local temp dir."""
    for name in ("inventory", "env"):
        # not env/extravars: a local run's dump of ITS extravars (see _run_local); this run sends its own
        shutil.copytree(private_data_dir / name, job_dir / name, ignore=shutil.ignore_patterns("extravars"))
    project = private_data_dir / "project"
    if project.is_symlink():
        (job_dir / "project").symlink_to(os.readlink(project), target_is_directory=True)
    else:
        shutil.copytree(project, job_dir / "project", symlinks=True)
    # the worker finds it first on PATH once it has unpacked the job (its private_data_dir is known here)
    _write_reaper(job_dir / "bin", parent="os.getppid()")


def _stop(worker: subprocess.Popen[bytes], grace_s: float = WORKER_STOP_S) -> None:
    if worker.poll() is not None:
        return
    worker.send_signal(signal.SIGTERM)
    try:
        worker.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait(timeout=grace_s)


def _run_streaming(
    private_data_dir: Path, job: _Job, on_event: EventHandler, pump: Pump
) -> tuple[str, int | None]:
    where = private_data_dir / "streaming" / job.ident
    shutil.rmtree(where, ignore_errors=True)
    job_dir, worker_dir = where / "job", where / "worker"
    _stage_job(private_data_dir, job_dir)
    artifacts = private_data_dir / "artifacts" / job.ident
    artifacts.mkdir(parents=True, exist_ok=True)
    argv = ["worker", "--private-data-dir", str(worker_dir)]
    with open(artifacts / "worker.stderr", "wb") as stderr:
        # its own session, like ansible-playbook in local mode: a terminal's Ctrl-C reaches the controller,
        # which decides what the worker is told
        worker = subprocess.Popen(
            [sys.executable, "-c", _WORKER_LAUNCH, str(os.getpid()), *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            start_new_session=True,
        )
    statuses: list[dict[str, Any]] = []
    outcome: dict[str, Any] = {}
    timed_out = threading.Event()

    def on_status(data: dict[str, Any], runner_config: object = None) -> None:
        statuses.append(data)

    def process() -> None:
        try:
            processor = ansible_runner.run(
                streamer="process",
                _input=worker.stdout,
                private_data_dir=str(private_data_dir),
                ident=job.ident,
                event_handler=on_event,
                status_handler=on_status,
                cancel_callback=lambda: False,  # (unused by process) and no signal handler of its own
                quiet=True,
            )
            outcome["status"] = processor.status
        except Exception as exc:  # a stream that breaks mid-zip: the run ended in error
            outcome["status"], outcome["error"] = "error", repr(exc)

    def expire() -> None:
        timed_out.set()
        _stop(worker)

    watchdog = threading.Timer(job.timeout_s + WORKER_GRACE_S, expire)
    watchdog.daemon = True
    try:
        assert worker.stdin is not None
        try:
            ansible_runner.run(
                streamer="transmit",
                _output=worker.stdin,
                private_data_dir=str(job_dir),
                envvars=_path_env(worker_dir / "bin") | job.env,
                cancel_callback=lambda: False,  # else transmit installs SIGINT/SIGTERM handlers of its own
                **job.kwargs(),
            )
            worker.stdin.close()
        except BrokenPipeError:
            pass  # the worker died reading the job; its stream (or its absence) says so to process
        thread = threading.Thread(target=process, name=f"ansible-runner process {job.ident}", daemon=True)
        thread.start()
        watchdog.start()
        try:
            pump(thread)
        except KeyboardInterrupt:
            # SIGTERM: the worker's ansible-runner cancels (kills ansible-playbook's process group) and
            # streams `canceled` and its artifacts back, which process still unpacks
            _stop(worker)
            thread.join(timeout=WORKER_STOP_S)
            raise
    finally:
        watchdog.cancel()
        if "status" in outcome:  # its stream ended: the worker is exiting
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.wait(timeout=WORKER_STOP_S)
        _stop(worker, grace_s=5)  # no worker outlives this call, whatever ended it
        for pipe in (worker.stdin, worker.stdout):
            if pipe is not None and not pipe.closed:
                with contextlib.suppress(BrokenPipeError):
                    pipe.close()
        _write_worker_record(artifacts, worker, worker_dir, argv, statuses, outcome)
    status = "timeout" if timed_out.is_set() else str(outcome.get("status", "error"))
    return status, _artifact_rc(artifacts, worker.returncode)


def _write_worker_record(
    artifacts: Path,
    worker: subprocess.Popen[bytes],
    worker_dir: Path,
    argv: list[str],
    statuses: list[dict[str, Any]],
    outcome: Mapping[str, Any],
) -> None:
    """artifacts/<ident>/worker.json: which worker ran the job, where, and the statuses it streamed back."""
    starting = next((s for s in statuses if s.get("status") == "starting"), {})
    record = {
        "pid": worker.pid,
        "argv": [sys.executable, "-m", "ansible_runner", *argv],
        "private_data_dir": str(worker_dir),
        "returncode": worker.returncode,
        "statuses": [s.get("status") for s in statuses],
        "explanation": next((s["job_explanation"] for s in statuses if s.get("job_explanation")), None),
        "cwd": starting.get("cwd"),  # the worker's project dir: where ansible-playbook ran
        "command": starting.get("command"),
        "error": outcome.get("error"),
    }
    tmp = artifacts / "worker.json.tmp"
    tmp.write_text(json.dumps(record, indent=2), encoding="utf-8")
    os.replace(tmp, artifacts / "worker.json")


def _artifact_rc(artifacts: Path, fallback: int | None) -> int | None:
    """ansible-playbook's rc, from the `rc` file the worker streamed back with its artifacts."""
    try:
        return int((artifacts / "rc").read_text().strip())
    except (OSError, ValueError):
        return fallback


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

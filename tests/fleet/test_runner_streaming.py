"""`execution.mode: streaming`: the spec option, its rendering, and real ansible-runner runs (a tiny playbook,
connection local) through transmit -> `ansible-runner worker` subprocess -> process, against the same runs
in local mode: same per-host results, the worker's own artifacts, a job timeout, Ctrl-C, and a controller
killed with SIGKILL leaving no worker and no ansible-playbook behind. The SSH deploy is tests/e2e/
test_streaming.py."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from fleet import runner
from fleet.errors import ExitCode, Interrupted, RunnerError, SpecError
from fleet.inventory import render_files
from fleet.runner import HostStatus
from fleet.spec import ExecutionMode, embedded_fleet, load_spec

PLAY = """
- name: two hosts, one change each
  hosts: all
  gather_facts: false
  tasks:
    - name: solfleet | Say hello
      ansible.builtin.command: echo hello {{ greeting }}
    - name: solfleet | Report
      ansible.builtin.debug:
        var: solfleet
      vars:
        solfleet: {outcome: activated, current: "2.0.0"}
"""


def hanging_play(marker: str) -> str:
    """n1 answers, then every host sleeps `marker` seconds (a value unique to the test, found with pgrep)."""
    return f"""
- name: answer on n1, then hang everywhere
  hosts: all
  gather_facts: false
  tasks:
    - name: solfleet | Activate release
      ansible.builtin.debug:
        var: solfleet
      vars:
        solfleet: {{outcome: activated, current: "2.0.0", previous: "1.0.0", prior_current: "1.0.0"}}
      when: inventory_hostname == "n1"
    - name: solfleet | Verify release
      ansible.builtin.command: sleep {marker}
      changed_when: false
"""


def make_pdd(root: Path, play: str, mode: str | None) -> Path:
    pdd = root / "pdd"
    (pdd / "project").mkdir(parents=True)
    (pdd / "inventory").mkdir()
    (pdd / "env").mkdir()
    (pdd / "project" / "play.yml").write_text(play)
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory = {"all": {"hosts": {"n1": local, "n2": local}}}
    (pdd / "inventory" / "hosts.yml").write_text(yaml.safe_dump(inventory))
    if mode is not None:
        (pdd / "execution.yml").write_text(f"mode: {mode}\n")
    return pdd


def run(pdd: Path, *, timeout_s: int = 120, ident: str = "t") -> runner.RunResult:
    return runner.run_playbook(
        private_data_dir=pdd,
        playbook="play.yml",
        hosts=["n1", "n2"],
        extravars={"greeting": "world"},
        ident=ident,
        timeout_s=timeout_s,
    )


def alive(needle: str) -> list[str]:
    out = subprocess.run(["pgrep", "-af", needle], capture_output=True, text=True, check=False).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


def _sid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3])
    except (OSError, IndexError, ValueError):
        return None


def survivors(pdd: Path) -> list[str]:
    """This run's worker, reaper and ansible-playbook still alive. Left out: ansible-core's per-host fork
    workers, which put themselves in their own session (os.setsid), so the group kill of ansible-runner's
    own cancel does not reach them; they end with their current task (docs/playbooks.md)."""
    out = []
    for line in alive(str(pdd)):
        pid, cmd = line.split(" ", 1)
        argv = cmd.split()
        fork_worker = _sid(int(pid)) == int(pid) and len(argv) > 1 and str(pdd) not in argv[1]
        if not fork_worker:
            out.append(line)
    return out


@pytest.fixture(autouse=True)
def _end_our_sessions(tmp_path: Path):
    """After each test: end the sessions of whatever the test's runs left (the fork workers above)."""
    yield
    for line in alive(str(tmp_path)):
        sid = _sid(int(line.split(" ", 1)[0]))
        if sid is not None and sid > 1:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(sid, signal.SIGKILL)


def worker_record(pdd: Path, ident: str = "t") -> dict:
    return json.loads((pdd / "artifacts" / ident / "worker.json").read_text())


# -- the option ----------------------------------------------------------------------------------------
def test_execution_mode_defaults_to_local_and_is_rendered(tmp_path: Path, make_spec) -> None:
    spec = load_spec(embedded_fleet(), work_dir=tmp_path)
    assert spec.execution.mode is ExecutionMode.LOCAL
    assert yaml.safe_load(render_files(spec, run_dir=tmp_path)["execution.yml"]) == {"mode": "local"}
    data = yaml.safe_load(embedded_fleet().read_text())
    streaming = make_spec({**data, "execution": {"mode": "streaming"}})
    assert streaming.execution.mode is ExecutionMode.STREAMING
    rendered = render_files(streaming, run_dir=tmp_path)["execution.yml"]
    assert yaml.safe_load(rendered) == {"mode": "streaming"}


@pytest.mark.parametrize(
    ("execution", "message"),
    [
        (
            {"mode": "remote"},
            "execution.mode: 'remote' is not allowed; expected one of: local, streaming",
        ),
        ({"mode": 1}, "execution.mode: 1 is not allowed; expected one of: local, streaming"),
        ({"worker": "x"}, "execution.worker: 'worker' is not allowed; unknown key; allowed keys: mode"),
        ("streaming", "execution: 'streaming' is not allowed; expected a mapping (key: value)"),
    ],
)
def test_a_bad_execution_is_one_line_naming_the_key(make_spec, execution: object, message: str) -> None:
    data = yaml.safe_load(embedded_fleet().read_text())
    with pytest.raises(SpecError) as info:
        make_spec({**data, "execution": execution})
    assert str(info.value) == f"fleet.yml: {message}"
    assert info.value.exit_code is ExitCode.USAGE


def test_a_bad_execution_mode_exits_2_through_the_cli(tmp_path: Path) -> None:
    data = yaml.safe_load(embedded_fleet().read_text())
    spec = tmp_path / "fleet.yml"
    spec.write_text(yaml.safe_dump({**data, "execution": {"mode": "remote"}}))
    env = {k: v for k, v in os.environ.items() if k != "SOLFLEET_WORK"}
    proc = subprocess.run(
        [sys.executable, "-m", "fleet.cli", "--work-dir", str(tmp_path / "work"), "--fleet", str(spec)]
        + ["render", "--out", str(tmp_path / "pdd")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"solfleet: error: {spec}: execution.mode: 'remote' is not allowed; expected one of: local, streaming"
    ]
    assert not (tmp_path / "pdd").exists()


def test_an_unknown_rendered_mode_is_refused(tmp_path: Path) -> None:
    pdd = make_pdd(tmp_path, PLAY, "remote")
    with pytest.raises(RunnerError, match=r"execution\.yml: mode 'remote' is not one of local, streaming"):
        run(pdd)


# -- runs ----------------------------------------------------------------------------------------------
def test_streaming_gives_the_same_host_results_as_local_and_the_worker_ran_it(tmp_path: Path) -> None:
    local = run(make_pdd(tmp_path / "local", PLAY, "local"))
    pdd = make_pdd(tmp_path / "streaming", PLAY, "streaming")
    streamed = run(pdd)
    assert (streamed.status, streamed.rc) == (local.status, local.rc) == ("successful", 0)
    for host in ("n1", "n2"):
        assert streamed.hosts[host] == local.hosts[host]
        assert streamed.hosts[host].status is HostStatus.CHANGED
        assert streamed.hosts[host].solfleet == {"outcome": "activated", "current": "2.0.0", "phases": {}}
    # the worker: its own private_data_dir, unpacked from the stream, where ansible-playbook ran
    record = worker_record(pdd)
    worker_dir = pdd / "streaming" / "t" / "worker"
    assert record["private_data_dir"] == str(worker_dir) and record["returncode"] == 0
    assert record["statuses"] == ["starting", "running", "successful"]
    assert record["cwd"] == str(worker_dir / "project")
    assert str(worker_dir / "env" / "extravars") in " ".join(record["command"])
    assert json.loads((worker_dir / "env" / "extravars").read_text()) == {"greeting": "world"}
    assert not (tmp_path / "local" / "pdd" / "streaming").exists()
    assert not (tmp_path / "local" / "pdd" / "artifacts" / "t" / "worker.json").exists()
    # the worker keeps no job_events (its event handler streams them); process writes each one here, and
    # unpacks the worker's artifacts (stdout, rc) beside them
    assert not list((worker_dir / "artifacts" / "t" / "job_events").iterdir())
    ours = list((streamed.artifacts / "job_events").iterdir())
    assert len(ours) == len(list((local.artifacts / "job_events").iterdir())) > 0
    stdout = (worker_dir / "artifacts" / "t" / "stdout").read_text()
    assert "PLAY [two hosts, one change each]" in stdout
    assert (streamed.artifacts / "stdout").read_text() == stdout
    assert (streamed.artifacts / "rc").read_text() == "0"


def test_a_streaming_job_timeout_carries_what_each_host_had_answered(tmp_path: Path) -> None:
    marker = f"4{uuid.uuid4().int % 10}.{uuid.uuid4().int % 10**6}"
    pdd = make_pdd(tmp_path, hanging_play(marker), "streaming")
    started = time.monotonic()
    with pytest.raises(RunnerError, match=r"ansible-runner timeout running play\.yml") as caught:
        run(pdd, timeout_s=4)
    assert time.monotonic() - started < 30  # stopped by the worker's job timeout, not by the sleep
    progress = caught.value.progress
    assert progress["n1"].solfleet["outcome"] == "activated"
    assert progress["n2"].status is HostStatus.NOT_RUN
    assert worker_record(pdd)["statuses"][-1] == "timeout"
    assert not survivors(pdd), survivors(pdd)


def test_ctrl_c_cancels_the_worker_run_and_leaves_nothing_running(tmp_path: Path) -> None:
    # a sleep far longer than any wait here: the run can only end by the interrupt, however loaded the machine
    marker = f"5{uuid.uuid4().int % 10}{uuid.uuid4().int % 10}.{uuid.uuid4().int % 10**6}"
    pdd = make_pdd(tmp_path, hanging_play(marker), "streaming")
    sent: list[float] = []
    # what a terminal's Ctrl-C does in a Python CLI; if another test left a handler that swallows it, this
    # test would wait out the whole sleep and report the leak as a missed cancel
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, signal.getsignal(signal.SIGINT)

    def interrupt_once_sleeping() -> None:
        deadline = time.monotonic() + 240
        while not alive(f"sleep {marker}") and time.monotonic() < deadline:
            time.sleep(0.2)
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)  # KeyboardInterrupt in the main thread, as a terminal's Ctrl-C

    threading.Thread(target=interrupt_once_sleeping, daemon=True).start()
    with pytest.raises(Interrupted) as caught:
        run(pdd, timeout_s=900)
    assert sent and time.monotonic() - sent[0] < 40, "the cancel took longer than the worker's own 30 s"
    assert caught.value.progress["n1"].solfleet["outcome"] == "activated"
    record = worker_record(pdd)
    assert record["statuses"][-1] == "canceled", record  # the worker cancelled and reported it
    assert record["returncode"] is not None
    assert not survivors(pdd), survivors(pdd)


CONTROLLER = """
import sys
from pathlib import Path
from fleet import runner
runner.run_playbook(private_data_dir=Path(sys.argv[1]), playbook="play.yml", hosts=["n1", "n2"],
                    extravars={}, ident="t", timeout_s=120)
"""


def until(cond: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.2)
    return cond()


@contextlib.contextmanager
def controller_of(pdd: Path) -> Iterator[subprocess.Popen[bytes]]:
    """run_playbook in a controller process of its own session, killed at the end if still alive."""
    controller = subprocess.Popen(
        [sys.executable, "-c", CONTROLLER, str(pdd)],
        env={**os.environ, "PYTHONPATH": str(Path(runner.__file__).parents[1])},
        start_new_session=True,
    )
    try:
        yield controller
    finally:
        if controller.poll() is None:
            controller.kill()


def test_a_controller_killed_outright_takes_the_worker_and_ansible_playbook_with_it(tmp_path: Path) -> None:
    marker = f"6{uuid.uuid4().int % 10}.{uuid.uuid4().int % 10**6}"
    pdd = make_pdd(tmp_path, hanging_play(marker), "streaming")
    with controller_of(pdd) as controller:
        until(lambda: bool(alive(f"sleep {marker}")), 60)
        workers = [line for line in alive(str(pdd)) if "ansible_runner worker" in line]
        assert workers, f"no ansible-runner worker for {pdd}: {alive(str(pdd))}"
        assert alive(f"sleep {marker}"), "the job never started in the worker"
        os.kill(controller.pid, signal.SIGKILL)
        controller.wait(timeout=10)
        assert until(lambda: not survivors(pdd), 20), f"outlived the controller: {survivors(pdd)}"


def test_a_local_controller_killed_outright_takes_every_host_task_with_it(tmp_path: Path) -> None:
    # local mode: the reaper in front of ansible-playbook gets SIGTERM from the kernel when the controller
    # dies and kills every descendant, ansible-core's per-host workers included (they leave the process
    # group with os.setsid), so no host's task runs on after the controller. (In streaming mode the
    # worker's own ansible-runner kills the group first, SIGKILL, and a per-host worker ends with its
    # task: docs/playbooks.md.)
    marker = f"7{uuid.uuid4().int % 10}.{uuid.uuid4().int % 10**6}"
    pdd = make_pdd(tmp_path, hanging_play(marker), "local")
    with controller_of(pdd) as controller:
        assert until(lambda: len(alive(f"sleep {marker}")) == 2, 60), "the job never reached both hosts"
        os.kill(controller.pid, signal.SIGKILL)
        controller.wait(timeout=10)
        gone = until(lambda: not alive(f"sleep {marker}") and not alive(str(pdd)), 20)
        assert gone, f"outlived the controller: {alive(f'sleep {marker}') + alive(str(pdd))}"


def test_a_killed_controller_leaves_what_a_node_module_detached_on_purpose(tmp_path: Path) -> None:
    # the operator service's instances on a `connection: local` node (library/solfleet_serve.py) are started
    # to outlive the run, marked SOLFLEET_DETACHED=1; the reaper, a subreaper, would otherwise sweep them
    marker = f"8{uuid.uuid4().int % 10}.{uuid.uuid4().int % 10**6}"
    kept = f"9{uuid.uuid4().int % 10}.{uuid.uuid4().int % 10**6}"
    play = hanging_play(marker).replace(
        "    - name: solfleet | Verify release\n",
        "    - name: solfleet | Start a detached service\n"
        f"      ansible.builtin.shell: SOLFLEET_DETACHED=1 setsid sleep {kept} </dev/null >/dev/null 2>&1 &\n"
        "      changed_when: true\n"
        "    - name: solfleet | Verify release\n",
    )
    pdd = make_pdd(tmp_path, play, "local")
    try:
        with controller_of(pdd) as controller:
            assert until(lambda: len(alive(f"sleep {marker}")) == 2, 60), "the job never reached both hosts"
            assert len(alive(f"sleep {kept}")) == 2, alive(f"sleep {kept}")
            os.kill(controller.pid, signal.SIGKILL)
            controller.wait(timeout=10)
            gone = until(lambda: not alive(f"sleep {marker}") and not alive(str(pdd)), 20)
            assert gone, f"outlived the controller: {alive(f'sleep {marker}') + alive(str(pdd))}"
            assert len(alive(f"sleep {kept}")) == 2, "the sweep killed a detached process"
    finally:
        for line in alive(f"sleep {kept}"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(line.split(" ", 1)[0]), signal.SIGKILL)


LEAK_PLAY = """
- name: what this run was given
  hosts: all
  gather_facts: false
  tasks:
    - name: solfleet | Report
      ansible.builtin.debug:
        var: solfleet
      vars:
        solfleet: {outcome: "{{ first_only | default('unset') }}", current: "{{ both }}"}
"""


@pytest.mark.parametrize("mode", ["local", "streaming"])
def test_a_later_run_in_the_same_run_dir_sees_only_its_own_extravars(tmp_path: Path, mode: str) -> None:
    # ansible-runner dumps the first run's extravars to env/extravars and passes that file to later runs
    # too: without the runner's guard, `first_only` leaks into the second step of an operation.
    pdd = make_pdd(tmp_path, LEAK_PLAY, mode)
    common = {"private_data_dir": pdd, "playbook": "play.yml", "hosts": ["n1"], "timeout_s": 120}
    first = runner.run_playbook(**common, extravars={"first_only": "leaked", "both": "1"}, ident="a")
    assert (first.hosts["n1"].solfleet["outcome"], first.hosts["n1"].solfleet["current"]) == ("leaked", "1")
    second = runner.run_playbook(**common, extravars={"both": "2"}, ident="b")
    assert (second.hosts["n1"].solfleet["outcome"], second.hosts["n1"].solfleet["current"]) == ("unset", "2")

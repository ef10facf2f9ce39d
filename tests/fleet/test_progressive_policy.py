"""Progressive steps without Ansible: the two spec keys, the plan that pauses, the paused state in a real
SQLite ledger (it outlives the process that paused), promote's check of where the pause left each node, the
status verdict, and the CLI's one-line refusals (exit 2, nothing touched). The runs on real nodes are in
tests/e2e/test_progressive.py."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fleet.errors import ExitCode, SpecError, UsageError
from fleet.ledger import Baseline, Ledger, OpStatus, new_operation_id
from fleet.plan import Plan, plan_rollout
from fleet.progressive import find_paused, misplaced
from fleet.spec import embedded_fleet, load_spec
from fleet.status import NodeStatus, status_exit_code
from fleet.workdir import ledger_path

SPEC = {
    "fleet": "t",
    "defaults": {"connection": "local", "python": "/usr/bin/python3"},
    "nodes": [
        {"name": "a1", "root": "/srv/a1", "labels": ["canary"]},
        {"name": "a2", "root": "/srv/a2"},
        {"name": "a3", "root": "/srv/a3"},
    ],
    "rollout": {"canary": {"labels": ["canary"]}, "batches": [1]},
}


def with_rollout(**keys: object) -> dict:
    data = copy.deepcopy(SPEC)
    data["rollout"].update(keys)
    return data


# -- the spec ---------------------------------------------------------------------------------------------
def test_preflight_health_is_on_and_unhealthy_fails_by_default(make_spec) -> None:
    from fleet.policy import UnhealthyPolicy

    rollout = make_spec(with_rollout()).rollout
    assert (rollout.preflight_health, rollout.unhealthy) == (True, UnhealthyPolicy.FAIL)
    rollout = make_spec(with_rollout(preflight_health=False, unhealthy="skip")).rollout
    assert (rollout.preflight_health, rollout.unhealthy) == (False, UnhealthyPolicy.SKIP)


def test_the_lease_outlives_every_step_a_rollout_can_run_to_its_limit(make_spec) -> None:
    """Each later batch's preflight health run is bounded by timeouts.run_s like the batch itself: a lease of
    run_s x (batches + 2) could expire under a live rollout whose preflights ran long, and let a second
    controller in. Canary + 2 batches of 1 here: 3 batches, 2 of them with a preflight run of their own."""
    from fleet.operation import Operation
    from fleet.recovery import lease_seconds

    for preflight, later_preflights in ((True, 2), (False, 0)):
        spec = make_spec(with_rollout(preflight_health=preflight))
        plan = plan_rollout(list(spec.nodes), spec.rollout, version="1.0.0")
        assert len(plan.batches) == 3
        t = spec.timeouts
        # the lease call, 3 batches, one undo, the later preflights; the undo's read, a renew, the lease end
        runs = 1 + 3 + 1 + later_preflights
        assert lease_seconds(Operation(spec, plan)) == t.run_s * runs + 3 * (2 * t.status_s + t.connect_s)


def test_both_keys_default_off(make_spec) -> None:
    rollout = make_spec(with_rollout()).rollout
    assert (rollout.pause_after_canary, rollout.batch_deadline_s) == (False, None)
    rollout = make_spec(with_rollout(pause_after_canary=True, batch_deadline_s=600)).rollout
    assert (rollout.pause_after_canary, rollout.batch_deadline_s) == (True, 600)


BAD = [
    ("pause_after_canary", "yes", "expected true or false"),
    ("pause_after_canary", 1, "expected true or false"),
    ("batch_deadline_s", -1, "expected an integer 1..86400"),
    ("batch_deadline_s", 0, "expected an integer 1..86400"),
    ("batch_deadline_s", "30", "expected an integer 1..86400"),
    ("batch_deadline_s", 2.5, "expected an integer 1..86400"),
    ("batch_deadline_s", True, "expected an integer 1..86400"),
    ("preflight_health", "no", "expected true or false"),
    ("unhealthy", "quarantine", "expected one of: fail, skip"),
    ("unhealthy", None, "expected one of: fail, skip"),
]


@pytest.mark.parametrize(("key", "value", "allowed"), BAD, ids=[f"{k}={v!r}" for k, v, _ in BAD])
def test_a_bad_value_is_one_line_naming_the_field(make_spec, key: str, value: object, allowed: str) -> None:
    with pytest.raises(SpecError) as info:
        make_spec(with_rollout(**{key: value}))
    message = str(info.value)
    assert "\n" not in message and f": rollout.{key}: {value!r} is not allowed; {allowed}" in message


def test_a_pause_needs_a_canary_to_pause_after(make_spec) -> None:
    data = with_rollout(pause_after_canary=True)
    del data["rollout"]["canary"]
    with pytest.raises(SpecError, match=r"rollout\.pause_after_canary: True .*needs rollout\.canary"):
        make_spec(data)


def cli(*args: str, work: Path, fleet: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SOLFLEET_WORK"}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "fleet.cli",
            "--fleet",
            str(fleet or embedded_fleet()),
            "--work-dir",
            str(work),
        ]
        + list(args),
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("line", "field"),
    [("batch_deadline_s: -1", "rollout.batch_deadline_s: -1"), ('pause_after_canary: "yes"', "'yes'")],
)
def test_through_the_cli_a_bad_key_exits_2_with_one_line(tmp_path: Path, line: str, field: str) -> None:
    text = embedded_fleet().read_text().replace("  keep_releases: 3", f"  keep_releases: 3\n  {line}")
    assert line in text
    spec = tmp_path / "fleet.yml"
    spec.write_text(text)
    proc = cli("deploy", "--version", "1.0.0", "--yes", work=tmp_path / "w", fleet=spec)
    assert proc.returncode == ExitCode.USAGE, proc.stderr
    (out,) = proc.stderr.strip().splitlines()
    assert out.startswith("solfleet: error: ") and field in out, out
    assert not (tmp_path / "w").exists()  # no ledger, no run dir, no node root


# -- the plan ---------------------------------------------------------------------------------------------
def test_the_plan_pauses_only_a_deploy_with_batches_after_its_canary(make_spec) -> None:
    spec = make_spec(with_rollout(pause_after_canary=True, batch_deadline_s=30))
    plan = plan_rollout(list(spec.nodes), spec.rollout, version="1.1.0")
    assert plan.pauses and plan.batch_deadline_s == 30
    assert [b.name for b in plan.batches] == ["canary", "batch 1", "batch 2"]
    assert Plan.from_json(plan.to_json()) == plan  # what the ledger stores is what a promote runs
    assert not plan_rollout(list(spec.nodes), spec.rollout, version="1.1.0", kind="stage").pauses
    only_canary = plan_rollout(list(spec.nodes[:1]), spec.rollout, version="1.1.0")
    assert not only_canary.pauses  # nothing left to promote: it runs to its end
    no_canary = plan_rollout(list(spec.nodes[1:]), spec.rollout, version="1.1.0")  # --limit a2,a3
    assert no_canary.batches[0].name == "batch 1" and not no_canary.pauses


# -- the ledger -------------------------------------------------------------------------------------------
PAUSE = """
import sys
from fleet.ledger import Baseline, HostRecord, Ledger, OpStatus
from fleet.plan import Plan
plan = Plan.from_json({plan!r})
with Ledger(__import__("pathlib").Path(sys.argv[1])) as ledger:
    ledger.begin(op_id={op_id!r}, kind="deploy", version="1.1.0", fleet="local", plan=plan.to_json())
    ledger.record_baseline({op_id!r}, [Baseline(h, True, "1.0.0", "s", "0.9.0") for h in plan.hosts])
    ledger.record_hosts({op_id!r}, [HostRecord("canary", "n1", "activated", True, "1.0.0", "1.1.0", None, "",
                                               {{}})])
    ledger.record_resume({op_id!r}, {{"extravars": {{"solfleet_version": "1.1.0"}}, "gates": {{}}}})
    ledger.finish({op_id!r}, OpStatus.PAUSED, "paused after the canary")
"""


@pytest.fixture
def paused_fleet(tmp_path: Path) -> tuple:
    """The embedded fleet with pause_after_canary, and a ledger holding one rollout paused after canary n1,
    written by another process that has exited (a controller restart)."""
    text = (
        embedded_fleet()
        .read_text()
        .replace("  keep_releases: 3", "  keep_releases: 3\n  pause_after_canary: true")
    )
    (tmp_path / "fleet.yml").write_text(text)
    spec = load_spec(tmp_path / "fleet.yml", work_dir=tmp_path / "work")
    plan = plan_rollout(list(spec.nodes), spec.rollout, version="1.1.0")
    op_id = new_operation_id()
    path = ledger_path(spec)
    path.parent.mkdir(parents=True)
    code = textwrap.dedent(PAUSE).format(plan=plan.to_json(), op_id=op_id)
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, timeout=60)
    return spec, plan, op_id


def test_a_paused_rollout_outlives_its_process_and_is_owed_nothing(paused_fleet: tuple) -> None:
    spec, plan, op_id = paused_fleet
    with Ledger(ledger_path(spec)) as ledger:  # a fresh open: the pausing pid is gone, the row stays paused
        (row,) = ledger.operations()
        assert (row.id, row.status) == (op_id, "paused")
        assert [op.id for op in ledger.paused()] == [op_id]
        assert ledger.unfinished() == []  # not owed a return to its baseline: promote or abort decides
        assert op_id not in ledger.own_stale_rollouts()  # no later rollout of this ledger takes its leases
        # the canary is where the pause left it, the rest on their baseline: status calls that in sync
        assert ledger.desired_versions() == {"n1": "1.1.0", "n2": "1.0.0", "n3": "1.0.0"}
        assert ledger.resume_data(op_id)["extravars"] == {"solfleet_version": "1.1.0"}


def test_resume_makes_it_running_and_an_unfinished_abort_is_owed_its_baseline(paused_fleet: tuple) -> None:
    spec, _plan, op_id = paused_fleet
    with Ledger(ledger_path(spec)) as ledger:
        ledger.resume(op_id)
        (row,) = ledger.operations()
        assert row.status == "running" and row.finished is None
        assert row.controller.endswith(f":{os.getpid()}")  # this process now owns it (a SIGKILL is seen)
        with pytest.raises(ValueError, match="not a paused operation"):
            ledger.resume(op_id)
        ledger.finish(op_id, OpStatus.ABORTED, "could not return n1")
        assert [op.id for op in ledger.unfinished()] == [op_id]
        ledger.mark_recovered(op_id, by=op_id)
        assert ledger.unfinished() == [] and ledger.paused() == []


def test_find_paused_reads_the_plan_baseline_and_where_the_canary_is(paused_fleet: tuple) -> None:
    spec, plan, op_id = paused_fleet
    for wanted in (None, op_id):
        paused = find_paused(spec, wanted, command="promote")
        assert paused.id == op_id and paused.plan == plan and paused.canary == ("n1",)
        assert paused.at_pause == {"n1": "1.1.0"}
        assert paused.baseline["n2"] == Baseline("n2", True, "1.0.0", "s", "0.9.0")


@pytest.mark.parametrize(
    ("op_id", "says"),
    [
        ("r-20990101T000000Z-abcdef", "'r-20990101T000000Z-abcdef' is not a rollout of fleet local"),
        ("", "is not a rollout of fleet local"),
    ],
)
def test_find_paused_refuses_an_unknown_id(paused_fleet: tuple, op_id: str, says: str) -> None:
    spec, _plan, paused_id = paused_fleet
    with pytest.raises(UsageError, match=f"promote: .*{says}.*paused rollouts: {paused_id}"):
        find_paused(spec, op_id, command="promote")


# -- promote's check of where the pause left each node -----------------------------------------------------
def state(host: str, current: str | None, previous: str | None, reachable: bool = True) -> Baseline:
    return Baseline(host, reachable, current, None, previous)


def test_misplaced_names_each_node_not_where_the_pause_left_it(paused_fleet: tuple) -> None:
    spec, _plan, op_id = paused_fleet
    paused = find_paused(spec, op_id, command="promote")
    where = {"n1": state("n1", "1.1.0", "1.0.0"), "n2": state("n2", "1.0.0", "0.9.0")}
    assert misplaced(paused, {**where, "n3": state("n3", "1.0.0", "0.9.0")}) == []
    moved = {**where, "n3": state("n3", "1.2.0", "1.0.0")}
    assert misplaced(paused, moved) == [
        "n3: current 1.2.0, previous 1.0.0; its baseline is current 1.0.0, previous 0.9.0"
    ]
    back = {**where, "n1": state("n1", "1.0.0", "0.9.0"), "n3": state("n3", "1.0.0", "0.9.0")}
    assert misplaced(paused, back) == ["n1: current is 1.0.0, the pause left it on 1.1.0"]
    down = {**where, "n3": state("n3", None, None, reachable=False)}
    assert misplaced(paused, down) == ["n3: no answer, so it cannot be confirmed where the pause left it"]
    assert misplaced(paused, down, unreachable_ok=True) == []  # unreachable: skip, and not the canary
    canary_down = {**where, "n1": state("n1", None, None, reachable=False), "n3": where["n2"]}
    assert misplaced(paused, canary_down, unreachable_ok=True)[0].startswith("n1: no answer")


# -- status -----------------------------------------------------------------------------------------------
def node(name: str, current: str, desired: str, drift: str = "in_sync") -> NodeStatus:
    return NodeStatus(
        name=name,
        reachable=True,
        current=current,
        previous=None,
        releases=[current],
        last_event=None,
        simulated=True,
        desired=desired,
        drift=drift,
        error="",
    )


def test_status_of_a_paused_fleet_is_paused_unless_something_worse() -> None:
    split = [node("n1", "1.1.0", "1.1.0"), node("n2", "1.0.0", "1.0.0")]
    assert status_exit_code(split) is ExitCode.SPLIT
    assert status_exit_code(split, paused=True) is ExitCode.PAUSED
    drifted = [node("n1", "1.1.0", "1.1.0"), node("n2", "1.2.0", "1.0.0", drift="drift")]
    assert status_exit_code(drifted, paused=True) is ExitCode.DRIFT
    same = [node("n1", "1.1.0", "1.1.0"), node("n2", "1.1.0", "1.1.0")]
    assert status_exit_code(same, paused=True) is ExitCode.PAUSED  # never 0 while a rollout waits


# -- the CLI's refusals: one line, exit 2, nothing touched ---------------------------------------------
def test_promote_and_abort_with_nothing_paused_exit_2(tmp_path: Path) -> None:
    for command in ("promote", "abort"):
        proc = cli(command, "--yes", work=tmp_path / "w")
        assert proc.returncode == ExitCode.USAGE, proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert line == f"solfleet: error: {command}: fleet local has no ledger yet, so no paused rollout"
    assert not (tmp_path / "w").exists()


def test_while_paused_deploy_and_rollback_are_refused_naming_both_commands(paused_fleet: tuple) -> None:
    spec, _plan, op_id = paused_fleet
    for args in (("deploy", "--version", "1.2.0", "--yes"), ("rollback", "--yes")):
        proc = cli(*args, work=spec.work_dir, fleet=spec.source)
        assert proc.returncode == ExitCode.USAGE, proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert f"rollout {op_id} (deploy 1.1.0) is paused after its canary" in line, line
        assert f"`solfleet promote {op_id}`" in line and f"`solfleet abort {op_id}`" in line, line
    with Ledger(ledger_path(spec)) as ledger:
        assert [(op.id, op.status) for op in ledger.operations()] == [(op_id, "paused")]
    assert not (spec.work_dir / "local-fleet").exists()  # no node root was touched


def test_abort_of_an_operation_that_is_not_paused_exits_2(paused_fleet: tuple) -> None:
    spec, _plan, op_id = paused_fleet
    with Ledger(ledger_path(spec)) as ledger:
        other = ledger.begin(op_id=new_operation_id(), kind="rollback", version=None, fleet="local", plan={})
        ledger.finish(other, OpStatus.SUCCEEDED)
    proc = cli("abort", other, "--yes", work=spec.work_dir, fleet=spec.source)
    assert proc.returncode == ExitCode.USAGE, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert f"abort: {other} is succeeded, not paused" in line and f"paused rollouts: {op_id}" in line

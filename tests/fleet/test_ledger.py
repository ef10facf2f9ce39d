"""The ledger is a real SQLite file; an interrupted run is never lost."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fleet.errors import Interrupted
from fleet.ledger import HostRecord, Ledger, OpStatus, new_operation_id, proc_identity
from fleet.operation import Operation
from fleet.plan import plan_rollout
from fleet.spec import embedded_fleet, load_spec
from fleet.workdir import ledger_path


def rec(host: str, outcome: str, before: str | None, after: str | None, step: str = "batch 1") -> HostRecord:
    return HostRecord(
        step=step,
        host=host,
        outcome=outcome,
        changed=outcome == "activated",
        version_before=before,
        version_after=after,
        failed_phase=None,
        message="m",
        phases={"push": 0.5, "verify": 2.0},
    )


def test_operations_and_host_outcomes_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite"
    with Ledger(path) as ledger:
        op = ledger.begin(
            op_id=new_operation_id(),
            kind="deploy",
            version="1.1.0",
            fleet="f",
            plan={"batches": [["a", "b"]]},
        )
        ledger.record_hosts(
            op, [rec("a", "activated", "1.0.0", "1.1.0"), rec("b", "refused", "1.0.0", "1.0.0")]
        )
        ledger.finish(op, OpStatus.FAILED, "b refused")
    with Ledger(path) as ledger:  # a fresh connection reads what was committed
        (op_row,) = ledger.operations()
        assert (op_row.kind, op_row.version, op_row.status, op_row.message) == (
            "deploy",
            "1.1.0",
            "failed",
            "b refused",
        )
        assert op_row.plan == {"batches": [["a", "b"]]} and op_row.finished is not None
        hosts = ledger.host_outcomes(op_row.id)
        assert [(h.host, h.outcome, h.version_before, h.version_after) for h in hosts] == [
            ("a", "activated", "1.0.0", "1.1.0"),
            ("b", "refused", "1.0.0", "1.0.0"),
        ]
        assert hosts[0].phases == {"push": 0.5, "verify": 2.0}
    # and it is plain SQLite anyone can query
    rows = sqlite3.connect(path).execute("SELECT host, outcome FROM host_outcomes ORDER BY id").fetchall()
    assert rows == [("a", "activated"), ("b", "refused")]


def test_desired_version_is_the_latest_known_per_host_and_ignores_stage(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.sqlite") as ledger:
        d1 = ledger.begin(op_id="r-1", kind="deploy", version="1.0.0", fleet="f", plan={})
        ledger.record_hosts(d1, [rec("a", "activated", None, "1.0.0"), rec("b", "activated", None, "1.0.0")])
        s = ledger.begin(op_id="r-2", kind="stage", version="2.0.0", fleet="f", plan={})
        ledger.record_hosts(s, [rec("a", "staged", "1.0.0", "1.0.0")])
        d2 = ledger.begin(op_id="r-3", kind="deploy", version="1.1.0", fleet="f", plan={})
        ledger.record_hosts(
            d2, [rec("a", "activated", "1.0.0", "1.1.0"), rec("b", "unreachable", None, None)]
        )
        assert ledger.desired_versions() == {"a": "1.1.0", "b": "1.0.0"}


def test_a_killed_controller_leaves_a_row_marked_interrupted(tmp_path: Path) -> None:
    """A real child process begins an operation and dies without finishing it (os._exit, as SIGKILL would)."""
    path = tmp_path / "l.sqlite"
    child = textwrap.dedent(f"""
        import os
        from fleet.ledger import Ledger
        ledger = Ledger(__import__("pathlib").Path({str(path)!r}))
        ledger.begin(op_id="r-killed", kind="deploy", version="3.0.0", fleet="f", plan={{}})
        os._exit(9)
    """)
    proc = subprocess.run([sys.executable, "-c", child], timeout=60)
    assert proc.returncode == 9
    raw = sqlite3.connect(path).execute("SELECT status FROM operations WHERE id='r-killed'").fetchone()
    assert raw == ("running",)  # the row survived the crash
    with Ledger(path) as ledger:  # the next solfleet run on this controller sees the pid is gone
        (op,) = ledger.operations()
        assert op.status == "interrupted" and "without finishing" in op.message


def test_a_killed_controller_whose_pid_now_names_another_process_is_interrupted(tmp_path: Path) -> None:
    """A pid is reused once its process is gone (after a reboot of the controller host, within minutes). The
    kernel cannot be made to hand a chosen pid to a new process, so the row is pointed at a live process
    started after the controller died: the state a reuse leaves. The pid alone would keep the dead run
    `running` for ever (never reconciled, its leases never taken over); its recorded start time says it is
    gone."""
    path = tmp_path / "l.sqlite"
    child = textwrap.dedent(f"""
        import os
        from fleet.ledger import Ledger
        ledger = Ledger(__import__("pathlib").Path({str(path)!r}))
        ledger.begin(op_id="r-reused", kind="deploy", version="3.0.0", fleet="f", plan={{}})
        os._exit(9)
    """)
    assert subprocess.run([sys.executable, "-c", child], timeout=60).returncode == 9
    other = subprocess.Popen(["sleep", "60"])
    try:
        db = sqlite3.connect(path)
        (recorded,) = db.execute("SELECT proc_start FROM operations WHERE id='r-reused'").fetchone()
        assert recorded and recorded != proc_identity(other.pid)
        with db:
            db.execute("UPDATE operations SET pid = ? WHERE id = 'r-reused'", (other.pid,))
        db.close()
        with Ledger(path) as ledger:
            (op,) = ledger.operations()
            assert op.status == "interrupted" and "without finishing" in op.message
    finally:
        other.kill()
        other.wait()


def test_a_row_without_a_recorded_start_time_is_judged_by_its_pid(tmp_path: Path) -> None:
    """A row from before start times were recorded (NULL) keeps the old rule: a live pid is a live run."""
    path = tmp_path / "l.sqlite"
    with Ledger(path) as first:
        first.begin(op_id="r-old", kind="deploy", version="1.0.0", fleet="f", plan={})
    db = sqlite3.connect(path)
    with db:
        db.execute("UPDATE operations SET proc_start = NULL WHERE id = 'r-old'")
    db.close()
    with Ledger(path) as second:
        assert second.operations()[0].status == "running"


def test_proc_identity_reads_a_command_name_with_spaces_and_parentheses(tmp_path: Path) -> None:
    odd = tmp_path / "a) (b"
    odd.symlink_to("/bin/sleep")
    proc = subprocess.Popen([str(odd), "60"])
    try:
        ident = proc_identity(proc.pid)
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        assert ident is not None and ident.startswith(boot + ":") and ident.split(":")[1].isdigit()
        assert ident != proc_identity(os.getpid())  # another process, another start time
    finally:
        proc.kill()
        proc.wait()
    assert proc_identity(proc.pid) is None  # reaped: nothing to read


def test_a_live_running_operation_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite"
    with Ledger(path) as first:
        first.begin(op_id="r-live", kind="deploy", version="1.0.0", fleet="f", plan={})
        with Ledger(path) as second:  # same pid, still alive
            assert second.operations()[0].status == "running"
    (pid,) = sqlite3.connect(path).execute("SELECT pid FROM operations WHERE id='r-live'").fetchone()
    assert pid == os.getpid()  # the row names this live process, which is why it was left alone


def test_ctrl_c_during_an_operation_marks_it_interrupted(tmp_path: Path) -> None:
    spec = load_spec(embedded_fleet(), work_dir=tmp_path)
    plan = plan_rollout(list(spec.nodes), spec.rollout, version="1.0.0")
    op = Operation(spec, plan)

    def body(ledger: Ledger) -> None:
        ledger.record_hosts(op.op_id, [rec("n1", "activated", None, "1.0.0", step="canary")])
        raise KeyboardInterrupt

    with pytest.raises(Interrupted):
        op.execute(body)
    with Ledger(ledger_path(spec)) as ledger:
        (row,) = ledger.operations()
        assert row.id == op.op_id and row.status == "interrupted"
        assert [h.host for h in ledger.host_outcomes(op.op_id)] == ["n1"]  # recorded before the interrupt
    assert (op.pdd / "inventory" / "hosts.yml").is_file()  # the run dir is kept for inspection


def test_failed_rows_of_an_older_ledger_owe_nothing_after_the_upgrade(tmp_path: Path) -> None:
    """A `failed` rollout with a baseline and no recovered_by is owed a return now; one written by a solfleet
    from before that rule (user_version 0) owed nothing then and must not start owing on upgrade."""
    from fleet.ledger import Baseline

    path = tmp_path / "l.sqlite"
    with Ledger(path) as ledger:
        for op_id in ("old", "new"):
            ledger.begin(op_id=op_id, kind="deploy", version="2.0.0", fleet="f", plan={})
            ledger.record_baseline(op_id, [Baseline("a", True, "1.0.0", None, None)])
            ledger.finish(op_id, OpStatus.FAILED, "could not return every host to the baseline")
            if op_id == "old":  # as an older solfleet left it
                ledger._db.execute("PRAGMA user_version = 0")
                break
    with Ledger(path) as ledger:  # the upgrade
        ledger.begin(op_id="new", kind="deploy", version="2.0.0", fleet="f", plan={})
        ledger.record_baseline("new", [Baseline("a", True, "1.0.0", None, None)])
        ledger.finish("new", OpStatus.FAILED, "could not return every host to the baseline")
    with Ledger(path) as ledger:
        assert [op.id for op in ledger.unfinished()] == ["new"]
        old = ledger.operation("old")
        assert old is not None and old.recovered_by == "old"

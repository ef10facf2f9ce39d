"""`solfleet status` exit codes: a node that answered nothing is not "fine". The real CLI runs status.yml
with Ansible (connection local) against the embedded fleet; the fault is real (a journal that is a
directory makes the node's status module fail)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from fleet.errors import ExitCode
from fleet.status import NodeStatus, drift_of, status_exit_code


def solfleet(*args: str, work: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SOLFLEET_WORK"}
    return subprocess.run(
        [sys.executable, "-m", "fleet.cli", "--work-dir", str(work), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=120,
    )


def test_status_exits_1_when_a_reachable_node_returns_no_state(tmp_path: Path) -> None:
    work = tmp_path / "work"
    journal = work / "local-fleet" / "n1" / "journal.jsonl"
    journal.mkdir(parents=True)  # the node's status module cannot read it: the task fails
    broken = solfleet("status", "--json", work=work, cwd=tmp_path)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    nodes = {n["name"]: n for n in json.loads(broken.stdout)["nodes"]}
    assert nodes["n1"]["reachable"] is True and nodes["n1"]["current"] is None
    assert "Is a directory" in nodes["n1"]["error"]
    assert nodes["n2"]["error"] == "" and nodes["n2"]["drift"] == "no_record"

    journal.rmdir()
    fixed = solfleet("status", "--json", work=work, cwd=tmp_path)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert all(n["error"] == "" for n in json.loads(fixed.stdout)["nodes"])


def node(name: str, *, reachable: bool = True, error: str = "") -> NodeStatus:
    return NodeStatus(
        name=name,
        reachable=reachable,
        current=None,
        previous=None,
        releases=[],
        last_event=None,
        simulated=True,
        desired=None,
        drift="unknown" if not reachable or error else "no_record",
        error=error,
    )


def test_status_exit_code_precedence() -> None:
    down = node("a", reachable=False, error="unreachable")
    no_state = node("b", error="Task failed")
    assert status_exit_code([node("c"), node("d")]) is ExitCode.OK
    assert status_exit_code([node("c"), down]) is ExitCode.UNREACHABLE
    assert status_exit_code([no_state, node("c")]) is ExitCode.OPERATION_FAILED
    assert status_exit_code([down, no_state]) is ExitCode.OPERATION_FAILED  # like deploy: 3 only if alone


def test_status_says_unverified_when_current_is_not_a_verified_release(tmp_path: Path) -> None:
    """n1's current points at a release whose verify.json says ok but which failed after activation
    (verify/failed.json): drift `unverified`, exit 1. Without failed.json it is a verified current again."""
    work = tmp_path / "work"
    root = work / "local-fleet" / "n1"
    verify = root / "releases" / "1.0.0" / "verify"
    verify.mkdir(parents=True)
    (verify / "verify.json").write_text(json.dumps({"ok": True}))
    (verify / "failed.json").write_text(json.dumps({"reason": "health after activation: injected"}))
    (root / "current").symlink_to("releases/1.0.0")
    failed = solfleet("status", "--json", work=work, cwd=tmp_path)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    nodes = {n["name"]: n for n in json.loads(failed.stdout)["nodes"]}
    assert (nodes["n1"]["current"], nodes["n1"]["current_verified"], nodes["n1"]["drift"]) == (
        "1.0.0",
        False,
        "unverified",
    )
    assert nodes["n1"]["releases"] == [] and nodes["n1"]["error"] == ""
    assert nodes["n2"]["drift"] == "no_record" and nodes["n2"]["current_verified"] is False

    (verify / "failed.json").unlink()
    fixed = solfleet("status", "--json", work=work, cwd=tmp_path)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    n1 = {n["name"]: n for n in json.loads(fixed.stdout)["nodes"]}["n1"]
    assert (n1["current_verified"], n1["drift"], n1["releases"]) == (True, "no_record", ["1.0.0"])


def test_unverified_current_outranks_the_ledger_and_fails_the_exit_code() -> None:
    assert drift_of("1.0.0", "1.0.0", reachable=True, current_verified=False) == "unverified"
    assert drift_of("1.0.0", None, reachable=True, current_verified=None) == "unverified"
    assert drift_of("1.0.0", "1.0.0", reachable=True, current_verified=True) == "in_sync"
    assert drift_of(None, "1.0.0", reachable=True, current_verified=False) == "drift"  # nothing current
    assert drift_of("1.0.0", "1.0.0", reachable=False) == "unknown"
    bad = NodeStatus(
        name="u",
        reachable=True,
        current="1.0.0",
        previous=None,
        releases=[],
        last_event=None,
        simulated=True,
        desired="1.0.0",
        drift="unverified",
        error="",
        current_verified=False,
    )
    assert status_exit_code([node("c"), bad]) is ExitCode.OPERATION_FAILED
    assert status_exit_code([node("a", reachable=False, error="x"), bad]) is ExitCode.OPERATION_FAILED

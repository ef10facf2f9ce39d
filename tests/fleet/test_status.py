"""`solfleet status` exit codes: a node that answered nothing is not "fine". The real CLI runs status.yml
with Ansible (connection local) against the embedded fleet; the fault is real (a journal that is a
directory makes the node's status module fail)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from fleet.errors import ExitCode
from fleet.report import lease_line
from fleet.spec import embedded_fleet, load_spec, resolve_work_dir
from fleet.status import FleetStatus, NodeStatus, _cmd, _move_detail, drift_of, status_exit_code


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
    # exit 1 of status is a node with no state to judge, not a failed operation (docs/cli.md)
    assert json.loads(broken.stdout)["verdict"] == "error"
    nodes = {n["name"]: n for n in json.loads(broken.stdout)["nodes"]}
    assert nodes["n1"]["reachable"] is True and nodes["n1"]["current"] is None
    assert "Is a directory" in nodes["n1"]["error"]
    assert nodes["n2"]["error"] == "" and nodes["n2"]["drift"] == "no_record"
    table = solfleet("status", work=work, cwd=tmp_path)  # the table names the cause too, not only --json
    assert table.returncode == 1, table.stdout + table.stderr
    assert "no state:" in table.stdout and "Is a directory" in table.stdout, table.stdout
    assert "status: exit 1 (error)" in table.stdout

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
    (verify/failed.json): drift `unverified`, exit 7 (suspect). Without failed.json it is a verified current
    again, but one this ledger never put there: exit 6 (drift)."""
    work = tmp_path / "work"
    root = work / "local-fleet" / "n1"
    verify = root / "releases" / "1.0.0" / "verify"
    verify.mkdir(parents=True)
    (verify / "verify.json").write_text(json.dumps({"ok": True}))
    (verify / "failed.json").write_text(json.dumps({"reason": "health after activation: injected"}))
    (root / "current").symlink_to("releases/1.0.0")
    failed = solfleet("status", "--json", work=work, cwd=tmp_path)
    assert failed.returncode == ExitCode.SUSPECT, failed.stdout + failed.stderr
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
    assert fixed.returncode == ExitCode.DRIFT, fixed.stdout + fixed.stderr
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
    assert status_exit_code([node("c"), bad]) is ExitCode.SUSPECT
    assert status_exit_code([node("a", reachable=False, error="x"), bad]) is ExitCode.SUSPECT


def test_status_deep_rehashes_current_and_reports_a_changed_file(tmp_path: Path) -> None:
    """A verified current whose bytes changed after verification (hand edit, bad disk): plain status trusts
    the verify record (no ledger record of it here: exit 6, drift); `status --deep` re-hashes current
    against its MANIFEST on the node and says `tampered`, naming the file, exit 7 (suspect)."""
    import hashlib

    work = tmp_path / "work"
    release = work / "local-fleet" / "n1" / "releases" / "1.0.0"
    (release / "verify").mkdir(parents=True)
    (release / "verify" / "verify.json").write_text(json.dumps({"ok": True}))
    body = release / "kernels.py"
    body.write_text("X = 1\n")
    digest = hashlib.sha256(body.read_bytes()).hexdigest()
    (release / "MANIFEST.json").write_text(json.dumps({"version": "1.0.0", "files": {"kernels.py": digest}}))
    (release.parent.parent / "current").symlink_to("releases/1.0.0")

    clean = solfleet("status", "--json", "--deep", "--limit", "n1", work=work, cwd=tmp_path)
    assert clean.returncode == ExitCode.DRIFT, clean.stdout + clean.stderr
    n1 = json.loads(clean.stdout)["nodes"][0]
    assert (n1["current_intact"], n1["current_check"], n1["drift"]) == (
        True,
        "1 files match MANIFEST.json",
        "no_record",
    )

    body.write_text("X = 2\n")
    plain = solfleet("status", "--json", "--limit", "n1", work=work, cwd=tmp_path)
    assert plain.returncode == ExitCode.DRIFT, plain.stdout + plain.stderr
    assert json.loads(plain.stdout)["nodes"][0]["current_intact"] is None  # not asked: not checked

    deep = solfleet("status", "--json", "--deep", "--limit", "n1", work=work, cwd=tmp_path)
    assert deep.returncode == ExitCode.SUSPECT, deep.stdout + deep.stderr
    n1 = json.loads(deep.stdout)["nodes"][0]
    assert (n1["current_intact"], n1["drift"]) == (False, "tampered")
    assert "sha256 mismatch for kernels.py" in n1["current_check"]
    table = solfleet("status", "--deep", "--limit", "n1", work=work, cwd=tmp_path)
    assert (
        table.returncode == ExitCode.SUSPECT and "tampered" in table.stdout and "kernels.py" in table.stdout
    ), table.stdout


def test_tampered_current_outranks_everything_but_unreachable() -> None:
    assert (
        drift_of("1.0.0", "1.0.0", reachable=True, current_verified=True, current_intact=False) == "tampered"
    )
    assert drift_of("1.0.0", "1.0.0", reachable=True, current_verified=True, current_intact=None) == "in_sync"
    assert drift_of("1.0.0", "1.0.0", reachable=False, current_intact=False) == "unknown"


def test_a_node_lease_is_named_with_what_it_means_for_the_next_deploy(tmp_path: Path) -> None:
    """A lease another controller left on a node refuses every deploy from here (exit 5) until it expires;
    status names it, through the real CLI and the node's own lease file."""
    work = tmp_path / "work"
    root = work / "local-fleet" / "n1"
    root.mkdir(parents=True)
    lease = {
        "rollout_id": "r-20261207T000000Z-0bb0b0",
        "controller": "bob@laptop:4242",
        "user": "bob",
        "pid": 4242,
        "expires": time.time() + 3600,
    }
    (root / "lease.json").write_text(json.dumps(lease))
    out = solfleet("status", work=work, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr  # a lease alone moves no release
    line = next(x for x in out.stdout.splitlines() if x.startswith("n1: lease of rollout"))
    assert "r-20261207T000000Z-0bb0b0 (bob@laptop:4242)" in line and "another controller's" in line, line
    assert "refused (exit 5)" in line


def test_lease_line_tells_this_work_dirs_leases_from_another_controllers() -> None:
    def fleet(**kw: object) -> FleetStatus:
        return FleetStatus(nodes=[], unfinished=[], **kw)  # type: ignore[arg-type]

    now = 1_800_000_000.0
    held = {"rollout_id": "r-1", "controller": "me@here:1", "expires": now + 60}
    assert "expired" in lease_line("n1", {**held, "expires": now - 1}, fleet(), now=now)
    assert "running now" in lease_line("n1", held, fleet(running=["r-1"]), now=now)
    assert "promote or abort" in lease_line("n1", held, fleet(paused=["r-1"]), now=now)
    assert "takes it over" in lease_line("n1", held, fleet(takeover=frozenset({"r-1"})), now=now)
    assert "another controller's" in lease_line("n1", held, fleet(takeover=frozenset({"r-2"})), now=now)
    assert "expiry is not a time ('junk')" in lease_line("n1", {**held, "expires": "junk"}, fleet(), now=now)


def test_a_lease_kept_by_an_unfinished_rollout_names_reconcile(tmp_path: Path) -> None:
    """A rollout that ended owing its hosts a return to its baseline keeps its leases, marked unfinished
    (fleet/recovery.py conclude_leases): status's lease line says so and names `solfleet reconcile`, from
    the holder's work dir (through the real CLI and the node's lease file), or from here when it is this
    work dir's own; an expired one is still the next deploy's to take."""
    work = tmp_path / "work"
    root = work / "local-fleet" / "n1"
    root.mkdir(parents=True)
    rid = "r-20261207T000000Z-0cc0c0"
    lease = {"rollout_id": rid, "controller": "bob@laptop:4242", "state": "unfinished"}
    (root / "lease.json").write_text(json.dumps({**lease, "expires": time.time() + 3600}))
    out = solfleet("status", work=work, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    line = " ".join(out.stdout.split()).split("n1: lease of rollout ", 1)[1].split("status: exit", 1)[0]
    assert "another work dir's unfinished rollout" in line, line
    assert "refused (exit 5) until `solfleet reconcile` from that work dir finishes it" in line, line

    now = 1_800_000_000.0
    held = {**lease, "expires": now + 60}
    mine = FleetStatus(nodes=[], unfinished=[rid], takeover=frozenset({rid}))
    own = lease_line("n1", held, mine, now=now)
    assert "this work dir's unfinished rollout" in own and "`solfleet reconcile` from here" in own, own
    assert "expired" in lease_line("n1", {**held, "expires": now - 1}, mine, now=now)
    # this work dir's unfinished-marked lease once nothing is owed any more (its rollout was reconciled,
    # the lease left on a node that could not be reached): reconcile has nothing to do, a deploy takes it
    done = FleetStatus(nodes=[], unfinished=[], takeover=frozenset({rid}))
    left = lease_line("n1", held, done, now=now)
    assert "reconcile" not in left and "the next deploy or rollback from here takes it over" in left, left
    # another unfinished rollout of this work dir does not make this one's lease owed
    other = FleetStatus(nodes=[], unfinished=["r-other"], takeover=frozenset({rid, "r-other"}))
    theirs = lease_line("n1", held, other, now=now)
    assert "unfinished rollout" not in theirs and "takes it over" in theirs, theirs
    # a node dark at the rollout's end keeps the lease it had, never re-marked: still that rollout's, owed
    running = {**held, "state": "running"}
    dark = lease_line("n1", running, mine, now=now)
    assert "this work dir's unfinished rollout" in dark and "`solfleet reconcile` from here" in dark, dark


def test_a_paused_lease_of_another_work_dir_names_promote_and_abort() -> None:
    """A lease marked paused (lease.json `state`) by a rollout this work dir does not know: the line says
    the rollout is paused after its canary and that promote or abort from its work dir ends it."""
    now = 1_800_000_000.0
    held = {"rollout_id": "r-x", "controller": "bob@laptop:1", "state": "paused", "expires": now + 60}
    line = lease_line("n1", held, FleetStatus(nodes=[], unfinished=[]), now=now)
    assert "another work dir's rollout, paused after its canary" in line, line
    assert "`solfleet promote` or `solfleet abort` there ends it" in line, line


def test_the_command_status_prints_names_this_fleet_and_work_dir(tmp_path: Path) -> None:
    """A command offered for the operator to paste must act on this fleet: with a spec or work dir other
    than the defaults it carries --fleet / --work-dir (quoted), and on the embedded fleet it needs neither."""
    spec_file = tmp_path / "my fleet.yml"
    spec_file.write_text(embedded_fleet().read_text())
    spec = load_spec(spec_file, work_dir=tmp_path / "w")
    cmd = _cmd(spec)
    assert cmd == f"solfleet --fleet '{spec_file}' --work-dir {tmp_path / 'w'}", cmd
    assert _cmd(load_spec(embedded_fleet(), work_dir=resolve_work_dir(None))) == "solfleet"


def test_pending_health_names_the_release_the_journals_last_move_put_in_place() -> None:
    """Health pending after a move whose confirmation was lost (the journal's last move names the release
    before): the detail names both releases and the rollback that confirms current, not "the last move to
    <current>"; after a confirmed move it offers `solfleet health` too (it journals a pass on current)."""
    lost = {"health_pending": True, "moved_to": "1.0.0", "current": "2.0.0"}
    detail = _move_detail(lost, "2.0.0", "solfleet", "n1") or ""
    assert "last move names 1.0.0, not current 2.0.0" in detail
    assert "`solfleet rollback --to 2.0.0 --limit n1` confirms 2.0.0 and runs health" in detail
    confirmed = {"health_pending": True, "moved_to": "2.0.0", "current": "2.0.0"}
    detail = _move_detail(confirmed, "2.0.0", "solfleet", "n1") or ""
    assert detail.startswith("health never ran after the last move to 2.0.0")
    assert "`solfleet health --limit n1`" in detail
    assert _move_detail(lost, None, "solfleet", "n1") is None  # no verified current: nothing to offer


def test_failed_health_offers_solfleet_health_only_where_it_can_clear_it() -> None:
    """`solfleet health` journals its result only where the journal's last move is to current. After a
    lost confirmation (the last move names V2, current is V1 again) it journals nothing, so the detail of a
    failed health offers only the rollback that confirms current; after a confirmed move, both."""
    failed = {"version": "2.0.0", "detail": "health after activation: marker", "time": "t"}
    lost = {"health_failed": failed, "moved_to": "2.0.0", "current": "1.0.0"}
    detail = _move_detail(lost, "1.0.0", "solfleet", "n1") or ""
    assert "`solfleet rollback --to 1.0.0 --limit n1` checks it again" in detail, detail
    assert "solfleet health" not in detail, detail
    here = {"health_failed": {**failed, "version": "1.0.0"}, "moved_to": "1.0.0", "current": "1.0.0"}
    detail = _move_detail(here, "1.0.0", "solfleet", "n1") or ""
    assert "or `solfleet health --limit n1` checks it again" in detail, detail

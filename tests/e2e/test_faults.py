"""The fault matrix (issue "the promise under faults"): after any command, any crash, any second operator,
every node is on a known, verified release, and the records say so.

Five real sshd nodes on 127.0.0.1 (node01 is the canary; batches [2, 100%]; on_failure rollback_fleet), the
real `solfleet` CLI in a subprocess, and real faults: SIGKILL / SIGTERM / SIGINT / SIGHUP sent to the CLI
process when a chosen node journals a chosen event, a stopped sshd, a SIGSTOPped sshd, a full tmpfs under
node05's root, a release tampered on disk, a node module killed during verify, a second controller.

After each case `assert_truthful` checks, from the nodes' own filesystems and the ledger: every reachable
node is on a verified release; its journal's last switch names that release; `status` reports it; the
ledger wants it there (when status says in sync); and `status`'s exit code is the one the state calls for.
Most cases also check the fleet is back where it was before the rollout (its baseline, current AND
previous).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from e2e_driver import REPO, VERIFY_OPS, CliResult, E2EFleet, break_residual_add, retag, wrap_health
from sshd_fleet import SshdFleet, sshd_missing_reason

from fleet.errors import ExitCode

pytestmark = pytest.mark.e2e

NODES = [f"node0{i}" for i in range(1, 6)]
FULL = "node05"  # its root is a small tmpfs, so its disk can really be filled
V1, V2, V3, V4, V5, V6, V7 = "5.1.0", "5.2.0", "5.3.0", "5.4.0", "5.5.0", "5.6.0", "5.7.0"
Links = dict[str, tuple[str | None, str | None]]


# -- the fleet -------------------------------------------------------------------------------------------
class Faults(E2EFleet):
    """The five-node fleet with the helpers the fault cases need."""

    def write(self, spec: dict[str, object], name: str = "fleet.yml") -> Path:
        path = self.spec.parent / name
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        return path

    def base_spec(self) -> dict:
        spec = self.sshd.spec(
            fleet="faults",
            on_failure="rollback_fleet",
            batches=[2, "100%"],
            canary={"labels": ["canary"]},
        )
        spec["nodes"][0]["labels"] = ["canary"]
        spec["timeouts"] = {"connect_s": 5, "status_s": 15}
        return spec

    def artifact(self, version: str) -> Path:
        """V1 is built by `solfleet build`; every other version is V1's bytes with another MANIFEST version
        (a real, valid artifact: building each from scratch would only cost time)."""
        path = self.dist / f"solfleet-ops-{version}.tar.gz"
        if not path.exists():
            if version == V1:
                return super().artifact(V1)
            retag(super().artifact(V1), path, version)
        return path

    def start(self, *args: str, work: Path | None = None) -> subprocess.Popen[str]:
        """The CLI as a process the test can signal (its own process group, so a signal reaches only it)."""
        env = dict(os.environ)
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        env["SOLFLEET_WORK"] = str(work or self.work)
        env.pop("NUMBA_ENABLE_CUDASIM", None)
        return subprocess.Popen(
            [sys.executable, "-m", "fleet.cli", "--fleet", str(self.spec), *args],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    def deploy_args(self, version: str) -> list[str]:
        return ["deploy", "--version", version, "--artifact", str(self.artifact(version))]

    def links(self) -> Links:
        return {n: (self.link(n, "current"), self.link(n, "previous")) for n in NODES}

    def wait_journal(self, node: str, event: str, version: str, *, timeout_s: float = 240) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(e["event"] == event and e["version"] == version for e in self.journal(node)):
                return
            time.sleep(0.1)
        raise AssertionError(f"{node} never journaled {event} {version}: {self.journal(node)[-3:]}")

    def wait_nodes_idle(self, *, timeout_s: float = 180) -> None:
        """Until no node module holds any node's deploy lock: a step that was running on a node when the
        controller died finishes there under its lock and journals it (docs/node-contract.md)."""
        deadline = time.monotonic() + timeout_s
        for node in NODES:
            path = self.root(node) / ".lock"
            while path.exists():
                fd = os.open(path, os.O_RDWR)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break  # free: released again when fd closes
                except BlockingIOError:
                    assert time.monotonic() < deadline, f"{node}'s node module still holds its lock"
                    time.sleep(0.2)
                finally:
                    os.close(fd)

    def orphans(self) -> list[str]:
        """ansible-playbook processes of this controller's work dir still alive."""
        out = subprocess.run(["pgrep", "-af", "ansible-playbook"], capture_output=True, text=True).stdout
        return [line for line in out.splitlines() if str(self.work) in line]

    def restore(self, links: Links) -> None:
        """Put the fleet back on `links` with plain rollbacks (used only when a case moved it on purpose)."""
        for target in ("previous", "current"):
            wanted = {n: links[n][0 if target == "current" else 1] for n in NODES}
            for version in sorted({v for v in wanted.values() if v}):
                hosts = ",".join(n for n, v in wanted.items() if v == version)
                result = self.cli("rollback", "--to", version, "--limit", hosts, "--yes")
                assert result.rc == 0, result.output[-3000:]
        assert self.links() == links


@pytest.fixture(scope="module")
def ff(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Faults]:
    reason = sshd_missing_reason()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but the SSH e2e fleet cannot start: {reason}")
        pytest.skip(reason)
    sshd = SshdFleet(tmp_path_factory.mktemp("faults-sshd"), count=5)
    base = tmp_path_factory.mktemp("faults-controller")
    mounted = False
    try:
        sshd.start()
        full_root = sshd.node(FULL).root  # 160 MiB: the node keeps 64 MiB spare, releases need the rest
        full_root.mkdir(parents=True, exist_ok=True)
        mount = ["mount", "-t", "tmpfs", "-o", "size=160m", "tmpfs", str(full_root)]
        mounted = subprocess.run(mount, capture_output=True).returncode == 0
        fleet = Faults(sshd=sshd, spec=base / "fleet.yml", work=base / "work", dist=base / "dist")
        fleet.mounted = mounted  # type: ignore[attr-defined]
        fleet.write(fleet.base_spec())
        for version in (V1, V2):
            result = fleet.cli(*fleet.deploy_args(version), "--verify-ops", VERIFY_OPS, "--yes")
            assert result.rc == 0, result.output[-3000:]
        assert fleet.links() == dict.fromkeys(NODES, (V2, V1))
        yield fleet
    finally:
        sshd.stop()
        if mounted:
            subprocess.run(["umount", "-l", str(sshd.node(FULL).root)], check=False)


def deploy(ff: Faults, version: str, *extra: str) -> CliResult:
    return ff.cli(*ff.deploy_args(version), "--verify-ops", VERIFY_OPS, "--yes", *extra)


def status(ff: Faults, *, spec: Path | None = None) -> tuple[int, dict]:
    result = ff.cli("status", "--json", spec=spec)
    return result.rc, json.loads(result.stdout or "{}")


def assert_truthful(ff: Faults, rc: int, *, down: tuple[str, ...] = ()) -> dict:
    """Every reachable node is on a verified release, its journal's last switch names it, status reports
    it, the ledger wants it there when status says in sync, and status exits `rc`."""
    code, report = status(ff)
    assert code == rc, f"status exit {code}, expected {rc}: {json.dumps(report, indent=1)[-3000:]}"
    nodes = {n["name"]: n for n in report["nodes"]}
    for name in NODES:
        if name in down:
            assert nodes[name]["reachable"] is False or nodes[name]["error"], nodes[name]
            continue
        current = ff.link(name, "current")
        assert current is not None and ff.verified(name, current), f"{name} is not on a verified release"
        moves = [e for e in ff.journal(name) if e["event"] in ("activated", "rolled_back")]
        assert moves and moves[-1]["version"] == current, f"{name}: journal {moves[-1:]} vs current {current}"
        assert nodes[name]["current"] == current, nodes[name]
        if nodes[name]["drift"] == "in_sync":
            assert nodes[name]["desired"] == current
        if rc in (ExitCode.OK, ExitCode.SPLIT):
            assert nodes[name]["drift"] == "in_sync", nodes[name]
    return report


def last_op(ff: Faults) -> dict:
    return dict(ff.last_operation())


# -- 1, 2: the spec is data; ssh options cannot be injected ------------------------------------------
def test_01_a_template_in_the_spec_is_refused_and_runs_nothing(ff: Faults, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    spec = ff.base_spec()
    spec["nodes"][0]["root"] = f"/x/{{{{ lookup('pipe', 'touch {marker}') }}}}"
    result = ff.cli("status", spec=ff.write(spec, "evil.yml"))
    assert result.rc == ExitCode.USAGE, result.output
    assert "nodes[0].root" in result.output and "spec values are data" in result.output
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not marker.exists(), "a spec value ran a command on the controller"


def test_02_known_hosts_paths_with_blanks_are_one_path_and_host_keys_stay_checked(
    ff: Faults, tmp_path: Path
) -> None:
    spec = ff.base_spec()
    spec["defaults"]["ssh"]["known_hosts_file"] = "/k/x -o StrictHostKeyChecking=no"
    injected = ff.cli("status", spec=ff.write(spec, "inject.yml"))
    assert injected.rc == ExitCode.USAGE and "known_hosts_file" in injected.output, injected.output

    spaced = tmp_path / "dir with space" / "known hosts"
    spaced.parent.mkdir()
    shutil.copy(ff.sshd.known_hosts, spaced)
    spec["defaults"]["ssh"]["known_hosts_file"] = str(spaced)
    code, report = status(ff, spec=ff.write(spec, "spaced.yml"))
    assert code == ExitCode.OK and all(n["reachable"] for n in report["nodes"]), report

    spaced.write_text("")  # no host keys at all: checking is on, so every node must refuse to connect
    code, report = status(ff, spec=ff.write(spec, "spaced.yml"))
    assert code == ExitCode.UNREACHABLE and not any(n["reachable"] for n in report["nodes"]), report


# -- 3, 5: signals to the controller ------------------------------------------------------------------
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_03_05_a_signal_mid_batch_applies_the_policy_and_exits_130(ff: Faults, sig: signal.Signals) -> None:
    before = ff.links()
    version = {signal.SIGTERM: V3, signal.SIGINT: V4, signal.SIGHUP: V5}[sig]
    proc = ff.start(*ff.deploy_args(version), "--verify-ops", VERIFY_OPS, "--yes")
    ff.wait_journal("node02", "activated", version)
    os.kill(proc.pid, sig)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == ExitCode.INTERRUPTED, out[-3000:]
    assert not ff.orphans(), ff.orphans()
    op = last_op(ff)
    assert op["status"] == "interrupted" and op["recovered_by"] == op["id"], op
    assert "on_failure=rollback_fleet: returned" in out and "now: node01:" in out, out[-2000:]
    assert ff.links() == before, "the policy did not return the fleet to its baseline"
    assert_truthful(ff, ExitCode.OK)


def test_03_sigkill_leaves_no_orphan_and_reconcile_returns_the_baseline(ff: Faults) -> None:
    before = ff.links()
    proc = ff.start(*ff.deploy_args(V6), "--verify-ops", VERIFY_OPS, "--yes")
    ff.wait_journal("node02", "activated", V6)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    time.sleep(3)
    assert not ff.orphans(), f"ansible-playbook outlived the controller: {ff.orphans()}"
    # the step a node was running finishes there (its switch and health are one locked step); after
    # that nothing may start: no new step on any node
    ff.wait_nodes_idle()
    frozen = {n: ff.journal(n) for n in NODES}
    time.sleep(5)
    assert {n: ff.journal(n) for n in NODES} == frozen, "something kept moving nodes after the SIGKILL"
    # the dead run is unfinished: status wants its baseline back and says so (drift, exit 6)
    code, report = status(ff)
    assert code == ExitCode.DRIFT and report["unfinished"], report
    assert {n["name"]: n["desired"] for n in report["nodes"]} == {n: before[n][0] for n in NODES}
    result = ff.cli("reconcile", "--yes")
    assert result.rc == 0, result.output[-3000:]
    assert ff.links() == before
    assert_truthful(ff, ExitCode.OK)


# -- 4, 6, 10: a re-run after a kill, with a node-local fault (a full disk) ----------------------------
def align_journal(ff: Faults, node: str, page: int = 4096) -> None:
    """Pad the node's journal with one well-formed line (an event nothing reads) so that it ends exactly on
    a tmpfs page: an append then needs a new page, which a full disk cannot give. Without it a short append
    lands in the last page's slack and a "full" disk still takes it."""
    journal = ff.root(node) / "journal.jsonl"
    empty = '{"event": "pad", "rollout_id": "", "detail": ""}\n'
    need = -journal.stat().st_size % page
    if need < len(empty):
        need += page
    with journal.open("a") as fh:
        fh.write(empty.replace('"detail": ""', '"detail": "' + "x" * (need - len(empty)) + '"'))
    assert journal.stat().st_size % page == 0


def fill(ff: Faults, node: str) -> list[Path]:
    """Fill `node`'s tmpfs to the last byte (a big file, then a small-block one for the rest)."""
    fillers = [ff.root(node) / "filler-1M", ff.root(node) / "filler-4k"]
    for filler, bs in zip(fillers, ("1M", "4k"), strict=True):
        subprocess.run(["dd", "if=/dev/zero", f"of={filler}", f"bs={bs}"], capture_output=True, check=False)
    return fillers


def test_04_06_kill_then_rerun_with_a_full_disk_returns_everyone_and_rollback_goes_back_once(
    ff: Faults,
) -> None:
    if not getattr(ff, "mounted", False):
        why = "no tmpfs could be mounted under node05's root (needs root and mount rights)"
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but {why}: the disk-full case would test nothing")
        pytest.skip(why)
    before = ff.links()
    proc = ff.start(*ff.deploy_args(V7), "--verify-ops", VERIFY_OPS, "--yes")
    ff.wait_journal("node02", "activated", V7)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    filler = fill(ff, FULL)
    try:
        rerun = deploy(ff, V7)
        assert rerun.rc == ExitCode.OPERATION_FAILED, rerun.output[-3000:]
        assert "returned" in rerun.output and "to its baseline" in rerun.output  # the reconcile ran first
        flat = " ".join(rerun.output.split())  # the table folds long messages at the terminal width
        assert FULL in flat and "[Errno 28]" in flat, rerun.output[-3000:]
        assert ff.links() == before, "the re-run's failure policy did not return every host"
        assert_truthful(ff, ExitCode.OK)
        # 6: a plain rollback after the automatic undo goes one step back (to the baseline's previous),
        # never forward onto the release the policy just rejected; the full node refuses before switching
        # the failed push freed what its temp file had taken: fill the disk again, to the last byte, with
        # the journal ending on a page boundary, so its next line needs a page the disk no longer has
        align_journal(ff, FULL)
        fill(ff, FULL)
        journal_before = ff.journal(FULL)
        back = ff.cli("rollback", "--yes")
        assert back.rc == ExitCode.OPERATION_FAILED, back.output[-3000:]
        assert FULL in back.output and "nothing was switched" in back.output, back.output[-3000:]
        for node in NODES:
            assert ff.link(node, "current") != V7
        assert {n: ff.link(n, "current") for n in NODES if n != FULL} == {
            n: before[n][1] for n in NODES if n != FULL
        }
        assert ff.links()[FULL] == before[FULL] and ff.journal(FULL) == journal_before  # 10: nothing moved
        op = last_op(ff)
        with ff.ledger() as conn:
            row = conn.execute(
                "SELECT outcome, version_before, version_after FROM host_outcomes WHERE operation_id = ?"
                " AND host = ?",
                (op["id"], FULL),
            ).fetchone()
        assert tuple(row) == ("refused", before[FULL][0], before[FULL][0]), tuple(row)
    finally:
        for path in filler:
            path.unlink(missing_ok=True)
    assert_truthful(ff, ExitCode.SPLIT)  # the full node stayed, the others went back: as recorded
    ff.restore(before)
    assert_truthful(ff, ExitCode.OK)


# -- 7, 8: one version is one artifact; one rollout at a time ------------------------------------------
def test_07_a_version_rebuilt_with_other_bytes_is_refused(ff: Faults, tmp_path: Path) -> None:
    current = ff.links()["node01"][0]
    assert current is not None
    other = retag(ff.artifact(V1), tmp_path / f"solfleet-ops-{current}.tar.gz", current, break_residual_add)
    trees = {n: ff.tree(n) for n in NODES}
    same_ledger = ff.cli("deploy", "--version", current, "--artifact", str(other), "--yes")
    assert same_ledger.rc == ExitCode.USAGE and "immutable" in same_ledger.output, same_ledger.output
    # another controller (its own work dir, an empty ledger): the nodes themselves hold the other bytes
    other_work = tmp_path / "other-controller"
    proc = ff.start("deploy", "--version", current, "--artifact", str(other), "--yes", work=other_work)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == ExitCode.USAGE and "already other bytes" in out, out[-2000:]
    for node in NODES:
        moved = [p for p, *_ in ff.tree(node) if p not in {q for q, *_ in trees[node]}]
        assert not [p for p in moved if not p.startswith(".lease")], f"{node}: {moved}"
    assert_truthful(ff, ExitCode.OK)


def test_08_a_second_controller_is_refused_while_a_rollout_holds_the_fleet(
    ff: Faults, tmp_path: Path
) -> None:
    before = ff.links()
    version = before["node01"][1]  # a rollout back to the previous release: quick, and leaves previous set
    assert version is not None
    first = ff.start(*ff.deploy_args(version), "--verify-ops", VERIFY_OPS, "--yes")
    deadline = time.monotonic() + 120
    while not all((ff.root(n) / "lease.json").exists() for n in NODES):
        assert time.monotonic() < deadline, "the first rollout never leased every node"
        time.sleep(0.1)
    other_work = tmp_path / "second-operator"
    second = ff.start(*ff.deploy_args(V3), "--verify-ops", VERIFY_OPS, "--yes", work=other_work)
    out2, _ = second.communicate(timeout=120)
    out1, _ = first.communicate(timeout=600)
    assert second.returncode == ExitCode.LOCKED, out2[-2000:]
    assert "another rollout holds" in out2 and "@" in out2 and "lease expires" in out2, out2[-2000:]
    assert first.returncode == 0, out1[-3000:]
    import sqlite3

    ledgers = list(other_work.glob("fleets/*/ledger.sqlite"))
    refused = [r[0] for p in ledgers for r in sqlite3.connect(p).execute("SELECT id FROM operations")]
    for node in NODES:
        assert ff.link(node, "current") == version
        # the refused rollout never wrote a line on any node
        assert not any(e.get("rollout_id") in refused for e in ff.journal(node)), refused
        assert not (ff.root(node) / "lease.json").exists(), f"{node} kept a lease after the rollout ended"
    assert_truthful(ff, ExitCode.OK)
    ff.restore(before)


# -- 9: the canary is never skipped ------------------------------------------------------------------
def test_09_an_unreachable_canary_with_unreachable_skip_stops_the_rollout(ff: Faults) -> None:
    spec = ff.base_spec()
    spec["rollout"]["unreachable"] = "skip"
    skip_spec = ff.write(spec, "skip.yml")
    journals = {n: ff.journal(n) for n in NODES}
    ff.sshd.stop_node("node01")
    try:
        result = ff.cli(*ff.deploy_args(V3), "--verify-ops", VERIFY_OPS, "--yes", spec=skip_spec)
    finally:
        ff.sshd.restart_node("node01")
    assert result.rc != 0, result.output[-3000:]
    assert "canary: no host completed verify and activation" in result.output, result.output[-3000:]
    assert {n: ff.journal(n) for n in NODES} == journals, "a node past the canary was touched"
    assert_truthful(ff, ExitCode.OK)


# -- 11, 12: refusals are journaled, and reasons reach the operator -----------------------------------
def test_12_a_broken_kernel_is_stopped_at_the_canary_with_its_reason(ff: Faults, tmp_path: Path) -> None:
    broken = retag(ff.artifact(V1), ff.dist / "solfleet-ops-6.0.0.tar.gz", "6.0.0", break_residual_add)
    journals = {n: ff.journal(n) for n in NODES if n != "node01"}
    result = ff.cli(
        "deploy", "--version", "6.0.0", "--artifact", str(broken), "--verify-ops", VERIFY_OPS, "--yes"
    )
    assert result.rc == ExitCode.OPERATION_FAILED, result.output[-3000:]
    # the node kept the full verify JSON; its first failing case (op / dtype / case, as verify wrote them)
    # is what the operator must read, with the error figure and where the JSON was kept
    kept = list((ff.root("node01") / "failed").glob("6.0.0.*.verify.json"))
    record = json.loads(kept[0].read_text()) if kept else {}
    assert record.get("ok") is False, kept
    failing = [f"{r['op']}/{r['dtype']}/{r['case']}" for r in record["results"] if not r["ok"]]
    assert failing and all(f.startswith("residual_add/") for f in failing), failing
    first = failing[0]
    assert f"{first}: " in result.output and "verify JSON kept at" in result.output, result.output
    assert {n: ff.journal(n) for n in NODES if n != "node01"} == journals
    last = ff.journal("node01")[-1]
    assert (last["event"], last["version"]) == ("failed", "6.0.0") and "residual_add" in last["detail"]
    with ff.ledger() as conn:
        (message,) = conn.execute(
            "SELECT message FROM host_outcomes WHERE operation_id = ? AND host = 'node01'",
            (last_op(ff)["id"],),
        ).fetchone()
    assert f"{first}: " in message, message
    # the rollout's own report (report.md in its run dir) names the node and the failing op and dtype
    (report_md,) = ff.work.glob(f"fleets/*/runs/{last_op(ff)['id']}/report.md")
    text = " ".join(report_md.read_text().split())
    assert "node01" in text and first in text and "verify" in text, text[-2000:]
    assert_truthful(ff, ExitCode.OK)


def break_health(release: Path) -> None:
    """A release whose own health check fails once it is activated (verify still passes)."""
    wrap_health(
        release,
        "this release is unhealthy once activated",
        "    report = _real_run()\n"
        "    report['ok'] = False\n"
        "    report['checks'].append(\n"
        "        {'name': 'injected', 'status': 'failed', 'ok': False, 'detail': 'broken'}\n"
        "    )\n"
        "    return report\n",
    )


def test_12_a_health_failure_after_activation_names_its_check_everywhere(ff: Faults) -> None:
    unhealthy = retag(ff.artifact(V1), ff.dist / "solfleet-ops-6.1.0.tar.gz", "6.1.0", break_health)
    before = ff.links()
    journals = {n: ff.journal(n) for n in NODES if n != "node01"}
    result = ff.cli(
        "deploy", "--version", "6.1.0", "--artifact", str(unhealthy), "--verify-ops", VERIFY_OPS, "--yes"
    )
    assert result.rc == ExitCode.OPERATION_FAILED, result.output[-3000:]
    # the failing check and its detail, not "exit 1": in the operator's output, the ledger and the report
    flat = " ".join(result.output.split())
    assert "injected: broken" in flat and "restored current" in flat, flat[-3000:]
    assert ff.links() == before, "the canary must be back on its prior current and previous"
    assert {n: ff.journal(n) for n in NODES if n != "node01"} == journals, "a node past the canary moved"
    with ff.ledger() as conn:
        (outcome, message) = conn.execute(
            "SELECT outcome, message FROM host_outcomes WHERE operation_id = ? AND host = 'node01'",
            (last_op(ff)["id"],),
        ).fetchone()
    assert outcome == "health_failed" and "injected: broken" in message, (outcome, message)
    (report_md,) = ff.work.glob(f"fleets/*/runs/{last_op(ff)['id']}/report.md")
    text = " ".join(report_md.read_text().split())
    assert "node01" in text and "injected: broken" in text, text[-2000:]
    assert_truthful(ff, ExitCode.OK)


# -- 13: a failed re-check of current is remembered ------------------------------------------------
def test_13_a_tampered_current_found_by_a_deploy_stays_suspect(ff: Faults) -> None:
    before = ff.links()
    current = before["node03"][0]
    assert current is not None
    target = ff.root("node03") / "releases" / current / "MANIFEST.json"
    readme = next(p for p in sorted((ff.root("node03") / "releases" / current / "kernels").rglob("*.py")))
    os.chmod(readme.parent, 0o755)
    os.chmod(readme, 0o644)
    original = readme.read_bytes()
    readme.write_bytes(original + b"\n# tampered\n")
    try:
        again = deploy(ff, current)  # node03's re-check of its current release finds it
        assert again.rc == ExitCode.OPERATION_FAILED and "node03" in again.output, again.output[-3000:]
        code, report = status(ff)  # plain status, no --deep: the node remembers
        n3 = {n["name"]: n for n in report["nodes"]}["node03"]
        assert code == ExitCode.SUSPECT and n3["drift"] == "suspect" and "re-check" in n3["suspect"], n3
    finally:
        readme.write_bytes(original)
    assert target.exists()
    assert status(ff)[0] == ExitCode.SUSPECT, "suspect must stay until a good deploy or rollback replaces it"
    ff.restore({n: (before[n][1], before[n][0]) for n in NODES})  # away, then back: current is replaced
    ff.restore(before)
    assert_truthful(ff, ExitCode.OK)


# -- 14: a node module killed during verify ---------------------------------------------------------
def _kill_verify_on(ff: Faults, node: str, timeout_s: float = 120) -> None:
    """SIGKILL the node module (and its verify child) working under `node`'s root."""
    root = str(ff.root(node))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids = subprocess.run(
            ["pgrep", "-f", "kernels verify"], capture_output=True, text=True
        ).stdout.split()
        for pid in pids:
            try:
                cwd = os.readlink(f"/proc/{pid}/cwd")
            except OSError:
                continue
            if cwd.startswith(root):
                parent = int(Path(f"/proc/{pid}/stat").read_text().split()[3])
                for victim in (parent, int(pid)):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(victim, signal.SIGKILL)
                return
        time.sleep(0.05)
    raise AssertionError(f"no verify ran under {root}")


def test_14_a_release_left_unverified_by_a_killed_module_is_removed_by_the_next_deploy(ff: Faults) -> None:
    before = ff.links()
    proc = ff.start(*ff.deploy_args(V3), "--verify-ops", VERIFY_OPS, "--yes")
    _kill_verify_on(ff, "node01")
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode != 0, out[-2000:]
    assert ff.links() == before
    left = ff.root("node01") / "releases" / V3
    assert left.is_dir() and not ff.verified("node01", V3), "expected the killed run's unverified release"
    assert_truthful(ff, ExitCode.OK)
    result = deploy(ff, V3)
    assert result.rc == 0, result.output[-3000:]
    removed = [e for e in ff.journal("node01") if e["event"] == "removed" and e["version"] == V3]
    assert removed, "the next deploy did not journal removing the unverified release"
    assert_truthful(ff, ExitCode.OK)
    ff.restore(before)


# -- 15: one hung node cannot hold status ------------------------------------------------------------
def test_15_status_with_a_hung_node_is_bounded_by_status_s(ff: Faults) -> None:
    hung = ff.sshd.node("node04")
    assert hung.proc is not None
    os.kill(hung.proc.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        code, report = status(ff)
        elapsed = time.monotonic() - started
    finally:
        os.kill(hung.proc.pid, signal.SIGCONT)
    n4 = {n["name"]: n for n in report["nodes"]}["node04"]
    assert elapsed < 2 * 15 + 5 + 30, f"status took {elapsed:.0f} s with status_s 15"
    assert code in (ExitCode.UNREACHABLE, ExitCode.OPERATION_FAILED) and (n4["error"] or not n4["reachable"])
    assert_truthful(ff, ExitCode.OK)


# -- 16: markup in a node path -------------------------------------------------------------------------
def test_16_a_node_path_with_markup_is_printed_not_parsed(ff: Faults, tmp_path: Path) -> None:
    spec = ff.base_spec()
    odd = ff.sshd.node("node05").root.parent / "odd[/]root[red]"
    spec["nodes"] = [dict(spec["nodes"][4], name="odd", root=str(odd))]
    del spec["rollout"]["canary"]
    odd_spec = ff.write(spec, "odd.yml")
    work = tmp_path / "odd-work"
    # a file where the releases dir should be: the node refuses, and its message names the path
    odd.mkdir(parents=True, exist_ok=True)
    (odd / "releases").write_text("not a directory")
    proc = ff.start(
        *ff.deploy_args(V2), "--verify-ops", VERIFY_OPS, "--yes", "--fleet", str(odd_spec), work=work
    )
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == ExitCode.OPERATION_FAILED, out[-3000:]
    assert "Traceback" not in out and "odd[/]root[red]" in out.replace("\n", ""), out[-2000:]
    hist = subprocess.run(
        [sys.executable, "-m", "fleet.cli", "--fleet", str(odd_spec), "--work-dir", str(work), "history"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert hist.returncode == 0, hist.stdout + hist.stderr
    assert "odd[/]root[red]" in hist.stdout.replace("\n", ""), hist.stdout
    shutil.rmtree(odd, ignore_errors=True)


# -- 17: a rollout that ends unfinished keeps its leases until reconcile ----------------------------------
def cut_off(ff: Faults, node: str) -> None:
    """`node` stops answering now, mid-rollout: its sshd stops, and so do the sessions it serves (else the
    controller's ControlPersist connection, opened by the rollout's lease call, would still reach it)."""
    sshd = ff.sshd.node(node).proc
    assert sshd is not None
    sessions = subprocess.run(["pgrep", "-P", str(sshd.pid)], capture_output=True, text=True).stdout.split()
    ff.sshd.stop_node(node)
    for pid in sessions:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)


def without_health_output(tree: list[tuple[str, int, float]]) -> list[tuple[str, int, float]]:
    """A node's tree (E2EFleet.tree) less what a health run writes (its metrics textfile, the numba cache)."""
    return [entry for entry in tree if not entry[0].startswith(("metrics", "cache"))]


def recovered_by_of(ff: Faults, op_id: str) -> str | None:
    with ff.ledger() as conn:
        (by,) = conn.execute("SELECT recovered_by FROM operations WHERE id = ?", (op_id,)).fetchone()
    return str(by) if by is not None else None


def lease_of(ff: Faults, node: str) -> dict | None:
    path = ff.root(node) / "lease.json"
    return json.loads(path.read_text()) if path.exists() else None


def test_17_an_unfinished_rollout_keeps_its_leases_until_reconcile_from_its_work_dir(
    ff: Faults, tmp_path: Path
) -> None:
    """The canary fails verify, so on_failure returns every host to its baseline; one host stops answering
    before that undo can read it, so the rollout ends unfinished. It keeps the lease of the host it still
    owes (the dark one, whose state nobody knows) and drops those of the hosts its undo found on their
    baseline, which owe it nothing: a second controller is refused (exit 5) naming the unfinished rollout,
    by the host it owes. Once the host is back, reconcile from the first work dir finishes it and drops the
    rest, and the second controller may deploy. (test_19: an owed host that answers, its lease renewed and
    marked unfinished.)"""
    before = ff.links()
    dark = "node04"
    broken = retag(ff.artifact(V1), ff.dist / "solfleet-ops-6.2.0.tar.gz", "6.2.0", break_residual_add)
    proc = ff.start(
        "deploy", "--version", "6.2.0", "--artifact", str(broken), "--verify-ops", VERIFY_OPS, "--yes"
    )
    other_work = tmp_path / "second-operator"
    try:
        # every node leased and its baseline read: the canary has its release staged; now cut node04 off
        ff.wait_journal("node01", "staged", "6.2.0")
        cut_off(ff, dark)
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == ExitCode.OPERATION_FAILED, out[-3000:]
        flat = " ".join(out.split())
        assert "could not return every host to the baseline (run `solfleet reconcile`)" in flat, flat[-3000:]
        op = last_op(ff)
        assert op["recovered_by"] is None, op  # unfinished: owed a return to its baseline
        for node in NODES:
            lease = lease_of(ff, node)
            if node == dark:  # owed (its state unknown): it keeps the lease it was given
                assert lease is not None and lease["rollout_id"] == op["id"], (node, lease)
            else:  # found on its baseline by the undo: owes nothing, its lease dropped
                assert lease is None, (node, lease)
        code, report = status(ff)
        assert code == ExitCode.DRIFT and report["unfinished"] == [op["id"]], (code, report)
    finally:
        ff.sshd.restart_node(dark)

    # a second controller (its own work dir and ledger) is refused by the lease of the host still owed;
    # nothing moves
    trees = {n: ff.tree(n) for n in NODES}
    second = ff.start(*ff.deploy_args(V3), "--verify-ops", VERIFY_OPS, "--yes", work=other_work)
    out2, _ = second.communicate(timeout=300)
    assert second.returncode == ExitCode.LOCKED, out2[-3000:]
    flat2 = " ".join(out2.split())
    assert f"{dark}: rollout {op['id']} of " in flat2, flat2
    # the owed host exactly as it was; the released ones answered its lease call (the canary's with the
    # preflight health, which refreshes the metrics textfile and the numba cache) and nothing else changed
    assert ff.tree(dark) == trees[dark], "a refused controller touched the owed node"
    after = {n: without_health_output(ff.tree(n)) for n in NODES}
    assert after == {n: without_health_output(t) for n, t in trees.items()}, (
        "a refused controller moved a node"
    )

    # the dark node's lease expired and another controller took it meanwhile (its lease file, as that
    # controller's lease call writes it): reconcile is refused there (exit 5); the others, which its lease
    # read found on their baseline, owe the rollout nothing, and it leaves no lease on them
    other = {"rollout_id": "r-20261207T000000Z-0e0e0e", "controller": "bob@laptop:4242", "state": "running",
             "acquired": "2026-12-07T00:00:00Z", "expires": time.time() + 3600}  # fmt: skip
    (ff.root(dark) / "lease.json").write_text(json.dumps(other))
    refused = ff.cli("reconcile", "--yes")
    assert refused.rc == ExitCode.LOCKED, refused.output[-3000:]
    for node in NODES:
        lease = lease_of(ff, node)
        if node == dark:
            assert lease == other, lease
        else:
            assert lease is None, (node, lease)
    assert recovered_by_of(ff, op["id"]) is None  # still owed: the dark node was never read
    (ff.root(dark) / "lease.json").unlink()  # that controller ended

    # reconcile from the first work dir finishes the rollout and drops every lease
    result = ff.cli("reconcile", "--yes")
    assert result.rc == 0, result.output[-3000:]
    with ff.ledger() as conn:
        (recovered_by,) = conn.execute(
            "SELECT recovered_by FROM operations WHERE id = ?", (op["id"],)
        ).fetchone()
    assert recovered_by is not None
    assert {n: lease_of(ff, n) for n in NODES} == dict.fromkeys(NODES), "reconcile left a lease"
    assert ff.links() == before
    # and the second controller may deploy now (the release every node runs: nothing moves)
    again = ff.start(*ff.deploy_args(before["node01"][0] or V2), "--verify-ops", VERIFY_OPS, "--yes",
                     work=other_work)  # fmt: skip
    out3, _ = again.communicate(timeout=300)
    assert again.returncode == 0, out3[-3000:]
    assert ff.links() == before and {n: lease_of(ff, n) for n in NODES} == dict.fromkeys(NODES)
    assert_truthful(ff, ExitCode.OK)


# -- 18: `solfleet health` records its result where status reads it -----------------------------------
def test_18_solfleet_health_journals_its_result_once(ff: Faults) -> None:
    result = ff.cli("health", "--json")
    assert result.rc == 0, result.output[-3000:]
    assert all(not n["journal_error"] for n in json.loads(result.stdout)["nodes"]), result.stdout
    journals = {}
    for node in NODES:
        last = ff.journal(node)[-1]
        assert (last["event"], last["version"]) == ("healthy", ff.link(node, "current")), last
        assert last["detail"] == "health passed (solfleet health)", last
        journals[node] = ff.journal(node)
    assert ff.cli("health").rc == 0
    assert {n: ff.journal(n) for n in NODES} == journals, "the same result was journaled twice"
    assert_truthful(ff, ExitCode.OK)


# -- 19: the hosts an unfinished rollout still owes keep its lease; rollback concludes it or keeps them ------
def test_19_an_owed_host_keeps_the_rollouts_lease_through_reconcile_and_rollback(
    ff: Faults, tmp_path: Path
) -> None:
    """node03 does not answer the lease call, so batch 1 fails (unreachable: fail) after the canary node01
    moved; node01's baseline release is marked failed meanwhile, so its undo is refused and the rollout ends
    unfinished owing node01 alone. Only node01 keeps the lease, renewed and marked unfinished; node02 (put
    back) and node04/node05 (never moved) are released. A reconcile that cannot finish keeps it named for
    the rollout owed, not for itself, so a second controller's refusal names that rollout and `solfleet
    reconcile`. A rollback that leaves node01 where it is keeps the lease; one that puts every owed host on a
    verified release concludes the rollout (status no longer calls it unfinished) and drops the leases."""
    before = ff.links()
    new, dark = "6.3.0", "node03"
    baseline01 = before["node01"][0]
    assert baseline01 is not None
    failed_mark = ff.root("node01") / "releases" / baseline01 / "verify" / "failed.json"
    cut_off(ff, dark)
    try:
        proc = ff.start(*ff.deploy_args(new), "--verify-ops", VERIFY_OPS, "--yes")
        ff.wait_journal("node01", "healthy", new)
        failed_mark.write_text(json.dumps({"time": "2026-12-07T00:00:00Z", "reason": "marked by test_19"}))
        out, _ = proc.communicate(timeout=300)
    finally:
        ff.sshd.restart_node(dark)
    try:
        assert proc.returncode == ExitCode.UNREACHABLE, out[-3000:]
        assert "could not return every host to the baseline" in " ".join(out.split()), out[-3000:]
        op = last_op(ff)
        assert op["recovered_by"] is None, op
        assert ff.link("node01", "current") == new and ff.links()["node02"] == before["node02"]
        kept = lease_of(ff, "node01")
        assert kept is not None and (kept["rollout_id"], kept["state"]) == (op["id"], "unfinished"), kept
        assert kept["expires"] > time.time() + 60, kept
        others = {n: lease_of(ff, n) for n in NODES if n != "node01"}
        assert others == dict.fromkeys(others), f"hosts on their baseline kept a lease: {others}"
        text = " ".join(ff.cli("status").stdout.split())
        assert f"node01: lease of rollout {op['id']}" in text, text[-3000:]
        assert "kept by this work dir's unfinished rollout; `solfleet reconcile` from here" in text, text[
            -3000:
        ]

        # a reconcile that cannot finish (node01's undo refused again): the lease stays the rollout's
        recon = ff.cli("reconcile", "--yes")
        assert recon.rc == ExitCode.OPERATION_FAILED, recon.output[-3000:]
        assert recovered_by_of(ff, op["id"]) is None
        lease = lease_of(ff, "node01")
        assert lease is not None and (lease["rollout_id"], lease["state"]) == (op["id"], "unfinished"), lease
        assert lease["controller"] != kept["controller"], "renewed by the reconcile's process"
        assert {n: lease_of(ff, n) for n in NODES if n != "node01"} == others

        # so a second controller is refused naming the rollout owed and what finishes it; nothing moves
        trees = {n: ff.tree(n) for n in NODES}
        second = ff.start(*ff.deploy_args(V3), "--verify-ops", VERIFY_OPS, "--yes", work=tmp_path / "other")
        out2, _ = second.communicate(timeout=300)
        assert second.returncode == ExitCode.LOCKED, out2[-3000:]
        flat2 = " ".join(out2.split())
        assert f"node01: rollout {op['id']} of " in flat2, flat2
        assert "(unfinished: it owes its hosts a return" in flat2, flat2
        assert "`solfleet reconcile` from its work dir finishes it" in flat2, flat2
        assert {n: ff.tree(n) for n in NODES} == trees, "a refused controller touched a node"

        # a rollback that leaves the owed host where it is (its previous is the release marked failed): the
        # rollout stays unfinished and node01 stays leased to it
        back = ff.cli("rollback", "--limit", "node01", "--yes")
        assert back.rc == ExitCode.OPERATION_FAILED, back.output[-3000:]
        flat_back = " ".join(back.output.split())
        assert f"unfinished {op['id']} stays unfinished (still owes node01 a return" in flat_back, flat_back
        assert recovered_by_of(ff, op["id"]) is None
        lease = lease_of(ff, "node01")
        assert lease is not None and (lease["rollout_id"], lease["state"]) == (op["id"], "unfinished"), lease
        assert ff.link("node01", "current") == new

        # a rollback that puts every host it owes on a verified release concludes it: what the escape hatch
        # did stands, status no longer calls the rollout unfinished, and no lease is left
        out_back = ff.cli("rollback", "--to", V1, "--yes")
        assert out_back.rc == 0, out_back.output[-3000:]
        assert f"unfinished {op['id']} is concluded by this rollback" in " ".join(out_back.output.split())
        rollback_id = last_op(ff)["id"]
        assert recovered_by_of(ff, op["id"]) == rollback_id
        assert {n: lease_of(ff, n) for n in NODES} == dict.fromkeys(NODES)
        assert {n: ff.link(n, "current") for n in NODES} == dict.fromkeys(NODES, V1)
        report = assert_truthful(ff, ExitCode.OK)
        assert report["unfinished"] == [], report
    finally:
        failed_mark.unlink(missing_ok=True)
    ff.restore(before)
    assert_truthful(ff, ExitCode.OK)

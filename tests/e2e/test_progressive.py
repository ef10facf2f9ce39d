"""Progressive steps on real sshd nodes: a deploy that pauses after its canary, then promote or abort from a
fresh `solfleet` process (the pausing one has exited: the state lives in the ledger and the node leases),
the refusals while a rollout is paused, and a batch deadline that a normal verify overruns.

Three nodes on 127.0.0.1 (node01 is the canary, then one batch of the rest; on_failure rollback_fleet),
the real CLI in a subprocess each time, and the answers read back from the nodes' own filesystems
(links, journals, lease files) and the controller's SQLite ledger.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from e2e_driver import VERIFY_OPS, CliResult, E2EFleet, retag
from sshd_fleet import SshdFleet, sshd_missing_reason

from fleet.errors import ExitCode

pytestmark = pytest.mark.e2e

NODES = ["node01", "node02", "node03"]
V1, V2, V3, V4 = "7.1.0", "7.2.0", "7.3.0", "7.4.0"
# A batch deadline a normal verify overruns: ansible-runner checks its job timeout every 5 s at most
# (pexpect_timeout), so the canary is stopped 6-11 s into its run, while its node module verifies these ops
# (~14 s of verify on an idle 2-core machine, ~30 s loaded, under the simulator: three ops, ~7 s, once
# finished before an 11 s cut-off and the canary read `activated`); the module then finishes under the node's
# lock, within the undo's 60 s wait.
DEADLINE_S = 6
DEADLINE_VERIFY_OPS = "residual_add,rmsnorm,softmax,layernorm,fused_add_rmsnorm,swiglu"
MODULE_TASK = "solfleet | Push, unpack, check, verify and activate release"
Links = dict[str, tuple[str | None, str | None]]


class Progressive(E2EFleet):
    def write(self, name: str, **rollout: object) -> Path:
        spec = self.sshd.spec(
            fleet="progressive",
            on_failure="rollback_fleet",
            batches=["100%"],
            canary={"labels": ["canary"]},
            **rollout,
        )
        spec["nodes"][0]["labels"] = ["canary"]
        spec["timeouts"] = {"connect_s": 5, "status_s": 15}
        path = self.spec.parent / name
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        return path

    def artifact(self, version: str) -> Path:
        """V1 from `solfleet build`; the others are V1's bytes under another MANIFEST version."""
        path = self.dist / f"solfleet-ops-{version}.tar.gz"
        if not path.exists() and version != V1:
            retag(super().artifact(V1), path, version)
        return super().artifact(version) if version == V1 else path

    def deploy_with(
        self, spec: Path, version: str, *, work: Path | None = None, ops: str = VERIFY_OPS
    ) -> CliResult:
        args = ["deploy", "--version", version, "--artifact", str(self.artifact(version))]
        args += ["--verify-ops", ops, "--yes"]
        if work is None:
            return self.cli(*args, spec=spec)
        saved, self.work = self.work, work  # a second controller: its own work dir, so its own ledger
        try:
            return self.cli(*args, spec=spec)
        finally:
            self.work = saved

    def links(self) -> Links:
        return {n: (self.link(n, "current"), self.link(n, "previous")) for n in NODES}

    def lease(self, node: str) -> dict | None:
        path = self.root(node) / "lease.json"
        return json.loads(path.read_text()) if path.exists() else None

    def status(self) -> tuple[int, dict]:
        result = self.cli("status", "--json", spec=self.paused_spec)
        return result.rc, json.loads(result.stdout or "{}")

    def operation(self, op_id: str) -> dict:
        with self.ledger() as conn:
            row = conn.execute("SELECT * FROM operations WHERE id = ?", (op_id,)).fetchone()
        assert row is not None, f"{op_id} is not in the ledger"
        return dict(row)

    def outcomes(self, op_id: str) -> list[dict]:
        with self.ledger() as conn:
            rows = conn.execute("SELECT * FROM host_outcomes WHERE operation_id = ? ORDER BY id", (op_id,))
            return [dict(r) for r in rows.fetchall()]

    @property
    def paused_spec(self) -> Path:
        return self.spec.parent / "paused.yml"


@pytest.fixture(scope="module")
def pf(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Progressive]:
    reason = sshd_missing_reason()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but the SSH e2e fleet cannot start: {reason}")
        pytest.skip(reason)
    sshd = SshdFleet(tmp_path_factory.mktemp("progressive-sshd"), count=3)
    base = tmp_path_factory.mktemp("progressive-controller")
    try:
        sshd.start()
        fleet = Progressive(sshd=sshd, spec=base / "fleet.yml", work=base / "work", dist=base / "dist")
        fleet.write("fleet.yml")
        fleet.write("paused.yml", pause_after_canary=True)
        result = fleet.deploy_with(fleet.spec, V1)
        assert result.rc == 0, result.output[-3000:]
        assert fleet.links() == dict.fromkeys(NODES, (V1, None))
        yield fleet
    finally:
        sshd.stop()


def paused_id(result: CliResult) -> str:
    """The id the pausing deploy names in its two next commands (its last lines; the plan says `ID`)."""
    assert result.rc == ExitCode.PAUSED, f"expected exit {int(ExitCode.PAUSED)}: {result.output[-3000:]}"
    words = result.stdout.rsplit("`solfleet promote ", 1)
    assert len(words) == 2, f"the paused deploy does not say how to promote: {result.stdout[-2000:]}"
    op_id = words[1].split("`", 1)[0]
    assert f"`solfleet abort {op_id}`" in result.stdout, result.stdout[-2000:]
    return op_id


def test_01_a_paused_rollout_is_told_truthfully_and_promote_from_a_new_process_finishes_it(
    pf: Progressive,
) -> None:
    result = pf.deploy_with(pf.paused_spec, V2)
    op_id = paused_id(result)
    # the pausing process has exited; the ledger row is a real state, the canary is on V2, the rest on V1
    assert pf.operation(op_id)["status"] == "paused"
    assert pf.links() == {"node01": (V2, V1), "node02": (V1, None), "node03": (V1, None)}
    for node in NODES:  # the leases stay with the paused rollout, and say it is paused
        lease = pf.lease(node)
        assert lease is not None and lease["rollout_id"] == op_id, (node, lease)
        assert lease["state"] == "paused" and lease["expires"] > time.time(), lease
    code, report = pf.status()
    assert code == ExitCode.PAUSED and report["paused"] == [op_id], json.dumps(report, indent=1)[-2000:]
    assert {n["name"]: n["drift"] for n in report["nodes"]} == dict.fromkeys(NODES, "in_sync")
    assert {n["name"]: n["desired"] for n in report["nodes"]} == {"node01": V2, "node02": V1, "node03": V1}
    text = pf.cli("status", spec=pf.paused_spec)
    assert text.rc == ExitCode.PAUSED and f"paused rollout {op_id}" in text.stdout, text.stdout[-2000:]
    history = json.loads(pf.cli("history", "--json", spec=pf.paused_spec).stdout)
    assert (history["operations"][0]["id"], history["operations"][0]["status"]) == (op_id, "paused")

    promoted = pf.cli("promote", "--yes", spec=pf.paused_spec)
    assert promoted.rc == 0, promoted.output[-3000:]
    assert pf.links() == dict.fromkeys(NODES, (V2, V1))
    row = pf.operation(op_id)
    assert (row["status"], row["recovered_by"]) == ("succeeded", op_id), row
    # one rollout from its canary to its end: the same id in every node's journal and in the ledger
    for node in NODES:
        activated = [e for e in pf.journal(node) if e["event"] == "activated" and e["version"] == V2]
        assert [e["rollout_id"] for e in activated] == [op_id], (node, pf.journal(node)[-3:])
        assert pf.lease(node) is None, f"{node} still leased after the promote: {pf.lease(node)}"
    steps = {(r["step"], r["host"]): r["outcome"] for r in pf.outcomes(op_id)}
    assert steps == {("canary", "node01"): "activated", **{("batch 1", h): "activated" for h in NODES[1:]}}
    code, report = pf.status()
    assert code == ExitCode.OK and report["paused"] == [], json.dumps(report, indent=1)[-2000:]


def move_current(pf: Progressive, node: str, version: str) -> None:
    """A second operator's hand on the node: `current` switched to another verified release."""
    root = pf.root(node)
    tmp = root / "current.hand"
    os.symlink(f"releases/{version}", tmp)
    os.replace(tmp, root / "current")


def test_02_while_paused_nothing_else_starts_a_moved_node_stops_promote_and_abort_returns_the_baseline(
    pf: Progressive, tmp_path: Path
) -> None:
    before = pf.links()
    assert before == dict.fromkeys(NODES, (V2, V1))
    op_id = paused_id(pf.deploy_with(pf.paused_spec, V3))
    assert pf.links() == {**before, "node01": (V3, V2)}
    trees = {n: pf.tree(n) for n in NODES}

    # a deploy (or rollback) from this work dir: one line naming the paused rollout and both commands
    for args in (["--version", V4], None):
        refused = pf.deploy_with(pf.spec, V4) if args else pf.cli("rollback", "--yes", spec=pf.spec)
        assert refused.rc == ExitCode.USAGE, refused.output[-3000:]
        (line,) = refused.stderr.strip().splitlines()
        assert f"rollout {op_id} (deploy {V3}) is paused after its canary" in line, line
        assert f"`solfleet promote {op_id}`" in line and f"`solfleet abort {op_id}`" in line, line
    # another controller (its own work dir and ledger) is refused by the nodes' leases, which say paused
    second = pf.deploy_with(pf.spec, V4, work=tmp_path / "second-work")
    assert second.rc == ExitCode.LOCKED, second.output[-3000:]
    flat = " ".join(second.stderr.split())
    assert f"rollout {op_id} of " in flat and "(paused after its canary:" in flat, flat[-2000:]
    assert {n: pf.tree(n) for n in NODES} == trees, "a refused command touched a node"

    # a node moved behind the pause's back: promote refuses, naming it, and changes nothing
    move_current(pf, "node03", V1)
    trees = {n: pf.tree(n) for n in NODES}
    refused = pf.cli("promote", op_id, "--yes", spec=pf.paused_spec)
    assert refused.rc == ExitCode.USAGE, refused.output[-3000:]
    (line,) = refused.stderr.strip().splitlines()
    assert f"promote {op_id} refused, nothing was changed: node03: current {V1}, previous {V1}" in line, line
    assert {n: pf.tree(n) for n in NODES} == trees, "a refused promote touched a node"
    assert pf.operation(op_id)["status"] == "paused"
    # its check renewed the leases under the promote; refused, it leaves them marked paused again
    assert {n: (pf.lease(n) or {}).get("state") for n in NODES} == dict.fromkeys(NODES, "paused")
    move_current(pf, "node03", V2)

    # abort, from yet another process: on_failure=rollback_fleet puts the canary back on its baseline
    aborted = pf.cli("abort", "--yes", spec=pf.paused_spec)
    assert aborted.rc == 0, aborted.output[-3000:]
    assert pf.links() == before
    row = pf.operation(op_id)
    assert (row["status"], row["recovered_by"]) == ("aborted", op_id), row
    assert "on_failure=rollback_fleet: returned 1 host(s) to the baseline" in row["message"], row
    moves = [e for e in pf.journal("node01") if e["event"] in ("activated", "rolled_back")]
    assert [(e["event"], e["version"], e["rollout_id"]) for e in moves[-2:]] == [
        ("activated", V3, op_id),
        ("rolled_back", V2, op_id),
    ]
    for node in NODES[1:]:  # never touched by this rollout
        assert not [e for e in pf.journal(node) if e.get("rollout_id") == op_id], pf.journal(node)[-3:]
    assert all(pf.lease(n) is None for n in NODES)
    code, report = pf.status()
    assert code == ExitCode.OK, json.dumps(report, indent=1)[-2000:]
    assert pf.cli("promote", op_id, "--yes", spec=pf.paused_spec).rc == ExitCode.USAGE  # nothing paused


def test_03_a_batch_past_its_deadline_fails_and_the_policy_returns_the_baseline(pf: Progressive) -> None:
    before = pf.links()
    spec = pf.write("deadline.yml", batch_deadline_s=DEADLINE_S)
    started = time.monotonic()
    result = pf.deploy_with(spec, V4, ops=DEADLINE_VERIFY_OPS)
    assert result.rc == ExitCode.OPERATION_FAILED, result.output[-3000:]
    assert f"canary: batch deadline {DEADLINE_S} s passed" in result.stdout, result.stdout[-3000:]
    op_id = pf.last_operation()["id"]
    canary = [r for r in pf.outcomes(op_id) if r["step"] == "canary"]
    assert [(r["host"], r["outcome"]) for r in canary] == [("node01", "not_finished")], canary
    # cut off inside the node module (verify), not before it started
    assert canary[0]["message"].startswith(
        f"batch deadline {DEADLINE_S} s passed (not finished in '{MODULE_TASK}'"
    ), canary
    assert "not scheduled: node02, node03" in pf.operation(op_id)["message"]
    # the canary's node module ran on under its lock after the run was stopped; the undo waited for it,
    # so nothing moves afterwards and every node is on its baseline, current AND previous
    assert pf.links() == before, f"after {time.monotonic() - started:.0f} s: {pf.links()}"
    journals = {n: pf.journal(n) for n in NODES}
    time.sleep(5)
    assert {n: pf.journal(n) for n in NODES} == journals, "a node kept moving after the deploy ended"
    assert pf.links() == before
    assert pf.operation(op_id)["status"] == "rolled_back"
    # the node journal says where the cut-off module ended and that node01 is back on V2 for this rollout
    mine = [e for e in pf.journal("node01") if e.get("rollout_id") == op_id]
    assert mine and mine[0]["event"] == "staged" and mine[0]["version"] == V4, mine
    moves = [e for e in pf.journal("node01") if e["event"] in ("activated", "rolled_back")]
    assert moves[-1]["version"] == before["node01"][0], moves[-2:]
    if any(e["event"] == "activated" for e in mine):  # it did activate V4 after the stop: the undo followed
        assert (moves[-1]["event"], moves[-1]["rollout_id"]) == ("rolled_back", op_id), moves[-2:]
    code, report = pf.status()
    assert code == ExitCode.OK, json.dumps(report, indent=1)[-2000:]

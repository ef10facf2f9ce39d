"""End-to-end: `execution.mode: streaming` deploys to 3 real sshd nodes on 127.0.0.1 through ansible-runner's
transmit -> `ansible-runner worker` -> process, and leaves the same nodes, journals and ledger rows as a
local-mode deploy of the same fleet. The two specs differ only in `execution`; one work dir, one ledger.

Tests run in file order: local deploys of V1 (onto empty nodes) and V2 (the reference: onto a release), a
streaming deploy of V3 (onto a release, like V2), a streaming status.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from e2e_driver import VERIFY_OPS, CliResult, E2EFleet, retag
from sshd_fleet import SshdFleet, sshd_missing_reason

pytestmark = pytest.mark.e2e

V1, V2, V3 = "7.1.0", "7.2.0", "7.3.0"
NODES = ("node01", "node02", "node03")


class Streaming(E2EFleet):
    streaming_spec: Path

    def artifact(self, version: str) -> Path:
        """V1 is built by `solfleet build`; V2 and V3 are its bytes under another MANIFEST version."""
        path = self.dist / f"solfleet-ops-{version}.tar.gz"
        if version != V1 and not path.exists():
            retag(super().artifact(V1), path, version)
        return super().artifact(version) if version == V1 else path

    def run_dirs(self, op_id: str) -> Path:
        (path,) = self.work.glob(f"fleets/*/runs/{op_id}")
        return path

    def host_rows(self, op_id: str) -> list[sqlite3.Row]:
        with self.ledger() as conn:
            query = "SELECT * FROM host_outcomes WHERE operation_id = ? ORDER BY host, id"
            return conn.execute(query, (op_id,)).fetchall()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Streaming]:
    reason = sshd_missing_reason()
    if reason:
        pytest.skip(reason)
    sshd = SshdFleet(tmp_path_factory.mktemp("streaming-sshd"), count=len(NODES))
    base = tmp_path_factory.mktemp("streaming-controller")
    try:
        sshd.start()
        spec = sshd.spec(fleet="streaming")
        local = base / "local.yml"
        local.write_text(yaml.safe_dump(spec, sort_keys=False))
        streaming = base / "streaming.yml"
        streaming.write_text(yaml.safe_dump({**spec, "execution": {"mode": "streaming"}}, sort_keys=False))
        f = Streaming(sshd=sshd, spec=local, work=base / "work", dist=base / "dist")
        f.streaming_spec = streaming
        yield f
    finally:
        sshd.stop()


def _assert_ok(result: CliResult, what: str) -> None:
    assert result.rc == 0, f"{what} exited {result.rc}:\n{result.output[-3000:]}"


def _deploy(f: Streaming, version: str, spec: Path) -> CliResult:
    args = ["deploy", "--version", version, "--artifact", str(f.artifact(version))]
    return f.cli(*args, "--verify-ops", VERIFY_OPS, "--yes", spec=spec)


def _shape(row: sqlite3.Row) -> dict[str, object]:
    """A ledger host row with what must differ between two deploys (ids, versions, times) reduced to
    whether it is set."""
    out: dict[str, object] = {}
    for key in row.keys():  # noqa: SIM118 (sqlite3.Row has keys(), not iteration over them)
        value = row[key]
        if key in ("id", "operation_id", "version_before", "version_after", "recorded", "message"):
            out[key] = value is not None
        elif key == "phases":
            out[key] = sorted(json.loads(value))
        else:
            out[key] = value
    return out


def test_local_deploys_are_the_reference(fleet: Streaming) -> None:
    _assert_ok(_deploy(fleet, V1, fleet.spec), f"local deploy {V1}")
    _assert_ok(_deploy(fleet, V2, fleet.spec), f"local deploy {V2}")
    op = fleet.last_operation()
    assert all(fleet.link(n, "current") == V2 and fleet.verified(n, V2) for n in NODES)
    assert not (fleet.run_dirs(op["id"]) / "streaming").exists(), "local mode streamed"
    assert not list(fleet.run_dirs(op["id"]).glob("artifacts/*/worker.json"))


def test_streaming_deploy_matches_local_and_ran_in_the_worker(fleet: Streaming) -> None:
    reference = fleet.last_operation()
    assert reference["version"] == V2
    result = _deploy(fleet, V3, fleet.streaming_spec)
    _assert_ok(result, f"streaming deploy {V3}")
    op = fleet.last_operation()
    assert op["id"] != reference["id"] and op["version"] == V3 and op["status"] == "succeeded", dict(op)
    for node in NODES:
        assert fleet.link(node, "current") == V3 and fleet.link(node, "previous") == V2
        assert fleet.verified(node, V3), f"{node}: releases/{V3} not verified"
        assert [(e["event"], e["version"]) for e in fleet.journal(node)][-5:] == [
            ("staged", V3),
            ("verified", V3),
            ("switching", V3),
            ("activated", V3),
            ("healthy", V3),
        ]
        assert all(e["rollout_id"] == op["id"] for e in fleet.journal(node)[-5:])
    # the ledger: the same rows, in the same shape, as the local deploy's
    ours, theirs = fleet.host_rows(op["id"]), fleet.host_rows(reference["id"])
    assert [r["outcome"] for r in ours] == [r["outcome"] for r in theirs]
    assert [_shape(r) for r in ours] == [_shape(r) for r in theirs]
    moved = {
        (r["host"], r["version_before"], r["version_after"]) for r in ours if r["outcome"] == "activated"
    }
    assert moved == {(n, V2, V3) for n in NODES}
    # ...from the same playbook_on_stats counts
    assert fleet.run_stats(op["id"]) == fleet.run_stats(reference["id"])
    # every runner run of this deploy went through a worker: its own private_data_dir, unpacked from the
    # transmitted stream, was ansible-playbook's working dir, and what process wrote came from its stream
    run_dir = fleet.run_dirs(op["id"])
    idents = sorted(p.name for p in (run_dir / "artifacts").iterdir())
    assert idents and sorted(p.name for p in (run_dir / "streaming").iterdir()) == idents
    for ident in idents:
        record = json.loads((run_dir / "artifacts" / ident / "worker.json").read_text())
        worker_dir = run_dir / "streaming" / ident / "worker"
        assert record["private_data_dir"] == str(worker_dir)
        assert record["argv"][1:4] == ["-m", "ansible_runner", "worker"]
        assert record["statuses"] == ["starting", "running", "successful"], (ident, record)
        assert record["returncode"] == 0 and record["cwd"] == str(worker_dir / "project")
        assert record["command"][:3] == ["ansible-playbook", "-i", str(worker_dir / "inventory")]
        stdout = (worker_dir / "artifacts" / ident / "stdout").read_text()
        assert stdout and (run_dir / "artifacts" / ident / "stdout").read_text() == stdout
        assert list((run_dir / "artifacts" / ident / "job_events").iterdir())
    # the live progress table came from the same events
    assert "node01" in result.stdout and V3 in result.stdout


def test_status_in_streaming_mode(fleet: Streaming) -> None:
    result = fleet.cli("status", "--json", spec=fleet.streaming_spec)
    _assert_ok(result, "streaming status --json")
    report = json.loads(result.stdout)
    assert {n["name"]: n["current"] for n in report["nodes"]} == dict.fromkeys(NODES, V3)
    local = fleet.cli("status", "--json")
    _assert_ok(local, "local status --json")
    assert json.loads(local.stdout)["nodes"] == report["nodes"]
    records = sorted(
        fleet.work.glob("fleets/*/runs/s-*/artifacts/*/worker.json"), key=lambda p: p.stat().st_mtime
    )
    assert records, "the streaming status run left no worker record"
    assert json.loads(records[-1].read_text())["statuses"][-1] == "successful"

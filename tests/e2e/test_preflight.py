"""GPU health as a rollout gate, on real sshd nodes: before each batch the rollout runs the checks of
`solfleet health` on the batch's hosts, and `rollout.unhealthy` decides what an unhealthy node gets.

The fault is real: one byte appended to a file of node03's current release (what a failing disk or a hand
on the node does), which the release-integrity check of `kernels health` finds. node01 is the canary, then
one batch of node02 + node03; max_failures 0.
- `unhealthy: fail`: the batch fails before anything is pushed to it, and the failure policy
  (rollback_fleet) returns the canary;
- `unhealthy: skip`: node03 is quarantined (left on its release, recorded, reported, never counted
  deployed), the others get the release, the deploy exits 9, and status says node03 is suspect (its
  health found the changed file) until a deploy replaces its current release.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from e2e_driver import VERIFY_OPS, CliResult, E2EFleet, retag
from sshd_fleet import SshdFleet, sshd_missing_reason

from fleet.errors import ExitCode

pytestmark = pytest.mark.e2e

NODES = ["node01", "node02", "node03"]
SICK = "node03"
V1, V2, V3 = "8.1.0", "8.2.0", "8.3.0"


class Preflight(E2EFleet):
    def write(self, name: str, **rollout: object) -> Path:
        spec = self.sshd.spec(
            fleet="preflight", on_failure="rollback_fleet", canary={"labels": ["canary"]}, **rollout
        )
        spec["nodes"][0]["labels"] = ["canary"]
        spec["timeouts"] = {"connect_s": 5, "status_s": 30}
        path = self.spec.parent / name
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        return path

    def artifact(self, version: str) -> Path:
        path = self.dist / f"solfleet-ops-{version}.tar.gz"
        if not path.exists() and version != V1:
            retag(super().artifact(V1), path, version)
        return super().artifact(version) if version == V1 else path

    def deploy_with(self, spec: Path, version: str) -> CliResult:
        args = ("deploy", "--version", version, "--artifact", str(self.artifact(version)))
        return self.cli(*args, "--verify-ops", VERIFY_OPS, "--yes", spec=spec)

    def currents(self) -> dict[str, str | None]:
        return {n: self.link(n, "current") for n in NODES}

    def outcome(self, version: str, host: str) -> tuple[str, str | None, str]:
        with self.ledger() as conn:
            row = conn.execute(
                "SELECT h.outcome, h.failed_phase, h.message FROM host_outcomes h"
                " JOIN operations o ON o.id = h.operation_id WHERE o.version = ? AND h.host = ?"
                " ORDER BY h.id DESC LIMIT 1",
                (version, host),
            ).fetchone()
        assert row is not None, f"no ledger row for {host} in the deploy of {version}"
        return tuple(row)  # type: ignore[return-value]


@pytest.fixture(scope="module")
def pre(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Preflight]:
    reason = sshd_missing_reason()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but the SSH e2e fleet cannot start: {reason}")
        pytest.skip(reason)
    sshd = SshdFleet(tmp_path_factory.mktemp("preflight-sshd"), count=3)
    base = tmp_path_factory.mktemp("preflight-controller")
    try:
        sshd.start()
        fleet = Preflight(sshd=sshd, spec=base / "fleet.yml", work=base / "work", dist=base / "dist")
        first = fleet.deploy_with(fleet.write("fleet.yml"), V1)
        assert first.rc == 0, first.output[-3000:]
        assert fleet.currents() == dict.fromkeys(NODES, V1)
        yield fleet
    finally:
        sshd.stop()


@pytest.fixture
def sick_node(pre: Preflight) -> Iterator[Path]:
    """One byte appended to a file of node03's current release; put back afterwards."""
    target = pre.root(SICK) / "releases" / V1 / "kernels" / "ops" / "residual_add.py"
    original = target.read_bytes()
    target.write_bytes(original + b"#")
    try:
        yield target
    finally:
        target.write_bytes(original)


def test_unhealthy_fail_stops_the_batch_before_its_push_and_the_policy_returns_the_canary(
    pre: Preflight, sick_node: Path
) -> None:
    journals = {n: pre.journal(n) for n in NODES[1:]}
    result = pre.deploy_with(pre.spec, V2)
    assert result.rc == ExitCode.OPERATION_FAILED, result.output[-3000:]
    flat = " ".join(result.output.split())
    assert "preflight health failed" in flat and SICK in flat, result.output[-3000:]
    assert "release" in flat and "residual_add.py" in flat, "the reason names the failed check's finding"
    assert pre.currents() == dict.fromkeys(NODES, V1), "rollback_fleet did not return the canary"
    # nothing reached the batch: no new line in node02's or node03's journal, no V2 pushed to them
    assert {n: pre.journal(n) for n in NODES[1:]} == journals
    for node in NODES[1:]:
        assert not (pre.root(node) / "releases" / V2).exists()
    outcome, phase, message = pre.outcome(V2, SICK)
    assert (outcome, phase) == ("unhealthy", "preflight_health") and "residual_add.py" in message
    assert pre.outcome(V2, "node01")[0] == "rolled_back"


def test_unhealthy_skip_quarantines_the_node_and_says_so(pre: Preflight, sick_node: Path) -> None:
    spec = pre.write("skip.yml", unhealthy="skip")
    journal = pre.journal(SICK)
    result = pre.deploy_with(spec, V3)
    assert result.rc == ExitCode.UNHEALTHY, result.output[-3000:]
    flat = " ".join(result.output.split())
    assert "quarantined" in flat and SICK in flat, result.output[-3000:]
    assert pre.currents() == {"node01": V3, "node02": V3, SICK: V1}
    assert pre.journal(SICK) == journal, "the quarantined node was touched"
    assert pre.outcome(V3, SICK)[:2] == ("quarantined", "preflight_health")
    # never counted deployed: status wants node03 where it is; and what its health found is remembered, so
    # status says suspect (worse than the split it also is) until a deploy or rollback replaces current
    status = pre.cli("status", "--json", spec=spec)
    assert status.rc == ExitCode.SUSPECT, status.output[-2000:]
    nodes = {n["name"]: n for n in json.loads(status.stdout)["nodes"]}
    assert nodes[SICK]["drift"] == "suspect" and "release.integrity" in nodes[SICK]["suspect"], nodes[SICK]
    assert nodes[SICK]["desired"] == V1 and nodes["node01"]["desired"] == V3

    # healed, the same deploy brings it in
    sick_node.write_bytes(sick_node.read_bytes()[:-1])
    again = pre.deploy_with(spec, V3)
    assert again.rc == 0, again.output[-3000:]
    assert pre.currents() == dict.fromkeys(NODES, V3)
    assert pre.cli("status", spec=spec).rc == ExitCode.OK  # current replaced: no longer suspect


def test_the_canary_preflight_runs_in_its_lease_call_and_still_stops_a_sick_canary(pre: Preflight) -> None:
    """The first batch's preflight runs in its hosts' lease calls (no health.yml run of its own): a canary
    whose current release has a changed file is still stopped before anything is pushed to any node."""
    canary = NODES[0]
    current = pre.link(canary, "current")
    assert current is not None
    target = pre.root(canary) / "releases" / current / "kernels" / "ops" / "residual_add.py"
    original = target.read_bytes()
    journals = {n: pre.journal(n) for n in NODES}
    target.write_bytes(original + b"#")
    try:
        result = pre.deploy_with(pre.spec, "8.4.0")
    finally:
        target.write_bytes(original)
    assert result.rc == ExitCode.OPERATION_FAILED, result.output[-3000:]
    flat = " ".join(result.output.split())
    assert "preflight health failed" in flat and canary in flat and "residual_add.py" in flat, flat[-3000:]
    assert {n: pre.journal(n) for n in NODES} == journals, "a node was touched"
    assert not any((pre.root(n) / "releases" / "8.4.0").exists() for n in NODES)
    assert pre.outcome("8.4.0", canary)[:2] == ("unhealthy", "preflight_health")
    # the runs of that deploy: the lease (with the canary's health), no preflight run for the canary batch
    runs = sorted(
        (pre.work / "fleets" / "preflight" / "runs" / pre.last_operation()["id"] / "artifacts").iterdir()
    )
    names = [r.name for r in runs]
    assert names[0].endswith("-baseline") and not any("preflight" in n for n in names), names

"""The README's main command on the embedded local fleet, for real: `solfleet build`, `deploy --yes`,
`status`, through the CLI, Ansible with connection local, the node module and the CUDA simulator. No SSH
(the SSH fleet is tests/e2e's), so it runs wherever the package is installed. Slow: ~1 minute."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def solfleet(*args: str, cwd: Path, work: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SOLFLEET_WORK", "NUMBA_ENABLE_CUDASIM")}
    env["SOLFLEET_WORK"] = str(work)
    return subprocess.run(
        [sys.executable, "-m", "fleet.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=1800,  # a cold build compiles PTX: ~11 min seen on 2 cores beside the suite
    )


def test_build_deploy_status_on_the_embedded_local_fleet(tmp_path: Path) -> None:
    work = tmp_path / "work"
    build = solfleet("build", "--version", "0.1.0", cwd=tmp_path, work=work)
    assert build.returncode == 0, build.stdout + build.stderr
    assert (tmp_path / "dist" / "solfleet-ops-0.1.0.tar.gz").is_file()

    deploy = solfleet("deploy", "--version", "0.1.0", "--yes", cwd=tmp_path, work=work)
    assert deploy.returncode == 0, deploy.stdout + deploy.stderr
    assert "succeeded" in deploy.stdout and deploy.stdout.count("activated") == 3

    status = solfleet("status", "--json", cwd=tmp_path, work=work)
    assert status.returncode == 0, status.stderr
    nodes = json.loads(status.stdout)["nodes"]
    assert [n["name"] for n in nodes] == ["n1", "n2", "n3"]
    for n in nodes:
        assert (n["current"], n["desired"], n["drift"], n["simulated"]) == ("0.1.0", "0.1.0", "in_sync", True)
        assert n["releases"] == ["0.1.0"] and n["last_event"]["event"] == "healthy"
        # the filesystem agrees: current is a relative link to the verified release
        root = work / "local-fleet" / n["name"]
        assert os.readlink(root / "current") == "releases/0.1.0"
        assert json.loads((root / "releases" / "0.1.0" / "verify" / "verify.json").read_text())["ok"] is True

    again = solfleet("deploy", "--version", "0.1.0", "--yes", cwd=tmp_path, work=work)
    assert again.returncode == 0, again.stdout + again.stderr
    history = json.loads(solfleet("history", "--json", cwd=tmp_path, work=work).stdout)["operations"]
    assert [op["status"] for op in history] == ["succeeded", "succeeded"]
    second = history[0]["hosts"]
    assert {h["host"]: (h["outcome"], h["changed"]) for h in second} == {
        f"n{i}": ("already_current", False) for i in (1, 2, 3)
    }


@pytest.fixture(scope="module")
def two_versions(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Artifacts 1.0.0 and 2.0.0 built from this tree, shared by the failure-policy tests."""
    base = tmp_path_factory.mktemp("policy")
    for version in ("1.0.0", "2.0.0"):
        built = solfleet("build", "--version", version, cwd=base, work=base / "unused")
        assert built.returncode == 0, built.stdout + built.stderr
    return base / "dist" / "solfleet-ops-1.0.0.tar.gz", base / "dist" / "solfleet-ops-2.0.0.tar.gz"


def policy_spec(path: Path, on_failure: str) -> Path:
    """The embedded fleet with another `rollout.on_failure`."""
    from fleet.spec import embedded_fleet

    text = embedded_fleet().read_text().replace("on_failure: rollback_fleet", f"on_failure: {on_failure}")
    assert f"on_failure: {on_failure}" in text
    path.write_text(text)
    return path


def break_node(root: Path) -> None:
    """A real fault on one node: its artifacts dir is a plain file, so the push there fails. n3 is in
    batch 1, after the canary n1 and next to n2, which may both have activated by then."""
    shutil.rmtree(root / "artifacts")
    (root / "artifacts").write_text("not a directory\n")


@pytest.mark.parametrize("policy", ["rollback_fleet", "halt"])
def test_failed_batch_policy(tmp_path: Path, two_versions: tuple[Path, Path], policy: str) -> None:
    v1, v2 = two_versions
    work = tmp_path / "work"
    first = solfleet(
        "deploy",
        "--version",
        "1.0.0",
        "--artifact",
        str(v1),
        "--verify-ops",
        "residual_add",
        "--yes",
        cwd=tmp_path,
        work=work,
    )
    assert first.returncode == 0, first.stdout + first.stderr
    spec = policy_spec(tmp_path / "fleet.yml", policy)
    break_node(work / "local-fleet" / "n3")
    second = solfleet(
        "--fleet",
        str(spec),
        "deploy",
        "--version",
        "2.0.0",
        "--artifact",
        str(v2),
        "--verify-ops",
        "residual_add",
        "--yes",
        cwd=tmp_path,
        work=work,
    )
    assert second.returncode == 1, second.stdout + second.stderr
    assert "batch 1 failed (1 > max_failures 0): n3: " in second.stdout

    def current(node: str) -> str:
        return os.readlink(work / "local-fleet" / node / "current")

    history = json.loads(solfleet("history", "--json", cwd=tmp_path, work=work).stdout)["operations"]
    op = history[0]
    outcomes = {
        (h["step"], h["host"]): (h["outcome"], h["version_before"], h["version_after"]) for h in op["hosts"]
    }
    assert outcomes[("canary", "n1")] == ("activated", "1.0.0", "2.0.0")
    assert outcomes[("batch 1", "n2")] == ("activated", "1.0.0", "2.0.0")
    # the node module itself takes the push: it refuses, naming the artifacts path it cannot use
    assert outcomes[("batch 1", "n3")][0] == "refused"
    n3 = next(h for h in op["hosts"] if h["host"] == "n3")
    assert "artifacts" in n3["message"], n3
    assert current("n3") == "releases/1.0.0"  # never touched past its failure
    if policy == "rollback_fleet":
        assert op["status"] == "rolled_back"
        # back to the baseline; n3, never moved, is left alone (no undo row for it)
        assert outcomes[("undo", "n1")] == ("rolled_back", "2.0.0", "1.0.0")
        assert outcomes[("undo", "n2")] == ("rolled_back", "2.0.0", "1.0.0")
        assert ("undo", "n3") not in outcomes
        assert current("n1") == current("n2") == "releases/1.0.0"
    else:
        assert op["status"] == "failed" and "on_failure=halt: hosts left where they are" in op["message"]
        assert not any(step.startswith("undo") for step, _ in outcomes)
        assert current("n1") == current("n2") == "releases/2.0.0"

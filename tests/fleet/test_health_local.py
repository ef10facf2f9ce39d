"""`solfleet health` and the node metrics file on the embedded local fleet, for real: build, deploy, health
through the CLI, Ansible with connection local, the node modules and the CUDA simulator. Slow: ~1-2 min."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kernels.harness.gpu_health import ALL_CHECKS

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


def samples(prom: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(prom.read_text()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_health_and_metrics_on_the_local_fleet(tmp_path: Path) -> None:
    work = tmp_path / "work"
    assert solfleet("build", "--version", "0.1.0", cwd=tmp_path, work=work).returncode == 0

    # before any deploy: no current release, so every node is unhealthy (exit 9), and says why
    before = solfleet("health", "--json", "--limit", "n1", cwd=tmp_path, work=work)
    assert before.returncode == 9, before.stdout + before.stderr
    (n1,) = json.loads(before.stdout)["nodes"]
    assert n1["ok"] is False and "no current release" in n1["error"]

    deploy = solfleet("deploy", "--version", "0.1.0", "--yes", "--verify-ops", "residual_add", cwd=tmp_path,
                      work=work)  # fmt: skip
    assert deploy.returncode == 0, deploy.stdout + deploy.stderr

    # the deploy wrote its report in its run dir, and `solfleet report` prints it
    history = json.loads(solfleet("history", "--json", cwd=tmp_path, work=work).stdout)["operations"]
    run = work / "fleets" / "local" / "runs" / history[0]["id"]
    rep = json.loads((run / "report.json").read_text())
    assert rep["status"] == "succeeded" and {h["host"] for s in rep["steps"] for h in s["hosts"]} == {
        "n1",
        "n2",
        "n3",
    }
    assert all(h["phases"].get("verify", 0) > 0 for s in rep["steps"] for h in s["hosts"])
    assert (run / "report.html").is_file() and (run / "report.md").is_file()
    printed = solfleet("report", cwd=tmp_path, work=work)
    assert (
        printed.returncode == 0
        and history[0]["id"] in printed.stdout
        and "| n3 (simulated) | activated |" in printed.stdout
    )

    # the deploy's own health run wrote each node's metrics: release, verify, health checks, last rollout
    for name in ("n1", "n2", "n3"):
        root = work / "local-fleet" / name
        got = samples(root / "metrics" / "solfleet.prom")
        info = [k for k in got if k[0] == "solfleet_release_info"]
        assert len(info) == 1 and dict(info[0][1])["version"] == "0.1.0"
        assert (
            dict(info[0][1])["sha256"]
            == json.loads((root / "releases/0.1.0/verify/artifact.json").read_text())["sha256"]
        )
        assert got[("solfleet_node_simulated", ())] == 1
        assert got[("solfleet_verify_ok", ())] == 1
        assert got[("solfleet_verify_passed", (("dtype", "float32"), ("op", "residual_add")))] == 1
        assert got[("solfleet_health_ok", ())] == 1
        for check in ALL_CHECKS:  # simulated: every GPU check is skipped, none passed
            assert got[("solfleet_health_check", (("check", check), ("status", "skipped")))] == 1
            assert got[("solfleet_health_check", (("check", check), ("status", "passed")))] == 0
        assert got[("solfleet_health_check", (("check", "release.integrity"), ("status", "passed")))] == 1
        assert got[("solfleet_last_rollout_timestamp_seconds", ())] > 0

    health = solfleet("health", "--json", cwd=tmp_path, work=work)
    assert health.returncode == 0, health.stdout + health.stderr
    nodes = json.loads(health.stdout)["nodes"]
    assert [n["name"] for n in nodes] == ["n1", "n2", "n3"]
    for n in nodes:
        assert n["ok"] is True and n["current"] == "0.1.0" and n["simulated"] is True
        by = {c["name"]: c for c in n["checks"]}
        for check in ALL_CHECKS:
            assert (by[check]["status"], by[check]["detail"]) == ("skipped", "skipped (simulated)")
        assert by["release.integrity"]["status"] == "passed"
        assert by["release.current"]["status"] == "passed"
        assert by["kernel.tiny_op"]["status"] == "passed"

    # a file of n2's current release changed on disk: health fails that node (and only it), exit 9
    victim = work / "local-fleet" / "n2" / "releases" / "0.1.0" / "kernels" / "__init__.py"
    os.chmod(victim.parent, 0o755)  # the node seals a verified release read-only
    os.chmod(victim, 0o644)
    victim.write_text(victim.read_text() + "\n# tampered\n")
    bad = solfleet("health", "--json", cwd=tmp_path, work=work)
    assert bad.returncode == 9, bad.stdout + bad.stderr
    verdicts = {n["name"]: n["ok"] for n in json.loads(bad.stdout)["nodes"]}
    assert verdicts == {"n1": True, "n2": False, "n3": True}
    n2 = next(n for n in json.loads(bad.stdout)["nodes"] if n["name"] == "n2")
    integrity = next(c for c in n2["checks"] if c["name"] == "release.integrity")
    assert integrity["status"] == "failed" and "kernels/__init__.py" in integrity["detail"]
    # the health run refreshed n2's metrics with the failed check
    got = samples(work / "local-fleet" / "n2" / "metrics" / "solfleet.prom")
    assert got[("solfleet_health_check", (("check", "release.integrity"), ("status", "failed")))] == 1
    assert got[("solfleet_health_ok", ())] == 0

"""`python -m kernels health` as a node runs it: inside a release under a node root, with the expectations in
its environment. A real copy of the kernels package with a real MANIFEST, the real interpreter, the
simulator; the metrics file it refreshes is parsed with prometheus_client's parser."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kernels.harness import health
from kernels.harness.gpu_health import ALL_CHECKS, GpuExpectations

REPO = Path(__file__).resolve().parents[2]


def make_release(root: Path, version: str) -> Path:
    """<root>/releases/<version> holding kernels/ and a MANIFEST of it, verified, with current -> it."""
    rel = root / "releases" / version
    shutil.copytree(REPO / "kernels", rel / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
    files = {
        str(p.relative_to(rel)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in rel.rglob("*")
        if p.is_file()
    }
    (rel / "MANIFEST.json").write_text(json.dumps({"version": version, "stack_id": "abc123", "files": files}))
    (rel / "verify").mkdir()
    (rel / "verify" / "verify.json").write_text(json.dumps({"ok": True, "results": [
        {"op": "residual_add", "dtype": "float32", "case": "3x37", "ok": True}]}))  # fmt: skip
    (rel / "verify" / "artifact.json").write_text(json.dumps({"sha256": "f" * 64}))
    (root / "journal.jsonl").write_text(
        json.dumps({"event": "activated", "time": "2026-12-01T10:00:00Z"}) + "\n"
    )
    os.symlink(f"releases/{version}", root / "current")
    return rel


def run_health(root: Path, expect: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ["PATH"],
        "NUMBA_ENABLE_CUDASIM": "1",
        "PYTHONPATH": str(root / "current"),
        "PYTHONDONTWRITEBYTECODE": "1",
        "SOLFLEET_ROOT": str(root),
        "SOLFLEET_HEALTH_EXPECT": json.dumps(expect),
    }
    return subprocess.run(
        [sys.executable, "-m", "kernels", "health", "--json"],
        cwd=root / "current",
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_health_in_a_release_on_a_node(tmp_path: Path) -> None:
    root = tmp_path / "node"
    rel = make_release(root, "1.0.0")
    p = run_health(root, {"count": "1", "model": "H200", "cc": "9.0", "driver": "580", "cuda": "13.0"})
    assert p.returncode == 0, p.stdout + p.stderr
    rep = json.loads(p.stdout)
    by = {c["name"]: c for c in rep["checks"]}
    assert rep["ok"] is True and rep["simulated"] is True
    assert [c["name"] for c in rep["checks"][: len(ALL_CHECKS)]] == list(ALL_CHECKS)
    assert all((by[n]["status"], by[n]["detail"]) == ("skipped", "skipped (simulated)") for n in ALL_CHECKS)
    assert by["release.integrity"]["status"] == "passed" and "1.0.0" in by["release.integrity"]["detail"]
    assert by["release.current"]["status"] == "passed"
    assert by["kernel.tiny_op"]["status"] == "passed"
    assert rep["metrics"]["written"] is True

    samples = [s for f in text_string_to_metric_families((root / "metrics" / "solfleet.prom").read_text())
               for s in f.samples]  # fmt: skip
    (info,) = [s for s in samples if s.name == "solfleet_release_info"]
    assert info.labels == {"version": "1.0.0", "sha256": "f" * 64, "stack_id": "abc123", "simulated": "true"}
    (last,) = [s for s in samples if s.name == "solfleet_last_rollout_timestamp_seconds"]
    assert last.value == 1796119200.0  # 2026-12-01T10:00:00Z
    statuses = {
        (s.labels["check"], s.labels["status"]): s.value for s in samples if s.name == "solfleet_health_check"
    }
    assert statuses[("gpu.ecc", "skipped")] == 1 and statuses[("gpu.ecc", "passed")] == 0

    # one byte of the release changed: integrity fails, the run exits 1, and the failure names the file
    victim = rel / "kernels" / "registry.py"
    victim.write_text(victim.read_text() + "#")
    p = run_health(root, {})
    assert p.returncode == 1
    rep = json.loads(p.stdout)
    (bad,) = [c for c in rep["checks"] if c["status"] == "failed"]
    assert bad["name"] == "release.integrity" and "kernels/registry.py" in bad["detail"]


def test_current_must_be_the_verified_release_health_runs_from(tmp_path: Path) -> None:
    root = tmp_path / "node"
    rel = make_release(root, "1.0.0")
    assert health.current_valid(root, rel)[0].value == "passed"
    (rel / "verify" / "failed.json").write_text("{}")
    status, detail = health.current_valid(root, rel)
    assert status.value == "failed" and "failed after activation" in detail
    (rel / "verify" / "failed.json").unlink()
    other = make_release(tmp_path / "other", "2.0.0")
    status, detail = health.current_valid(root, other)
    assert status.value == "failed" and "health runs from" in detail
    (root / "current").unlink()
    os.symlink("releases/9.9.9", root / "current")
    status, detail = health.current_valid(root, rel)
    assert status.value == "failed" and "dangles" in detail
    assert health.current_valid(None, rel)[0].value == "skipped"


def test_expectations_come_from_flags_then_the_environment() -> None:
    env = {
        "SOLFLEET_HEALTH_EXPECT": json.dumps(
            {"count": "8", "model": "H200", "cc": "", "driver": "580", "cuda": "13.0"}
        ),
        "SOLFLEET_ROOT": "/opt/solfleet",
    }
    got = health.inputs_from(root=None, expect={"model": "H100", "cc": None}, env=env)
    assert got.expect == GpuExpectations(count=8, model="H100", cc=None, driver="580", cuda="13.0")
    assert str(got.root) == "/opt/solfleet"
    with pytest.raises(ValueError, match="unknown key"):
        health.inputs_from(root=None, expect={}, env={"SOLFLEET_HEALTH_EXPECT": '{"gpus": 8}'})
    with pytest.raises(ValueError, match="count 'eight' is not an integer"):
        health.expectations_from({"count": "eight"})

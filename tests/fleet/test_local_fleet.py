"""The README's main command on the embedded local fleet, for real: `solfleet build`, `deploy --yes`,
`status`, through the CLI, Ansible with connection local, the node module and the CUDA simulator. No SSH
(the SSH fleet is tests/e2e's), so it runs wherever the package is installed. Slow: ~1 minute."""

from __future__ import annotations

import json
import os
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
        timeout=900,
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
        assert n["releases"] == ["0.1.0"] and n["last_event"]["event"] == "activated"
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

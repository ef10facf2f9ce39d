"""`solfleet wheelhouse` + `solfleet provision` over real SSH (sshd nodes on 127.0.0.1), then a deploy that
runs on the provisioned runtime. The runtime is layered on this interpreter (the e2e nodes share the
controller's filesystem) and carries one real wheel built here, installed on each node with
`pip install --no-index --require-hashes` from the pushed wheelhouse: no registry anywhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from e2e_driver import REPO, VERIFY_OPS
from sshd_fleet import SshdFleet, sshd_missing_reason

sys.path.insert(0, str(REPO / "tests" / "fleet"))
from wheels import PROBE_DIST, PROBE_MODULE, build_wheel, pip_wheel_dir  # noqa: E402

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshdFleet]:
    reason = sshd_missing_reason()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but the SSH e2e fleet cannot start: {reason}")
        pytest.skip(reason)
    sshd = SshdFleet(tmp_path_factory.mktemp("provision-fleet"), count=2)
    try:
        sshd.start()
        yield sshd
    finally:
        sshd.stop()


def cli(*args: str, spec: Path, work: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["SOLFLEET_WORK"] = str(work)
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, "-m", "fleet.cli", "--fleet", str(spec), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


def test_provision_twice_then_deploy_on_the_provisioned_runtime(fleet: SshdFleet, tmp_path: Path) -> None:
    links = tmp_path / "links"
    build_wheel(links, version="1.0.0")
    data = fleet.spec(fleet="prov")
    data["stack"]["requirements"] = [f"{PROBE_DIST}==1.0.0"]
    data["provision"] = {
        "mode": "layered",
        "base_python": sys.executable,
        "carry": [PROBE_DIST],
        "supported_os": ["Debian 12", "Debian 13", "Ubuntu 22.04", "Ubuntu 24.04"],
        "min_free_disk_mb": 10,
        "config": {"device_id": 0, "log_level": "debug", "benchmark_iterations": 3},
    }
    del data["defaults"]["python"]  # provisioned: each node's python defaults to its runtime
    spec = tmp_path / "fleet.yml"
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    work = tmp_path / "work"

    wh = cli(
        "wheelhouse",
        "--no-index",
        "--find-links",
        str(links),
        "--find-links",
        str(pip_wheel_dir()),
        spec=spec,
        work=work,
        cwd=tmp_path,
    )
    assert wh.returncode == 0, wh.stdout + wh.stderr
    archive = next((tmp_path / "dist").glob("solfleet-wheelhouse-*.tar.gz"))
    stack_id = archive.name.removeprefix("solfleet-wheelhouse-").removesuffix(".tar.gz")
    lock = (tmp_path / "dist" / f"solfleet-wheelhouse-{stack_id}" / "requirements.lock").read_text()
    assert f"{PROBE_DIST}==1.0.0 --hash=sha256:" in lock

    dry = cli("provision", "--dry-run", "--json", spec=spec, work=work, cwd=tmp_path)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert json.loads(dry.stdout)["check_mode"] is True
    for node in fleet.nodes:
        assert not (node.root / "runtimes").exists(), "a dry run created the runtime"

    first = cli("provision", "--yes", "--json", spec=spec, work=work, cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    hosts = json.loads(first.stdout)["hosts"]
    assert [h["name"] for h in hosts] == ["node01", "node02"]
    assert all(h["failed"] == 0 and h["changed"] >= 3 for h in hosts), hosts
    for node in fleet.nodes:
        python = node.root / "runtimes" / stack_id / "bin" / "python"
        out = subprocess.run(
            [
                str(python),
                "-c",
                f"import {PROBE_MODULE}, numba, sys; print({PROBE_MODULE}.VERSION, sys.prefix)",
            ],
            env={"PATH": "/usr/bin:/bin", "PYTHONNOUSERSITE": "1"},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert out == ["1.0.0", str(node.root / "runtimes" / stack_id)]
        assert (node.root / "wheelhouses" / stack_id / "MANIFEST.json").is_file()
        config = json.loads((node.root / "config.yaml").read_text())
        assert (config["log_level"], config["benchmark_iterations"]) == ("debug", 3)

    second = cli("provision", "--yes", "--json", spec=spec, work=work, cwd=tmp_path)
    assert second.returncode == 0, second.stdout + second.stderr
    assert [(h["name"], h["changed"], h["failed"]) for h in json.loads(second.stdout)["hosts"]] == [
        ("node01", 0, 0),
        ("node02", 0, 0),
    ]

    build = cli("build", "--version", "1.0.0", spec=spec, work=work, cwd=tmp_path)
    assert build.returncode == 0, build.stdout + build.stderr
    deploy = cli(
        "deploy",
        "--version",
        "1.0.0",
        "--yes",
        "--verify-ops",
        VERIFY_OPS,
        spec=spec,
        work=work,
        cwd=tmp_path,
    )
    assert deploy.returncode == 0, deploy.stdout + deploy.stderr
    inventory = next((work / "fleets" / "prov" / "runs").glob("r-*/inventory/hosts.yml")).read_text()
    for node in fleet.nodes:
        runtime = str(node.root / "runtimes" / stack_id / "bin" / "python")
        assert (
            f'solfleet_python: !unsafe "{runtime}"' in inventory
            and f'ansible_python_interpreter: !unsafe "{runtime}"' in inventory
        )
        assert os.readlink(node.root / "current") == "releases/1.0.0"
        assert (
            json.loads((node.root / "releases" / "1.0.0" / "verify" / "verify.json").read_text())["ok"]
            is True
        )

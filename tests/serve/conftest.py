"""Real service instances for the tests: `python -m kernels.serve` as a subprocess on 127.0.0.1, under the
CUDA simulator where there is no GPU (tests/conftest.py sets it), driven over HTTP by tritonclient."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from loopback import free_port

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 120.0


@dataclass
class Instance:
    proc: subprocess.Popen[bytes]
    port: int
    config: Path
    log: Path

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"http://{self.url}{path}", timeout=10) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def metrics(self) -> str:
        status, body = self.get("/metrics")
        assert status == 200
        return body.decode()

    def metric(self, name: str, **labels: str) -> float:
        """One sample's value from /metrics (0 when the series does not exist yet)."""
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        for line in self.metrics().splitlines():
            if line.startswith("#") or " " not in line:
                continue
            key, value = line.rsplit(" ", 1)
            series, _, rest = key.partition("{")
            got = ",".join(sorted(p for p in rest.rstrip("}").split(",") if p))
            if series == name and got == want:
                return float(value)
        return 0.0

    def log_text(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def write_config(
    path: Path, *, port: int, state_dir: Path, service: dict[str, Any] | None = None, **top: Any
) -> Path:
    cfg: dict[str, Any] = {"device_id": 0, "log_level": "info", **top}
    cfg["service"] = {"host": "127.0.0.1", "port": port, "state_dir": str(state_dir), **(service or {})}
    path.write_text(yaml.safe_dump(cfg))
    return path


def start(config: Path, port: int, *, pythonpath: Path = REPO, wait: bool = True) -> Instance:
    """Start an instance and wait until /v2/health/ready answers 200 (or the process exits)."""
    log = config.with_suffix(".log")
    env = dict(os.environ, PYTHONPATH=str(pythonpath), SOLFLEET_SERVE_TESTING="1", PYTHONUNBUFFERED="1")
    with log.open("ab") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kernels.serve", "--config", str(config)],
            cwd=config.parent,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
    inst = Instance(proc, port, config, log)
    if wait:
        wait_ready(inst)
    return inst


def wait_ready(inst: Instance, *, pid: int | None = None) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if inst.proc.poll() is not None:
            raise AssertionError(f"service exited {inst.proc.returncode} before ready:\n{inst.log_text()}")
        state = inst.config.parent / "run" / "serve-0.json"
        try:
            d = json.loads(state.read_text())
        except (OSError, ValueError):
            d = {}
        if d.get("pid") == inst.proc.pid and d.get("state") == "ready":
            return
        time.sleep(0.1)
    raise AssertionError(f"service not ready after {START_TIMEOUT_S} s:\n{inst.log_text()}")


def make_release(dest: Path, version: str) -> Path:
    """A release directory as a node holds one: MANIFEST.json beside a copy of the kernels package."""
    dest.mkdir(parents=True)
    shutil.copytree(REPO / "kernels", dest / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
    manifest = {"format": 1, "name": "solfleet-ops", "version": version, "git": {"commit": "0" * 40}}
    (dest / "MANIFEST.json").write_text(json.dumps(manifest))
    return dest


@pytest.fixture(scope="module")
def main_instance(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Every op self-tested, the default limits, a small memory limit for the over-limit case."""
    d = tmp_path_factory.mktemp("serve-main")
    port = free_port()
    cfg = write_config(
        d / "config.yaml",
        port=port,
        state_dir=d / "run",
        memory_limit_mb=8,
        service={"max_concurrency": 2, "max_queue": 8},
    )
    inst = start(cfg, port)
    yield inst
    inst.stop()

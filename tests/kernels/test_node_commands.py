"""info and health as the fleet runs them: their JSON keys and exit codes, under the simulator (and on a
GPU where there is one); the peaks cache location."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from opcheck import needs_gpu

from kernels.runtime import device

REPO = Path(__file__).resolve().parents[2]


def _run(*args: str, sim: bool) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if sim:
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    else:
        env.pop("NUMBA_ENABLE_CUDASIM", None)
    return subprocess.run([sys.executable, "-m", "kernels", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300, check=False)  # fmt: skip


def test_health_json_simulated():  # type: ignore[no-untyped-def]
    p = _run("health", "--json", sim=True)
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["ok"] is True and rep["simulated"] is True
    assert [c["name"] for c in rep["checks"]][-4:] == [
        "release.integrity",
        "release.current",
        "kernel.tiny_op",
        "gpu.memory",
    ]


def test_info_json_simulated():  # type: ignore[no-untyped-def]
    p = _run("info", "--json", sim=True)
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["simulated"] is True and set(rep) == {"simulated", "device", "versions", "peaks", "coverage"}
    assert rep["coverage"]["rows"] and {r["tier"] for r in rep["coverage"]["rows"]} == {"simulated"}
    assert rep["peaks"]["mem_gbs"] is None


def test_cache_dir_follows_xdg(monkeypatch, tmp_path):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert device.cache_dir() == tmp_path / "solfleet"


@pytest.mark.gpu
@needs_gpu
def test_info_and_health_on_gpu(tmp_path):  # type: ignore[no-untyped-def]
    os.environ["XDG_CACHE_HOME"] = str(tmp_path)
    p = _run("info", "--json", sim=False)
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["simulated"] is False and rep["peaks"]["mem_gbs"] > 100 and rep["peaks"]["fp32_tflops"] > 1
    assert rep["device"]["sm_count"] > 0 and rep["versions"]["cuda_driver"]
    assert list(tmp_path.glob("solfleet/copy-bw-*.json")), "copy bandwidth not cached"
    h = _run("health", "--json", sim=False)
    assert h.returncode == 0 and json.loads(h.stdout)["ok"] is True, h.stdout + h.stderr

"""The verify harness: its JSON shape, that it fails (naming the op) when a kernel is broken, the CLI exit
codes and the unknown-op error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from opcheck import needs_device

from kernels.harness import verify
from kernels.ops import residual_add, softmax
from kernels.registry import select
from kernels.runtime.arrays import SIMULATED

REPO = Path(__file__).resolve().parents[2]
SIM_ENV = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}


def _cli(*args: str, code: str | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m", "kernels", *args]
    return subprocess.run(cmd, cwd=REPO, env=SIM_ENV, capture_output=True, text=True, timeout=120,
                          check=False)  # fmt: skip


@needs_device
def test_report_shape_and_all_pass():  # type: ignore[no-untyped-def]
    rep = verify.run(select("residual_add,softmax"), shapes="verify")
    assert rep["ok"] is True, (rep["seed"], [r for r in rep["results"] if not r["ok"]])
    assert rep["simulated"] is SIMULATED
    assert set(rep) >= {"ok", "simulated", "device", "versions", "results", "seed"}
    assert {"numba", "numba-cuda", "numpy"} <= set(rep["versions"])
    for r in rep["results"]:
        assert set(r) >= {"op", "dtype", "case", "ok", "rel_err", "tol"}
        assert r["ok"] and 0 <= r["rel_err"] <= r["tol"]
    assert {r["op"] for r in rep["results"]} == {"residual_add", "softmax"}


@needs_device
def test_wrong_values_fail_naming_the_op(monkeypatch):  # type: ignore[no-untyped-def]
    real = residual_add._launch

    def off_by_a_bit(xo, ro, oo, stream=0):  # type: ignore[no-untyped-def]
        real(xo, xo, oo, stream)  # computes x + x instead of x + r

    monkeypatch.setattr(residual_add, "_launch", off_by_a_bit)
    rep = verify.run(select("residual_add,softmax"), shapes="verify")
    bad = [r for r in rep["results"] if not r["ok"]]
    # the failing cases and the seed in the message: CI once saw softmax fail here too (2026-12-05)
    assert rep["ok"] is False and rep["failed_ops"] == ["residual_add"], (rep["seed"], bad)
    assert bad and all(r["op"] == "residual_add" and "exceeds tolerance" in r["error"] for r in bad)


@needs_device
def test_unwritten_output_fails(monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setattr(softmax, "softmax", lambda x, out=None, **kw: out)  # launches nothing
    rep = verify.run(select("softmax"), shapes="verify")
    assert rep["ok"] is False
    assert all("not written" in r["error"] for r in rep["results"])


def test_rel_error_flags_nan_and_shape():  # type: ignore[no-untyped-def]
    ref = np.ones((2, 3))
    assert verify.rel_error(np.ones((2, 3), np.float32), ref) == (0.0, None)
    out = np.ones((2, 3))
    out[1, 2] = np.nan
    assert "1 of 6 elements not written" in verify.rel_error(out, ref)[1]
    assert "shape (3, 2)" in verify.rel_error(np.ones((3, 2)), ref)[1]


def test_cli_verify_json_under_simulator():  # type: ignore[no-untyped-def]
    p = _cli("verify", "--json", "--ops", "residual_add,cast")
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["ok"] is True and rep["simulated"] is True
    assert {r["op"] for r in rep["results"]} == {"residual_add", "cast"}


def test_cli_broken_kernel_exits_nonzero_naming_the_op():  # type: ignore[no-untyped-def]
    code = (
        "import sys, kernels.ops.rmsnorm as m\n"
        "plain = m._K.plain\n"
        "class Broken:\n"
        "    def launch(self, grid, block, args, **kw):\n"
        "        pass\n"  # writes nothing: outputs stay NaN
        "plain.update({k: Broken() for k in plain})\n"
        "from kernels.cli import main\n"
        "sys.exit(main(['verify', '--ops', 'rmsnorm,residual_add']))\n"
    )
    p = _cli(code=code)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "failed ops: rmsnorm" in p.stdout and "FAIL" in p.stdout


def test_cli_unknown_op_is_one_line_exit_2():  # type: ignore[no-untyped-def]
    p = _cli("verify", "--ops", "residual_add,nope")
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown op(s) nope" in lines[0] and "allowed:" in lines[0]


@pytest.mark.skipif(not SIMULATED, reason="the simulator run the fleet does on every simulated deploy")
def test_full_simulated_verify_passes_every_op():  # type: ignore[no-untyped-def]
    # What a simulated node runs on every deploy: every op, every case. How long it takes is measured by
    # benchmarks/bench.py, not asserted here (a timed assert fails on a busy machine, not on slow code).
    p = _cli("verify", "--json")
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    report = json.loads(p.stdout)
    assert report["ok"] is True
    assert {r["op"] for r in report["results"]} >= {"residual_add", "rmsnorm", "gemm"}, report

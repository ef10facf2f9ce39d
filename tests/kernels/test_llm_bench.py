"""benchmarks/h200_llm.py's plumbing under the CUDA simulator (the dry run the device script runs first): each
op's sim cases staged, launched once and checked against float64; a kernel that writes wrong values makes the
script fail and its row say so. Timing and the torch / Liger providers need the GPU (benchmarks/h100/)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
OPS = "residual_add,rope,cast_fp8,fused_add_rmsnorm"

pytestmark = pytest.mark.skipif(
    os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="the dry run is the simulator's"
)


# residual_add's launch replaced by one that writes nothing: its output keeps the NaN poison
LAZY = """
import runpy, sys
import kernels.ops.residual_add as m
m.residual_add = lambda x, r, out=None, **kw: out
sys.argv = ["h200_llm.py", *sys.argv[1:]]
runpy.run_path("benchmarks/h200_llm.py", run_name="__main__")
"""


def run(tmp_path: Path, lazy: bool = False) -> tuple[subprocess.CompletedProcess[str], dict]:  # type: ignore[type-arg]
    head = [sys.executable, "-c", LAZY] if lazy else [sys.executable, "benchmarks/h200_llm.py"]
    p = subprocess.run(
        [*head, "--out", str(tmp_path), "--ops", OPS, "--dtypes", "bfloat16"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    doc = json.loads((tmp_path / "h200_llm.json").read_text())
    return p, doc


def test_dry_run_checks_every_op_it_runs(tmp_path: Path) -> None:
    p, doc = run(tmp_path)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert doc["versions"]["simulated"] is True and doc["errors"] == []
    rows = doc["rows"]
    assert {r["op"] for r in rows} == set(OPS.split(",")) and all(r["dtype"] == "bfloat16" for r in rows)
    assert all(r["ok"] and r["tier"] == "simulated" and r["rel_err"] <= r["tol"] for r in rows), rows
    assert all(r["scale_ok"] for r in rows if r["op"] == "cast_fp8")
    assert "checks: " in p.stdout and f"{len(rows)}/{len(rows)} ok" in p.stdout


def test_a_kernel_that_writes_nothing_fails_the_run_and_its_row(tmp_path: Path) -> None:
    p, doc = run(tmp_path, lazy=True)
    assert p.returncode == 1, p.stdout[-2000:] + p.stderr[-2000:]
    bad = [r for r in doc["rows"] if not r["ok"]]
    assert [r["op"] for r in bad] == ["residual_add"] and "not written" in str(bad[0]["why"]), bad

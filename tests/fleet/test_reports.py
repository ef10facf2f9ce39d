"""Rollout reports from a real SQLite ledger (host outcomes with phase timings, gate verdicts judged on the
committed H200 bench figures), and report.html rendered by a real headless Chromium: the screenshot is not
blank and every host is named in the page as the browser built it."""

from __future__ import annotations

import copy
import json
import shutil
import struct
import subprocess
import zlib
from pathlib import Path
from typing import Any

import pytest

from fleet import gating, reports
from fleet.ledger import HostRecord, Ledger, OpStatus
from fleet.policy import Gates

REPO = Path(__file__).resolve().parents[2]
BENCH: dict[str, Any] = json.loads((REPO / "benchmarks/h200/bench-2026-11-30.json").read_text())
HOSTS = ("gpu-a1", "gpu-a2", "gpu-b1")
CHROMIUM = shutil.which("chromium")


def ledger_with_a_failed_rollout(path: Path) -> str:
    slow = copy.deepcopy(BENCH)
    for r in slow["results"]:
        if r["op"] == "gemm":
            r.update(
                median_us=r["median_us"] * 1.3,
                p10_us=r["p10_us"] * 1.3,
                p90_us=r["p90_us"] * 1.3,
                sol=r["sol"] / 1.3,
            )
    gates = Gates(
        min_sol={"gemm": {"float32": 0.6, "float16": 0.35}, "residual_add": 0.8},
        max_regression_vs_previous=0.1,
    )
    judged = [
        gating.evaluate_host(
            host="gpu-a1", solfleet={"bench": slow, "bench_previous": BENCH}, gates=gates, simulated=False
        ),
        gating.evaluate_host(
            host="gpu-a2", solfleet={"bench": BENCH, "bench_previous": BENCH}, gates=gates, simulated=False
        ),
        gating.evaluate_host(host="gpu-b1", solfleet={}, gates=gates, simulated=True),
    ]
    with Ledger(path) as ledger:
        op = ledger.begin(
            op_id="r-20261201-1",
            kind="deploy",
            version="2.0.0",
            fleet="lab",
            plan={"batches": [{"name": "canary", "hosts": ["gpu-a1"]}]},
        )
        phases = {
            "push": 0.8,
            "unpack_check": 0.4,
            "verify": 6.2,
            "bench": 12.5,
            "activate": 0.05,
            "health": 1.1,
        }
        ledger.record_hosts(
            op,
            [
                HostRecord(
                    "canary",
                    "gpu-a1",
                    "gate_failed",
                    True,
                    "1.0.0",
                    "2.0.0",
                    "gate",
                    judged[0].message(),
                    phases,
                    False,
                ),
                HostRecord(
                    "canary",
                    "gpu-a2",
                    "activated",
                    True,
                    "1.0.0",
                    "2.0.0",
                    None,
                    "2.0.0 activated",
                    phases,
                    False,
                ),
                HostRecord(
                    "canary", "gpu-b1", "activated", True, "1.0.0", "2.0.0", None, "", {"verify": 3.0}, True
                ),
                HostRecord(
                    "undo",
                    "gpu-a1",
                    "rolled_back",
                    True,
                    "2.0.0",
                    "1.0.0",
                    None,
                    "",
                    {"activate": 0.1},
                    False,
                ),
            ],
        )
        ledger.finish(op, OpStatus.ROLLED_BACK, "canary failed: gpu-a1: gate")
    gating.record(path, op, judged)
    return op


def test_report_json_and_md_from_the_ledger(tmp_path: Path) -> None:
    op = ledger_with_a_failed_rollout(tmp_path / "ledger.sqlite")
    rep = reports.report_from_ledger(tmp_path / "ledger.sqlite", None)
    assert rep["id"] == op and rep["status"] == "rolled_back"
    assert [s["step"] for s in rep["steps"]] == ["canary", "undo"]
    assert rep["undo"][0]["host"] == "gpu-a1" and rep["undo"][0]["version_after"] == "1.0.0"
    failed = [g for g in rep["gates"] if g["verdict"] == "failed"]
    assert failed and {g["host"] for g in failed} == {"gpu-a1"} and {g["op"] for g in failed} == {"gemm"}
    assert {g["verdict"] for g in rep["gates"] if g["host"] == "gpu-b1"} == {"not_evaluated"}
    paths = reports.write_reports(tmp_path / "run", rep)
    assert [p.name for p in paths] == list(reports.REPORT_FILES)
    assert json.loads(paths[0].read_text())["id"] == op
    md = paths[1].read_text()
    assert "| gpu-a1 | gate_failed | 1.0.0 -> 2.0.0 | gate |" in md and "max_regression_vs_previous" in md
    with pytest.raises(Exception, match="no operation 'r-nope'"):
        reports.report_from_ledger(tmp_path / "ledger.sqlite", "r-nope")


def png_pixels(data: bytes) -> bytes:
    """The decompressed scanlines of a PNG (stdlib only: the chunks' IDAT data, inflated)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        if kind == b"IDAT":
            idat += data[pos + 8 : pos + 8 + length]
        pos += 12 + length
    return zlib.decompress(idat)


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (scripts/bootstrap.sh installs it)")
def test_report_html_renders_in_headless_chromium(tmp_path: Path) -> None:
    ledger_with_a_failed_rollout(tmp_path / "ledger.sqlite")
    rep = reports.report_from_ledger(tmp_path / "ledger.sqlite", None)
    html_path = reports.write_reports(tmp_path / "run", rep)[2]
    text = html_path.read_text()
    assert "http://" not in text and "https://" not in text and "<script" not in text  # self-contained
    shot = tmp_path / "shot.png"
    flags = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--window-size=1200,1400",
    ]
    proc = subprocess.run(
        [*flags, f"--screenshot={shot}", html_path.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0 and shot.is_file(), proc.stderr[-2000:]
    pixels = png_pixels(shot.read_bytes())
    assert len(set(pixels)) > 20, "the screenshot is blank"
    dom = subprocess.run(
        [*flags, "--dump-dom", html_path.as_uri()], capture_output=True, text=True, timeout=120, check=False
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    for host in HOSTS:
        assert host in dom.stdout
    # the SOL table is there, coloured: the failing gemm cell of gpu-a1 in the failed colour
    assert reports.VERDICT_COLOURS["failed"] in dom.stdout and "SOL by node and op" in dom.stdout

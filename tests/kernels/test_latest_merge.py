"""benchmarks/latest.py's merge of the H200 reports into latest.json: a row that two reports both timed
keeps both measurements, a failed check in either fails the row, and no reference is overwritten; one
report's two kernels of a case stay two rows; a report is rebuilt from its log; a script may give two runs."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_latest", REPO / "benchmarks" / "latest.py")
assert _spec is not None and _spec.loader is not None
latest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(latest)


def _row(source: str, us: float, ok: bool, refs: dict[str, Any]) -> dict[str, Any]:
    return {"op": "rmsnorm", "dtype": "bfloat16", "case": "16384x4096", "path": "vector", "median_us": us,
            "sol": 0.8, "rel_err": 1e-3, "ok": ok, "source": source, "refs": refs}  # fmt: skip


def test_a_row_timed_twice_keeps_both_and_drops_nothing() -> None:
    llm = _row("h200_llm.py", 80.0, True, {"torch": {"us": 120.0, "ratio": 1.5}, "liger": {"us": 90.0}})
    reg = _row("kernels bench", 82.0, False, {"torch": {"us": 130.0, "ratio": 1.59}, "cupy": {"us": 100.0}})
    other = {**_row("kernels bench", 10.0, True, {}), "op": "cast"}
    (cast, rms) = latest.merge([[llm], [reg, other]])
    assert cast["op"] == "cast" and rms is llm
    assert rms["median_us"] == 80.0 and rms["also"]["kernels bench"]["median_us"] == 82.0
    assert rms["ok"] is False  # the second report's failed check fails the row
    assert rms["refs"]["torch"] == {"us": 120.0, "ratio": 1.5}  # the first report's ratio is not replaced
    assert rms["refs"]["torch@kernels bench"]["ours_us_in_that_run"] == 82.0
    assert rms["refs"]["cupy"]["ours_us_in_that_run"] == 82.0 and "liger" in rms["refs"]


def _gemm_row(path: str, us: float, ratio: float) -> dict[str, Any]:
    return {"op": "o_proj", "dtype": "bfloat16", "case": "16x512x2560", "path": path, "median_us": us,
            "sol": 0.5, "rel_err": 1e-3, "ok": True, "source": "benchmarks/h200_bf16.py",
            "refs": {"cublas": {"median_us": 183.0, "ratio": ratio}}}  # fmt: skip


def test_one_reports_two_kernels_of_a_case_stay_two_rows() -> None:
    """h200_bf16.py times o_proj on auto's TMA tile and on the cp.async tile: two kernels, two rows, each with
    its own cuBLAS ratio (before, the second was filed under the first as 'cublas@...', another run of it)."""
    tma, cp = _gemm_row("wgmma_tma", 181.0, 1.01), _gemm_row("wgmma", 254.0, 0.72)
    rows = latest.merge([[tma, cp]])
    assert [(r["path"], r["refs"]["cublas"]["ratio"]) for r in rows] == [("wgmma", 0.72), ("wgmma_tma", 1.01)]
    assert not any("also" in r for r in rows)
    # another report's row of one kernel joins that kernel's row, whichever came first
    reg = {**_gemm_row("wgmma_tma", 183.0, 1.0), "source": "kernels bench"}
    for first in ([cp], [cp, tma]):
        rows = latest.merge([first, [dict(reg, refs=dict(reg["refs"]))]])
        by_path = {r["path"]: r for r in rows}
        assert len(rows) == 2 and "also" not in by_path["wgmma"]
        if len(first) == 1:  # the TMA row is the registry's own
            assert by_path["wgmma_tma"]["median_us"] == 183.0 and "also" not in by_path["wgmma_tma"]
        else:  # it joined the TMA row
            assert by_path["wgmma_tma"]["also"]["kernels bench"]["median_us"] == 183.0
    # a report's two kernels of a case never both join another report's one row of it (none is dropped)
    lone = {**_gemm_row("auto", 185.0, 0.99), "source": "kernels bench"}
    rows = latest.merge([[lone], [_gemm_row("wgmma_tma", 181.0, 1.01), _gemm_row("wgmma", 250.0, 0.72)]])
    assert sorted(r["median_us"] for r in rows) == [181.0, 185.0, 250.0] and not any(
        "also" in r for r in rows
    )
    # nor does a report's second row of one kernel replace its first
    twice = [
        {**_gemm_row("auto", 180.0, 1.0), "source": "s"},
        {**_gemm_row("auto", 182.0, 1.0), "source": "s"},
    ]
    for first in ([], [_gemm_row("wgmma_tma", 181.0, 1.01)]):
        rows = latest.merge([first, [dict(r) for r in twice]])
        assert sorted(r["median_us"] for r in rows) == sorted([180.0, 182.0] + [181.0] * len(first))
    # a report that names no kernel ("auto") joins the case's one row of another report
    auto = {**_gemm_row("auto", 185.0, 0.99), "source": "kernels bench"}
    (row,) = latest.merge([[_gemm_row("wgmma_tma", 181.0, 1.01)], [auto]])
    assert (
        row["also"]["kernels bench"]["path"] == "auto"
        and row["refs"]["cublas@kernels bench"]["ratio"] == 0.99
    )


def test_a_report_is_rebuilt_from_its_log(tmp_path: Path) -> None:
    """Both scripts log each row as one JSON line when measured: a run whose JSON did not come back is read
    from its log, rows and peaks alike, and the report says it came from a log."""
    row = {"op": "rmsnorm", "dtype": "bfloat16", "case": "16384x4096", "path": "vector", "ours_us": 94.7}
    log = tmp_path / "llm.txt"
    log.write_text(
        "[   14.9s] {'simulated': False, 'device': 'NVIDIA H100 80GB HBM3'} peaks {'mem_gbs': 2955.6}\n"
        "/x/dispatcher.py:748: NumbaPerformanceWarning: grid size 1\n"
        f"[   39.0s] {json.dumps(row)}\n"
        "[    1.7s] ERROR o_proj bfloat16: NVRTCError: compilation log:\x00\n"  # (NVRTC's log ends in a NUL)
        "rmsnorm  bfloat16  16384x4096  vector  94.7  0.96\n"  # the table
    )
    doc = latest.load_report(log)
    assert doc["rows"] == [row] and doc["peaks"] == {"mem_gbs": 2955.6}
    assert doc["device"] == "NVIDIA H100 80GB HBM3" and doc["from_log"] == str(log)
    assert doc["errors"] == ["o_proj bfloat16: NVRTCError: compilation log:\x00"]  # a failed step is said
    cut = tmp_path / "cut.txt"  # killed mid-line; and a card that measured no copy bandwidth
    cut.write_text(
        "[ 0.1s] device H peaks {'mem_gbs': nan, 'fp32_tflops': -inf, 'name': 'nano'}\n"
        f"[ 1.0s] {json.dumps(row)}\n"
        '[ 2.0s] {"op": "rms\n'
    )
    doc = latest.load_report(cut)
    assert doc["rows"] == [row] and doc["peaks"] == {"mem_gbs": None, "fp32_tflops": None, "name": "nano"}
    assert doc["errors"] == ['cut.txt: a row line that is not JSON: [ 2.0s] {"op": "rms']
    gemm_log = tmp_path / "gemm.txt"
    gemm_log.write_text("[    0.3s] device NVIDIA H100 80GB HBM3 peaks {'mem_gbs': 2955.6}\n"
                        f"[    9.5s] {json.dumps({**row, 'op': 'o_proj'})}\n")  # fmt: skip
    assert latest.load_report(gemm_log)["device"] == "NVIDIA H100 80GB HBM3"
    report = tmp_path / "r.json"
    report.write_text(json.dumps({"rows": [row]}))
    assert "from_log" not in latest.load_report(report)  # a JSON report is read as it is
    empty = tmp_path / "empty.txt"
    empty.write_text("Traceback (most recent call last):\n")
    with pytest.raises(SystemExit, match="empty.txt: neither a JSON report nor a log with row lines"):
        latest.load_report(empty)


def test_two_runs_of_one_script_merge_and_are_listed(tmp_path: Path) -> None:
    """--llm twice (a run stopped at its deadline, then one for the rest): both runs' rows, and `inputs`
    naming each file, whether it was a log, and the peaks it measured."""
    a, b = tmp_path / "a.txt", tmp_path / "b.json"
    ra = {"op": "rmsnorm", "dtype": "bfloat16", "case": "16384x4096", "path": "vector", "ours_us": 94.7,
          "torch_us": 128.0, "ok": True}  # fmt: skip
    rb = {**ra, "op": "swiglu", "ours_us": 135.5, "torch_us": 227.1}
    a.write_text(f"[ 1.0s] {{'device': 'H'}} peaks {{'mem_gbs': 1.0}}\n[ 2.0s] {json.dumps(ra)}\n")
    b.write_text(json.dumps({"rows": [rb], "peaks": {"mem_gbs": 2.0}, "errors": ["swiglu fp32: boom"]}))
    c = tmp_path / "c.json"  # a third run timing run 1's case again: kept, not written over run 1's
    c.write_text(json.dumps({"rows": [{**ra, "ours_us": 95.5, "torch_us": 127.0}]}))
    out = tmp_path / "latest.json"
    argv = ["latest.py", "--llm", str(a), "--llm", str(b), "--llm", str(c), "--out", str(out)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, "argv", argv)
        assert latest.main() == 0
    doc = json.loads(out.read_text())
    assert [r["op"] for r in doc["results"]] == ["rmsnorm", "swiglu"]
    rms = doc["results"][0]
    assert rms["median_us"] == 94.7 and rms["source"] == "benchmarks/h200_llm.py run 1"
    assert rms["also"]["benchmarks/h200_llm.py run 3"]["median_us"] == 95.5
    assert rms["refs"]["torch@benchmarks/h200_llm.py run 3"]["ours_us_in_that_run"] == 95.5
    assert doc["device"] == {"name": "H"}  # a log names it by a string: the report's form is a dict
    assert doc["results"][1]["refs"]["torch"]["ratio"] == round(227.1 / 135.5, 3)
    inputs = [(i["from_log"], i["peaks"]) for i in doc["inputs"]["llm"]]
    assert inputs == [(True, {"mem_gbs": 1.0}), (False, {"mem_gbs": 2.0}), (False, None)]
    assert doc["errors"] == {"llm run 2": ["swiglu fp32: boom"]}
    no_roof = tmp_path / "no_roof.json"  # a report without a measured copy bandwidth: the table, no picture
    no_roof.write_text(json.dumps({"rows": [rb], "peaks": {"mem_gbs": None}}))
    png = tmp_path / "roofline.png"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, "argv", ["latest.py", "--llm", str(no_roof), "--out", str(out), "--plot", str(png)])
        assert latest.main() == 0
    assert not png.exists() and json.loads(out.read_text())["results"][0]["op"] == "swiglu"

"""benchmarks/latest.py's merge of the H200 reports into latest.json: a row that two reports both timed
keeps both measurements, a failed check in either fails the row, and no reference is overwritten."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

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

"""The benchmark driver: `python -m kernels bench` for the chosen ops (kernels.harness.bench: the shared
timing code), one row per case appended to benchmarks/results.jsonl (date, commit, device, op, dtype, shape,
path, median, SOL, ratio vs CuPy), optionally the full report as a new latest.json, and a comparison with a
previous report: every case more than --max-slower slower than it there is flagged (exit 1).

    python benchmarks/bench.py --compare cupy --baseline benchmarks/h200/bench-2026-11-30.json \
        [--ops gemm,softmax]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from kernels.harness import bench
from kernels.registry import select

RESULTS = Path(__file__).with_name("results.jsonl")


def rows(report: dict[str, Any], commit: str) -> list[dict[str, Any]]:
    out = []
    for r in report["results"]:
        if "median_us" not in r:
            continue
        out.append({"date": report["date"], "commit": commit, "device": report["device"]["name"],
                    "op": r["op"], "dtype": r["dtype"], "shape": r["case"], "path": r.get("path"),
                    "median_us": r["median_us"], "sol": r.get("sol"),
                    "ratio_vs_cupy": r.get("ratio_vs_cupy")})  # fmt: skip
    return out


def compare(report: dict[str, Any], baseline: dict[str, Any], max_slower: float) -> list[dict[str, Any]]:
    """One row per case of `report`: its median, the baseline's, the change (+: slower) and a flag."""
    base = {(r["op"], r["dtype"], r["case"]): r for r in baseline.get("results", []) if "median_us" in r}
    out = []
    for r in report["results"]:
        b = base.get((r["op"], r["dtype"], r["case"]))
        now = r.get("median_us")
        change = None if b is None or now is None else now / b["median_us"] - 1.0
        out.append({"op": r["op"], "dtype": r["dtype"], "case": r["case"], "median_us": now,
                    "baseline_us": b["median_us"] if b else None, "change": change,
                    "slower": change is not None and change > max_slower,
                    "ok": bool(r.get("ok"))})  # fmt: skip
    return out


def _commit() -> str:
    p = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False)
    return p.stdout.strip() or "unknown"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", help="comma-separated op names (default: all)")
    p.add_argument("--compare", choices=("cupy",))
    p.add_argument("--iters", type=int, default=bench.ITERS)
    p.add_argument(
        "--baseline", type=Path, help="a previous report (e.g. benchmarks/h200/bench-2026-11-30.json)"
    )
    p.add_argument(
        "--max-slower", type=float, default=0.02, help="flag cases slower than this (default 0.02)"
    )
    p.add_argument("--out", type=Path, help="write the full report here (e.g. a new latest.json)")
    p.add_argument("--results", type=Path, default=RESULTS, help="the JSONL file rows are appended to")
    a = p.parse_args()
    report = bench.run(select(a.ops), compare=a.compare, iters=a.iters)
    if a.out:
        a.out.write_text(json.dumps(report, indent=1, default=str))
    with a.results.open("a") as f:
        for row in rows(report, _commit()):
            f.write(json.dumps(row) + "\n")
    bad = not all(r.get("ok") for r in report["results"])
    if a.baseline:
        table = compare(report, json.loads(a.baseline.read_text()), a.max_slower)
        print(f"{'op':<15}{'dtype':<9}{'case':<18}{'now us':>10}{'base us':>10}{'change':>9}  flag")
        for t in table:
            ch = "-" if t["change"] is None else f"{100 * t['change']:+.1f}%"
            base = "-" if t["baseline_us"] is None else f"{t['baseline_us']:.1f}"
            now = "-" if t["median_us"] is None else f"{t['median_us']:.1f}"
            flag = ("SLOWER " if t["slower"] else "") + ("" if t["ok"] else "WRONG")
            print(f"{t['op']:<15}{t['dtype']:<9}{t['case']:<18}{now:>10}{base:>10}{ch:>9}  {flag}")
        slower = [t for t in table if t["slower"]]
        pct = f"{100 * a.max_slower:.0f} %"
        print(f"{len(slower)} of {len(table)} cases more than {pct} slower than the baseline")
        bad = bad or bool(slower)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

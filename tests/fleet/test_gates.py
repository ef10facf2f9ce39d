"""Performance gates on real figures: the committed H200 bench report (benchmarks/h200/bench-2026-11-30.json,
the format a node's `kernels bench` writes) as the previous release, and copies of it where one figure is made
slower, as the new one."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from fleet import gates
from fleet.gates import Verdict

REPO = Path(__file__).resolve().parents[2]
REPORT: dict[str, Any] = json.loads((REPO / "benchmarks/h200/bench-2026-11-30.json").read_text())
OPS = sorted({r["op"] for r in REPORT["results"]})


def slowed(report: dict[str, Any], op: str, dtype: str, factor: float) -> dict[str, Any]:
    """The report with every case of op/dtype `factor` times slower (median, p10, p90 and SOL scaled)."""
    out = copy.deepcopy(report)
    for r in out["results"]:
        if (r["op"], r["dtype"]) == (op, dtype):
            for k in ("median_us", "p10_us", "p90_us"):
                r[k] = r[k] * factor
            r["sol"] = r["sol"] / factor
    return out


def with_clock(report: dict[str, Any], mhz: float) -> dict[str, Any]:
    """The 2026-11-30 report records no SM clock per case; the throttle tests add one to every row."""
    out = copy.deepcopy(report)
    for r in out["results"]:
        r["sm_clock_mhz"] = mhz
    return out


def verdicts(results: list[gates.GateResult], gate: str) -> dict[tuple[str, str, str], Verdict]:
    return {(r.op, r.dtype, r.case): r.verdict for r in results if r.gate == gate}


REG = "max_regression_vs_previous"


def test_figures_come_from_the_bench_report():
    figs = gates.figures_from_bench(REPORT)
    assert len(figs) == len(REPORT["results"])
    f = next(f for f in figs if (f.op, f.dtype, f.case) == ("gemm", "float32", "4096^3"))
    assert f.median_s == pytest.approx(2920.9e-6) and f.sol == pytest.approx(0.703)
    assert f.device == "NVIDIA H200 0000:00:06" and f.sm_clock_max_mhz == 1980.0
    # the spread is recorded per case: half the p10-p90 range over the median
    assert f.spread == pytest.approx((2944.24 - 2919.87) / 2 / 2920.9)


@pytest.mark.parametrize("op", OPS)
def test_a_15_percent_slower_op_is_refused_at_10_percent(op):
    dtype = next(r["dtype"] for r in REPORT["results"] if r["op"] == op)
    new = gates.figures_from_bench(slowed(REPORT, op, dtype, 1.15))
    old = gates.figures_from_bench(REPORT)
    res = gates.evaluate(new=new, previous=old, min_sol={}, max_regression=0.10, simulated=False)
    got = verdicts(res, REG)
    bad = {k for k, v in got.items() if v is Verdict.FAILED}
    assert bad == {
        (r["op"], r["dtype"], r["case"]) for r in REPORT["results"] if (r["op"], r["dtype"]) == (op, dtype)
    }
    assert all(v is Verdict.PASSED for k, v in got.items() if k not in bad)
    first = gates.blocking(res)[0]
    assert first.figures["slowdown"] == pytest.approx(0.15, abs=1e-4)
    assert "+15.0%" in first.detail and "limit 10%" in first.detail


def test_the_same_figures_pass():
    figs = gates.figures_from_bench(REPORT)
    res = gates.evaluate(new=figs, previous=figs, min_sol={"gemm": 0.3}, max_regression=0.10, simulated=False)
    assert res and all(r.verdict is Verdict.PASSED for r in res), [r.detail for r in res if not r.verdict]
    assert not gates.blocking(res)


def test_a_slowdown_inside_the_limit_passes_and_one_past_limit_plus_noise_fails():
    old = gates.figures_from_bench(REPORT)
    # layernorm float16 has the widest spread of the report: ~2% half-range
    (lf,) = [f for f in old if (f.op, f.dtype) == ("layernorm", "float16")]
    assert lf.spread > 0.015
    within = gates.figures_from_bench(slowed(REPORT, "layernorm", "float16", 1.10 + lf.spread * 0.9))
    past = gates.figures_from_bench(slowed(REPORT, "layernorm", "float16", 1.10 + lf.spread * 1.2 + 0.01))
    key = ("layernorm", "float16", "16384x4096")
    ok = gates.evaluate(new=within, previous=old, min_sol={}, max_regression=0.10, simulated=False)
    no = gates.evaluate(new=past, previous=old, min_sol={}, max_regression=0.10, simulated=False)
    assert verdicts(ok, REG)[key] is Verdict.PASSED
    assert verdicts(no, REG)[key] is Verdict.FAILED


def test_simulated_is_not_evaluated_never_passed():
    figs = gates.figures_from_bench(REPORT)
    for new in (figs, []):
        res = gates.evaluate(
            new=new,
            previous=figs,
            min_sol={"gemm": {"float16": 0.3}, "softmax": 0.8},
            max_regression=0.1,
            simulated=True,
        )
        assert [(r.gate, r.op, r.dtype) for r in res] == [
            ("min_sol", "gemm", "float16"),
            ("min_sol", "softmax", "*"),
            (REG, "*", "*"),
        ]
        assert all(
            r.verdict is Verdict.NOT_EVALUATED and r.detail == "not_evaluated (simulated)" for r in res
        )


def test_throttled_node_is_reported_as_throttled_not_regressed():
    old = gates.figures_from_bench(with_clock(REPORT, 1980.0))
    new = gates.figures_from_bench(with_clock(slowed(REPORT, "gemm", "float32", 1.3), 1410.0))
    res = gates.evaluate(
        new=new, previous=old, min_sol={"gemm": {"float32": 0.6}}, max_regression=0.1, simulated=False
    )
    reg = verdicts(res, REG)
    assert reg[("gemm", "float32", "4096^3")] is Verdict.THROTTLED
    assert (
        reg[("softmax", "float32", "16384x4096")] is Verdict.PASSED
    )  # not slower: the clock does not matter
    (sol,) = [r for r in res if r.gate == "min_sol" and r.case == "4096^3"]
    assert sol.verdict is Verdict.THROTTLED and "1410 MHz" in sol.detail
    assert not gates.blocking(res)
    # the same slowdown at the previous clock is a regression
    same_clock = gates.figures_from_bench(with_clock(slowed(REPORT, "gemm", "float32", 1.3), 1965.0))
    res = gates.evaluate(new=same_clock, previous=old, min_sol={}, max_regression=0.1, simulated=False)
    assert verdicts(res, REG)[("gemm", "float32", "4096^3")] is Verdict.FAILED


def test_min_sol_per_op_and_per_dtype():
    figs = gates.figures_from_bench(REPORT)
    # gemm: fp32 0.70, fp16 (tensor cores) 0.39-0.40 in the 2026-11-30 report
    res = gates.evaluate(new=figs, previous=None, min_sol={"gemm": 0.5}, max_regression=None, simulated=False)
    got = verdicts(res, "min_sol")
    assert {k for k, v in got.items() if v is Verdict.FAILED} == {
        ("gemm", "float16", "4096^3"),
        ("gemm", "float16", "8192x2560x2560"),
    }
    assert got[("gemm", "float32", "4096^3")] is Verdict.PASSED
    res = gates.evaluate(
        new=figs,
        previous=None,
        min_sol={"gemm": {"float16": 0.35, "float32": 0.7}},
        max_regression=None,
        simulated=False,
    )
    got = verdicts(res, "min_sol")
    assert got[("gemm", "float16", "4096^3")] is Verdict.PASSED
    assert got[("gemm", "float32", "4096^3")] is Verdict.PASSED  # 0.703
    assert got[("gemm", "float32", "8192x2560x2560")] is Verdict.PASSED  # 0.702
    assert not gates.blocking(res)
    strict = gates.evaluate(
        new=figs, previous=None, min_sol={"gemm": {"float32": 0.7025}}, max_regression=None, simulated=False
    )
    got = verdicts(strict, "min_sol")
    assert got == {
        ("gemm", "float32", "4096^3"): Verdict.PASSED,
        ("gemm", "float32", "8192x2560x2560"): Verdict.FAILED,
    }
    failed = gates.blocking(strict)[0]
    assert failed.figures["sol"] == pytest.approx(0.702) and failed.figures["min_sol"] == 0.7025


def test_a_real_node_without_the_figure_fails_the_gate():
    figs = [f for f in gates.figures_from_bench(REPORT) if f.op != "softmax"]
    res = gates.evaluate(
        new=figs, previous=None, min_sol={"softmax": 0.5}, max_regression=None, simulated=False
    )
    assert [(r.verdict, r.detail) for r in res] == [
        (Verdict.FAILED, "no bench figure for softmax * on this node")
    ]
    errored = copy.deepcopy(REPORT)
    errored["results"][0] = {
        "op": "cast",
        "dtype": "float32",
        "case": "16384x4096",
        "ok": False,
        "error": "boom",
    }
    res = gates.evaluate(
        new=gates.figures_from_bench(errored),
        previous=gates.figures_from_bench(REPORT),
        min_sol={"cast": 0.5},
        max_regression=0.1,
        simulated=False,
    )
    assert {r.gate: r.verdict for r in res if r.op == "cast"} == {
        "min_sol": Verdict.FAILED,
        REG: Verdict.FAILED,
    }


def test_no_baseline():
    figs = gates.figures_from_bench(REPORT)
    first = gates.evaluate(new=figs, previous=None, min_sol={}, max_regression=0.1, simulated=False)
    assert {r.verdict for r in first} == {Verdict.NO_BASELINE}
    assert first[0].detail == "no previous release on this node"
    other_gpu = copy.deepcopy(REPORT)
    other_gpu["device"]["pci_bus_id"] = "0000:00:07"
    res = gates.evaluate(
        new=figs,
        previous=gates.figures_from_bench(other_gpu),
        min_sol={},
        max_regression=0.1,
        simulated=False,
    )
    assert {r.verdict for r in res} == {Verdict.NO_BASELINE}
    assert "on NVIDIA H200 0000:00:06" in res[0].detail


def test_figures_timed_another_way_are_not_compared():
    """The committed report predates the bench's pause before every call (its method block has none): a
    release benched with the pause is not compared with it, even 15 % slower, and says why."""
    assert gates.timing_of(REPORT) == "events with no pause"
    paused = copy.deepcopy(REPORT)
    paused["method"]["pause_before_each_call_us"] = 150
    op, dtype = REPORT["results"][0]["op"], REPORT["results"][0]["dtype"]
    new = gates.figures_from_bench(slowed(paused, op, dtype, 1.15))
    res = gates.evaluate(
        new=new, previous=gates.figures_from_bench(REPORT), min_sol={}, max_regression=0.1, simulated=False
    )
    assert {r.verdict for r in res} == {Verdict.NO_BASELINE}
    assert res[0].detail == (
        f"not compared: the previous release timed {op} {dtype} {REPORT['results'][0]['case']} on "
        "NVIDIA H200 0000:00:06 as events with no pause, this one as device time (a 150 us pause before each "
        "call)"
    )
    # both paused: compared, and the slower op refused
    res = gates.evaluate(
        new=new, previous=gates.figures_from_bench(paused), min_sol={}, max_regression=0.1, simulated=False
    )
    assert Verdict.FAILED in {r.verdict for r in res if (r.op, r.dtype) == (op, dtype)}


def test_gate_op_names_are_checked_against_the_registry():
    from kernels.registry import all_ops

    names = list(all_ops())
    assert gates.unknown_gate_ops(min_sol={"gemm": 0.5, "residual_add": 0.8}, known_ops=names) is None
    err = gates.unknown_gate_ops(min_sol={"sgemm": 0.5, "residual_add": 0.8}, known_ops=names)
    assert err is not None and "\n" not in err
    assert err.startswith("gates.min_sol: unknown op sgemm; allowed ops: ")
    assert all(n in err for n in names)


def test_results_serialise():
    figs = gates.figures_from_bench(REPORT)
    (r, *_) = gates.evaluate(new=figs, previous=figs, min_sol={}, max_regression=0.1, simulated=False)
    d = json.loads(json.dumps(r.as_dict()))
    assert d["verdict"] == "passed" and d["gate"] == REG and d["figures"]["slowdown"] == 0.0

"""Gates in a rollout, on real figures: a host's node-module result carrying the committed H200 bench report
(benchmarks/h200/bench-2026-11-30.json, the format a node's `kernels bench` writes) as `bench_previous` and a
copy with one op made slower as `bench`; verdicts stored in and read back from a real SQLite ledger."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from fleet import gating
from fleet.gates import Verdict
from fleet.ledger import Ledger
from fleet.policy import Gates
from fleet.spec import FleetSpec

REPO = Path(__file__).resolve().parents[2]
REPORT: dict[str, Any] = json.loads((REPO / "benchmarks/h200/bench-2026-11-30.json").read_text())


def slowed(op: str, dtype: str, factor: float) -> dict[str, Any]:
    out = copy.deepcopy(REPORT)
    for r in out["results"]:
        if (r["op"], r["dtype"]) == (op, dtype):
            r.update(
                median_us=r["median_us"] * factor,
                p10_us=r["p10_us"] * factor,
                p90_us=r["p90_us"] * factor,
                sol=r["sol"] / factor,
            )
    return out


GATES = Gates(min_sol={"gemm": {"float32": 0.6}, "residual_add": 0.8}, max_regression_vs_previous=0.10)


def test_a_release_15_percent_slower_fails_the_host_naming_op_dtype_and_figures() -> None:
    sf = {"bench": slowed("softmax", "float32", 1.15), "bench_previous": REPORT}
    host = gating.evaluate_host(host="gpu-a1", solfleet=sf, gates=GATES, simulated=False)
    assert host.failed
    (bad,) = host.blocking
    assert (bad.gate, bad.op, bad.dtype, bad.verdict) == ("max_regression_vs_previous", "softmax", "float32",
                                                          Verdict.FAILED)  # fmt: skip
    failure = gating.gate_failure(host)
    assert failure is not None and failure["failed_phase"] == "gate"
    assert (
        "max_regression_vs_previous softmax float32" in failure["message"] and "+15.0%" in failure["message"]
    )
    # the same release against itself passes every gate: no false refusal on real figures
    same = gating.evaluate_host(
        host="gpu-a1", solfleet={"bench": REPORT, "bench_previous": REPORT}, gates=GATES, simulated=False
    )
    assert not same.failed and gating.gate_failure(same) is None
    assert {r.verdict for r in same.results} == {Verdict.PASSED}


def test_min_sol_per_dtype_on_real_figures() -> None:
    strict = Gates(min_sol={"gemm": {"float32": 0.75}})  # the H200 measured 0.703 at 4096^3
    host = gating.evaluate_host(host="h", solfleet={"bench": REPORT}, gates=strict, simulated=False)
    assert host.failed and all(r.op == "gemm" and r.dtype == "float32" for r in host.blocking)
    assert "SOL 0.703 < 0.75" in host.message()


def test_simulated_hosts_are_never_passed() -> None:
    host = gating.evaluate_host(host="n1", solfleet={"bench": REPORT}, gates=GATES, simulated=True)
    assert not host.failed
    assert {(r.verdict, r.detail) for r in host.results} == {
        (Verdict.NOT_EVALUATED, "not_evaluated (simulated)")
    }


def test_a_real_node_without_figures_fails_with_the_reason() -> None:
    sf = {"bench": None, "bench_error": "kernels bench timed out after 900 s"}
    host = gating.evaluate_host(host="h", solfleet=sf, gates=GATES, simulated=False)
    assert host.failed and all("timed out after 900 s" in r.detail for r in host.blocking)


def test_plan_and_extravars(make_spec: Any) -> None:
    spec: FleetSpec = make_spec({
        "fleet": "t", "defaults": {"connection": "local"},
        "nodes": [{"name": "sim", "root": "/tmp/a", "simulated": True}, {"name": "real", "root": "/tmp/b"}],
        "gates": {"min_sol": {"gemm": 0.5}},
    })  # fmt: skip
    rows = {r["host"]: r for r in gating.planned(spec.gates, spec.nodes)}
    assert rows["sim"]["verdict"] == "not_evaluated" and rows["sim"]["detail"] == "not_evaluated (simulated)"
    assert rows["real"]["verdict"] == "pending"
    assert gating.deploy_extravars(spec.gates) == {"solfleet_bench": True, "solfleet_bench_ops": "gemm"}
    assert gating.deploy_extravars(Gates()) == {"solfleet_bench": False, "solfleet_bench_ops": ""}


def test_verdicts_round_trip_through_the_ledger(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    with Ledger(path):
        pass
    a = gating.evaluate_host(
        host="a",
        solfleet={"bench": slowed("gemm", "float32", 1.2), "bench_previous": REPORT},
        gates=GATES,
        simulated=False,
    )
    b = gating.evaluate_host(host="b", solfleet={}, gates=GATES, simulated=True)
    gating.record(path, "r-1", [a, b])
    rows = gating.recorded(path, "r-1")
    assert len(rows) == len(a.results) + len(b.results)
    assert {r["verdict"] for r in rows if r["host"] == "b"} == {"not_evaluated"}
    failed = [r for r in rows if r["host"] == "a" and r["verdict"] == "failed"]
    assert failed and all(r["op"] == "gemm" for r in failed) and failed[0]["figures"]["median_s"] > 0
    assert gating.recorded(path, "r-other") == []


def test_judge_step_turns_a_gate_failure_into_a_failed_host() -> None:
    from fleet.operation import FAILED_OUTCOMES, StepResult, host_record
    from fleet.runner import HostProgress, HostStatus

    def hp(host: str, bench: dict[str, Any], simulated: bool) -> HostProgress:
        sf = {"outcome": "activated", "current": "2.0.0", "prior_current": "1.0.0", "simulated": simulated,
              "bench": bench, "bench_previous": REPORT, "phases": {"verify": 1.0}}  # fmt: skip
        return HostProgress(host=host, status=HostStatus.OK, solfleet=sf)

    progress = {"fast": hp("fast", REPORT, False), "slow": hp("slow", slowed("cast", "float32", 1.15), False),
                "sim": hp("sim", slowed("cast", "float32", 1.15), True)}  # fmt: skip
    step = StepResult(step="canary", hosts=tuple(progress), records=tuple(host_record("canary", p)
                      for p in progress.values()), seconds=1.0, ok_hosts=progress)  # fmt: skip
    judged_step, judged, changed = gating.judge_step(step, gates=GATES, simulated={})
    by = {r.host: r for r in judged_step.records}
    assert by["fast"].outcome == "activated" and by["sim"].outcome == "activated"
    assert (by["slow"].outcome, by["slow"].failed_phase) == ("gate_failed", "gate")
    assert "cast float32" in by["slow"].message and by["slow"].version_after == "2.0.0"
    assert [r.host for r in changed] == ["slow"]
    assert {h.host: h.failed for h in judged} == {"fast": False, "slow": True, "sim": False}
    assert all(r.verdict is Verdict.NOT_EVALUATED for r in next(h for h in judged if h.host == "sim").results)
    # the rollout counts it: gate_failed must be one of the failed outcomes (fleet/operation.py)
    assert "gate_failed" in FAILED_OUTCOMES, "wire gate_failed into fleet.operation.FAILED_OUTCOMES"
    # no gates set: nothing is judged, the step is unchanged
    assert gating.judge_step(step, gates=Gates(), simulated={}) == (step, [], [])

"""Operator coverage (kernels.harness.coverage): what "auto" runs per op, dtype and production shape on a
device, its tier and why. gemm's rule is a pure function of the compute capability, so every device class
is checked here without its GPU; the rest runs under the simulator, and on a real H200 in the gpu tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from opcheck import needs_gpu

from kernels.harness import coverage, verify
from kernels.ops import gemm
from kernels.registry import TIERS, Case, Choice, OpSpec, all_ops, select
from kernels.runtime.arrays import BF16, SIMULATED

REPO = Path(__file__).resolve().parents[2]
F16, F32 = np.dtype(np.float16), np.dtype(np.float32)


@pytest.mark.parametrize(
    ("dtype", "n", "k", "cc", "path", "tier"),
    [
        (F16, 4096, 4096, (9, 0), "wgmma_tma", "primary"),
        (BF16, 2560, 2560, (9, 0), "wgmma_tma", "primary"),
        (F16, 4095, 4096, (9, 0), "mma", "primary"),  # N not a multiple of 8: the tile cannot take it
        (BF16, 4096, 4092, (9, 0), "portable", "fallback"),
        (F16, 4096, 4096, (8, 0), "mma", "primary"),
        (BF16, 4096, 4096, (8, 6), "portable", "fallback"),  # bf16 tensor-core code is sm_90a only
        (BF16, 4096, 4096, (10, 0), "portable", "fallback"),  # sm_90a code runs on 9.0 alone
        (F16, 4096, 4096, (7, 5), "portable", "fallback"),
        (F32, 4096, 4096, (9, 0), "simt", "primary"),
        (F32, 4096, 4096, (7, 0), "simt", "primary"),
    ],
)
def test_gemm_choice_per_device_class(dtype: np.dtype, n: int, k: int, cc: tuple[int, int], path: str,
                                      tier: str) -> None:  # fmt: skip
    choice = gemm.explain(dtype=dtype, n=n, k=k, cc=cc, simulated=False)
    assert (choice.path, choice.tier) == (path, tier), choice
    # it is the path the launcher's own rule takes, not a second opinion
    auto = gemm.select_path(path="auto", dtype=dtype, cc=cc, simulated=False)
    assert choice.path == gemm.shape_path(auto, dtype, n, k)
    assert choice.why.strip(), choice


def test_gemm_choice_under_the_simulator() -> None:
    choice = gemm.explain(dtype=BF16, n=64, k=64, cc=None, simulated=True)
    assert choice == Choice("portable", "simulated", "the CUDA simulator runs the portable kernel")


def test_every_op_dtype_and_bench_case_is_covered() -> None:
    rep = coverage.report(list(all_ops().values()))
    expected = {(s.name, c.dtype, c.label) for s in all_ops().values() for c in s.bench_cases}
    assert {(r["op"], r["dtype"], r["case"]) for r in rep["rows"]} == expected
    assert all(r["tier"] in TIERS and r["why"] and r["path"] for r in rep["rows"]), rep["rows"]
    if SIMULATED:
        assert {r["tier"] for r in rep["rows"]} == {"simulated"}
        assert rep["fallback_only"] == [] and rep["fallback_cases"] == []


def _stand_in(name: str, choose: object) -> OpSpec:
    cases = tuple(Case(label, {}, dt) for label in ("small", "large") for dt in ("float32", "bfloat16"))
    return OpSpec(name=name, dtypes=("float32", "bfloat16"), make_problem=None, launch=None,  # type: ignore[arg-type]
                  flops=lambda c: 0.0, bytes=lambda c: 0.0, tolerance={}, sim_cases=(), verify_cases=(),
                  bench_cases=cases, choose=choose)  # type: ignore[arg-type]  # fmt: skip


def test_fallback_only_needs_every_production_shape_on_a_fallback() -> None:
    def by_dtype(c: Case) -> Choice:  # bf16 always a fallback; fp32 only at the small shape
        slow = c.dtype == "bfloat16" or c.label == "small"
        return Choice("portable" if slow else "fast", "fallback" if slow else "primary", "because")

    def broken(c: Case) -> Choice:
        raise RuntimeError("no device")

    rep = coverage.report([_stand_in("op_a", by_dtype), _stand_in("op_b", broken)])
    assert rep["fallback_only"] == ["op_a bfloat16", "op_b bfloat16", "op_b float32"]
    assert "op_a float32 small" in rep["fallback_cases"] and "op_a float32 large" not in rep["fallback_cases"]
    # a rule that raises is reported, as a fallback naming the error, never dropped
    assert {r["why"] for r in rep["rows"] if r["op"] == "op_b"} == {"RuntimeError: no device"}
    text = coverage.table(rep)
    assert "only a fallback here: op_a bfloat16, op_b bfloat16, op_b float32" in text
    assert "op_a                float32   fast             primary   because [large]" in text


def test_a_tier_outside_the_list_is_reported_as_a_fallback_not_raised() -> None:
    rep = coverage.report([_stand_in("op_c", lambda c: Choice("x", "fast", "y"))])
    assert {r["tier"] for r in rep["rows"]} == {"fallback"}
    assert {r["why"] for r in rep["rows"]} == {"tier 'fast' is not one of primary, fallback, simulated (y)"}


def test_verify_report_carries_coverage_and_each_case_its_tier() -> None:
    rep = verify.run(select("residual_add,gemm"), seed=1)
    assert rep["ok"], rep
    assert {r["op"] for r in rep["coverage"]["rows"]} == set(all_ops())  # every op, not just the verified
    tiers = {(r["op"], r.get("tier")) for r in rep["results"]}
    expected = "simulated" if SIMULATED else "primary"
    assert ("residual_add", expected) in tiers and all(t is not None for _, t in tiers), tiers


def test_info_json_lists_the_coverage() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "kernels", "info", "--json"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert {r["op"] for r in rep["coverage"]["rows"]} == set(all_ops())
    text = subprocess.run([sys.executable, "-m", "kernels", "info"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300, check=False).stdout  # fmt: skip
    assert "op                  dtype     path" in text and "gemm                bfloat16" in text, text


@pytest.mark.gpu
@needs_gpu
def test_an_h200_runs_no_op_only_on_a_fallback() -> None:
    from kernels.runtime.device import compute_capability

    if compute_capability() != (9, 0):
        pytest.skip("the H200's figures: a cc 9.0 GPU")
    rep = coverage.report(list(all_ops().values()))
    assert rep["fallback_only"] == [], rep["fallback_only"]
    paths = {(r["op"], r["dtype"]): r["path"] for r in rep["rows"]}
    assert paths[("gemm", "bfloat16")] == paths[("gemm", "float16")] == "wgmma_tma"
    assert paths[("o_proj", "bfloat16")] == paths[("linear", "bfloat16")] == "wgmma_tma"

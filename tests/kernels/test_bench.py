"""The bench report: the builder's arithmetic and table (no GPU needed), the simulator refusal, and on a
GPU the JSON shape of a real run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from opcheck import needs_gpu

from kernels import cli
from kernels.harness import bench
from kernels.registry import select

REPO = Path(__file__).resolve().parents[2]


def test_stats_and_sol():  # type: ignore[no-untyped-def]
    st = bench._stats([float(v) for v in range(1, 101)])
    assert st == {"median_us": 50.5, "p10_us": 10.9, "p90_us": 90.1}
    spec = select("residual_add")[0]
    row = {"gbs": 3000.0, "tflops": 1.0}
    assert bench._sol(spec, row, {"mem_gbs": 4000.0, "fp32_tflops": 60.0}) == 0.75
    assert bench._sol(spec, row, {"mem_gbs": None}) is None
    gemm = select("gemm")[0]
    peaks = {"mem_gbs": 4000.0, "fp32_tflops": 60.0, "fp16_tensor_tflops": 1000.0}
    assert bench._sol(gemm, {"tflops": 30.0, "path": "simt"}, peaks) == 0.5
    # a tensor-core case is scored against the tensor-core peak, not the fp32 FMA peak
    assert bench._sol(gemm, {"tflops": 400.0, "path": "mma"}, peaks) == 0.4
    for path in ("wgmma", "wgmma_tma"):  # every Hopper tile too
        assert bench._sol(gemm, {"tflops": 700.0, "path": path}, peaks) == 0.7


def test_table_renders_every_row():  # type: ignore[no-untyped-def]
    rep = {
        "device": {"name": "X"}, "date": "d", "peaks": {"mem_gbs": 4000.0, "fp32_tflops": 60.0},
        "results": [
            {"op": "residual_add", "dtype": "float32", "case": "c", "median_us": 100.0, "p10_us": 99.0,
             "p90_us": 101.0, "gbs": 3000.0, "tflops": 0.1, "sol": 0.75, "ok": True,
             "cupy": {"median_us": 150.0}, "ratio_vs_cupy": 1.5},
            {"op": "cast", "dtype": "float32", "case": "c", "ok": False, "error": "boom"},
        ],
    }  # fmt: skip
    table = cli._bench_table(rep)
    assert "residual_add" in table and "1.50" in table and "0.75" in table and "ERROR boom" in table


def test_bench_refuses_under_simulator():  # type: ignore[no-untyped-def]
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    p = subprocess.run([sys.executable, "-m", "kernels", "bench", "--ops", "residual_add"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert p.returncode == 2
    assert "bench needs a real GPU" in p.stderr and len(p.stderr.strip().splitlines()) == 1


@pytest.mark.gpu
@needs_gpu
def test_bench_json_on_gpu(tmp_path):  # type: ignore[no-untyped-def]
    out = tmp_path / "b.json"
    p = subprocess.run([sys.executable, "-m", "kernels", "bench", "--json", "--ops", "residual_add,softmax",
                        "--compare", "cupy", "--iters", "5", "--out", str(out)], cwd=REPO,
                       capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    rep = json.loads(out.read_text())
    assert set(rep) >= {"date", "device", "versions", "command", "peaks", "results"}
    assert rep["peaks"]["mem_gbs"] > 100
    for r in rep["results"]:
        keys = {"op", "dtype", "case", "median_us", "p10_us", "p90_us", "tflops", "gbs", "sol", "ok"}
        assert set(r) >= keys
        assert r["ok"] and r["p10_us"] <= r["median_us"] <= r["p90_us"]
        if r["dtype"] == "bfloat16":  # CuPy has no bf16: the row says so instead of timing it
            assert r["cupy"] == {"error": "CuPy has no bfloat16"} and "ratio_vs_cupy" not in r
        else:
            assert r["cupy"]["median_us"] > 0 and r["ratio_vs_cupy"] > 0


@pytest.mark.gpu
@needs_gpu
def test_events_time_the_device_not_a_slow_launcher(monkeypatch):  # type: ignore[no-untyped-def]
    """A launcher that spends 60 us of host time before a ~1 us kernel, interleaved with a fast one: the
    device-side pause before each call keeps the stream busy while the host launches, so neither call is
    charged for the host. With no pause (SPIN_US = 0) the device drains and the slow one is charged >= 50 us:
    the measurement this guards against."""
    import time

    from numba import cuda

    @cuda.jit
    def tiny(a):  # type: ignore[no-untyped-def]
        a[cuda.threadIdx.x] += 1.0

    buf = cuda.device_array(32, dtype="float32")

    def slow(_args):  # type: ignore[no-untyped-def]
        t = time.perf_counter() + 60e-6
        while time.perf_counter() < t:
            pass
        tiny[1, 32](buf)

    def fast(_args):  # type: ignore[no-untyped-def]
        tiny[1, 32](buf)

    def medians() -> list[float]:
        times = bench.time_interleaved([(slow, [{}], None), (fast, [{}], None)], 20)
        return [sorted(t)[len(t) // 2] for t in times]

    paused = medians()
    assert max(paused) < 30.0, paused
    monkeypatch.setattr(bench, "SPIN_US", 0)
    drained = medians()
    assert drained[0] >= 50.0, drained


def test_roofline_plot_from_a_report(tmp_path):  # type: ignore[no-untyped-def]
    pytest.importorskip("matplotlib")
    from kernels.harness.roofline import plot

    rep = {
        "device": {"name": "X"}, "peaks": {"mem_gbs": 4000.0, "fp32_tflops": 60.0},
        "results": [
            {"op": "residual_add", "dtype": "float32", "flops": 1e6, "bytes": 12e6, "median_us": 3.5,
             "tflops": 0.29, "sol": 0.86, "cupy": {"tflops": 0.2}},
            {"op": "gemm", "dtype": "float32", "flops": 1e12, "bytes": 2e8, "median_us": 2e4, "tflops": 50.0,
             "sol": 0.8, "case": "4096^3", "path": "wgmma_tma"},
            {"op": "gemm", "dtype": "float32", "flops": 1e12, "bytes": 2e8, "median_us": 3e4, "tflops": 33.0,
             "sol": 0.5, "case": "4096^3", "path": "wgmma"},  # two kernels of a case: labelled by path
            {"op": "cast", "dtype": "float32", "ok": False, "error": "not timed"},
        ],
    }  # fmt: skip
    out = plot(rep, tmp_path / "roofline.png")
    assert out == tmp_path / "roofline.png"
    assert out.stat().st_size > 10_000 and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("providers", "sets", "restore", "lead"),
    [(2, 3, False, True), (1, 3, False, False), (2, 1, False, False), (2, 3, True, False)],
    ids=["two-providers", "one-provider", "one-set", "restored"],
)
def test_each_timed_call_follows_one_of_its_own(providers, sets, restore, lead):  # type: ignore[no-untyped-def]
    """time_interleaved's call order (bench.call_order, which it walks): with several providers and several
    input sets, before each timed call of a provider (on set i), one untimed call of the same provider on the
    set before, so that the call starts from L2 as its own op leaves it (benchmarks/PERF.md, "the bench's
    call order"). No such call with one provider (its calls already follow each other), with one set (it
    would leave the timed call's inputs in L2), or for a provider with a restore (the restore and L2 flush
    come first)."""
    calls = bench.call_order([(sets, restore)] * providers, 4)
    rounds = bench.WARMUP + 4
    per_round = providers * (2 if lead else 1)
    assert len(calls) == rounds * per_round
    for i in range(rounds):
        want = []
        for j in range(providers):
            if lead:
                want.append((i, j, (i - 1) % sets, False))
            want.append((i, j, i % sets, True))
        assert calls[i * per_round : (i + 1) * per_round] == want, i

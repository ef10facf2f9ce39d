"""The node's Prometheus textfile, parsed back with prometheus_client's own parser, on the committed H200
verify and bench reports and on health checks of the captured H200 facts."""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kernels.harness import gpu_health as gh
from kernels.harness import metrics

REPO = Path(__file__).resolve().parents[2]
BENCH = json.loads((REPO / "benchmarks/h200/bench-2026-11-30.json").read_text())
VERIFY = json.loads((REPO / "tests/data/h200/verify-2026-11-30.json").read_text())
FACTS = gh.facts_from_nvml_dump(json.loads((REPO / "tests/data/gpu/h200-healthy/nvml.json").read_text()))
CHECKS = gh.check_facts(facts=FACTS, expect=gh.GpuExpectations(count=1, model="H200", cc="9.0"))
RELEASE = metrics.ReleaseInfo(version="1.4.0", sha256="ab" * 32, stack_id="s-3f2a9c")


def samples(path: Path) -> dict[str, list]:
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(path.read_text()):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def value(ss: dict[str, list], name: str, **labels: str) -> float:
    (hit,) = [s.value for s in ss[name] if all(s.labels.get(k) == v for k, v in labels.items())]
    return hit


def full(**over) -> metrics.NodeMetrics:
    base = dict(release=RELEASE, verify=VERIFY, bench=BENCH, checks=CHECKS, last_rollout_s=1796000000.0)
    return metrics.NodeMetrics(**(base | over))


def test_file_carries_every_part(tmp_path):
    path = metrics.write_metrics(root=tmp_path, metrics=full(), now_s=1796000123.5)
    assert path == tmp_path / "metrics" / "solfleet.prom"
    ss = samples(path)
    (info,) = ss["solfleet_release_info"]
    assert info.value == 1 and info.labels == {
        "version": "1.4.0", "sha256": "ab" * 32, "stack_id": "s-3f2a9c", "simulated": "false"
    }  # fmt: skip
    assert value(ss, "solfleet_node_simulated") == 0
    assert value(ss, "solfleet_verify_ok") == 1
    ops = {(r["op"], r["dtype"]) for r in VERIFY["results"]}
    assert {(s.labels["op"], s.labels["dtype"]) for s in ss["solfleet_verify_passed"]} == ops
    for r in BENCH["results"]:
        lv = {"op": r["op"], "dtype": r["dtype"], "case": r["case"]}
        assert value(ss, "solfleet_sol_ratio", **lv) == pytest.approx(r["sol"])
        assert value(ss, "solfleet_bench_median_seconds", **lv) == pytest.approx(r["median_us"] * 1e-6)
    assert "solfleet_bench_sm_clock_hertz" not in ss  # the 2026-11-30 report records no clock per case
    for c in CHECKS:
        for st in metrics.STATUSES:
            assert value(ss, "solfleet_health_check", check=c.name, status=st) == int(st == c.status.value)
    assert value(ss, "solfleet_health_ok") == 1
    assert value(ss, "solfleet_last_rollout_timestamp_seconds") == 1796000000.0
    assert value(ss, "solfleet_metrics_timestamp_seconds") == 1796000123.5


def test_names_follow_prometheus_rules(tmp_path):
    ss = samples(metrics.write_metrics(root=tmp_path, metrics=full()))
    for name in ss:
        assert re.fullmatch(r"solfleet_[a-z][a-z0-9_]*", name), name
        assert not name.endswith("_total"), f"{name}: no counters here, so no _total"
    assert {n for n in ss if "seconds" in n or "hertz" in n} == {
        "solfleet_bench_median_seconds", "solfleet_last_rollout_timestamp_seconds",
        "solfleet_metrics_timestamp_seconds",
    }  # fmt: skip


def test_a_failed_case_and_a_failed_check_show(tmp_path):
    verify = json.loads(json.dumps(VERIFY))
    verify["ok"] = False
    bad = verify["results"][0]
    bad["ok"] = False
    checks = [*CHECKS[:-1], gh.Check("gpu.clock_event_reasons", gh.CheckStatus.FAILED, "0x8 hw_slowdown")]
    ss = samples(metrics.write_metrics(root=tmp_path, metrics=full(verify=verify, checks=checks)))
    assert value(ss, "solfleet_verify_ok") == 0
    assert value(ss, "solfleet_verify_passed", op=bad["op"], dtype=bad["dtype"]) == 0
    others = {(r["op"], r["dtype"]) for r in verify["results"][1:]} - {(bad["op"], bad["dtype"])}
    assert all(value(ss, "solfleet_verify_passed", op=o, dtype=d) == 1 for o, d in others)
    assert value(ss, "solfleet_health_check", check="gpu.clock_event_reasons", status="failed") == 1
    assert value(ss, "solfleet_health_ok") == 0


def test_simulated_node_says_so(tmp_path):
    checks = gh.run_gpu_checks(expect=gh.GpuExpectations(), state_dir=tmp_path / "state", simulated=True)
    m = metrics.NodeMetrics(release=RELEASE, simulated=True, checks=checks)
    ss = samples(metrics.write_metrics(root=tmp_path, metrics=m))
    assert value(ss, "solfleet_node_simulated") == 1
    assert ss["solfleet_release_info"][0].labels["simulated"] == "true"
    assert all(value(ss, "solfleet_health_check", check=n, status="skipped") == 1 for n in gh.ALL_CHECKS)
    assert "solfleet_sol_ratio" not in ss


def test_update_keeps_what_it_is_not_given(tmp_path):
    metrics.write_metrics(root=tmp_path, metrics=full())
    failed = [gh.Check("gpu.xid", gh.CheckStatus.FAILED, "Xid 79")]
    ss = samples(metrics.update_metrics(root=tmp_path, changes={"checks": failed}))
    assert ss["solfleet_release_info"][0].labels["version"] == "1.4.0"
    assert len(ss["solfleet_sol_ratio"]) == len(BENCH["results"])
    assert {s.labels["check"] for s in ss["solfleet_health_check"]} == {"gpu.xid"}
    assert value(ss, "solfleet_health_ok") == 0


def test_bad_input_is_one_clear_error(tmp_path):
    with pytest.raises(ValueError, match="unknown metrics input.*sol: allowed are release, simulated"):
        metrics.update_metrics(root=tmp_path, changes={"sol": 1})
    with pytest.raises(ValueError, match="needs a name and a status in passed, failed, skipped"):
        metrics.write_metrics(
            root=tmp_path, metrics=metrics.NodeMetrics(checks=[{"name": "x", "status": "ok"}])
        )


def test_write_is_atomic(tmp_path):
    """A reader polling the file while it is rewritten never sees a partial file, and the rename leaves the
    old inode intact for a reader that had it open."""
    path = metrics.write_metrics(root=tmp_path, metrics=full(), now_s=0.0)
    old = path.open()
    old_ino = os.stat(path).st_ino
    stop, seen, broken = threading.Event(), [], []

    def reader() -> None:
        while not stop.is_set():
            text = path.read_text()
            ss = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
            # metrics_timestamp_seconds is the last series written: present means the file is whole
            if "solfleet_metrics_timestamp_seconds" not in ss or len(ss) < 5:
                broken.append(text)
            seen.append(ss.get("solfleet_metrics_timestamp_seconds"))

    t = threading.Thread(target=reader)
    t.start()
    try:
        for i in range(1, 150):
            metrics.write_metrics(root=tmp_path, metrics=full(), now_s=float(i))
    finally:
        stop.set()
        t.join()
    assert not broken, broken[0][:300]
    assert len(seen) > 10 and len(set(seen)) > 1, "the reader must have overlapped the writes"
    assert "solfleet_metrics_timestamp_seconds 0.0" in old.read()
    old.close()
    assert os.stat(path).st_ino != old_ino
    assert sorted(p.name for p in path.parent.iterdir()) == ["solfleet-inputs.json", "solfleet.prom"]

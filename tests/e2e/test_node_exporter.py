"""The node's metrics file through the real Prometheus tools: Debian's prometheus-node-exporter serves a node
root's metrics/ folder with its textfile collector on a loopback port, the test scrapes it, finds the
solfleet_ series, and `promtool check metrics` (Debian's prometheus package) lints the scraped text.

Skipped with a reason when the binaries are missing, except under CI (env CI set), where that is a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from loopback import free_port
from prometheus_client.parser import text_string_to_metric_families

from kernels.harness import gpu_health as gh
from kernels.harness import metrics

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
PROMTOOL = "/usr/bin/promtool"


def _require(path: str, package: str) -> str:
    if os.access(path, os.X_OK):
        return path
    found = shutil.which(Path(path).name)
    if found:
        return found
    why = f"{path} not found (apt-get install {package}; scripts/bootstrap.sh does)"
    if os.environ.get("CI"):
        pytest.fail(f"CI is set but {why}")
    pytest.skip(why)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return str(r.read().decode())


@pytest.fixture
def node_root(tmp_path: Path) -> Path:
    """A node root whose metrics file holds every part, from the committed H200 reports and captured facts."""
    facts = gh.facts_from_nvml_dump(json.loads((REPO / "tests/data/gpu/h200-healthy/nvml.json").read_text()))
    m = metrics.NodeMetrics(
        release=metrics.ReleaseInfo(version="1.4.0", sha256="cd" * 32, stack_id="s-3f2a9c"),
        verify=json.loads((REPO / "tests/data/h200/verify-2026-11-30.json").read_text()),
        bench=json.loads((REPO / "benchmarks/h200/bench-2026-11-30.json").read_text()),
        checks=gh.check_facts(facts=facts, expect=gh.GpuExpectations(count=1, model="H200")),
        last_rollout_s=time.time(),
    )
    metrics.write_metrics(root=tmp_path, metrics=m)
    return tmp_path


@pytest.fixture
def exporter(node_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    exe = _require(NODE_EXPORTER, "prometheus-node-exporter")
    log = tmp_path_factory.mktemp("node-exporter") / "log"
    for _ in range(3):  # the port is free when picked; another process may take it before the exporter binds
        port = free_port()
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [exe, "--collector.disable-defaults", "--collector.textfile",
                 f"--collector.textfile.directory={node_root / 'metrics'}",
                 f"--web.listen-address=127.0.0.1:{port}"],
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        url = f"http://127.0.0.1:{port}/metrics"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                _get(url)
                break
            except OSError:
                time.sleep(0.1)
        if proc.poll() is None:
            try:
                yield url
            finally:
                proc.terminate()
                proc.wait(timeout=10)
            return
    pytest.fail(f"node_exporter did not start: {log.read_text()[-500:]}")


def test_node_exporter_serves_the_solfleet_series(exporter: str, node_root: Path) -> None:
    text = _get(exporter)
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    # the collector parsed our file without error
    assert [s.value for s in fams["node_textfile_scrape_error"].samples] == [0.0]
    names = {f for f in fams if f.startswith("solfleet_")}
    assert {
        "solfleet_release_info", "solfleet_verify_ok", "solfleet_verify_passed", "solfleet_sol_ratio",
        "solfleet_bench_median_seconds", "solfleet_health_check", "solfleet_health_ok",
        "solfleet_last_rollout_timestamp_seconds", "solfleet_node_simulated",
        "solfleet_metrics_timestamp_seconds",
    } <= names  # fmt: skip
    served = {(s.name, tuple(sorted(s.labels.items())), s.value) for n in names for s in fams[n].samples}
    written = {
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for f in text_string_to_metric_families((node_root / "metrics" / "solfleet.prom").read_text())
        for s in f.samples
    }
    assert served == written

    promtool = _require(PROMTOOL, "prometheus")
    lint = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
    # the same lint refuses what Prometheus naming forbids, so a pass above means something
    bad = (
        "# HELP solfleet_x_milliseconds x\n# TYPE solfleet_x_milliseconds gauge\nsolfleet_x_milliseconds 1\n"
    )
    refused = subprocess.run(
        [promtool, "check", "metrics"], input=bad, capture_output=True, text=True, check=False
    )
    assert refused.returncode != 0 and "base unit" in refused.stdout + refused.stderr

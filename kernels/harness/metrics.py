"""Prometheus textfile metrics of a node: `<root>/metrics/solfleet.prom`, read by node_exporter's textfile
collector (`--collector.textfile.directory=<root>/metrics`).

The file is made from a fresh CollectorRegistry each time and written by prometheus_client's
`write_to_textfile` (a temp file in the same folder, then rename(2)), so a scrape sees either the old file or
the new one, never half of one. The inputs of the last write are kept beside it in `solfleet-inputs.json`
(node_exporter reads only `*.prom`), so a health run can refresh the health series without knowing the
release's verify and bench figures, and a deploy can refresh those without rerunning health.

Series (all prefixed `solfleet_`, in base units):
  release_info{version,sha256,stack_id,simulated}      1
  node_simulated                                       1 on a node declared simulated, else 0
  verify_ok                                            1 when the whole verify report passed
  verify_passed{op,dtype}                              1 when every case of that op and dtype passed
  sol_ratio{op,dtype,case}                             achieved / binding peak, from the bench report
  bench_median_seconds{op,dtype,case}                  median time per call
  bench_sm_clock_hertz{op,dtype,case}                  SM clock during the case, where the bench recorded it
  health_check{check,status}                           1 for the check's status, 0 for the other two
  health_ok                                            1 when no health check failed
  last_rollout_timestamp_seconds                       when a deploy or rollback last changed `current`
  metrics_timestamp_seconds                            when this file was written (to alert on a stale one)
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, Info, write_to_textfile

PREFIX = "solfleet"
FILENAME = "solfleet.prom"
INPUTS = "solfleet-inputs.json"
STATUSES = ("passed", "failed", "skipped")


@dataclass(frozen=True)
class ReleaseInfo:
    version: str
    sha256: str
    stack_id: str


@dataclass(frozen=True)
class NodeMetrics:
    """Everything the file reports. `verify` and `bench` are the JSON reports of `python -m kernels verify`
    and `bench` (as dicts); `checks` are health checks as {"name", "status", "detail"} dicts or objects with
    `name` and `status` (a string or an enum whose value is one, e.g. gpu_health.Check)."""

    release: ReleaseInfo | None = None
    simulated: bool = False
    verify: Mapping[str, Any] | None = None
    bench: Mapping[str, Any] | None = None
    checks: Sequence[Any] = field(default_factory=tuple)
    last_rollout_s: float | None = None  # seconds since the epoch


def _check_pair(c: Any) -> tuple[str, str]:
    if isinstance(c, Mapping):
        name, status = c.get("name"), c.get("status")
    else:
        name, status = getattr(c, "name", None), getattr(c, "status", None)
    status = getattr(status, "value", status)
    if not isinstance(name, str) or status not in STATUSES:
        raise ValueError(f"health check {c!r}: needs a name and a status in {', '.join(STATUSES)}")
    return name, str(status)


def build_registry(m: NodeMetrics, *, now_s: float) -> CollectorRegistry:
    """A fresh registry holding every series of `m` (pure: no I/O)."""
    reg = CollectorRegistry()

    def gauge(name: str, doc: str, labels: Sequence[str] = ()) -> Gauge:
        return Gauge(f"{PREFIX}_{name}", doc, list(labels), registry=reg)

    sim = "true" if m.simulated else "false"
    gauge("node_simulated", "1 on a node declared simulated (no GPU facts, no timings)").set(int(m.simulated))
    if m.release is not None:
        Info(f"{PREFIX}_release", "The release `current` points to", registry=reg).info(
            {**{k: str(v) for k, v in asdict(m.release).items()}, "simulated": sim}
        )

    if m.verify is not None:
        gauge("verify_ok", "1 when every verify case of the current release passed").set(
            int(bool(m.verify.get("ok")))
        )
        per: dict[tuple[str, str], bool] = {}
        for r in m.verify.get("results", []):
            key = (str(r.get("op")), str(r.get("dtype")))
            per[key] = per.get(key, True) and bool(r.get("ok"))
        g = gauge("verify_passed", "1 when every verify case of this op and dtype passed", ("op", "dtype"))
        for (op, dtype), ok in sorted(per.items()):
            g.labels(op=op, dtype=dtype).set(int(ok))

    if m.bench is not None:
        rows = [r for r in m.bench.get("results", []) if r.get("median_us") is not None]
        labels = ("op", "dtype", "case")
        sol = gauge("sol_ratio", "Achieved throughput / the binding peak (speed of light)", labels)
        med = gauge("bench_median_seconds", "Median device time per call", labels)
        clk = None
        for r in rows:
            lv = {"op": str(r["op"]), "dtype": str(r["dtype"]), "case": str(r.get("case", ""))}
            med.labels(**lv).set(float(r["median_us"]) * 1e-6)
            if r.get("sol") is not None:
                sol.labels(**lv).set(float(r["sol"]))
            if r.get("sm_clock_mhz") is not None:
                if clk is None:
                    clk = gauge("bench_sm_clock_hertz", "SM clock during the bench case", labels)
                clk.labels(**lv).set(float(r["sm_clock_mhz"]) * 1e6)

    if m.checks:
        pairs = [_check_pair(c) for c in m.checks]
        g = gauge("health_check", "1 for the check's current status, 0 for the others", ("check", "status"))
        for name, status in pairs:
            for s in STATUSES:
                g.labels(check=name, status=s).set(int(s == status))
        gauge("health_ok", "1 when no health check failed").set(int(all(s != "failed" for _, s in pairs)))

    if m.last_rollout_s is not None:
        gauge("last_rollout_timestamp_seconds", "When a deploy or rollback last switched `current`").set(
            m.last_rollout_s
        )
    gauge("metrics_timestamp_seconds", "When this file was written").set(now_s)
    return reg


def write_metrics(*, root: Path, metrics: NodeMetrics, now_s: float | None = None) -> Path:
    """Write `<root>/metrics/solfleet.prom` atomically, and the inputs beside it; returns the .prom path."""
    folder = root / "metrics"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / FILENAME
    write_to_textfile(str(path), build_registry(metrics, now_s=time.time() if now_s is None else now_s))
    _write_inputs(folder / INPUTS, metrics)
    return path


def update_metrics(*, root: Path, changes: Mapping[str, Any], now_s: float | None = None) -> Path:
    """Rewrite the file with `changes` (NodeMetrics field names) over the inputs of the last write."""
    allowed = [f.name for f in fields(NodeMetrics)]
    bad = sorted(set(changes) - set(allowed))
    if bad:
        raise ValueError(f"unknown metrics input(s) {', '.join(bad)}: allowed are {', '.join(allowed)}")
    current = read_inputs(root=root)
    merged = {f: getattr(current, f) for f in allowed} | dict(changes)
    return write_metrics(root=root, metrics=NodeMetrics(**merged), now_s=now_s)


def read_inputs(*, root: Path) -> NodeMetrics:
    """The inputs of the last write under `root`, or empty ones when there was none."""
    p = root / "metrics" / INPUTS
    if not p.exists():
        return NodeMetrics()
    d = json.loads(p.read_text())
    rel = d.get("release")
    return NodeMetrics(
        release=None if rel is None else ReleaseInfo(**rel),
        simulated=bool(d.get("simulated")),
        verify=d.get("verify"),
        bench=d.get("bench"),
        checks=tuple(d.get("checks") or ()),
        last_rollout_s=d.get("last_rollout_s"),
    )


def _write_inputs(path: Path, m: NodeMetrics) -> None:
    checks = [dict(zip(("name", "status"), _check_pair(c), strict=True)) for c in m.checks]
    d = {
        "release": None if m.release is None else asdict(m.release),
        "simulated": m.simulated,
        "verify": m.verify,
        "bench": m.bench,
        "checks": checks,
        "last_rollout_s": m.last_rollout_s,
    }
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(d))
    tmp.replace(path)

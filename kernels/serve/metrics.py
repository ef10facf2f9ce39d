"""The service's Prometheus metrics, on one registry of its own (served at /metrics, and written to a
textfile-collector file when configured). Names carry the `solfleet_serve_` prefix and a `device` label so
the per-GPU instances of a node add up in one textfile directory."""

from __future__ import annotations

import enum
import os
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class Outcome(enum.Enum):
    SUCCESS = "success"
    REJECTED = "rejected"
    TIMEOUT = "timeout"
    BAD_REQUEST = "bad_request"
    ERROR = "error"


# 50 us .. 10 s: the small ops take tens of microseconds on the GPU, the big ones milliseconds
_BUCKETS = (5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)


class Metrics:
    def __init__(
        self, *, device: str, version: str, commit: str, manifest_sha256: str, simulated: bool
    ) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.device = device
        self.requests = Counter(
            "solfleet_serve_requests",
            "infer requests by op and outcome",
            ["device", "op", "outcome"],
            registry=r,
        )
        self.queue_seconds = Histogram(
            "solfleet_serve_queue_seconds",
            "time waiting for a compute slot",
            ["device", "op"],
            buckets=_BUCKETS,
            registry=r,
        )
        self.compute_seconds = Histogram(
            "solfleet_serve_compute_seconds",
            "host-to-device copy + launch + device-to-host copy",
            ["device", "op"],
            buckets=_BUCKETS,
            registry=r,
        )
        self.retries = Counter(
            "solfleet_serve_retries", "transient device failures retried", ["device", "op"], registry=r
        )
        self.in_flight = Gauge("solfleet_serve_in_flight", "requests computing now", ["device"], registry=r)
        self.queued = Gauge(
            "solfleet_serve_queued", "requests waiting for a slot now", ["device"], registry=r
        )
        self.ready = Gauge(
            "solfleet_serve_ready", "1 while the instance reports ready", ["device"], registry=r
        )
        self.mem_used = Gauge(
            "solfleet_serve_device_memory_used_bytes",
            "device memory in use (whole GPU)",
            ["device"],
            registry=r,
        )
        self.mem_total = Gauge(
            "solfleet_serve_device_memory_total_bytes", "device memory", ["device"], registry=r
        )
        info = Gauge(
            "solfleet_serve_release_info",
            "the release this instance serves",
            ["device", "version", "commit", "manifest_sha256", "simulated"],
            registry=r,
        )
        info.labels(device, version, commit, manifest_sha256, str(simulated).lower()).set(1)
        self.in_flight.labels(device).set(0)
        self.queued.labels(device).set(0)
        self.ready.labels(device).set(0)

    def count(self, op: str, outcome: Outcome) -> None:
        self.requests.labels(self.device, op, outcome.value).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def write_textfile(self, path: str) -> None:
        """Atomic (temp file + rename), as the textfile collector requires."""
        p = Path(path)
        tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
        tmp.write_bytes(self.render())
        os.replace(tmp, p)

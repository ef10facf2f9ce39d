"""The service's configuration: the node's `<root>/config.yaml`, validated once, before anything starts.

Schema (docs/service.md is the reference; every key is optional, unknown keys are an error naming the key):

    device_id: 0               # GPU this instance serves (one instance per GPU)
    memory_limit_mb: 4096      # device bytes one request may need (inputs + outputs), refused above
    timeout_ms: 5000           # longest a request may wait in the queue; past it: 504, never run
    retry_count: 1             # retries of a transient device failure (out of memory); in-place ops: never
    log_level: info            # debug | info | warning | error
    benchmark_iterations: 50   # read by `kernels bench`, accepted here so one file serves both
    service:
      host: 127.0.0.1
      port: 8000               # instance on GPU i listens on port + i
      max_concurrency: 4       # requests computing at once
      max_queue: 16            # requests waiting for a slot; beyond concurrency + queue: 503 at once
      bind: visible_devices    # visible_devices (CUDA_VISIBLE_DEVICES=device_id) | context (select_device)
      exit_timeout_s: 30       # SIGTERM: longest wait for in-flight and queued work
      idle_grace_ms: 1000      # SIGTERM: how long idle keep-alive clients get to send one last request
      keep_alive_s: 30         # idle keep-alive connections are closed after this
      self_test_ops: []        # ops verified at a tiny shape before ready ([] = every op)
      state_dir: ""            # where serve-<device>.json (pid, version, state) lives; "" = <config dir>/run
      handoff: true            # once ready, SIGTERM the instance named in the state file (same device)
      textfile: ""             # Prometheus textfile to rewrite every 15 s ("" = none)
      log: {target: stderr, file: "", max_bytes: 10485760, backups: 5}   # stderr | journald | file
      testing: {}              # test-only knobs (compute_delay_ms, delay_ops, faults), refused unless
                               # SOLFLEET_SERVE_TESTING=1

This module imports no numba: `python -m kernels.serve` must set CUDA_VISIBLE_DEVICES before CUDA starts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_TARGETS = ("stderr", "journald", "file")
BINDS = ("visible_devices", "context")
FAULT_KINDS = ("oom", "gpu")
TESTING_ENV = "SOLFLEET_SERVE_TESTING"


class ConfigError(ValueError):
    """A bad configuration: one line naming the key, the value and what is allowed."""


@dataclass(frozen=True)
class LogConfig:
    target: str = "stderr"
    file: str = ""
    max_bytes: int = 10 * 1024 * 1024
    backups: int = 5


@dataclass(frozen=True)
class Fault:
    op: str
    kind: str  # oom: a transient allocation failure (retried where allowed); gpu: a device error
    count: int  # how many of that op's launches fail


@dataclass(frozen=True)
class TestingConfig:
    """Test-only knobs (tests/serve): a fixed sleep inside the computation of some ops, so overflow and
    timeout cases are deterministic on any machine, and faults raised where the device call would."""

    compute_delay_ms: int = 0
    delay_ops: tuple[str, ...] = ()  # () = every op
    faults: tuple[Fault, ...] = ()


@dataclass(frozen=True)
class ServiceConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    max_concurrency: int = 4
    max_queue: int = 16
    bind: str = "visible_devices"
    exit_timeout_s: float = 30.0
    idle_grace_ms: int = 1000
    keep_alive_s: float = 30.0
    self_test_ops: tuple[str, ...] = ()
    state_dir: str = ""
    handoff: bool = True
    textfile: str = ""
    log: LogConfig = field(default_factory=LogConfig)
    testing: TestingConfig = field(default_factory=TestingConfig)


@dataclass(frozen=True)
class Config:
    device_id: int = 0
    memory_limit_mb: int = 4096
    timeout_ms: int = 5000
    retry_count: int = 1
    log_level: str = "info"
    benchmark_iterations: int = 50
    service: ServiceConfig = field(default_factory=ServiceConfig)
    path: str = ""  # the file it was read from ("" = defaults)

    @property
    def listen_port(self) -> int:
        return self.service.port + self.device_id

    @property
    def memory_limit_bytes(self) -> int:
        return self.memory_limit_mb * 1024 * 1024

    @property
    def state_file(self) -> Path:
        base = Path(self.service.state_dir) if self.service.state_dir else _default_state_dir(self.path)
        return base / f"serve-{self.device_id}.json"


def _default_state_dir(path: str) -> Path:
    return (Path(path).resolve().parent if path else Path.cwd()) / "run"


# --- validation --------------------------------------------------------------------------------------------


def _int(where: str, v: Any, lo: int, hi: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
        allowed = f"an integer >= {lo}" + ("" if hi is None else f" and <= {hi}")
        raise ConfigError(f"{where}: {v!r} is not allowed; expected {allowed}")
    return v


def _num(where: str, v: Any, lo: float) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not v >= lo:
        raise ConfigError(f"{where}: {v!r} is not allowed; expected a number >= {lo}")
    return float(v)


def _str(where: str, v: Any, choices: tuple[str, ...] | None = None) -> str:
    if not isinstance(v, str) or (choices is not None and v not in choices):
        allowed = "a string" if choices is None else "one of " + ", ".join(choices)
        raise ConfigError(f"{where}: {v!r} is not allowed; expected {allowed}")
    return v


def _bool(where: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise ConfigError(f"{where}: {v!r} is not allowed; expected true or false")
    return v


def _mapping(where: str, v: Any, cls: type) -> dict[str, Any]:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(v).__name__}")
    known = {f.name for f in fields(cls)} - {"path"}
    for key in v:
        if key not in known:
            prefix = f"{where}." if where else ""
            raise ConfigError(f"{prefix}{key}: unknown key; allowed: {', '.join(sorted(known))}")
    return v


def _log(raw: Any) -> LogConfig:
    d = _mapping("service.log", raw, LogConfig)
    cfg = LogConfig(
        target=_str("service.log.target", d.get("target", "stderr"), LOG_TARGETS),
        file=_str("service.log.file", d.get("file", "")),
        max_bytes=_int("service.log.max_bytes", d.get("max_bytes", 10 * 1024 * 1024), 4096),
        backups=_int("service.log.backups", d.get("backups", 5), 0),
    )
    if cfg.target == "file" and not cfg.file:
        raise ConfigError("service.log.file: required when service.log.target is file")
    return cfg


def _testing(raw: Any) -> TestingConfig:
    d = _mapping("service.testing", raw, TestingConfig)
    if d and os.environ.get(TESTING_ENV) != "1":
        raise ConfigError(f"service.testing: test-only knobs are refused unless {TESTING_ENV}=1")
    faults = []
    for k, f in enumerate(d.get("faults") or []):
        where = f"service.testing.faults[{k}]"
        fd = _mapping(where, f, Fault)
        faults.append(
            Fault(
                op=_str(f"{where}.op", fd.get("op")),
                kind=_str(f"{where}.kind", fd.get("kind"), FAULT_KINDS),
                count=_int(f"{where}.count", fd.get("count", 1), 0),
            )
        )
    delay_ops = d.get("delay_ops", [])
    if not isinstance(delay_ops, list):
        raise ConfigError("service.testing.delay_ops: expected a list of op names")
    return TestingConfig(
        compute_delay_ms=_int("service.testing.compute_delay_ms", d.get("compute_delay_ms", 0), 0),
        delay_ops=tuple(str(o) for o in delay_ops),
        faults=tuple(faults),
    )


def _service(raw: Any) -> ServiceConfig:
    d = _mapping("service", raw, ServiceConfig)
    ops = d.get("self_test_ops", [])
    if not isinstance(ops, list) or not all(isinstance(o, str) for o in ops):
        raise ConfigError(f"service.self_test_ops: {ops!r} is not allowed; expected a list of op names")
    return ServiceConfig(
        host=_str("service.host", d.get("host", "127.0.0.1")),
        port=_int("service.port", d.get("port", 8000), 1, 65535),
        max_concurrency=_int("service.max_concurrency", d.get("max_concurrency", 4), 1, 1024),
        max_queue=_int("service.max_queue", d.get("max_queue", 16), 0, 100000),
        bind=_str("service.bind", d.get("bind", "visible_devices"), BINDS),
        exit_timeout_s=_num("service.exit_timeout_s", d.get("exit_timeout_s", 30.0), 0.0),
        idle_grace_ms=_int("service.idle_grace_ms", d.get("idle_grace_ms", 1000), 0),
        keep_alive_s=_num("service.keep_alive_s", d.get("keep_alive_s", 30.0), 1.0),
        self_test_ops=tuple(ops),
        state_dir=_str("service.state_dir", d.get("state_dir", "")),
        handoff=_bool("service.handoff", d.get("handoff", True)),
        textfile=_str("service.textfile", d.get("textfile", "")),
        log=_log(d.get("log")),
        testing=_testing(d.get("testing")),
    )


def from_mapping(raw: Any, *, path: str = "") -> Config:
    """Validate a parsed config file (None = every default)."""
    d = _mapping("", raw, Config)
    return Config(
        device_id=_int("device_id", d.get("device_id", 0), 0, 255),
        memory_limit_mb=_int("memory_limit_mb", d.get("memory_limit_mb", 4096), 1),
        timeout_ms=_int("timeout_ms", d.get("timeout_ms", 5000), 1),
        retry_count=_int("retry_count", d.get("retry_count", 1), 0, 10),
        log_level=_str("log_level", d.get("log_level", "info"), LOG_LEVELS),
        benchmark_iterations=_int("benchmark_iterations", d.get("benchmark_iterations", 50), 1),
        service=_service(d.get("service")),
        path=path,
    )


def load(
    path: str | Path | None,
    *,
    device_id: int | None = None,
    port: int | None = None,
    exit_timeout_s: float | None = None,
) -> Config:
    """Read and validate `path` (None: defaults); `device_id` / `port` / `exit_timeout_s` override the file
    (the systemd unit passes its instance's GPU, the role the spec's port and exit timeout)."""
    raw: Any = None
    if path is not None:
        p = Path(path)
        try:
            raw = yaml.safe_load(p.read_text())
        except OSError as e:
            raise ConfigError(f"{p}: cannot read: {e.strerror or e}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"{p}: not valid YAML: {e}") from None
    cfg = from_mapping(raw, path=str(path) if path is not None else "")
    import dataclasses

    if device_id is not None:
        cfg = dataclasses.replace(cfg, device_id=_int("--device-id", device_id, 0, 255))
    if port is not None:
        svc = dataclasses.replace(cfg.service, port=_int("--port", port, 1, 65535))
        cfg = dataclasses.replace(cfg, service=svc)
    if exit_timeout_s is not None:
        svc = dataclasses.replace(cfg.service, exit_timeout_s=_num("--exit-timeout-s", exit_timeout_s, 0.0))
        cfg = dataclasses.replace(cfg, service=svc)
    return cfg

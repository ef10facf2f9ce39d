"""The fleet spec's `provision` section: how `solfleet provision` prepares a node (runtime mode, base
interpreter, driver policy, reboots, preflight limits) and the node config it writes to `<root>/config.yaml`.
Every field is documented in docs/fleet-spec.md ("provision")."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import PurePosixPath
from typing import Any

from fleet import validate as v
from fleet.stack import PACKAGE_PINS, Stack, canonical_name

LOG_LEVELS = ["debug", "info", "warning", "error"]
DEFAULT_SUPPORTED_OS = ("Debian 12", "Debian 13", "Ubuntu 22.04", "Ubuntu 24.04", "RedHat 9", "Rocky 9")


class RuntimeMode(StrEnum):
    VENV = "venv"  # runtimes/<id> holds every pinned package, installed from the wheelhouse
    LAYERED = "layered"  # runtimes/<id> holds the carried packages; the base interpreter's site-packages
    # come after them on sys.path (for images that already hold most of the stack); pins checked either way


class DriverPolicy(StrEnum):
    REFUSE = "refuse"  # a loaded driver that differs from the pin is refused, never reinstalled
    INSTALL = "install"  # install/upgrade to the pin (apt/dnf), hold it, reboot when it changed


@dataclass(frozen=True)
class ServiceConfig:
    """The service's limits. Its port and exit timeout are per node (the node's `service` field, which the
    runtime role writes into the same `service` mapping of config.yaml)."""

    max_concurrency: int
    max_queue: int


@dataclass(frozen=True)
class NodeConfig:
    """`<root>/config.yaml` on every provisioned node."""

    device_id: int
    memory_limit_mb: int
    log_level: str
    timeout_ms: int
    retry_count: int
    benchmark_iterations: int
    service: ServiceConfig

    def as_dict(self) -> dict[str, Any]:
        return {
            "device_id": self.device_id,
            "memory_limit_mb": self.memory_limit_mb,
            "log_level": self.log_level,
            "timeout_ms": self.timeout_ms,
            "retry_count": self.retry_count,
            "benchmark_iterations": self.benchmark_iterations,
            "service": {
                "max_concurrency": self.service.max_concurrency,
                "max_queue": self.service.max_queue,
            },
        }


@dataclass(frozen=True)
class Provision:
    mode: RuntimeMode
    base_python: str  # node path of the interpreter the runtime is made from (and layered on)
    carry: tuple[str, ...]  # distributions the wheelhouse holds (canonical names)
    driver_policy: DriverPolicy
    driver_package: str  # "auto" = nvidia-driver-<branch>-open (apt) / nvidia-driver (dnf)
    reboot: bool
    max_parallel_reboots: int
    min_free_disk_mb: int
    supported_os: tuple[str, ...]
    persistence_mode: bool
    dcgm: bool
    config: NodeConfig


def runtime_dir(root: PurePosixPath, stack_id: str) -> PurePosixPath:
    return root / "runtimes" / stack_id


def runtime_python(root: PurePosixPath, stack_id: str) -> str:
    """The interpreter a provisioned node runs `python -m kernels` and Ansible's modules with."""
    return str(runtime_dir(root, stack_id) / "bin" / "python")


def default_carry(stack: Stack) -> tuple[str, ...]:
    """Venv mode carries every pinned package and requirement."""
    return tuple(
        [PACKAGE_PINS[k] for k in PACKAGE_PINS if k in stack.pins] + [r.name for r in stack.requirements]
    )


def parse_provision(
    top: v.Fields, label: str, stack: Stack, variables: Mapping[str, str], auto_python: str
) -> Provision | None:
    if not top.has("provision"):
        top.raw("provision")
        return None
    raw = top.raw("provision")
    p = v.Fields({} if raw is None else raw, "provision", label)
    mode = RuntimeMode(v.choice(label, p.sub("mode"), p.raw("mode", "venv"), [m.value for m in RuntimeMode]))
    base_raw = p.raw("base_python", "/usr/bin/python3")
    base_python = (
        auto_python
        if base_raw == "auto"
        else str(v.node_path(label, p.sub("base_python"), base_raw, variables))
    )
    known = {canonical_name(d) for d in default_carry(stack)}
    if p.has("carry"):
        carry = tuple(
            canonical_name(c)
            for c in v.string_list(
                label, p.sub("carry"), p.raw("carry"), pattern=r"[A-Za-z0-9][A-Za-z0-9._-]*", what="names"
            )
        )
        for i, name in enumerate(carry):
            if name not in known:
                v.fail(
                    label,
                    f"provision.carry[{i}]",
                    name,
                    f"carry only what the stack pins: one of {', '.join(sorted(known))}",
                )
        if mode is RuntimeMode.VENV and set(carry) != known:
            v.fail(
                label, p.sub("carry"), list(carry), "mode venv carries every pin; omit carry (layered only)"
            )
    else:
        carry = default_carry(stack)
    d = v.Fields(p.raw("driver", {}) or {}, "provision.driver", label)
    policy = DriverPolicy(
        v.choice(label, d.sub("policy"), d.raw("policy", "refuse"), [x.value for x in DriverPolicy])
    )
    package = v.string(
        label,
        d.sub("package"),
        d.raw("package", "auto"),
        pattern=r"[a-z0-9][a-z0-9.+_-]{0,80}",
        what="a package",
    )
    d.done(["policy", "package"])
    if policy is DriverPolicy.INSTALL and "driver" not in stack.pins:
        v.fail(label, d.sub("policy"), "install", "installing a driver needs stack.driver pinned")
    provision = Provision(
        mode=mode,
        base_python=base_python,
        carry=carry,
        driver_policy=policy,
        driver_package=package,
        reboot=v.boolean(label, p.sub("reboot"), p.raw("reboot", True)),
        max_parallel_reboots=v.integer(
            label, p.sub("max_parallel_reboots"), p.raw("max_parallel_reboots", 1), lo=1, hi=1000
        ),
        min_free_disk_mb=v.integer(
            label, p.sub("min_free_disk_mb"), p.raw("min_free_disk_mb", 2048), lo=0, hi=10_000_000
        ),
        supported_os=v.string_list(
            label,
            p.sub("supported_os"),
            p.raw("supported_os", list(DEFAULT_SUPPORTED_OS)),
            pattern=r"[A-Za-z][A-Za-z ]*[A-Za-z] [0-9][0-9.]*",
            what='"Distribution version" entries like "Ubuntu 24.04"',
        ),
        persistence_mode=v.boolean(label, p.sub("persistence_mode"), p.raw("persistence_mode", True)),
        dcgm=v.boolean(label, p.sub("dcgm"), p.raw("dcgm", False)),
        config=_config(p, label),
    )
    p.done(
        [
            "mode",
            "base_python",
            "carry",
            "driver",
            "reboot",
            "max_parallel_reboots",
            "min_free_disk_mb",
            "supported_os",
            "persistence_mode",
            "dcgm",
            "config",
        ]
    )
    return provision


def _config(p: v.Fields, label: str) -> NodeConfig:
    c = v.Fields(p.raw("config", {}) or {}, "provision.config", label)
    s = v.Fields(c.raw("service", {}) or {}, "provision.config.service", label)
    for moved in ("port", "exit_timeout_s"):
        if s.has(moved):
            v.fail(label, s.sub(moved), s.raw(moved), f"set it in the node's service.{moved} (or defaults)")
    service = ServiceConfig(
        max_concurrency=v.integer(
            label, s.sub("max_concurrency"), s.raw("max_concurrency", 4), lo=1, hi=1024
        ),
        max_queue=v.integer(label, s.sub("max_queue"), s.raw("max_queue", 32), lo=0, hi=100_000),
    )
    s.done(["max_concurrency", "max_queue"])
    config = NodeConfig(
        device_id=v.integer(label, c.sub("device_id"), c.raw("device_id", 0), lo=0, hi=63),
        # the service refuses 0: it bounds what one request may allocate (and the body it reads)
        memory_limit_mb=v.integer(
            label, c.sub("memory_limit_mb"), c.raw("memory_limit_mb", 4096), lo=1, hi=10_000_000
        ),
        log_level=v.choice(label, c.sub("log_level"), c.raw("log_level", "info"), LOG_LEVELS),
        timeout_ms=v.integer(label, c.sub("timeout_ms"), c.raw("timeout_ms", 60_000), lo=1, hi=86_400_000),
        retry_count=v.integer(label, c.sub("retry_count"), c.raw("retry_count", 0), lo=0, hi=10),
        benchmark_iterations=v.integer(
            label, c.sub("benchmark_iterations"), c.raw("benchmark_iterations", 20), lo=1, hi=100_000
        ),
        service=service,
    )
    c.done(
        [
            "device_id",
            "memory_limit_mb",
            "log_level",
            "timeout_ms",
            "retry_count",
            "benchmark_iterations",
            "service",
        ]
    )
    return config

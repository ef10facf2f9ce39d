"""A node's `service` field: whether the operator service (docs/service.md) runs on the node, on which GPUs
and ports, and what supervises it. Documented in docs/fleet-spec.md ("service").

`defaults.service` and a node's `service` merge key by key (a node may override only `port`), and an error
names where the bad value came from (`defaults.service.port` or `nodes[2].service.port`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from fleet import validate as v

SERVICE_KEYS = ["enabled", "manager", "port", "gpus", "ready_timeout_s", "exit_timeout_s"]
MAX_GPUS = 64


class ServiceManager(StrEnum):
    SYSTEMD = "systemd"  # one unit per GPU and slot (templates/solfleet-serve@.service.j2)
    PROCESS = "process"  # no systemd: the role starts each instance detached (setsid) from the node's python


@dataclass(frozen=True)
class ServiceSpec:
    enabled: bool = False
    manager: ServiceManager = ServiceManager.SYSTEMD
    port: int = 8000  # base port: the instance on GPU i listens on port + i
    gpus: tuple[int, ...] = ()  # resolved indexes; () when not enabled
    ready_timeout_s: int = 300
    exit_timeout_s: int = 30

    @property
    def ports(self) -> tuple[int, ...]:
        return tuple(self.port + g for g in self.gpus)


def parse_service(
    label: str,
    node_path: str,
    node_raw: object,
    default_raw: object,
    *,
    gpu_count: int | None,
    simulated: bool,
) -> ServiceSpec:
    """`node_raw` / `default_raw`: the node's and the defaults' `service` values (None when absent).
    `gpu_count`: the node's declared GPU count (None: no `gpu` field)."""
    fields: dict[str, tuple[str, Any]] = {}
    for where, raw in (("defaults.service", default_raw), (f"{node_path}.service", node_raw)):
        if raw is None:
            continue
        f = v.Fields(raw, where, label)
        for key in SERVICE_KEYS:
            if f.has(key):
                fields[key] = (f.sub(key), f.raw(key))
        f.done(SERVICE_KEYS)

    def pick(key: str, fallback: Any) -> tuple[str, Any]:
        return fields.get(key, (f"{node_path}.service.{key}", fallback))

    enabled = v.boolean(label, *pick("enabled", False))
    manager = ServiceManager(v.choice(label, *pick("manager", "systemd"), [m.value for m in ServiceManager]))
    port = v.integer(label, *pick("port", 8000), lo=1, hi=65535)
    ready = v.integer(label, *pick("ready_timeout_s", 300), lo=1, hi=86_400)
    exit_s = v.integer(label, *pick("exit_timeout_s", 30), lo=0, hi=3_600)
    gpus = _gpus(label, *pick("gpus", "all"), gpu_count=gpu_count, simulated=simulated)
    if enabled:
        path, _ = pick("gpus", "all")
        if not gpus:
            v.fail(label, path, 0, "the node declares gpu.count 0: an enabled service needs a GPU")
        if port + max(gpus) > 65535:
            v.fail(label, pick("port", 8000)[0], port, f"port + the highest GPU index ({max(gpus)}) <= 65535")
    return ServiceSpec(
        enabled=enabled,
        manager=manager,
        port=port,
        gpus=gpus if enabled else (),
        ready_timeout_s=ready,
        exit_timeout_s=exit_s,
    )


def _gpus(label: str, path: str, raw: object, *, gpu_count: int | None, simulated: bool) -> tuple[int, ...]:
    """`all`: every declared GPU (a simulated node, or one without a `gpu` field, has one: GPU 0); or a list
    of distinct indexes below the declared count."""
    count = 1 if simulated or gpu_count is None else gpu_count
    if raw == "all":
        return tuple(range(count))
    if not isinstance(raw, list):
        v.fail(label, path, raw, '"all" or a list of GPU indexes like [0, 1]')
    out: list[int] = []
    for i, item in enumerate(raw):
        g = v.integer(label, f"{path}[{i}]", item, lo=0, hi=MAX_GPUS - 1)
        if g >= count:
            v.fail(label, f"{path}[{i}]", g, f"a GPU index below the node's gpu.count ({count})")
        if g in out:
            v.fail(label, f"{path}[{i}]", g, "each GPU may appear once")
        out.append(g)
    return tuple(out)


def check_port_overlap(label: str, nodes: Mapping[int, tuple[str, ServiceSpec]]) -> None:
    """Two nodes on one machine (same address) must not both listen on one port. `nodes`: index ->
    (machine key, service)."""
    seen: dict[tuple[str, int], int] = {}
    for i, (where, svc) in nodes.items():
        for p in svc.ports:
            if (where, p) in seen:
                v.fail(
                    label,
                    f"nodes[{i}].service.port",
                    svc.port,
                    f"nodes[{seen[(where, p)]}] on the same machine already serves on port {p}",
                )
        for p in svc.ports:
            seen[(where, p)] = i

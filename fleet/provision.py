"""`solfleet provision`: preflight, driver, runtime and node config on every node (playbooks/provision.yml),
then the reboots a driver change needs, at most `provision.max_parallel_reboots` nodes at a time.

Plan, then apply: `provision_plan` is pure and printed first; `--dry-run` runs the same playbook in check
mode (Ansible reports what would change, touches nothing) and schedules no reboot. The playbook runs under
each node's base interpreter (`provision.base_python`): the runtime it builds does not exist yet.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Any

from fleet import runner
from fleet.errors import UsageError
from fleet.inventory import write_private_data_dir
from fleet.provision_spec import Provision, RuntimeMode, runtime_python
from fleet.runner import HostStatus, ProgressSink
from fleet.spec import FleetSpec, Node
from fleet.wheelhouse import read_wheelhouse
from fleet.workdir import run_dir

PROVISION_PLAYBOOK = "provision.yml"
REBOOT_PLAYBOOK = "provision_reboot.yml"
ROLES = ("preflight", "driver", "runtime")


class ProvisionExit(IntEnum):
    OK = 0
    FAILED = 1
    UNREACHABLE = 3


@dataclass(frozen=True)
class HostOutcome:
    name: str
    ok: int  # task counts, as Ansible's stats count them
    changed: int
    failed: int
    unreachable: bool
    driver_action: str | None  # none | skip | install | reboot | refuse (None: the driver role did not run)
    reboot: bool  # the driver changed and the node needs a reboot
    runtime_python: str | None
    message: str = ""


@dataclass(frozen=True)
class ProvisionResult:
    hosts: tuple[HostOutcome, ...]
    check_mode: bool
    stack_id: str
    reboot_waves: tuple[tuple[str, ...], ...]  # done (or, in check mode, scheduled)
    rebooted: tuple[str, ...] = field(default_factory=tuple)
    reboot_failed: tuple[str, ...] = field(default_factory=tuple)

    @property
    def exit_code(self) -> ProvisionExit:
        if any(h.failed for h in self.hosts if not h.unreachable) or self.reboot_failed:
            return ProvisionExit.FAILED
        if any(h.unreachable for h in self.hosts):
            return ProvisionExit.UNREACHABLE
        return ProvisionExit.OK

    def as_json(self) -> dict[str, Any]:
        return {
            "hosts": [
                {"name": h.name, "ok": h.ok, "changed": h.changed, "failed": h.failed} for h in self.hosts
            ],
            "stack_id": self.stack_id,
            "check_mode": self.check_mode,
            "driver": {h.name: h.driver_action for h in self.hosts},
            "reboot_waves": [list(w) for w in self.reboot_waves],
        }


def require_provision(spec: FleetSpec) -> Provision:
    if spec.provision is None:
        raise UsageError(
            f"{spec.source}: no `provision` section; add one to provision nodes"
            " (docs/fleet-spec.md, provision)"
        )
    return spec.provision


def reboot_waves(hosts: Sequence[str], max_parallel: int) -> tuple[tuple[str, ...], ...]:
    """Hosts to reboot in spec order, in waves of at most `max_parallel`: a driver rollback is a reboot,
    so never more nodes than the operator allows are down at once."""
    if max_parallel < 1:
        raise ValueError(f"max_parallel {max_parallel} is not allowed; expected >= 1")
    return tuple(tuple(hosts[i : i + max_parallel]) for i in range(0, len(hosts), max_parallel))


def default_wheelhouse(spec: FleetSpec, dist: Path) -> Path:
    from fleet.wheelhouse import archive_path

    return archive_path(dist, spec.stack_id)


def extravars(
    spec: FleetSpec, *, wheelhouse: Path, check: bool, roles: Sequence[str] = ROLES
) -> dict[str, Any]:
    """Every role variable, from the spec (pure). Host-specific values (root, simulated, gpu cc) come from
    the rendered inventory's host vars, which the roles' defaults read."""
    p = require_provision(spec)
    stack = spec.resolved_stack
    return {
        # the runtime does not exist before provision: Ansible's modules run under the base interpreter
        "ansible_python_interpreter": p.base_python,
        "solfleet_provision_check": check,
        "solfleet_provision_roles": list(roles),
        "solfleet_preflight_supported_os": list(p.supported_os),
        "solfleet_preflight_min_free_disk_mb": p.min_free_disk_mb,
        "solfleet_preflight_python_pin": stack.pins.get("python", ""),
        "solfleet_preflight_driver_pin": stack.pins.get("driver", ""),
        "solfleet_preflight_driver_policy": p.driver_policy.value,
        "solfleet_preflight_driver_package": p.driver_package,
        "solfleet_driver_pin": stack.pins.get("driver", ""),
        "solfleet_driver_policy": p.driver_policy.value,
        "solfleet_driver_package": p.driver_package,
        "solfleet_driver_persistence_mode": p.persistence_mode,
        "solfleet_driver_dcgm": p.dcgm,
        "solfleet_runtime_stack_id": spec.stack_id,
        "solfleet_runtime_mode": p.mode.value,
        "solfleet_runtime_base_python": p.base_python,
        "solfleet_runtime_wheelhouse": str(wheelhouse.resolve()),
        "solfleet_runtime_expected": stack.as_manifest(),
        "solfleet_runtime_config": p.config.as_dict(),
    }


def provision_plan(
    spec: FleetSpec, nodes: Sequence[Node], *, wheelhouse: Path, check: bool, roles: Sequence[str] = ROLES
) -> list[str]:
    """What provision will do, as lines to print before anything runs (pure)."""
    p = require_provision(spec)
    stack = spec.resolved_stack
    lines = [
        f"provision {len(nodes)} node(s) of fleet {spec.name} to stack {spec.stack_id}"
        + (" (dry run: Ansible check mode, nothing changes)" if check else ""),
        "  stack: "
        + ", ".join(f"{k} {v}" for k, v in stack.pins.items())
        + (f"; requirements {', '.join(str(r) for r in stack.requirements)}" if stack.requirements else ""),
    ]
    if "preflight" in roles:
        lines.append(
            f"  preflight: OS in {', '.join(p.supported_os)}; GPU visible and cc as declared; "
            f">= {p.min_free_disk_mb} MiB free;"
            f" base python {p.base_python} matches {stack.pins.get('python')}"
        )
    if "driver" in roles:
        pin = stack.pins.get("driver")
        lines.append(
            f"  driver: pinned {pin}, policy {p.driver_policy.value} "
            + (
                "(a node with another driver loaded is refused)"
                if p.driver_policy.value == "refuse"
                else f"(install + hold, then reboot, at most {p.max_parallel_reboots} node(s) at a time"
                + ("" if p.reboot else "; provision.reboot is false: reboots are left to you")
                + ")"
            )
            if pin
            else "  driver: no stack.driver pin: not managed"
        )
    if "runtime" in roles:
        carried = ", ".join(p.carry) or "nothing"
        layer = f", layered on {p.base_python}'s site-packages" if p.mode is RuntimeMode.LAYERED else ""
        lines.append(
            f"  runtime: <root>/runtimes/{spec.stack_id} ({p.mode.value}{layer}) from {wheelhouse.name} "
            f"(carries {carried}); pip install --no-index --require-hashes; pins checked"
        )
        lines.append(
            "  config: <root>/config.yaml "
            + ", ".join(f"{k}={v}" for k, v in p.config.as_dict().items() if k != "service")
        )
    for node in nodes:
        lines.append(
            f"  - {node.name} ({node.connection.value} {node.host}) root {node.root} -> python "
            f"{runtime_python(node.root, spec.stack_id)}{' [simulated]' if node.simulated else ''}"
        )
    return lines


def _outcome(hp: runner.HostProgress, spec: FleetSpec, node: Node) -> HostOutcome:
    driver = hp.solfleet.get("driver") if isinstance(hp.solfleet.get("driver"), dict) else None
    runtime = hp.solfleet.get("runtime") if isinstance(hp.solfleet.get("runtime"), dict) else None
    unreachable = hp.status is HostStatus.UNREACHABLE
    return HostOutcome(
        name=hp.host,
        ok=hp.ok,
        changed=hp.changed,
        failed=hp.failed + hp.unreachable,
        unreachable=unreachable,
        driver_action=None if driver is None else str(driver.get("action")),
        reboot=bool(driver and driver.get("reboot")),
        runtime_python=str(runtime.get("python")) if runtime else runtime_python(node.root, spec.stack_id),
        message=hp.message,
    )


def provision(
    spec: FleetSpec,
    nodes: Sequence[Node],
    *,
    wheelhouse: Path,
    check: bool,
    roles: Sequence[str] = ROLES,
    progress: ProgressSink | None = None,
    reboot_progress: ProgressSink | None = None,
) -> ProvisionResult:
    p = require_provision(spec)
    if "runtime" in roles:
        read_wheelhouse(wheelhouse, stack_id=spec.stack_id)  # exit 2 before any node is touched
    op_id = f"p-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(3)}"
    pdd = run_dir(spec, op_id)
    write_private_data_dir(spec, pdd)
    names = [n.name for n in nodes]
    result = runner.run_playbook(
        private_data_dir=pdd,
        playbook=PROVISION_PLAYBOOK,
        hosts=names,
        extravars=extravars(spec, wheelhouse=wheelhouse, check=check, roles=roles),
        ident="00-provision",
        timeout_s=spec.timeouts.run_s,
        progress=progress,
    )
    outcomes = tuple(_outcome(result.hosts[n.name], spec, n) for n in nodes)
    due = [h.name for h in outcomes if h.reboot and not h.failed]
    waves = reboot_waves(due, p.max_parallel_reboots) if due else ()
    if check or not p.reboot or not waves:
        return ProvisionResult(hosts=outcomes, check_mode=check, stack_id=spec.stack_id, reboot_waves=waves)
    rebooted: list[str] = []
    failed: list[str] = []
    for i, wave in enumerate(waves):
        run = runner.run_playbook(
            private_data_dir=pdd,
            playbook=REBOOT_PLAYBOOK,
            hosts=list(wave),
            extravars={**extravars(spec, wheelhouse=wheelhouse, check=False), "solfleet_provision_roles": []},
            ident=f"{i + 1:02d}-reboot",
            timeout_s=spec.timeouts.run_s,
            progress=reboot_progress,
        )
        for host in wave:
            (
                failed if run.hosts[host].status in (HostStatus.FAILED, HostStatus.UNREACHABLE) else rebooted
            ).append(host)
        if failed:
            break  # a node that did not come back on the pinned driver stops the next wave
    return ProvisionResult(
        hosts=outcomes,
        check_mode=check,
        stack_id=spec.stack_id,
        reboot_waves=waves,
        rebooted=tuple(rebooted),
        reboot_failed=tuple(failed),
    )

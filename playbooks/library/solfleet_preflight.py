#!/usr/bin/python
"""solfleet_preflight: gather a node's provisioning facts (or take captured ones) and check them."""

from __future__ import annotations

import sys

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.solfleet_provision import gather_facts, preflight_checks

DOCUMENTATION = r"""
module: solfleet_preflight
short_description: Check OS, kernel headers, GPU visibility, compute capability, free disk and Python
description:
  - Gathers the node's facts (/etc/os-release, nvidia-smi or lspci, /proc/driver/nvidia/version, dpkg/rpm,
    free disk under I(root)), or uses I(facts) when given (facts captured from a real node, for check-mode
    tests), runs every check and fails naming each failed one. Read-only; supports check mode.
  - Returns C(solfleet.preflight) = {checks, facts}; C(facts) feeds the solfleet_driver module.
options:
  root: {description: "absolute node root (free disk is measured there)", type: path, required: true}
  node: {description: "node name, for messages", type: str, required: true}
  facts: {description: "use these facts instead of gathering them", type: dict, default: null}
  supported_os:
    description: "accepted 'Distribution version' entries"
    type: list
    elements: str
    required: true
  min_free_disk_mb: {description: "free MiB needed under root", type: int, default: 2048}
  gpu_cc: {description: "compute capability the spec declares, empty = any", type: str, default: ""}
  gpu_count: {description: "GPUs the spec declares, 0 = any", type: int, default: 0}
  simulated: {description: "node declared simulated (GPU checks skipped)", type: bool, default: false}
  python: {description: "stack.python pin the base interpreter must match", type: str, default: ""}
  driver: {description: "stack.driver pin, empty = none", type: str, default: ""}
  driver_policy: {description: "refuse or install", type: str, default: refuse, choices: [refuse, install]}
  driver_package: {description: "driver package name or auto", type: str, default: auto}
"""


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "root": {"type": "path", "required": True},
            "node": {"type": "str", "required": True},
            "facts": {"type": "dict", "default": None},
            "supported_os": {"type": "list", "elements": "str", "required": True},
            "min_free_disk_mb": {"type": "int", "default": 2048},
            "gpu_cc": {"type": "str", "default": ""},
            "gpu_count": {"type": "int", "default": 0},
            "simulated": {"type": "bool", "default": False},
            "python": {"type": "str", "default": ""},
            "driver": {"type": "str", "default": ""},
            "driver_policy": {"type": "str", "default": "refuse", "choices": ["refuse", "install"]},
            "driver_package": {"type": "str", "default": "auto"},
        },
        supports_check_mode=True,
    )
    p = module.params
    facts = p["facts"] or gather_facts(
        root=p["root"], python_version=".".join(map(str, sys.version_info[:3]))
    )
    checks = preflight_checks(facts, p)
    result = {"changed": False, "solfleet": {"preflight": {"checks": checks, "facts": facts}}, "facts": facts}
    failed = [c for c in checks if c["status"] == "failed"]
    if failed:
        why = "; ".join(f"{c['name']}: {c['detail']}" for c in failed)
        module.fail_json(msg=f"solfleet: {p['node']}: preflight: {why}", **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()

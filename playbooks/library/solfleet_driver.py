#!/usr/bin/python
"""solfleet_driver: choose the NVIDIA driver action for a node from its preflight facts."""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.solfleet_provision import driver_decision

DOCUMENTATION = r"""
module: solfleet_driver
short_description: Decide skip / install / reboot / refuse for the pinned NVIDIA driver
description:
  - >-
    Pure decision from I(facts) (solfleet_preflight's): C(skip) when the pinned version is loaded, C(refuse)
    when another is loaded (or none) and I(driver_policy=refuse), C(install) when it must be installed,
    C(reboot) when it is installed but not loaded yet, C(none) without a pin or on a simulated node.
  - >-
    Fails on C(refuse) with one line naming the loaded and pinned versions. Changes nothing itself; the
    role's package tasks act on C(solfleet.driver.action). Supports check mode.
options:
  node: {description: "node name, for messages", type: str, required: true}
  facts: {description: "solfleet_preflight facts", type: dict, required: true}
  driver: {description: "stack.driver pin, empty = none", type: str, default: ""}
  driver_policy: {description: "refuse or install", type: str, default: refuse, choices: [refuse, install]}
  driver_package: {description: "package name or auto", type: str, default: auto}
  simulated: {description: "node declared simulated", type: bool, default: false}
"""


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "node": {"type": "str", "required": True},
            "facts": {"type": "dict", "required": True},
            "driver": {"type": "str", "default": ""},
            "driver_policy": {"type": "str", "default": "refuse", "choices": ["refuse", "install"]},
            "driver_package": {"type": "str", "default": "auto"},
            "simulated": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    p = module.params
    decision = driver_decision(p["facts"], p)
    result = {"changed": False, "solfleet": {"driver": decision}, "driver": decision}
    if decision["action"] == "refuse":
        module.fail_json(msg=f"solfleet: {p['node']}: driver: {decision['why']}", **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()

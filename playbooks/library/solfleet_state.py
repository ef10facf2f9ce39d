#!/usr/bin/python
"""solfleet_state: read a node's solfleet state (status), or run the kernels health check in `current`.

Read-only: takes no lock (status must answer while a deploy holds it) and never changes anything.
"""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.solfleet_artifact import check_files, read_manifest
from ansible.module_utils.solfleet_kernels import run_kernels
from ansible.module_utils.solfleet_layout import NodeError, NodeLayout

DOCUMENTATION = r"""
module: solfleet_state
short_description: Report a node's solfleet releases, links and last journal event; optionally run health
description:
  - I(mode=status) returns C(solfleet) = node, root, current, current_verified, previous, releases,
    last_event, simulated. With I(deep=true) it also re-hashes every file of C(current) against its
    MANIFEST.json: C(current_intact) true/false and C(current_check) say what was found (null when not asked).
  - I(mode=health) also runs C(python -m kernels health --json) in C(<root>/current) and fails when unhealthy.
options:
  mode: {description: "status or health", type: str, choices: [status, health], default: status}
  root: {description: "absolute node root", type: path, required: true}
  node: {description: "node name", type: str, required: true}
  python: {description: "interpreter that runs python -m kernels (mode=health)", type: str, default: ""}
  simulated: {description: "run health under the CUDA simulator", type: bool, default: false}
  deep: {description: "mode=status: re-hash current's files against its MANIFEST", type: bool, default: false}
  health_timeout_s: {description: "timeout of health", type: int, default: 120}
"""


def intact(release: str) -> tuple[bool, str]:
    """Re-hash every file of `release` against its MANIFEST.json, the check a deploy makes before it trusts
    an existing release. Verify records say what was true when they were written; this says what is true
    now (a bad disk or a hand edit after activation shows here and nowhere else)."""
    try:
        checked = check_files(release, read_manifest(release))
    except NodeError as exc:
        return False, exc.message
    return True, f"{checked} files match MANIFEST.json"


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "mode": {"type": "str", "choices": ["status", "health"], "default": "status"},
            "root": {"type": "path", "required": True},
            "node": {"type": "str", "required": True},
            "python": {"type": "str", "default": ""},
            "simulated": {"type": "bool", "default": False},
            "health_timeout_s": {"type": "int", "default": 120},
            "deep": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        layout = NodeLayout(p["root"], p["node"], p["simulated"])
    except NodeError as exc:
        module.fail_json(msg=f"solfleet: {p['node']}: {exc.phase}: {exc.message}")
    state = layout.state()
    if p["mode"] == "status":
        state["current_intact"], state["current_check"] = (
            intact(layout.link_path("current")) if p["deep"] and state["current"] else (None, None)
        )
        module.exit_json(changed=False, solfleet=state)
    if not state["current"]:
        module.fail_json(
            msg=f"solfleet: {p['node']}: health: no current release under {layout.root}", solfleet=state
        )
    if not p["python"]:
        module.fail_json(msg=f"solfleet: {p['node']}: health: python is empty", solfleet=state)
    current = layout.link_path("current")
    try:
        run = run_kernels(
            python=p["python"],
            release=current,
            command="health",
            args=[],
            cache_dir=layout.cache,
            simulated=p["simulated"],
            timeout_s=p["health_timeout_s"],
            phase="health",
        )
    except NodeError as exc:
        module.fail_json(msg=f"solfleet: {p['node']}: health: {exc.message}", solfleet=state)
    state["health"] = run.data
    if not run.ok:
        module.fail_json(
            msg=f"solfleet: {p['node']}: health: {run.message} (current {state['current']})", solfleet=state
        )
    module.exit_json(
        changed=False, msg=f"solfleet: {p['node']}: healthy on {state['current']}", solfleet=state
    )


if __name__ == "__main__":
    main()

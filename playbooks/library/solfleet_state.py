#!/usr/bin/python
"""solfleet_state: read a node's solfleet state (status), run the kernels health check in `current`, or take
and drop the rollout lease.

status is read-only: it waits for no lock (status must answer while a deploy holds it) and changes nothing;
it only tries the node's lock without waiting, to say whether a step holds it (`busy`).
health changes nothing either, except that with journal=true (`solfleet health`) it records its result in
the journal, under the node's lock and only when `current` did not move while it ran (journal_health).
lease/release change only `<root>/lease.json`.
"""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.solfleet_artifact import check_files, read_manifest
from ansible.module_utils.solfleet_kernels import KernelsRun, health_env, run_kernels
from ansible.module_utils.solfleet_layout import LEASE_STATES, Lease, NodeError, NodeLayout, NodeLock

DOCUMENTATION = r"""
module: solfleet_state
short_description: Report a node's solfleet releases, links and last journal event; optionally run health
description:
  - >-
    I(mode=status) returns C(solfleet) = node, root, current, current_verified, previous, releases,
    last_event, simulated, busy. With I(deep=true) it also re-hashes every file of C(current) against its
    MANIFEST.json: C(current_intact) true/false and C(current_check) say what was found (null when not asked).
  - >-
    C(busy) (every mode's state) is true when a step holds the node's lock C(<root>/.lock) as the state is
    read (a deploy or rollback step, also one whose controller is gone and which runs on to its end, a
    service start, or the health journal line): C(current) may still move when that step ends. The lock is
    tried without waiting, before anything else is read, and let go at once; no lock file means false, one
    that cannot be opened or probed true. A step still waiting for the lock is not seen.
  - >-
    I(mode=health) also runs C(python -m kernels health --json) in C(<root>/current) and fails when unhealthy.
    With I(journal=true) it journals the result (C(healthy) or C(failed), the release checked, the failed
    checks), so that status's health verdict follows the latest check; C(health_journaled) and
    C(health_journal_error) say whether it did, and why not.
  - >-
    I(mode=lease) takes the node's rollout lease for I(rollout_id) (refused, naming the holder, when another
    live rollout holds it, unless that rollout is in I(take_over)) and returns the state as I(mode=status)
    does, read once the lease is held: the controller's baseline (with C(busy): a step of another rollout,
    such as one whose controller died, may still be running there). I(mode=release) drops the lease when
    I(rollout_id) holds it.
  - >-
    I(mode=lease) with I(health=true) also runs the health check of I(mode=health) once the lease is held and
    the node has a C(current) (the controller's preflight of its first batch, in the same node call as the
    baseline): C(health) holds the report, C(health_error) why there is none. An unhealthy node does not fail
    the lease; the controller judges the report as it judges a health run's.
options:
  mode: {description: "what to do", type: str, choices: [status, health, lease, release], default: status}
  rollout_id: {description: "mode=lease/release: the rollout", type: str, default: ""}
  controller: {description: "mode=lease: user@host:pid of the controller", type: str, default: ""}
  lease_state:
    description: "mode=lease: the holder's state, written in lease.json"
    type: str
    choices: [running, paused, unfinished]
    default: running
  lease_s: {description: "mode=lease: seconds until the lease expires", type: int, default: 3600}
  take_over: {description: "mode=lease: rollouts whose lease may go", type: list, elements: str, default: []}
  health: {description: "mode=lease: also run health once the lease is held", type: bool, default: false}
  journal: {description: "mode=health: record the result in the journal", type: bool, default: false}
  root: {description: "absolute node root", type: path, required: true}
  node: {description: "node name", type: str, required: true}
  python: {description: "interpreter that runs python -m kernels (mode=health)", type: str, default: ""}
  simulated: {description: "run health under the CUDA simulator", type: bool, default: false}
  deep: {description: "mode=status: re-hash current's files against its MANIFEST", type: bool, default: false}
  health_timeout_s: {description: "timeout of health", type: int, default: 120}
  gpu_cc: {description: "health: expected compute capability ('' = not set)", type: str, default: ""}
  gpu_count: {description: "health: expected GPU count ('' = not set)", type: str, default: ""}
  gpu_model: {description: "health: expected GPU model ('' = not set)", type: str, default: ""}
  stack_driver: {description: "health: the stack's driver pin ('' = none)", type: str, default: ""}
  stack_cuda: {description: "health: the stack's CUDA version ('' = none)", type: str, default: ""}
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


def check_health(layout: NodeLayout, p: dict, state: dict) -> KernelsRun:
    """`python -m kernels health --json` in current; its report goes to state["health"]. A failed
    release-integrity check marks current suspect (status says so until a deploy or rollback replaces it).
    Returns the run (its `ok` and `message`); raises NodeError when the health run itself failed."""
    current = layout.link_path("current")
    run = run_kernels(
        config=layout.config_path,
        python=p["python"],
        release=current,
        command="health",
        args=[],
        cache_dir=layout.cache,
        simulated=p["simulated"],
        timeout_s=p["health_timeout_s"],
        phase="health",
        extra_env=health_env(layout.root, p),
    )
    state["health"] = run.data
    broken = [
        c
        for c in (run.data or {}).get("checks") or []
        if isinstance(c, dict) and c.get("name") == "release.integrity" and c.get("status") == "failed"
    ]
    if broken:
        # Found once, remembered: current's files no longer match what was verified, so status says
        # `suspect` from now on (as after a deploy's failed re-check) until a deploy or rollback replaces it.
        reason = f"re-check by health: release.integrity failed: {broken[0].get('detail', '')}"
        try:
            layout.mark_suspect(state["current"], reason)
            state["current_suspect"] = reason
        except OSError as exc:
            state["suspect_error"] = f"cannot write {layout.suspect_path}: {exc.strerror or exc}"
    return run


# How long a health run waits for the node's lock to journal its result: long enough for another health
# run's append, never a deploy's verify (`solfleet health` answers within timeouts.status_s).
HEALTH_JOURNAL_LOCK_S = 2.0


def journal_health(layout: NodeLayout, checked: str, switches_before: int, ok: bool, message: str) -> dict:
    """Record a health run's result on `checked` in the journal (`healthy`, or `failed` with why), the line
    status reads for the node's health since the last move (NodeLayout.move_state), so that a pass on
    current clears `health_failed` and a failure sets it. The run holds no lock while it checks (it must
    answer while a deploy verifies for minutes), so the line is appended under the node's lock, and only
    when nothing moved meanwhile: `current` still `checked`, no switch journaled since the run began
    (`switches_before`); else a move's own health line would be overtaken by an older result. Nor for a
    release that is not verified (status says `unverified` whatever its health). Nor is it
    written when the journal's last move names another release (a line move_state would not count), or when
    the journal already holds the same line for current since the last move (a periodic health run does not
    grow the journal). Returns `health_journaled` (the journal holds this result for current now) and
    `health_journal_error` (why not)."""
    event = "healthy" if ok else "failed"
    detail = "health passed (solfleet health)" if ok else f"health (solfleet health): {message}"
    why = None
    try:
        with NodeLock(layout, HEALTH_JOURNAL_LOCK_S):
            now = layout.link_version("current")
            moved = layout.move_state()
            last = moved["last_health"] or {}
            if now != checked or layout.journaled_switches() != switches_before:
                why = f"current moved while health ran (now {now or 'none'}): the move's own health stands"
            elif not layout.is_verified(checked):
                # a release that failed after activation (a kill before the switch back): no line ever makes
                # it healthy, and the rollback no-op must keep refusing it
                why = f"current {checked} is not a verified release: a deploy or a rollback replaces it"
            elif moved["moved_to"] != checked:
                why = (
                    f"the journal's last move names {moved['moved_to'] or 'nothing'}, not current {checked}:"
                    f" `rollback --to {checked}` confirms it and runs health"
                )
            elif (last.get("event"), last.get("detail")) != (event, detail):
                layout.journal(event, checked, "", detail)
    except NodeError as exc:  # the lock: a deploy or rollback is at work here
        why = exc.message
    except OSError as exc:  # a full disk, a root that cannot be written
        why = f"cannot journal it: {exc.strerror or exc}"
    return {
        "health_journaled": why is None,
        "health_journal_error": None if why is None else f"result not journaled: {why}",
    }


def lease_health(layout: NodeLayout, p: dict, state: dict) -> None:
    """mode=lease with health=true: the health check of mode=health on a node with a current release. Never
    fails the lease: the report goes to state["health"], and why there is no passing run to
    state["health_error"]."""
    if not p["health"] or not state["current"]:
        return
    if not p["python"]:
        state["health_error"] = "python is empty"
        return
    try:
        run = check_health(layout, p, state)
    except NodeError as exc:
        state["health_error"] = exc.message
        return
    if not run.ok:
        state["health_error"] = f"{run.message} (current {state['current']})"


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "mode": {"type": "str", "choices": ["status", "health", "lease", "release"], "default": "status"},
            "rollout_id": {"type": "str", "default": ""},
            "controller": {"type": "str", "default": ""},
            # what a refused second controller reads of the holder (solfleet_layout.LEASE_STATES)
            "lease_state": {"type": "str", "choices": list(LEASE_STATES), "default": "running"},
            "lease_s": {"type": "int", "default": 3600},
            "take_over": {"type": "list", "elements": "str", "default": []},
            "health": {"type": "bool", "default": False},
            "journal": {"type": "bool", "default": False},
            "root": {"type": "path", "required": True},
            "node": {"type": "str", "required": True},
            "python": {"type": "str", "default": ""},
            "simulated": {"type": "bool", "default": False},
            "health_timeout_s": {"type": "int", "default": 120},
            "deep": {"type": "bool", "default": False},
            "gpu_cc": {"type": "str", "default": ""},
            "gpu_count": {"type": "str", "default": ""},
            "gpu_model": {"type": "str", "default": ""},
            "stack_driver": {"type": "str", "default": ""},
            "stack_cuda": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        layout = NodeLayout(p["root"], p["node"], p["simulated"])
    except NodeError as exc:
        module.fail_json(msg=f"solfleet: {p['node']}: {exc.phase}: {exc.message}")
    if p["mode"] in ("lease", "release"):
        if not p["rollout_id"]:
            module.fail_json(msg=f"solfleet: {p['node']}: lease: rollout_id is empty")
        lease = Lease(layout)
        if p["mode"] == "release":
            released = lease.release(p["rollout_id"])
            # changed=False for lease and release alike: the lease is the rollout's own bookkeeping, gone at
            # its end, so a re-deploy of the current version still reports changed=0 (idempotence).
            module.exit_json(changed=False, solfleet={"node": p["node"], "released": released})
        try:
            replaced = lease.acquire(
                rollout_id=p["rollout_id"],
                controller=p["controller"],
                expires_in_s=p["lease_s"],
                take_over=list(p["take_over"]),
                state=p["lease_state"],
            )
        except NodeError as exc:
            state = layout.state()
            state.update(outcome="refused", failed_phase="lease", message=exc.message)
            module.fail_json(msg=f"solfleet: {p['node']}: lease: {exc.message}", solfleet=state)
        except OSError as exc:
            # A node that cannot even write its lease (a full disk) cannot take part in a switch either (the
            # node module refuses before switching when it cannot journal): report the state, lease unheld,
            # and let the node module's own refusal say so per host.
            state = layout.state()
            state["lease_error"] = f"cannot write {layout.lease_path}: {exc.strerror or exc}"
            lease_health(layout, p, state)  # a full disk is the deploy's to refuse, not a health finding
            module.exit_json(changed=False, solfleet=state)
        state = layout.state()
        state["lease_replaced"] = replaced or None
        lease_health(layout, p, state)
        module.exit_json(changed=False, solfleet=state)
    switches = layout.journaled_switches()  # before current is read: a move after it shows (journal_health)
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
    try:
        run = check_health(layout, p, state)
    except NodeError as exc:  # the run itself failed (a timeout): a failed check, as after a move
        if p["journal"]:
            state.update(journal_health(layout, state["current"], switches, False, exc.message))
        module.fail_json(msg=f"solfleet: {p['node']}: health: {exc.message}", solfleet=state)
    if p["journal"]:
        state.update(journal_health(layout, state["current"], switches, run.ok, run.message))
    if not run.ok:
        module.fail_json(
            msg=f"solfleet: {p['node']}: health: {run.message} (current {state['current']})", solfleet=state
        )
    module.exit_json(
        changed=False, msg=f"solfleet: {p['node']}: healthy on {state['current']}", solfleet=state
    )


if __name__ == "__main__":
    main()

"""Per-host outcomes folded from an ansible-runner event stream recorded from a real local deploy
(tests/fleet/data/*.jsonl), then turned into ledger records. The real runs are the e2e tests'."""

from __future__ import annotations

import json
from pathlib import Path

from fleet.operation import host_record
from fleet.runner import HostProgress, HostStatus, fold_event

DATA = Path(__file__).parent / "data"


def recorded(name: str) -> list[dict]:
    lines = (DATA / name).read_text().splitlines()
    return [json.loads(line) for line in lines if line and not line.startswith("#")]


def fold(events: list[dict], hosts: list[str]) -> dict[str, HostProgress]:
    state = {h: HostProgress(host=h) for h in hosts}
    for event in events:
        fold_event(state, event)
    return state


def test_recorded_batch_with_one_activation_and_one_failure() -> None:
    state = fold(recorded("deploy-batch-n3-fails.jsonl"), ["n2", "n3"])
    n2, n3 = state["n2"], state["n3"]
    assert n2.status is HostStatus.CHANGED and n2.failed == 0
    assert n2.solfleet["outcome"] == "activated" and n2.push_s is not None and n2.push_s > 0
    assert set(n2.solfleet["phases"]) >= {"unpack_check", "activate", "health"}
    assert n3.status is HostStatus.FAILED
    assert n3.failed_task == "solfleet | Push artifact"  # the first failure, not the rescue's re-raise
    assert "n3" in n3.message and "\n" not in n3.message

    a = host_record("batch 1", n2)
    assert (a.outcome, a.changed, a.version_before, a.version_after) == ("activated", True, "0.2.0", "0.1.0")
    assert a.failed_phase is None and a.phases["push"] == n2.push_s
    b = host_record("batch 1", n3)
    assert (b.outcome, b.failed_phase, b.version_after) == ("failed", "push", None)


def test_stats_are_the_final_word_and_progress_is_incremental() -> None:
    events = recorded("deploy-batch-n3-fails.jsonl")
    stats_at = next(i for i, e in enumerate(events) if e["event"] == "playbook_on_stats")
    partial = fold(events[:stats_at], ["n2", "n3"])
    assert partial["n2"].status is HostStatus.RUNNING and partial["n2"].task  # mid-run: a current task shown
    final = fold(events, ["n2", "n3"])
    assert final["n2"].task == "" and final["n2"].ok >= 3


def test_unreachable_and_never_run_hosts() -> None:
    # synthetic events in ansible-runner's shape: the recorded local fleet cannot be unreachable
    events = [
        {"event": "runner_on_start", "event_data": {"host": "a", "task": "solfleet | Push artifact"}},
        {
            "event": "runner_on_unreachable",
            "event_data": {
                "host": "a",
                "task": "solfleet | Push artifact",
                "res": {
                    "msg": "Failed to connect to the host via ssh: Connection refused",
                    "unreachable": True,
                },
            },
        },
        {
            "event": "playbook_on_stats",
            "event_data": {
                "dark": {"a": 1},
                "failures": {},
                "ok": {},
                "changed": {},
                "skipped": {},
                "rescued": {},
            },
        },
    ]
    state = fold(events, ["a", "b"])
    assert state["a"].status is HostStatus.UNREACHABLE and "Connection refused" in state["a"].message
    assert state["b"].status is HostStatus.NOT_RUN
    rec = host_record("canary", state["a"])
    assert (rec.outcome, rec.failed_phase, rec.version_before, rec.version_after) == (
        "unreachable",
        "connect",
        None,
        None,
    )
    assert host_record("canary", state["b"]).outcome == "not_run"


def test_a_refusal_reported_by_the_node_module_wins_over_rescued_stats() -> None:
    """A rescue that swallowed the failure leaves stats `ok`; the module's outcome still says refused."""
    sf = {
        "node": "a",
        "version": "2.0.0",
        "outcome": "refused",
        "failed_phase": "unpack_check",
        "message": "kernels/ops/add.py: sha256 mismatch",
        "current": "1.0.0",
        "previous": None,
        "phases": {"unpack_check": 0.1},
    }
    events = [
        {
            "event": "runner_on_failed",
            "event_data": {
                "host": "a",
                "task": "solfleet | Unpack, check and activate",
                "res": {"msg": "solfleet: a: unpack_check: sha256", "solfleet": sf},
            },
        },
        {
            "event": "playbook_on_stats",
            "event_data": {"ok": {"a": 3}, "rescued": {"a": 1}, "failures": {}, "dark": {}},
        },
    ]
    state = fold(events, ["a"])
    assert state["a"].status is HostStatus.OK
    rec = host_record("canary", state["a"])
    assert (rec.outcome, rec.failed_phase, rec.version_before, rec.version_after) == (
        "refused",
        "unpack_check",
        "1.0.0",
        "1.0.0",
    )
    assert rec.message == "kernels/ops/add.py: sha256 mismatch"


def test_interrupted_hosts_keep_what_the_node_already_said() -> None:
    from fleet.operation import _interrupted_record

    events = recorded("deploy-batch-n3-fails.jsonl")
    stats_at = next(i for i, e in enumerate(events) if e["event"] == "playbook_on_stats")
    mid = fold(events[:stats_at], ["n2", "n3"])  # as if Ctrl-C came just before the end
    assert _interrupted_record("batch 1", mid["n2"], "n2").outcome == "activated"  # the module had answered
    mid["n3"].solfleet = {}
    busy = HostProgress(host="n4", status=HostStatus.RUNNING, task="solfleet | Push artifact")
    rec = _interrupted_record("batch 1", busy, "n4")
    assert (rec.outcome, rec.failed_phase) == ("interrupted", "push") and "Push artifact" in rec.message
    assert _interrupted_record("batch 1", None, "n5").failed_phase == "not_started"


def test_undo_target_is_the_nodes_prior_current_not_its_previous() -> None:
    """An activation on a node whose `current` was missing: `previous` still names an older release, but the
    host ran nothing before, so its record has no version_before and the undo keeps it (docs/cli.md)."""
    sf = {
        "node": "a",
        "version": "2.0.0",
        "outcome": "activated",
        "failed_phase": None,
        "message": "2.0.0 activated",
        "prior_current": None,
        "current": "2.0.0",
        "previous": "0.9.0",
        "phases": {"activate": 0.01},
        "simulated": True,
    }
    moved = dict(sf, node="b", prior_current="1.0.0", previous="1.0.0")
    events = [
        {
            "event": "runner_on_ok",
            "event_data": {
                "host": h,
                "task": "solfleet | Unpack, check and activate",
                "res": {"changed": True, "msg": f"solfleet: {h}: 2.0.0 activated", "solfleet": result},
            },
        }
        for h, result in (("a", sf), ("b", moved))
    ]
    events.append(
        {
            "event": "playbook_on_stats",
            "event_data": {"ok": {"a": 3, "b": 3}, "changed": {"a": 1, "b": 1}, "failures": {}, "dark": {}},
        }
    )
    state = fold(events, ["a", "b"])
    a, b = host_record("batch 1", state["a"]), host_record("batch 1", state["b"])
    assert (a.outcome, a.version_before, a.version_after) == ("activated", None, "2.0.0")
    assert (b.outcome, b.version_before, b.version_after) == ("activated", "1.0.0", "2.0.0")

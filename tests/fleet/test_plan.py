"""Rollout planning is pure: canary first, then batches by count or percentage, the last size repeating."""

from __future__ import annotations

from pathlib import PurePosixPath

import pytest

from fleet.errors import UsageError
from fleet.plan import plan_rollback, plan_rollout, select_nodes
from fleet.policy import Canary, Rollout
from fleet.spec import Connection, Node, SshOptions


def nodes(n: int, canary: tuple[int, ...] = ()) -> list[Node]:
    return [
        Node(
            name=f"gpu-{i:02d}",
            host=f"10.0.0.{i}",
            port=22,
            user="ops",
            connection=Connection.SSH,
            root=PurePosixPath("/opt/solfleet"),
            simulated=False,
            labels=("canary",) if i in canary else ("rack-b",) if i % 2 else (),
            gpu=None,
            python="/usr/bin/python3",
            ssh=SshOptions(None, None),
        )
        for i in range(1, n + 1)
    ]


def sizes(plan) -> list[int]:
    return [len(b.hosts) for b in plan.batches]


def test_canary_by_label_then_count_then_percentages() -> None:
    rollout = Rollout(canary=Canary(labels=("canary",)), batches=(1, "25%", "100%"))
    plan = plan_rollout(nodes(16, canary=(5,)), rollout, version="1.0.0")
    assert plan.batches[0].name == "canary" and plan.batches[0].hosts == ("gpu-05",)
    assert sizes(plan) == [1, 1, 4, 10]
    assert sorted(plan.hosts) == sorted(n.name for n in nodes(16))  # every node exactly once
    assert len(set(plan.hosts)) == 16


def test_canary_by_count_and_repeating_last_size() -> None:
    plan = plan_rollout(nodes(10), Rollout(canary=Canary(count=2), batches=(3,)), version="1.0.0")
    assert plan.batches[0].hosts == ("gpu-01", "gpu-02")
    assert sizes(plan) == [2, 3, 3, 2]
    assert [b.name for b in plan.batches] == ["canary", "batch 1", "batch 2", "batch 3"]


def test_percentages_round_up_and_never_zero() -> None:
    plan = plan_rollout(nodes(5), Rollout(batches=("10%",)), version="1.0.0")
    assert sizes(plan) == [1, 1, 1, 1, 1]
    plan = plan_rollout(nodes(7), Rollout(batches=("50%",)), version="1.0.0")
    assert sizes(plan) == [4, 3]


def test_max_failures_count_or_percentage_of_the_batch() -> None:
    plan = plan_rollout(nodes(10), Rollout(batches=(4,), max_failures="50%"), version="1.0.0")
    assert [b.max_failures for b in plan.batches] == [2, 2, 1]
    plan = plan_rollout(nodes(10), Rollout(batches=(4,), max_failures=1), version="1.0.0")
    assert [b.max_failures for b in plan.batches] == [1, 1, 1]


def test_no_canary_when_the_limit_excludes_it() -> None:
    ns = select_nodes(nodes(6, canary=(1,)), "gpu-0[4-6]")
    plan = plan_rollout(ns, Rollout(canary=Canary(labels=("canary",)), batches=("100%",)), version="1.0.0")
    assert [b.name for b in plan.batches] == ["batch 1"] and plan.hosts == ("gpu-04", "gpu-05", "gpu-06")


def test_limit_by_name_glob_and_label_keeps_spec_order() -> None:
    ns = nodes(6, canary=(1,))
    assert [n.name for n in select_nodes(ns, "gpu-03,gpu-01")] == ["gpu-01", "gpu-03"]
    assert [n.name for n in select_nodes(ns, "label:rack-b")] == ["gpu-03", "gpu-05"]
    with pytest.raises(UsageError, match="--limit: 'gpu-99' matches no node"):
        select_nodes(ns, "gpu-01,gpu-99")
    with pytest.raises(UsageError, match="--limit"):
        select_nodes(ns, " , ")


def test_rollback_is_one_batch_of_everyone() -> None:
    plan = plan_rollback(nodes(4), Rollout(), to="1.0.0")
    assert plan.kind == "rollback" and plan.version == "1.0.0"
    assert sizes(plan) == [4] and plan.batches[0].max_failures == 0
    assert plan.to_json()["batches"][0]["hosts"] == ["gpu-01", "gpu-02", "gpu-03", "gpu-04"]


def test_undo_targets_follow_on_failure() -> None:
    from fleet.plan import Batch
    from fleet.rollout import undo_targets

    hosts = ["gpu-01", "gpu-02", "gpu-03", "gpu-04", "gpu-05"]
    failed = Batch("batch 1", ("gpu-02", "gpu-03", "gpu-04"), 0)
    # every targeted host goes back to the baseline (hosts already there are left alone by restore)
    assert undo_targets("rollback_fleet", hosts, failed) == hosts
    assert undo_targets("rollback_batch", hosts, failed) == ["gpu-02", "gpu-03", "gpu-04"]
    assert undo_targets("halt", hosts, failed) == []

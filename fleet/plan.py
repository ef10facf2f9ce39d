"""Rollout planning: which hosts go in which batch, and how many failures each batch tolerates. Pure: no I/O,
so the plan printed before a deploy is exactly what runs, and `--dry-run` can stop right after it."""

from __future__ import annotations

import fnmatch
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from fleet.errors import UsageError
from fleet.policy import Rollout
from fleet.spec import Node


@dataclass(frozen=True)
class Batch:
    name: str  # "canary", "batch 1", ...
    hosts: tuple[str, ...]
    max_failures: int  # the batch fails when MORE hosts than this fail


@dataclass(frozen=True)
class Plan:
    kind: str  # "deploy" | "stage" | "rollback"
    version: str | None  # deploy: the version; rollback: the --to version or None (= each node's previous)
    batches: tuple[Batch, ...]
    on_failure: str
    unreachable: str
    keep_releases: int
    pause_after_canary: bool = False  # deploy: stop after a passing canary (fleet/progressive.py)
    batch_deadline_s: int | None = None  # a batch still running after this long is a failed batch

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(h for b in self.batches for h in b.hosts)

    @property
    def pauses(self) -> bool:
        """A deploy with a canary and more batches after it stops once the canary has passed."""
        return (
            self.pause_after_canary
            and self.kind == "deploy"
            and len(self.batches) > 1
            and self.batches[0].name == "canary"
        )

    def to_json(self) -> dict[str, Any]:
        """Plain JSON types (lists, not tuples): what the ledger stores and `history --json` prints."""
        data: dict[str, Any] = json.loads(json.dumps(asdict(self)))
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Plan:
        """The plan a paused rollout stored in the ledger, as it was printed (a promote runs exactly it)."""
        return cls(
            kind=str(data["kind"]),
            version=data.get("version"),
            batches=tuple(
                Batch(str(b["name"]), tuple(b["hosts"]), int(b["max_failures"])) for b in data["batches"]
            ),
            on_failure=str(data["on_failure"]),
            unreachable=str(data["unreachable"]),
            keep_releases=int(data["keep_releases"]),
            pause_after_canary=bool(data.get("pause_after_canary", False)),
            batch_deadline_s=data.get("batch_deadline_s"),
        )


def select_nodes(nodes: Sequence[Node], limit: str | None) -> list[Node]:
    """`--limit a,b`, shell globs (`gpu-a*`) or `label:canary`; each pattern must match a node."""
    if not limit:
        return list(nodes)
    patterns = [p.strip() for p in limit.split(",") if p.strip()]
    if not patterns:
        raise UsageError(f"--limit: {limit!r} is not allowed; expected node names, globs or label:NAME")
    chosen: set[str] = set()
    for pattern in patterns:
        if pattern.startswith("label:"):
            hits = {n.name for n in nodes if pattern[6:] in n.labels}
        else:
            hits = {n.name for n in nodes if fnmatch.fnmatchcase(n.name, pattern)}
        if not hits:
            names = ", ".join(n.name for n in nodes)
            raise UsageError(f"--limit: {pattern!r} matches no node; nodes: {names}")
        chosen |= hits
    return [n for n in nodes if n.name in chosen]  # spec order, not pattern order


def _count(value: int | str, total: int, *, at_least: int) -> int:
    """An int is a count; "N%" is N percent of `total`, rounded up (a batch) or down (failures)."""
    if isinstance(value, int):
        return value
    pct = int(value.rstrip("%"))
    if at_least:  # batch size: round up so "10%" of 5 hosts is 1, not 0
        return max(at_least, math.ceil(pct * total / 100))
    return math.floor(pct * total / 100)


def plan_rollout(nodes: Sequence[Node], rollout: Rollout, *, version: str, kind: str = "deploy") -> Plan:
    """Canary batch first (nodes with a canary label, or the first `count`), then batches sized by
    `rollout.batches` (the last size repeats) until every targeted node is scheduled."""
    if not nodes:
        raise UsageError("--limit: no node selected")
    total = len(nodes)
    canary: list[str] = []
    if rollout.canary is not None:
        if rollout.canary.labels:
            canary = [n.name for n in nodes if set(n.labels) & set(rollout.canary.labels)]
        else:
            canary = [n.name for n in nodes[: rollout.canary.count]]
    rest = [n.name for n in nodes if n.name not in canary]
    batches: list[Batch] = []
    if canary:
        batches.append(Batch("canary", tuple(canary), _count(rollout.max_failures, len(canary), at_least=0)))
    i = 0
    while rest:
        size = _count(rollout.batches[min(i, len(rollout.batches) - 1)], total, at_least=1)
        hosts, rest = rest[:size], rest[size:]
        i += 1
        batches.append(
            Batch(f"batch {i}", tuple(hosts), _count(rollout.max_failures, len(hosts), at_least=0))
        )
    return Plan(
        kind=kind,
        version=version,
        batches=tuple(batches),
        on_failure=rollout.on_failure.value,
        unreachable=rollout.unreachable.value,
        keep_releases=rollout.keep_releases,
        pause_after_canary=rollout.pause_after_canary and kind == "deploy",
        batch_deadline_s=rollout.batch_deadline_s,
    )


def plan_rollback(nodes: Sequence[Node], rollout: Rollout, *, to: str | None) -> Plan:
    """A rollback is an emergency: every selected node in one batch, no failures tolerated."""
    if not nodes:
        raise UsageError("--limit: no node selected")
    return Plan(
        kind="rollback",
        version=to,
        batches=(Batch("all", tuple(n.name for n in nodes), 0),),
        on_failure="halt",
        unreachable=rollout.unreachable.value,
        keep_releases=rollout.keep_releases,
    )

"""The rollout policy sections of the fleet spec: `rollout` (how batches proceed and what happens when one
fails), `gates` (what a release must pass) and `timeouts`. Parsed by spec.py's loader with the same
one-line errors; kept apart so spec.py stays about nodes and paths."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from fleet import validate as v

if TYPE_CHECKING:
    from fleet.spec import Node

LABEL_RE = r"[a-z0-9][a-z0-9_-]{0,62}"
OP_RE = r"[a-z][a-z0-9_]{0,62}"


class OnFailure(StrEnum):
    ROLLBACK_FLEET = "rollback_fleet"
    ROLLBACK_BATCH = "rollback_batch"
    HALT = "halt"


class UnhealthyPolicy(StrEnum):
    FAIL = "fail"  # a node whose preflight health fails counts as a failure of its batch (never deployed)
    SKIP = "skip"  # quarantined: excluded from the rollout, recorded and reported, never counted deployed


class UnreachablePolicy(StrEnum):
    FAIL = "fail"  # an unreachable host counts as a failure of its batch
    SKIP = "skip"  # recorded and reported, but not counted against max_failures


@dataclass(frozen=True)
class Canary:
    labels: tuple[str, ...] = ()
    count: int = 0


@dataclass(frozen=True)
class Rollout:
    canary: Canary | None = None
    batches: tuple[int | str, ...] = ("100%",)  # int = hosts, "N%" = percent of the targeted nodes
    max_failures: int | str = 0  # a batch fails when its failures are MORE than this
    unreachable: UnreachablePolicy = UnreachablePolicy.FAIL
    on_failure: OnFailure = OnFailure.ROLLBACK_FLEET
    keep_releases: int = 5
    # progressive steps (docs/fleet-spec.md): stop after a passing canary until `solfleet promote` or
    # `solfleet abort`; and a wall-clock bound per batch whose overrun is a batch failure
    pause_after_canary: bool = False
    batch_deadline_s: int | None = None
    # GPU health before each batch (`kernels health` in the node's current release, the checks of
    # `solfleet health`), and what an unhealthy node gets
    preflight_health: bool = True
    unhealthy: UnhealthyPolicy = UnhealthyPolicy.FAIL


@dataclass(frozen=True)
class Gates:
    correctness: str = "required"
    # op -> SOL for every dtype of the op, or op -> {dtype: SOL} (fleet.gates.MinSol)
    min_sol: Mapping[str, float | Mapping[str, float]] = field(default_factory=dict)
    max_regression_vs_previous: float | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.min_sol) or self.max_regression_vs_previous is not None

    @property
    def bench_ops(self) -> str:
        """`--ops` of the bench a real node runs during verification: the ops min_sol names, or "" (every
        op) when only the regression gate is set. Meaningful only when `enabled`."""
        return ",".join(sorted(self.min_sol))

    def describe(self) -> list[str]:
        """One text per gate the spec sets, e.g. `min_sol gemm=0.5, softmax.float16=0.6`."""
        parts = []
        for op, val in sorted(self.min_sol.items()):
            if isinstance(val, Mapping):
                parts += [f"{op}.{dt}={t:g}" for dt, t in sorted(val.items())]
            else:
                parts.append(f"{op}={val:g}")
        out = ["min_sol " + ", ".join(parts)] if parts else []
        if self.max_regression_vs_previous is not None:
            out.append(f"max_regression_vs_previous={self.max_regression_vs_previous:g}")
        return out


@dataclass(frozen=True)
class Timeouts:
    connect_s: int = 10  # SSH connect (ANSIBLE_TIMEOUT)
    task_s: int = 1800  # any one task (ANSIBLE_TASK_TIMEOUT); verify under the simulator is the slow one
    verify_s: int = 900  # `python -m kernels verify` on a node (passed to the playbook)
    run_s: int = 7200  # one ansible-runner run (one batch)
    # status, health and the lease/state reads: each task and the whole run. Short, so one hung node
    # turns into one `unknown` row within a minute instead of holding the answer for task_s.
    status_s: int = 60


def parse_rollout(top: v.Fields, label: str, nodes: Sequence[Node]) -> Rollout:
    raw = top.raw("rollout", {})
    r = v.Fields({} if raw is None else raw, "rollout", label)
    canary = None
    canary_raw = r.raw("canary")
    if canary_raw is not None:
        c = v.Fields(canary_raw, r.sub("canary"), label)
        if c.has("labels") == c.has("count"):
            v.fail(
                label, r.sub("canary"), canary_raw, "expected exactly one of {labels: [...]} or {count: N}"
            )
        if c.has("labels"):
            labels = v.string_list(label, c.sub("labels"), c.raw("labels"), pattern=LABEL_RE, what="labels")
            in_use = sorted({lab for n in nodes for lab in n.labels})
            if not labels or not any(set(labels) & set(n.labels) for n in nodes):
                v.fail(
                    label,
                    c.sub("labels"),
                    list(labels),
                    f"must match at least one node; labels in use: {', '.join(in_use) or 'none'}",
                )
            canary = Canary(labels=labels)
        else:
            canary = Canary(count=v.integer(label, c.sub("count"), c.raw("count"), lo=1, hi=len(nodes)))
        c.done(["labels", "count"])
    batches_raw = r.raw("batches", ["100%"])
    if not isinstance(batches_raw, list) or not batches_raw:
        v.fail(label, r.sub("batches"), batches_raw, 'expected a non-empty list like [1, "25%", "100%"]')
    batches = tuple(
        v.percent_or_int(label, f"{r.sub('batches')}[{i}]", b, lo=1, what="a batch size")
        for i, b in enumerate(batches_raw)
    )
    max_failures = v.percent_or_int(
        label, r.sub("max_failures"), r.raw("max_failures", 0), lo=0, what="failures tolerated per batch"
    )
    unreachable = UnreachablePolicy(
        v.choice(
            label, r.sub("unreachable"), r.raw("unreachable", "fail"), [p.value for p in UnreachablePolicy]
        )
    )
    on_failure = OnFailure(
        v.choice(
            label, r.sub("on_failure"), r.raw("on_failure", "rollback_fleet"), [p.value for p in OnFailure]
        )
    )
    keep = v.integer(label, r.sub("keep_releases"), r.raw("keep_releases", 5), lo=2, hi=100)
    pause = v.boolean(label, r.sub("pause_after_canary"), r.raw("pause_after_canary", False))
    if pause and canary is None:
        v.fail(
            label,
            r.sub("pause_after_canary"),
            pause,
            "needs rollout.canary ({labels: [...]} or {count: N}): the pause comes after the canary batch",
        )
    deadline_raw = r.raw("batch_deadline_s")
    deadline = (
        None
        if deadline_raw is None
        else v.integer(label, r.sub("batch_deadline_s"), deadline_raw, lo=1, hi=86400)
    )
    preflight = v.boolean(label, r.sub("preflight_health"), r.raw("preflight_health", True))
    unhealthy = UnhealthyPolicy(
        v.choice(label, r.sub("unhealthy"), r.raw("unhealthy", "fail"), [p.value for p in UnhealthyPolicy])
    )
    r.done(
        [
            "canary",
            "batches",
            "max_failures",
            "unreachable",
            "on_failure",
            "keep_releases",
            "pause_after_canary",
            "batch_deadline_s",
            "preflight_health",
            "unhealthy",
        ]
    )
    return Rollout(
        canary=canary,
        batches=batches,
        max_failures=max_failures,
        unreachable=unreachable,
        on_failure=on_failure,
        keep_releases=keep,
        pause_after_canary=pause,
        batch_deadline_s=deadline,
        preflight_health=preflight,
        unhealthy=unhealthy,
    )


def registered_ops() -> Mapping[str, tuple[str, ...]]:
    """Every registered op and the dtypes it benches. Imported only when a spec gates an op: the registry
    imports the kernels (numba, a second or two), which a spec without gates never pays for."""
    from kernels.registry import all_ops

    return {
        name: tuple(sorted({c.dtype for c in (*spec.bench_cases, *spec.verify_cases, *spec.sim_cases)}))
        for name, spec in all_ops().items()
    }


def parse_gates(
    top: v.Fields, label: str, *, known_ops: Callable[[], Mapping[str, tuple[str, ...]]] = registered_ops
) -> Gates:
    raw = top.raw("gates", {})
    g = v.Fields({} if raw is None else raw, "gates", label)
    correctness = v.choice(label, g.sub("correctness"), g.raw("correctness", "required"), ["required"])
    sol_raw = g.raw("min_sol", {})
    s = v.Fields({} if sol_raw is None else sol_raw, g.sub("min_sol"), label)
    min_sol: dict[str, float | Mapping[str, float]] = {}
    ops = known_ops() if s.data else {}
    for op in list(s.data):
        v.string(label, s.sub(str(op)), op, pattern=OP_RE, what="an op name")
        if op not in ops:
            v.fail(label, s.sub(op), op, f"not a registered op; allowed ops: {', '.join(sorted(ops))}")
        val = s.raw(op)
        if isinstance(val, Mapping):
            d = v.Fields(val, s.sub(op), label)
            per: dict[str, float] = {}
            for dtype in list(d.data):
                if dtype not in ops[op]:
                    v.fail(label, d.sub(str(dtype)), dtype, f"{op} has dtypes {', '.join(ops[op])}")
                per[dtype] = v.number(label, d.sub(dtype), d.raw(dtype), lo=0.0, hi=1.0)
            if not per:
                v.fail(label, s.sub(op), val, "expected a SOL like 0.5, or {dtype: SOL}")
            min_sol[op] = per
        else:
            min_sol[op] = v.number(label, s.sub(op), val, lo=0.0, hi=1.0)
    reg_raw = g.raw("max_regression_vs_previous")
    regression = (
        None
        if reg_raw is None
        else v.number(label, g.sub("max_regression_vs_previous"), reg_raw, lo=0.0, hi=1.0)
    )
    g.done(["correctness", "min_sol", "max_regression_vs_previous"])
    return Gates(correctness=correctness, min_sol=min_sol, max_regression_vs_previous=regression)


def parse_timeouts(top: v.Fields, label: str) -> Timeouts:
    raw = top.raw("timeouts", {})
    t = v.Fields({} if raw is None else raw, "timeouts", label)
    d = Timeouts()
    out = Timeouts(
        connect_s=v.integer(label, t.sub("connect_s"), t.raw("connect_s", d.connect_s), lo=1, hi=600),
        task_s=v.integer(label, t.sub("task_s"), t.raw("task_s", d.task_s), lo=1, hi=86400),
        verify_s=v.integer(label, t.sub("verify_s"), t.raw("verify_s", d.verify_s), lo=1, hi=86400),
        run_s=v.integer(label, t.sub("run_s"), t.raw("run_s", d.run_s), lo=1, hi=86400),
        status_s=v.integer(label, t.sub("status_s"), t.raw("status_s", d.status_s), lo=1, hi=3600),
    )
    t.done(["connect_s", "task_s", "verify_s", "run_s", "status_s"])
    return out

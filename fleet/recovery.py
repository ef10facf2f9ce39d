"""The memory of a rollout across runs: its baseline, its node leases, and the return to its baseline.

Before the first host is touched, `take_baseline` takes every targeted node's lease (docs/node-contract.md)
and records, in the same node-side step, where each node is: its current release, that release's artifact
sha256, and its `previous`. Every undo returns hosts to that baseline (`restore`): the failure policy, an
interrupted run, and `reconcile` of a run that died (SIGKILL, a lost controller). Hosts are compared with
the baseline as they are NOW (a state read), not as the ledger last heard of them, so a host that a dead run
activated is moved back too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import yaml

from fleet.errors import ExitCode, FleetError, Interrupted, UsageError
from fleet.ledger import Baseline, HostRecord, Ledger, OpStatus
from fleet.operation import (
    LEASE_END_PLAYBOOK,
    LEASE_PLAYBOOK,
    ROLLBACK_PLAYBOOK,
    STATUS_PLAYBOOK,
    Operation,
    StepAborted,
)
from fleet.runner import HostStatus
from fleet.spec import FleetSpec, project_root

# outcomes of a restore step that leave the host on its baseline
RESTORED = ("rolled_back", "unchanged")
# why a host read `busy` (the node's lock held: a node step, maybe of a controller that is gone, runs on
# there) is still owed, whatever it read
BUSY_NOTE = "a node step is still running there (its deploy lock is held)"


class LeaseState(StrEnum):
    """The holder's state a node lease carries (lease.json `state`), for a refused second controller to read
    what ends it (playbooks/module_utils/solfleet_layout.py LEASE_STATES)."""

    RUNNING = "running"
    PAUSED = "paused"  # stopped after its canary: promote or abort ends it
    UNFINISHED = "unfinished"  # ended owing its hosts a return to its baseline: reconcile finishes it


class LeaseHeld(FleetError):
    """Another rollout (another controller, or another work dir of this one) holds some targeted nodes."""

    exit_code = ExitCode.LOCKED


@dataclass(frozen=True)
class NodeState:
    """What a node said of itself just now (solfleet_state), or that it did not answer."""

    host: str
    reachable: bool
    current: str | None = None
    previous: str | None = None
    current_sha: str | None = None
    release_shas: Mapping[str, str | None] | None = None
    message: str = ""
    # a node step held the node's lock when it answered: its `current` may still move (Baseline.busy)
    busy: bool = False


def _state_of(host: str, status: HostStatus, sf: Mapping[str, Any], message: str) -> NodeState:
    if status is HostStatus.UNREACHABLE or "current" not in sf:
        return NodeState(host=host, reachable=False, message=message or f"no state ({status.value})")
    return NodeState(
        host=host,
        reachable=True,
        current=sf.get("current"),
        previous=sf.get("previous"),
        current_sha=sf.get("current_sha"),
        release_shas=dict(sf.get("release_shas") or {}),
        busy=sf.get("busy") is True,
    )


def lease_seconds(op: Operation) -> int:
    """Long enough for every step a rollout can run to reach its own time limit, so a live rollout never
    loses its lease; short enough that a vanished controller does not hold the fleet for a day. The steps
    bounded by `timeouts.run_s`: the lease call (with the first batch's preflight health), each batch, each
    later batch's preflight health run, and one undo; those bounded by `timeouts.status_s` (twice it plus
    the connect timeout each): the undo's state read, a lease renew and the lease end."""
    t, batches = op.spec.timeouts, len(op.plan.batches)
    runs = 1 + batches + 1
    if op.spec.rollout.preflight_health:
        runs += max(0, batches - 1)  # the first batch's preflight rides in the lease call
    return t.run_s * runs + 3 * (2 * t.status_s + t.connect_s)


def take_baseline(
    op: Operation,
    ledger: Ledger,
    hosts: list[str],
    *,
    version: str | None = None,
    artifact_sha256: str | None = None,
    take_over: Iterable[str] | None = None,
    record: bool = True,
    drop_on_refusal: bool = True,
    health_hosts: Iterable[str] = (),
) -> dict[str, Baseline]:
    """Lease every host and record its baseline (`record=False`: a reconcile, whose own undo must never
    become a baseline to return to). Refuses (and drops the leases it took) when another live
    rollout holds a node (LeaseHeld, exit 5), or when `version` is already on a node as other bytes
    (UsageError, exit 2): in both cases no release has moved. `take_over`: rollout ids whose leases may be
    replaced; default every rollout of this ledger that is not running now. `drop_on_refusal=False`: a
    promote or abort of a paused rollout, whose leases stay its own when it is refused. `health_hosts`: hosts
    whose lease call also runs the health check once the lease is held (a deploy's first batch: its
    preflight, in the same node call); their answers go to `op.lease_health` (None: no answer)."""
    if take_over is None:
        take_over = [i for i in ledger.own_stale_rollouts() if i != op.op_id]
    step = op.run_step(
        ledger,
        "baseline",
        hosts,
        LEASE_PLAYBOOK,
        {
            "solfleet_rollout_id": op.op_id,
            "solfleet_controller": op.controller,
            "solfleet_lease_s": lease_seconds(op),
            "solfleet_take_over": list(take_over),
            "solfleet_lease_health": list(health_hosts),
        },
        record=False,
    )
    op.lease_health = {h: step.ok_hosts.get(h) for h in health_hosts}
    held: list[str] = []
    other_bytes: list[str] = []
    baselines: dict[str, Baseline] = {}
    for host in hosts:
        hp = step.ok_hosts.get(host)
        sf: Mapping[str, Any] = hp.solfleet if hp is not None else {}
        if sf.get("failed_phase") == "lease":
            held.append(f"{host}: {sf.get('message')}")
            continue
        state = _state_of(host, hp.status if hp else HostStatus.NOT_RUN, sf, hp.message if hp else "")
        baselines[host] = Baseline(
            host=host,
            reachable=state.reachable,
            current=state.current,
            current_sha256=state.current_sha,
            previous=state.previous,
            busy=state.busy,
        )
        on_node = (state.release_shas or {}).get(version or "")
        if version and artifact_sha256 and on_node and on_node != artifact_sha256:
            other_bytes.append(f"{host} has {version} as artifact {on_node[:12]}..")
    # set before any refusal: a caller that keeps (renews) its leases after one must skip the hosts this
    # call did not lease (a renewal there would take a lease it never held), and may release those the read
    # found owing nothing (recover)
    op.lease_read = dict(baselines)
    op.unleased = {}
    for host in hosts:
        if host in baselines and baselines[host].reachable:
            continue
        hp = step.ok_hosts.get(host)
        if hp is None or hp.status in (HostStatus.UNREACHABLE, HostStatus.NOT_RUN):
            op.unleased[host] = ("unreachable", "did not answer when this rollout took its leases")
        else:  # it answered, but its lease call failed: the node's own reason
            why = hp.message or hp.solfleet.get("message") or f"no state ({hp.status.value})"
            op.unleased[host] = ("refused", f"its lease call failed: {why}")
    if held or other_bytes:
        if drop_on_refusal:
            end_leases(op, ledger, [h for h in hosts if h in baselines])
        if held:
            raise LeaseHeld(
                f"another rollout holds {len(held)} node(s), nothing was changed: {'; '.join(held[:3])}"
                + (f"; and {len(held) - 3} more" if len(held) > 3 else "")
            )
        raise UsageError(
            f"version {version} is already other bytes on the fleet ({'; '.join(other_bytes[:3])}), not "
            f"{(artifact_sha256 or '')[:12]}..: a version is immutable, build a new version"
        )
    if record:
        ledger.record_baseline(op.op_id, list(baselines.values()))
    return baselines


def renew_leases(
    op: Operation, ledger: Ledger, hosts: list[str], *, state: LeaseState, rollout_id: str | None = None
) -> None:
    """Renew this operation's lease on `hosts` for another `lease_seconds` from now, the holder marked
    `state` (paused, unfinished) so that a refused second controller reads what ends it, not "running".
    `rollout_id`: renew them as that rollout's instead (the unfinished rollout a reconcile or rollback could
    not finish: the lease then names the rollout owed, its `controller` this process), replacing this
    operation's own. Best effort, like end_leases: a node that does not answer keeps the lease it has (it
    expires as it would)."""
    if not hosts:
        return
    holder = rollout_id or op.op_id
    with contextlib.suppress(StepAborted):
        op.run_step(
            ledger,
            "lease renew",
            hosts,
            LEASE_PLAYBOOK,
            {
                "solfleet_rollout_id": holder,
                "solfleet_controller": op.controller,
                "solfleet_lease_state": state.value,
                "solfleet_lease_s": lease_seconds(op),
                "solfleet_take_over": [op.op_id] if holder != op.op_id else [],
            },
            record=False,
            timeout_s=op.spec.timeouts.status_s,
        )


def end_leases(op: Operation, ledger: Ledger, hosts: list[str], *, rollout_id: str | None = None) -> None:
    """Drop this operation's lease (or `rollout_id`'s, one of this ledger's own) on `hosts`. Best effort: a
    node that does not answer keeps the lease until it expires, or until the next rollout of this controller
    takes it over (take_baseline)."""
    if not hosts:
        return
    with contextlib.suppress(Interrupted, StepAborted):
        op.run_step(
            ledger,
            "lease end",
            hosts,
            LEASE_END_PLAYBOOK,
            {"solfleet_rollout_id": rollout_id or op.op_id},
            record=False,
            timeout_s=op.spec.timeouts.status_s,
        )


def conclude_leases(op: Operation, ledger: Ledger, hosts: list[str]) -> None:
    """At the end of a rollout's process (deploy, promote, abort): one that owes nothing drops its leases.
    One that still owes its hosts a return to its baseline (its undo interrupted, or unable to reach or move
    every host: no `recovered_by`) keeps them, renewed for another lease period and marked unfinished, so
    that no other controller moves its half-moved hosts before `solfleet reconcile` from this work dir
    (which takes them over, Ledger.own_stale_rollouts) returns them; a refused one reads why. They still
    expire, so a work dir that is gone does not hold the fleet for ever. Only hosts still owed are kept
    (keep_owed_leases): those its undo found or put on their baseline are released. Hosts it never leased
    are left alone."""
    row = ledger.operation(op.op_id)
    if row is None or row.recovered_by is not None:
        end_leases(op, ledger, hosts)
    else:
        keep_owed_leases(op, ledger, hosts)


def keep_leases(
    op: Operation, ledger: Ledger, hosts: list[str], state: LeaseState, *, rollout_id: str | None = None
) -> None:
    """Renew this operation's leases on the `hosts` it leased (not `op.unleased`), marked `state`: an
    unfinished rollout's at its end, a paused one's after a refused promote or abort (`rollout_id`: as that
    rollout's, renew_leases). A signal now leaves them as they are (held until their expiry), like a node
    that does not answer."""
    with contextlib.suppress(Interrupted):
        renew_leases(
            op, ledger, [h for h in hosts if h not in op.unleased], state=state, rollout_id=rollout_id
        )


def keep_owed_leases(
    op: Operation, ledger: Ledger, hosts: list[str], *, rollout_id: str | None = None
) -> None:
    """The end of an operation that leaves a rollout unfinished (`rollout_id`, default this one): the hosts
    still owed a return to its baseline keep their leases, renewed and marked unfinished under that
    rollout's id (keep_leases); hosts this process found or put on the baseline, or that owe it nothing
    (`op.settled`), are released. A host whose state is unknown (no answer, an undo cut short) is owed."""
    owed = [h for h in hosts if h not in op.settled]
    done = [h for h in hosts if h in op.settled]
    keep_leases(op, ledger, owed, LeaseState.UNFINISHED, rollout_id=rollout_id)
    end_leases(op, ledger, done)
    if rollout_id is not None and rollout_id != op.op_id:
        # where this process could not take that rollout's lease over (a node that could not write its
        # lease file), that rollout's own lease is still there: it is ours to drop as well
        end_leases(op, ledger, done, rollout_id=rollout_id)


def read_states(op: Operation, ledger: Ledger, hosts: list[str]) -> dict[str, NodeState]:
    step = op.run_step(
        ledger,
        "state",
        hosts,
        STATUS_PLAYBOOK,
        {"solfleet_status_deep": False},
        record=False,
        timeout_s=op.spec.timeouts.status_s,
    )
    out = {}
    for host in hosts:
        hp = step.ok_hosts.get(host)
        out[host] = (
            _state_of(host, hp.status, hp.solfleet, hp.message)
            if hp is not None
            else NodeState(host=host, reachable=False, message="no answer")
        )
    return out


@dataclass(frozen=True)
class RestoreResult:
    ok: bool  # every host asked for is on its baseline
    # nothing more can be done: every host is on its baseline, or had no release before the rollout (kept
    # on the verified release it runs). False while a host is unreachable or its undo failed.
    final: bool
    moved: list[str]
    where: dict[str, str]  # host -> one line: where it is now and why


def restore(
    op: Operation,
    ledger: Ledger,
    baseline: Mapping[str, Baseline],
    hosts: list[str],
    *,
    pending: Iterable[str] = (),
    moved_from: str | None = None,
) -> RestoreResult:
    """Return `hosts` to `baseline`: current AND previous, so a later plain rollback never lands on the
    release that was just rejected. Hosts already there are left alone, except `pending` ones (cut off
    mid-step: their node module may still activate after the state read), whose undo runs anyway and waits
    for the node's lock; a host with no baseline release (a first deploy) stays on what it runs, said so in
    the ledger. `moved_from` (a reconcile of an unfinished rollout of that version, from a later process):
    a host on neither that version nor its baseline was moved by another operation since, and is left
    where it is, said so in the ledger, rather than taken back past that operation. A host read `busy` (a
    node step holds its lock: one of a controller that is gone runs on there) is undone as a `pending` one;
    where a rule would leave it where it is, it is left, but still owed: where that is stays open until its
    step ends."""
    states = read_states(op, ledger, hosts)
    busy = {h for h, s in states.items() if s.reachable and s.busy}
    pending = set(pending) | busy
    op.settled.difference_update(hosts)  # known again below, from this read and this undo
    moves: dict[str, dict[str, str]] = {}
    notes: list[HostRecord] = []
    where: dict[str, str] = {}
    ok = final = True
    for host in hosts:
        base, now = baseline.get(host), states[host]
        if base is None or not base.reachable:
            where[host] = f"{now.current or 'unknown'} (no baseline: it did not answer before the rollout)"
            op.settled.add(host)  # nothing to return it to
            continue
        if not now.reachable:
            ok = final = False
            where[host] = f"unknown: unreachable ({now.message})"
            notes.append(_note(host, "unreachable", base, None, f"not restored: {now.message}"))
            continue
        if host in busy and (
            base.current is None or (moved_from is not None and now.current not in (moved_from, base.current))
        ):
            ok = final = False
            where[host] = f"{now.current or 'none'} as read, but {BUSY_NOTE}: still owed"
            note = f"not restored: {now.current or 'none'} as read, but {BUSY_NOTE}; its rollout stays owed"
            notes.append(_note(host, "not_finished", base, None, note))
            continue
        if (now.current, now.previous) == (base.current, base.previous) and (
            host not in pending or base.current is None
        ):
            where[host] = f"{now.current or 'none'} (baseline)"
            op.settled.add(host)
            continue
        if moved_from is not None and now.current not in (moved_from, base.current):
            ok = False
            where[host] = f"{now.current or 'none'} (moved by another operation since: left where it is)"
            note = f"not returned: on {now.current or 'none'}, neither {moved_from} nor the baseline"
            notes.append(_note(host, "kept", base, now.current, note))
            op.settled.add(host)  # left where it is, by rule: nothing more is owed there
            continue
        if base.current is None:
            ok = False
            where[host] = f"{now.current} (kept: no release before the rollout to return to)"
            notes.append(_note(host, "kept", base, now.current, "no prior release on this node to return to"))
            op.settled.add(host)
            continue
        moves[host] = {"current": base.current, "previous": base.previous or ""}
    if notes:
        ledger.record_hosts(op.op_id, notes)
    if moves:
        extravars: dict[str, Any] = {"solfleet_restore": moves, "solfleet_rollout_id": op.op_id}
        if pending & set(moves):
            # a cut-off deploy step may hold the node's lock until its own bound: wait that long, so it ends
            # (and journals where) before the undo reads and moves the node; the other hosts' locks are free
            extravars["solfleet_lock_timeout_s"] = deploy_step_lock_s(op.spec)
        try:
            step = op.run_step(ledger, "undo", list(moves), ROLLBACK_PLAYBOOK, extravars)
        except StepAborted as exc:
            step = exc.step
        for r in step.records:
            if r.outcome in RESTORED:
                op.settled.add(r.host)
            if r.outcome == "unchanged":
                where[r.host] = f"{r.version_after} (baseline)"
            elif r.outcome in RESTORED:
                where[r.host] = f"{r.version_after} (restored to baseline)"
            else:
                ok = final = False
                where[r.host] = f"{r.version_after or 'unknown'}: undo {r.outcome}: {r.message}"
    moved = [r.host for r in step.records if r.outcome == "rolled_back"] if moves else []
    return RestoreResult(ok=ok, final=final, moved=moved, where=where)


def deploy_step_lock_s(spec: FleetSpec) -> int:
    """The longest a deploy's node step can hold a node's lock: that task's outer guard in the role
    (playbooks/roles/solfleet/tasks/main.yml: the lock wait, verify, health, bench when gates are on, and
    300 s), with this spec's verify limit and the role's defaults for the rest."""
    defaults_file = project_root() / "playbooks" / "roles" / "solfleet" / "defaults" / "main.yml"
    d = yaml.safe_load(defaults_file.read_text(encoding="utf-8"))
    bench = int(d["solfleet_bench_timeout_s"]) if spec.gates.enabled else 0
    lock, health = int(d["solfleet_lock_timeout_s"]), int(d["solfleet_health_timeout_s"])
    return lock + spec.timeouts.verify_s + health + bench + 300


def _note(host: str, outcome: str, base: Baseline, after: str | None, message: str) -> HostRecord:
    return HostRecord(
        step="undo",
        host=host,
        outcome=outcome,
        changed=False,
        version_before=after,
        version_after=after,
        failed_phase="rollback" if outcome != "kept" else None,
        message=message,
        phases={},
    )


def recover(op: Operation, ledger: Ledger, unfinished_id: str) -> RestoreResult:
    """Return every host of an unfinished operation to its baseline, under this operation's lease (taking
    over the dead one's), and mark it recovered by `op`."""
    baseline = ledger.baseline(unfinished_id)
    # a host taken out of the fleet spec since (a node that died for good) is no longer this fleet's to
    # return: it is said so and owes nothing, so one dead node never holds the fleet's deploys forever
    in_spec = {n.name for n in op.spec.nodes}
    gone = sorted(h for h in baseline if h not in in_spec)
    hosts = [h for h in baseline if h in in_spec]
    row = ledger.operation(unfinished_id)
    if not hosts:  # every host gone from the spec: nothing to lease, read or move
        result = RestoreResult(ok=True, final=True, moved=[], where={})
    else:
        try:
            take_baseline(op, ledger, hosts, record=False, drop_on_refusal=False)
        except LeaseHeld:
            # refused on some node (another rollout holds it): the leases it took over from the unfinished
            # rollout stay that rollout's, marked unfinished, on the hosts still owed; those its lease read
            # found owing nothing (on the baseline, or moved by another operation since) are released
            moved_from = row.version if row else None
            op.settled = {
                h
                for h in hosts
                if h in op.lease_read and owes_nothing(baseline.get(h), op.lease_read[h], moved_from)
            }
            keep_owed_leases(op, ledger, hosts, rollout_id=unfinished_id)
            raise
        finished = False
        try:
            result = restore(op, ledger, baseline, hosts, moved_from=row.version if row else None)
            finished = result.final
        finally:
            if finished:
                end_leases(op, ledger, hosts)
                # where this run could not take the dead rollout's lease over (a node that could not write
                # its lease file), the dead one's lease is still there: drop it too, it is ours
                end_leases(op, ledger, hosts, rollout_id=unfinished_id)
            else:
                # the rollout stays unfinished (a host dark, an undo refused, a signal): the hosts it still
                # owes stay leased, as at its own end (conclude_leases), until the next reconcile from
                # here; the leases name that rollout, not this reconcile: a refused controller learns what
                # is owed and what finishes it
                keep_owed_leases(op, ledger, hosts, rollout_id=unfinished_id)
    if gone:
        where = {**result.where, **dict.fromkeys(gone, "not returned: no longer in the fleet spec")}
        result = RestoreResult(ok=False, final=result.final, moved=result.moved, where=where)
    if result.final:
        ledger.mark_recovered(unfinished_id, by=op.op_id)
    return result


def owes_nothing(base: Baseline | None, now: Baseline, moved_from: str | None) -> bool:
    """A host read `now` owes the rollout with `base` nothing when the rollout never read it (no baseline,
    or it did not answer before the rollout: it was never leased, so never moved; restore's rule too), or,
    only where `now` answered, when it had no baseline release to return to (restore keeps it on what it
    runs), it is on that baseline (current and previous), or (`moved_from`: that rollout's version) it runs
    neither that version nor its baseline, moved by another operation since (restore leaves it). A host
    that did not answer `now` is owed, even with no release before the rollout: the rollout may have put
    its version there, and nobody knows where it stands. So is one read `busy`, whatever it read: a node
    step (the unfinished rollout's own, its controller gone) may still move it once the read is taken."""
    if base is None or not base.reachable:
        return True
    if not now.reachable or now.busy:
        return False
    if base.current is None:
        return True
    if (now.current, now.previous) == (base.current, base.previous):
        return True
    return moved_from is not None and now.current not in (moved_from, base.current)


def conclude_rollback_leases(
    op: Operation, ledger: Ledger, hosts: list[str], records: Iterable[HostRecord], *, moved: bool = True
) -> dict[str, list[str]]:
    """The end of a rollback (the escape hatch) while this ledger has unfinished rollouts (a reconcile that
    could not finish them ran first). For each, a host owes it nothing more when it owed nothing at the
    rollback's lease read (owes_nothing) and the rollback moved nothing there (`refused`, or refused at its
    lease call: `moved=False`), when the rollback left it on a verified release (`rolled_back`, `unchanged`:
    what the rollback did stands), when it is no longer in the fleet spec, or when it had no release before
    that rollout and this rollback's lease read found it answering. Every other host of its baseline (no
    answer, a failed step, a host this rollback did not select or read) is still owed. A rollout owed nothing
    more is concluded (recovered by this rollback: status no longer calls it unfinished, and no reconcile
    moves the rollback's hosts back); each one's own lease, where this rollback could not take it over, is
    dropped on the hosts no unfinished rollout owes; the hosts still owed that this rollback leased keep their
    lease, renewed and marked unfinished as that rollout's (keep_leases); every other lease it took is
    dropped. `moved=False`: a rollback refused at its lease call (it moved nothing): no rollout is concluded,
    the owed hosts' leases are kept all the same. Returns, per rollout still unfinished, the hosts it still
    owes (a concluded one maps to [])."""
    outcome = {r.host: r.outcome for r in records}
    in_spec = {n.name for n in op.spec.nodes}
    kept: dict[str, str] = {}  # host -> the (oldest) unfinished rollout that still owes it
    owed_by: dict[str, list[str]] = {}
    rows = ledger.unfinished()
    for row in rows:
        owed = []
        for host, base in ledger.baseline(row.id).items():
            if host not in in_spec or not base.reachable:
                continue  # owes nothing: no longer this fleet's, or no baseline read before it
            read = op.lease_read.get(host)
            if base.current is None and read is not None and read.reachable and not read.busy:
                # no release before it to return to (restore's rule: only for a host that answers, and whose
                # node step, if one runs on there, has ended)
                continue
            if outcome.get(host) in RESTORED:
                continue
            unmoved = outcome.get(host) == "refused" or not moved  # this rollback switched nothing there
            if unmoved and read is not None and owes_nothing(base, read, row.version):
                continue
            owed.append(host)
        owed_by[row.id] = owed
        if not owed and moved:
            ledger.mark_recovered(row.id, by=op.op_id)
        for host in owed:
            kept.setdefault(host, row.id)
    leased = [h for h in hosts if h not in op.unleased]
    if moved:
        # each rollout's own lease where this rollback could not take it over (a node that could not write
        # its lease file), on the hosts no unfinished rollout owes any more: ours to drop
        for row in rows:
            end_leases(op, ledger, [h for h in leased if h not in kept], rollout_id=row.id)
    for rollout_id in sorted(set(kept.values())):
        keep_leases(
            op,
            ledger,
            [h for h in leased if kept.get(h) == rollout_id],
            LeaseState.UNFINISHED,
            rollout_id=rollout_id,
        )
    end_leases(op, ledger, [h for h in hosts if h not in kept])
    return owed_by


def describe_where(where: Mapping[str, str]) -> str:
    return "; ".join(f"{h}: {w}" for h, w in sorted(where.items()))


def conclude_recovery(op: Operation, unfinished_id: str, result: RestoreResult) -> None:
    report = op.report
    if result.final:
        report.status = OpStatus.SUCCEEDED if result.ok else OpStatus.FAILED
        report.exit_code = ExitCode.OK if result.ok else ExitCode.OPERATION_FAILED
        report.message = (
            f"{unfinished_id} returned to its baseline ({len(result.moved)} host(s) moved): "
            + describe_where(result.where)
        )
    else:
        report.status, report.exit_code = OpStatus.FAILED, ExitCode.OPERATION_FAILED
        report.message = (
            f"{unfinished_id} could not be returned to its baseline everywhere; it stays unfinished: "
            + describe_where(result.where)
        )

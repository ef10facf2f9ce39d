"""The failure policy when a batch does not end normally. ansible-runner's job timeout is produced for real
(a tiny playbook, connection local); the deploy-level tests script `runner.run_playbook`, the one boundary
to Ansible, so the policy is checked against a real SQLite ledger without a minutes-long simulator deploy.
The script answers the lease/state/lease-end reads from a small model of each node's links, which the
scripted deploy and undo answers move, so the baseline and the undo are computed from what "the nodes"
say, as in a real run."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleet import cli, runner
from fleet.errors import ControllerError, ExitCode, Interrupted, RunnerError
from fleet.ledger import Baseline, Ledger, Operation
from fleet.operation import _interrupted_record
from fleet.plan import plan_rollback, plan_rollout
from fleet.recovery import deploy_step_lock_s, owes_nothing
from fleet.rollout import ArtifactInfo, deploy, rollback
from fleet.runner import HostProgress, HostStatus, RunResult
from fleet.spec import embedded_fleet, load_spec
from fleet.workdir import ledger_path

HANGING_PLAY = """
- name: answer on n1, then hang everywhere
  hosts: all
  gather_facts: false
  tasks:
    - name: solfleet | Activate release
      ansible.builtin.debug:
        var: solfleet
      vars:
        solfleet:
          {outcome: activated, current: "2.0.0", previous: "1.0.0", prior_current: "1.0.0", simulated: true}
      when: inventory_hostname == "n1"
    - name: solfleet | Verify release
      ansible.builtin.command: sleep 30
      changed_when: false
"""


def test_a_timed_out_run_carries_what_each_host_had_answered(tmp_path: Path) -> None:
    pdd = tmp_path / "pdd"
    (pdd / "project").mkdir(parents=True)
    (pdd / "inventory").mkdir()
    (pdd / "project" / "hang.yml").write_text(HANGING_PLAY)
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory = {"all": {"hosts": {"n1": local, "n2": local}}}
    (pdd / "inventory" / "hosts.yml").write_text(yaml.safe_dump(inventory))
    started = time.monotonic()
    with pytest.raises(RunnerError, match=r"ansible-runner timeout running hang\.yml") as caught:
        runner.run_playbook(
            private_data_dir=pdd,
            playbook="hang.yml",
            hosts=["n1", "n2"],
            extravars={},
            ident="t",
            timeout_s=4,
        )
    assert time.monotonic() - started < 25  # stopped by the timeout, not by the 30 s task
    progress = caught.value.progress
    assert set(progress) == {"n1", "n2"}
    n1 = _interrupted_record("batch 1", progress["n1"], "n1", outcome="not_finished")
    assert (n1.outcome, n1.version_before, n1.version_after) == ("activated", "1.0.0", "2.0.0")
    n2 = _interrupted_record("batch 1", progress["n2"], "n2", outcome="not_finished")
    assert (n2.outcome, n2.failed_phase) == ("not_finished", "verify_release")
    assert "Verify release" in n2.message


def answered(
    host: str, outcome: str, *, before: str | None, after: str, previous: str | None = None
) -> HostProgress:
    """A host whose node module answered (the `solfleet` result a real run folds from its events).
    `before` is the node's current when the module took its lock (`prior_current`); `previous` defaults to it
    for a switch, as on a node whose current existed."""
    moved = outcome in ("activated", "rolled_back")
    prior = (previous or before) if moved else None
    return HostProgress(
        host=host,
        status=HostStatus.CHANGED if moved else HostStatus.OK,
        changed=1 if moved else 0,
        solfleet={
            "outcome": outcome,
            "current": after,
            "previous": prior,
            "prior_current": before,
            "simulated": True,
        },
    )


READS = ("lease.yml", "status.yml", "lease_end.yml")


class ScriptedRunner:
    """Stands in for `runner.run_playbook`: `script` maps a deploy/rollback step's hosts to what that run
    does; lease.yml, status.yml and lease_end.yml answer from `links` (host -> (current, previous)), which
    each scripted answer updates the way the node module would have."""

    def __init__(
        self, script: Mapping[tuple[str, ...], Any], links: dict[str, tuple[str | None, str | None]]
    ):
        self.script = script
        self.links = links
        self.calls: list[tuple[str, tuple[str, ...], dict[str, Any]]] = []
        self.job_timeouts: list[tuple[str, int]] = []  # (playbook, timeout_s) of every run

    def _read(self, host: str) -> HostProgress:
        current, previous = self.links[host]
        return HostProgress(
            host=host,
            status=HostStatus.OK,
            solfleet={"current": current, "previous": previous, "current_sha": None, "release_shas": {}},
        )

    def __call__(self, **kw: Any) -> RunResult:
        hosts = tuple(kw["hosts"])
        self.calls.append((kw["playbook"], hosts, dict(kw["extravars"])))
        self.job_timeouts.append((kw["playbook"], kw["timeout_s"]))
        if kw["playbook"] in READS:
            what: Any = {h: self._read(h) for h in hosts}
        else:
            what = self.script[(kw["playbook"], hosts)]
        # a RunnerError or Interrupted carries what each host had answered; any other exception (an OSError
        # of the controller) nothing
        progress = getattr(what, "progress", {}) if isinstance(what, Exception) else what
        for host, hp in progress.items():
            sf = hp.solfleet
            if sf.get("outcome") in ("activated", "rolled_back"):
                self.links[host] = (sf["current"], sf.get("previous"))
        if isinstance(what, Exception):
            raise what
        return RunResult(
            ident=kw["ident"],
            playbook=kw["playbook"],
            status="successful",
            rc=0,
            hosts=what,
            artifacts=kw["private_data_dir"],
            seconds=0.1,
        )


def timed_out_batch_1() -> RunnerError:
    """n2 activated, then the job timeout stopped the run while n3 was verifying."""
    n3 = HostProgress(host="n3", status=HostStatus.NOT_RUN, task="solfleet | Verify release")
    return RunnerError(
        "ansible-runner timeout running deploy.yml on n2, n3 (limit 60s); artifacts: x",
        progress={"n2": answered("n2", "activated", before="1.0.0", after="2.0.0"), "n3": n3},
    )


def run_deploy(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    on_failure: str,
    script: Mapping,
    max_failures: int = 0,
    links: dict[str, tuple[str | None, str | None]] | None = None,
    rollout: str = "",
    runner_class: type[ScriptedRunner] = ScriptedRunner,
) -> tuple:
    """Deploy 2.0.0 to the embedded fleet (with this on_failure and max_failures, and `rollout`: more
    `rollout` lines) through `script`."""
    text = embedded_fleet().read_text().replace("on_failure: rollback_fleet", f"on_failure: {on_failure}")
    text = text.replace("max_failures: 0", f"max_failures: {max_failures}")
    # the scripts answer the deploy and read steps; preflight health has its own e2e (test_preflight.py)
    rollout = "  preflight_health: false\n" + rollout
    text = text.replace("  keep_releases: 3\n", f"  keep_releases: 3\n{rollout}")
    (tmp_path / "fleet.yml").write_text(text)
    spec = load_spec(tmp_path / "fleet.yml", work_dir=tmp_path / "work")
    plan = plan_rollout(list(spec.nodes), spec.rollout, version="2.0.0")
    scripted = runner_class(script, dict(links or {h: ("1.0.0", None) for h in ("n1", "n2", "n3")}))
    monkeypatch.setattr(runner, "run_playbook", scripted)
    result = deploy(spec, plan, artifact=ArtifactInfo(path=tmp_path / "a.tar.gz", sha256="0" * 64))
    with Ledger(ledger_path(spec)) as ledger:
        (op,) = ledger.operations()
        rows = {(h.step, h.host): h for h in ledger.host_outcomes(op.id)}
    return result, op, rows, scripted


CANARY_OK = {("deploy.yml", ("n1",)): {"n1": answered("n1", "activated", before="1.0.0", after="2.0.0")}}


def test_a_timed_out_batch_is_recorded_and_rolled_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    undo = {
        h: answered(h, "rolled_back", before="2.0.0", after="1.0.0", previous="0.9.0") for h in ("n1", "n2")
    }
    # n3 was cut off mid-verify: its node module runs on under the node's lock and may still activate, so
    # its undo runs too (it waits for that lock) and finds it on the baseline
    undo["n3"] = answered("n3", "unchanged", before="1.0.0", after="1.0.0")
    script = {
        **CANARY_OK,
        ("deploy.yml", ("n2", "n3")): timed_out_batch_1(),
        ("rollback.yml", ("n1", "n2", "n3")): undo,
    }
    baseline = {h: ("1.0.0", "0.9.0") for h in ("n1", "n2", "n3")}
    result, op, rows, scripted = run_deploy(tmp_path, monkeypatch, "rollback_fleet", script, links=baseline)
    assert result.exit_code is ExitCode.RUNNER  # still exit 4, but only after the failure policy ran
    assert op.status == "rolled_back" and result.status == "rolled_back"
    assert op.message.startswith("batch 1 failed: ansible-runner timeout running deploy.yml")
    assert "returned 2 host(s) to the baseline" in op.message
    # the stopped batch is in the ledger, each host with what it had done
    n2, n3 = rows[("batch 1", "n2")], rows[("batch 1", "n3")]
    assert (n2.outcome, n2.version_before, n2.version_after) == ("activated", "1.0.0", "2.0.0")
    assert (n3.outcome, n3.failed_phase) == ("not_finished", "verify_release")
    # both hosts this rollout activated (canary n1, and n2 before the timeout) went back to the baseline:
    # current 1.0.0 AND previous 0.9.0, as the baseline read recorded them before the first push
    undo_call = next(c for c in scripted.calls if c[0] == "rollback.yml")
    assert undo_call[1] == ("n1", "n2", "n3")
    assert undo_call[2]["solfleet_restore"] == {
        "n1": {"current": "1.0.0", "previous": "0.9.0"},
        "n2": {"current": "1.0.0", "previous": "0.9.0"},
        "n3": {"current": "1.0.0", "previous": "0.9.0"},
    }
    assert rows[("undo", "n1")].outcome == rows[("undo", "n2")].outcome == "rolled_back"
    assert rows[("undo", "n3")].outcome == "unchanged"
    assert scripted.links == baseline
    # leases: taken first (before any push), dropped last
    assert scripted.calls[0][0] == "lease.yml" and scripted.calls[-1][0] == "lease_end.yml"


def test_a_timed_out_batch_under_halt_leaves_hosts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = {**CANARY_OK, ("deploy.yml", ("n2", "n3")): timed_out_batch_1()}
    result, op, rows, scripted = run_deploy(tmp_path, monkeypatch, "halt", script)
    assert result.exit_code is ExitCode.RUNNER and op.status == "failed"
    assert "on_failure=halt: hosts left where they are" in op.message
    assert [c[0] for c in scripted.calls] == ["lease.yml", "deploy.yml", "deploy.yml", "lease_end.yml"]
    assert rows[("batch 1", "n3")].outcome == "not_finished"


def test_a_failed_canary_stops_the_rollout_even_within_max_failures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Canary n1 fails, within max_failures 1: the canary proved nothing, so batch 1 is never scheduled."""
    refused = answered("n1", "refused", before="1.0.0", after="1.0.0")
    script = {("deploy.yml", ("n1",)): {"n1": refused}}
    result, op, _rows, scripted = run_deploy(tmp_path, monkeypatch, "halt", script, max_failures=1)
    assert result.exit_code is ExitCode.OPERATION_FAILED
    assert op.message.startswith("canary: no host completed verify and activation (n1: refused)")
    assert "not scheduled: n2, n3" in op.message
    assert [c[1] for c in scripted.calls if c[0] == "deploy.yml"] == [("n1",)]


def test_the_failure_message_counts_the_failed_batch_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batch 1 (n2, n3) fails 2 > max_failures 1 after a good canary: the message says 2 and names n2."""
    refused = {h: answered(h, "refused", before="1.0.0", after="1.0.0") for h in ("n2", "n3")}
    script = {**CANARY_OK, ("deploy.yml", ("n2", "n3")): refused}
    result, op, _rows, _calls = run_deploy(tmp_path, monkeypatch, "halt", script, max_failures=1)
    assert result.exit_code is ExitCode.OPERATION_FAILED
    assert op.message.startswith("batch 1 failed (2 > max_failures 1): n2: ")


def test_a_host_that_had_no_current_is_kept_not_moved_to_a_stale_previous(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Canary n1 had no `current` (its `previous` still named 0.9.0): undo keeps it on 2.0.0 and says so;
    n2 goes back to the 1.0.0 it ran. Before prior_current, n1 was sent to 0.9.0."""
    n1 = answered("n1", "activated", before=None, after="2.0.0", previous="0.9.0")
    n2 = answered("n2", "activated", before="1.0.0", after="2.0.0")
    n3 = answered("n3", "refused", before="1.0.0", after="1.0.0")
    script = {
        ("deploy.yml", ("n1",)): {"n1": n1},
        ("deploy.yml", ("n2", "n3")): {"n2": n2, "n3": n3},
        ("rollback.yml", ("n2",)): {"n2": answered("n2", "rolled_back", before="2.0.0", after="1.0.0")},
    }
    links = {"n1": (None, "0.9.0"), "n2": ("1.0.0", None), "n3": ("1.0.0", None)}
    result, op, rows, scripted = run_deploy(tmp_path, monkeypatch, "rollback_fleet", script, links=links)
    assert result.exit_code is ExitCode.OPERATION_FAILED and op.status == "failed"
    assert rows[("canary", "n1")].version_before is None
    assert [c[:2] for c in scripted.calls if c[0] == "rollback.yml"] == [("rollback.yml", ("n2",))]
    undo_call = next(c for c in scripted.calls if c[0] == "rollback.yml")
    assert undo_call[2]["solfleet_restore"] == {"n2": {"current": "1.0.0", "previous": ""}}
    kept = rows[("undo", "n1")]
    assert (kept.outcome, kept.version_after) == ("kept", "2.0.0")
    assert rows[("undo", "n2")].outcome == "rolled_back"


def test_a_batch_past_its_deadline_is_failed_and_its_cut_off_host_undone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """batch_deadline_s 30 (run_s 3600): the canary's run gets a 30 s job timeout; stopped while n1 was in
    its node module, n1 is `not_finished` with the deadline as its reason, the batch fails whatever
    max_failures says, and the undo runs on n1 although its state read shows the baseline (its module may
    still activate: the undo waits for its lock)."""
    n1 = HostProgress(host="n1", status=HostStatus.RUNNING, task="solfleet | Deploy release")
    cut = RunnerError(
        "ansible-runner timeout running deploy.yml on n1 (limit 30s)", progress={"n1": n1}, status="timeout"
    )
    script = {
        ("deploy.yml", ("n1",)): cut,
        ("rollback.yml", ("n1",)): {"n1": answered("n1", "unchanged", before="1.0.0", after="1.0.0")},
    }
    result, op, rows, scripted = run_deploy(
        tmp_path, monkeypatch, "rollback_fleet", script, max_failures=5, rollout="  batch_deadline_s: 30\n"
    )
    assert ("deploy.yml", 30) in scripted.job_timeouts
    assert result.exit_code is ExitCode.OPERATION_FAILED and op.status == "rolled_back"
    assert op.message.startswith(
        "canary: batch deadline 30 s passed; n1: deploy_release: batch deadline 30 s"
    )
    assert "not scheduled: n2, n3" in op.message
    row = rows[("canary", "n1")]
    assert row.outcome == "not_finished"
    assert row.message.startswith("batch deadline 30 s passed (not finished in 'solfleet | Deploy release'")
    assert [c[1] for c in scripted.calls if c[0] == "rollback.yml"] == [("n1",)]
    assert rows[("undo", "n1")].outcome == "unchanged"


def _cli(tmp_path: Path, *args: str) -> int:
    return cli.main([*args, "--fleet", str(tmp_path / "fleet.yml"), "--work-dir", str(tmp_path / "work")])


def _unfinished(tmp_path: Path) -> list[str]:
    spec = load_spec(tmp_path / "fleet.yml", work_dir=tmp_path / "work")
    with Ledger(ledger_path(spec)) as ledger:
        return [o.id for o in ledger.unfinished()]


def _unfinished_by_a_refused_undo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any, Any]:
    """Batch 1 fails and the canary n1 refuses its undo: the rollout is unfinished."""
    refused = {h: answered(h, "refused", before="1.0.0", after="1.0.0") for h in ("n2", "n3")}
    script: dict[Any, Any] = {
        **CANARY_OK,
        ("deploy.yml", ("n2", "n3")): refused,
        ("rollback.yml", ("n1",)): {"n1": answered("n1", "refused", before="2.0.0", after="2.0.0")},
    }
    _result, op, _rows, scripted = run_deploy(tmp_path, monkeypatch, "rollback_fleet", script)
    assert _unfinished(tmp_path) == [op.id]
    return op, scripted, script


def test_an_undo_a_node_refused_leaves_the_rollout_owed_to_reconcile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batch 1 fails, and the canary n1 refuses its undo: the row is `failed` and unfinished, so status wants
    the baseline and reconcile finishes the policy once n1 takes the undo (before, the row was not owed
    anything: reconcile said "nothing to reconcile" and n1 stayed on the rejected release, in sync). A
    rollback asked for without --yes on a pipe is refused before that return moves anything."""
    refused = {h: answered(h, "refused", before="1.0.0", after="1.0.0") for h in ("n2", "n3")}
    script: dict[Any, Any] = {
        **CANARY_OK,
        ("deploy.yml", ("n2", "n3")): refused,
        ("rollback.yml", ("n1",)): {"n1": answered("n1", "refused", before="2.0.0", after="2.0.0")},
    }
    result, op, _rows, scripted = run_deploy(tmp_path, monkeypatch, "rollback_fleet", script)
    assert result.exit_code is ExitCode.OPERATION_FAILED and op.status == "failed"
    assert "could not return every host to the baseline (run `solfleet reconcile`)" in op.message
    assert op.recovered_by is None and _unfinished(tmp_path) == [op.id]
    assert scripted.links["n1"] == ("2.0.0", "1.0.0")

    calls = len(scripted.calls)
    monkeypatch.setattr(sys.stdin, "isatty", lambda: False)
    assert _cli(tmp_path, "rollback") == ExitCode.USAGE  # not confirmed: nothing ran, the return included
    assert len(scripted.calls) == calls and _unfinished(tmp_path) == [op.id]

    script[("rollback.yml", ("n1",))] = {"n1": answered("n1", "rolled_back", before="2.0.0", after="1.0.0")}
    assert _cli(tmp_path, "reconcile", "--yes") == ExitCode.OK
    assert scripted.links["n1"][0] == "1.0.0"
    assert _unfinished(tmp_path) == []
    spec = load_spec(tmp_path / "fleet.yml", work_dir=tmp_path / "work")
    with Ledger(ledger_path(spec)) as ledger:
        row = ledger.operation(op.id)
        assert row is not None and row.recovered_by not in (None, op.id)


def _lease_calls(
    scripted: ScriptedRunner, since: int = 0
) -> list[tuple[str, tuple[str, ...], str, list[str]]]:
    """The lease renewals (marked unfinished) and lease ends made since call `since`: (playbook, hosts,
    rollout id, take_over)."""
    return [
        (c[0], c[1], c[2]["solfleet_rollout_id"], list(c[2].get("solfleet_take_over") or []))
        for c in scripted.calls[since:]
        if c[0] == "lease_end.yml"
        or (c[0] == "lease.yml" and c[2].get("solfleet_lease_state") == "unfinished")
    ]


def test_the_leases_an_unfinished_rollout_keeps_are_the_owed_hosts_named_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Canary n1 refuses its undo; n2 and n3 were refused their deploy, so the undo's read finds them on the
    baseline. The rollout keeps n1's lease alone (renewed, unfinished) and drops n2's and n3's. A reconcile
    that cannot finish renews n1's as that rollout's (taking over its own), not under the reconcile's id. A
    rollback that leaves n1 owed keeps it so too; one that puts every owed host on a verified release
    concludes the rollout (recovered by the rollback) and drops the leases."""
    op, scripted, script = _unfinished_by_a_refused_undo(tmp_path, monkeypatch)
    assert _lease_calls(scripted) == [
        ("lease.yml", ("n1",), op.id, []),
        ("lease_end.yml", ("n2", "n3"), op.id, []),
    ]

    def last_id() -> str:
        spec = load_spec(tmp_path / "fleet.yml", work_dir=tmp_path / "work")
        with Ledger(ledger_path(spec)) as ledger:
            return ledger.operations()[0].id

    def recovered_by() -> str | None:
        spec = load_spec(tmp_path / "fleet.yml", work_dir=tmp_path / "work")
        with Ledger(ledger_path(spec)) as ledger:
            row = ledger.operation(op.id)
            assert row is not None
            return row.recovered_by

    since = len(scripted.calls)
    assert _cli(tmp_path, "reconcile", "--yes") == ExitCode.OPERATION_FAILED  # n1 refuses again
    reconcile_id = last_id()
    assert _lease_calls(scripted, since)[0] == ("lease.yml", ("n1",), op.id, [reconcile_id])
    assert ("lease_end.yml", ("n2", "n3"), reconcile_id, []) in _lease_calls(scripted, since)
    assert _unfinished(tmp_path) == [op.id]

    # a plain rollback of n1 (after the same refused return): refused, so n1 stays owed and leased to op
    since = len(scripted.calls)
    assert _cli(tmp_path, "rollback", "--limit", "n1", "--yes") == ExitCode.OPERATION_FAILED
    rollback_id = last_id()
    assert _lease_calls(scripted, since)[-1] == ("lease.yml", ("n1",), op.id, [rollback_id])
    assert recovered_by() is None and _unfinished(tmp_path) == [op.id]

    # a rollback that leaves every host on a verified release concludes it
    script[("rollback.yml", ("n1", "n2", "n3"))] = {
        "n1": answered("n1", "rolled_back", before="2.0.0", after="1.0.0"),
        "n2": answered("n2", "unchanged", before="1.0.0", after="1.0.0"),
        "n3": answered("n3", "unchanged", before="1.0.0", after="1.0.0"),
    }
    since = len(scripted.calls)
    assert _cli(tmp_path, "rollback", "--to", "1.0.0", "--yes") == ExitCode.OK
    rollback_id = last_id()
    assert _lease_calls(scripted, since)[-1] == ("lease_end.yml", ("n1", "n2", "n3"), rollback_id, [])
    assert recovered_by() == rollback_id and _unfinished(tmp_path) == []


def test_what_a_host_owes_an_unfinished_rollout_from_one_read() -> None:
    """owes_nothing: a host read on its baseline (current AND previous), one with no baseline release that
    answers, and one moved by another operation (neither the rollout's version nor its baseline) owe
    nothing; a host on the rollout's version, half-returned (previous differs) or that did not answer is
    owed."""
    base = Baseline(host="n1", reachable=True, current="1.0.0", current_sha256=None, previous="0.9.0")

    def read(current: str | None, previous: str | None, reachable: bool = True) -> Baseline:
        return Baseline(
            host="n1", reachable=reachable, current=current, current_sha256=None, previous=previous
        )

    assert owes_nothing(base, read("1.0.0", "0.9.0"), "2.0.0")
    assert owes_nothing(None, read("2.0.0", "1.0.0"), "2.0.0")
    assert owes_nothing(replace(base, current=None), read("2.0.0", None), "2.0.0")
    assert owes_nothing(replace(base, reachable=False), read("2.0.0", "1.0.0"), "2.0.0")
    assert owes_nothing(base, read("3.0.0", "1.0.0"), "2.0.0")  # another operation's since
    assert not owes_nothing(base, read("3.0.0", "1.0.0"), None)  # no version to tell it by: owed
    assert not owes_nothing(base, read("2.0.0", "1.0.0"), "2.0.0")
    assert not owes_nothing(base, read("1.0.0", "2.0.0"), "2.0.0")
    assert not owes_nothing(base, read(None, None, reachable=False), "2.0.0")


def test_a_host_with_no_release_before_that_did_not_answer_is_owed() -> None:
    """owes_nothing reads `now` before the "no release before" rule: a host with no release before the
    rollout that does not answer may run the rollout's version, so it is owed. A host the rollout never
    read (no baseline, or no answer before it) owes nothing, answering or not: the rollout never moved it.
    Before, a host with no release before the rollout owed nothing whether it answered or not."""
    base = Baseline(host="n1", reachable=True, current=None, current_sha256=None, previous=None)
    dark = Baseline(host="n1", reachable=False, current=None, current_sha256=None, previous=None)
    assert not owes_nothing(base, dark, "2.0.0")
    assert not owes_nothing(base, dark, None)
    assert owes_nothing(replace(base, reachable=False), dark, "2.0.0")
    assert owes_nothing(None, dark, "2.0.0")


def test_a_rollback_refused_at_its_lease_call_keeps_the_owed_hosts_lease_for_the_rollout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older rollout owes n1 a return (its undo refused again by the reconcile the CLI runs first);
    another controller's rollout takes n3 after that reconcile's lease call (it would have refused the
    reconcile: exit 5, no rollback). The rollback takes over the older rollout's lease on n1, then is
    refused at n3 (exit 5, nothing moved): n1's
    lease is renewed as that rollout's, marked unfinished, and the rollout stays unfinished (a refused
    rollback concludes nothing). Before, the refusal dropped every lease the rollback had taken, n1's too:
    any controller could then deploy onto n1, still on the rejected release and owed a return."""
    op, scripted, _script = _unfinished_by_a_refused_undo(tmp_path, monkeypatch)
    plain = scripted._read

    def takes() -> int:  # lease calls since `since` that take leases (renewals carry a state)
        return sum(c[0] == "lease.yml" and "solfleet_lease_state" not in c[2] for c in scripted.calls[since:])

    def read(host: str) -> HostProgress:
        playbook, _hosts, extra = scripted.calls[-1]
        if host == "n3" and playbook == "lease.yml" and "solfleet_lease_state" not in extra and takes() == 2:
            held = "rollout r-other of ops@elsewhere:1 holds this node; nothing was changed"
            return HostProgress(
                host=host, status=HostStatus.FAILED, solfleet={"failed_phase": "lease", "message": held}
            )
        return plain(host)

    monkeypatch.setattr(scripted, "_read", read)
    since = len(scripted.calls)
    assert _cli(tmp_path, "rollback", "--to", "1.0.0", "--yes") == ExitCode.LOCKED
    assert takes() == 2  # the reconcile's lease call, then the rollback's
    # the reconcile's undo of n1 (refused again); the rollback moved nothing
    assert [c[1] for c in scripted.calls[since:] if c[0] == "rollback.yml"] == [("n1",)]
    spec = load_spec(tmp_path / "fleet.yml", work_dir=tmp_path / "work")
    with Ledger(ledger_path(spec)) as ledger:
        rollback_id = ledger.operations()[0].id
        row = ledger.operation(op.id)
        assert row is not None and row.recovered_by is None
    assert rollback_id != op.id and _unfinished(tmp_path) == [op.id]
    calls = _lease_calls(scripted, since)
    assert ("lease.yml", ("n1",), op.id, [rollback_id]) in calls  # renewed as the owed rollout's
    ends = [c for c in calls if c[0] == "lease_end.yml" and c[2] == rollback_id]
    assert ends and all("n1" not in c[1] for c in ends)  # never dropped where the rollout is owed
    assert scripted.links["n1"] == ("2.0.0", "1.0.0")


class DarkAfterTheLeases(ScriptedRunner):
    """n2 answers the first lease call (the rollout's baseline read), then nothing more."""

    def _read(self, host: str) -> HostProgress:
        first_lease = [c[0] for c in self.calls].count("lease.yml") == 1 and self.calls[-1][0] == "lease.yml"
        if host == "n2" and not first_lease:
            return HostProgress(host=host, status=HostStatus.UNREACHABLE, message="ssh: connect timed out")
        return super()._read(host)


def test_a_rollback_that_never_read_an_owed_host_does_not_conclude_the_rollout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first deploy (no release before it on any node) fails its batch and n2 goes dark: the undo cannot
    read n2, so the rollout stays unfinished, owing n2 (restore leaves a host with no prior release where it
    is only once it answers). A rollback limited to n3 never reads n2: it must not conclude that rollout.
    Before, a host with no release before the rollout counted as owing nothing whether read or not, and
    the rollback marked the rollout recovered while n2 was still unread."""
    script: dict[Any, Any] = {
        ("deploy.yml", ("n1",)): {"n1": answered("n1", "activated", before=None, after="2.0.0")},
        ("deploy.yml", ("n2", "n3")): {
            "n2": HostProgress(host="n2", status=HostStatus.UNREACHABLE, message="ssh: connect timed out"),
            "n3": answered("n3", "refused", before=None, after=""),
        },
        ("rollback.yml", ("n3",)): {"n3": answered("n3", "unchanged", before=None, after="")},
    }
    links: dict[str, tuple[str | None, str | None]] = dict.fromkeys(("n1", "n2", "n3"), (None, None))
    _result, op, _rows, scripted = run_deploy(
        tmp_path, monkeypatch, "rollback_fleet", script, links=links, runner_class=DarkAfterTheLeases
    )
    assert _unfinished(tmp_path) == [op.id]  # n2 was never read back
    rc = _cli(tmp_path, "rollback", "--limit", "n3", "--yes")
    assert rc == ExitCode.OK, rc
    assert [c[1] for c in scripted.calls if c[0] == "rollback.yml"] == [("n3",)]
    assert _unfinished(tmp_path) == [op.id]  # still owed n2


class HeldAfterTheRollout(DarkAfterTheLeases):
    """n2 as in DarkAfterTheLeases; n3 is held by another controller's rollout at every lease call that
    takes leases after the rollout's own (a reconcile's is refused: exit 5)."""

    def _read(self, host: str) -> HostProgress:
        playbook, _hosts, extra = self.calls[-1]
        takes = sum(c[0] == "lease.yml" and "solfleet_lease_state" not in c[2] for c in self.calls)
        if host == "n3" and playbook == "lease.yml" and "solfleet_lease_state" not in extra and takes > 1:
            held = "rollout r-other of ops@elsewhere:1 holds this node; nothing was changed"
            return HostProgress(
                host=host, status=HostStatus.FAILED, solfleet={"failed_phase": "lease", "message": held}
            )
        return super()._read(host)


def test_a_refused_reconcile_keeps_owing_a_dark_host_that_had_no_release_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first deploy fails its batch and n2 goes dark: the rollout stays unfinished, owing n2. A reconcile
    is refused at n3 (another controller's rollout holds it: exit 5) while n2 still does not answer: its
    lease read proves nothing about n2, so n2 stays owed and the rollout's lease there is never dropped;
    n1, read on the release it was kept on, owes nothing and is released. Before, the refused path counted
    n2 as owing nothing (no release before the rollout) and dropped the rollout's lease on it."""
    script: dict[Any, Any] = {
        ("deploy.yml", ("n1",)): {"n1": answered("n1", "activated", before=None, after="2.0.0")},
        ("deploy.yml", ("n2", "n3")): {
            "n2": HostProgress(host="n2", status=HostStatus.UNREACHABLE, message="ssh: connect timed out"),
            "n3": answered("n3", "refused", before=None, after=""),
        },
    }
    links: dict[str, tuple[str | None, str | None]] = dict.fromkeys(("n1", "n2", "n3"), (None, None))
    _result, op, _rows, scripted = run_deploy(
        tmp_path, monkeypatch, "rollback_fleet", script, links=links, runner_class=HeldAfterTheRollout
    )
    assert _unfinished(tmp_path) == [op.id]  # n2 was never read back
    since = len(scripted.calls)
    assert _cli(tmp_path, "reconcile", "--yes") == ExitCode.LOCKED
    assert _unfinished(tmp_path) == [op.id]
    ends = [c for c in _lease_calls(scripted, since) if c[0] == "lease_end.yml"]
    assert ends and all(c[1] == ("n1",) for c in ends)  # n1 released; n2's lease never dropped


class BusyAfterTheRollout(ScriptedRunner):
    """Once a later operation has taken its leases, n2 reads `busy` at every read: the rollout's node step
    there runs on under the node's lock (it shields itself from signals), its controller gone, and has not
    switched `current` yet. `held`: n3 is also held by another controller's rollout at every later lease
    call that takes leases (a reconcile's is refused: exit 5)."""

    held = False

    def _read(self, host: str) -> HostProgress:
        playbook, _hosts, extra = self.calls[-1]
        takes = sum(c[0] == "lease.yml" and "solfleet_lease_state" not in c[2] for c in self.calls)
        taking = playbook == "lease.yml" and "solfleet_lease_state" not in extra
        if self.held and host == "n3" and taking and takes > 1:
            held = "rollout r-other of ops@elsewhere:1 holds this node; nothing was changed"
            return HostProgress(
                host=host, status=HostStatus.FAILED, solfleet={"failed_phase": "lease", "message": held}
            )
        read = super()._read(host)
        if host == "n2" and takes > 1:
            read.solfleet["busy"] = True
        return read


class BusyAndHeldAfterTheRollout(BusyAfterTheRollout):
    held = True


def _stopped_in_batch_1(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    runner_class: type[ScriptedRunner],
    links: dict[str, tuple[str | None, str | None]] | None = None,
) -> tuple[str, ScriptedRunner]:
    """The canary n1 activates 2.0.0, then the controller stops in batch 1 (a controller error; a SIGKILL
    leaves the same unfinished row): the rollout owes its hosts a return, and no undo ran."""
    before = (links or {}).get("n1", ("1.0.0", None))[0]
    script = {
        ("deploy.yml", ("n1",)): {"n1": answered("n1", "activated", before=before, after="2.0.0")},
        ("deploy.yml", ("n2", "n3")): OSError(28, "No space left on device"),
    }
    with pytest.raises(ControllerError):
        run_deploy(tmp_path, monkeypatch, "rollback_fleet", script, links=links, runner_class=runner_class)
    scripted = runner.run_playbook
    assert isinstance(scripted, runner_class)
    (op_id,) = _unfinished(tmp_path)
    return op_id, scripted


def _newest(tmp_path: Path) -> Operation:
    spec = load_spec(tmp_path / "fleet.yml", work_dir=tmp_path / "work")
    with Ledger(ledger_path(spec)) as ledger:
        return ledger.operations()[0]


def test_a_host_read_busy_owes_the_rollout_whatever_it_read() -> None:
    """owes_nothing: a host whose read says `busy` (a node step holds its lock) is owed, on its baseline or
    with no release before the rollout: that step may still move it. A host the rollout never read still
    owes nothing."""
    base = Baseline(host="n1", reachable=True, current="1.0.0", current_sha256=None, previous="0.9.0")
    busy = replace(base, busy=True)
    assert not owes_nothing(base, busy, "2.0.0")
    assert not owes_nothing(replace(base, current=None), replace(busy, current=None, previous=None), "2.0.0")
    assert not owes_nothing(base, replace(busy, current="3.0.0"), "2.0.0")
    assert owes_nothing(replace(base, reachable=False), busy, "2.0.0")


def test_a_refused_reconcile_keeps_owing_a_host_whose_node_step_still_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The controller stopped in batch 1; n2's node step of the rollout runs on (busy), not yet switched, so
    n2 reads on its baseline. A reconcile refused at n3 (exit 5) keeps n2's lease, renewed with n1's as the
    rollout's, and drops none. Before, its lease read counted n2 as owing nothing and dropped n2's lease:
    the step could then switch n2 to 2.0.0 with no lease, while the records said it was on its baseline."""
    op_id, scripted = _stopped_in_batch_1(tmp_path, monkeypatch, BusyAndHeldAfterTheRollout)
    since = len(scripted.calls)
    assert _cli(tmp_path, "reconcile", "--yes") == ExitCode.LOCKED
    reconcile_id = _newest(tmp_path).id
    assert _unfinished(tmp_path) == [op_id]
    assert _lease_calls(scripted, since) == [("lease.yml", ("n1", "n2"), op_id, [reconcile_id])]


def test_a_reconcile_undoes_a_host_whose_node_step_still_runs_after_that_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """n2 reads on its baseline but busy: the reconcile's undo takes it too and waits for its lock as long as
    a deploy step can hold it (as for a host cut off mid-step), so a switch the step makes after the read is
    returned as well. Before, n2 was left alone as on its baseline and the rollout concluded."""
    op_id, scripted = _stopped_in_batch_1(tmp_path, monkeypatch, BusyAfterTheRollout)
    back = {h: answered(h, "rolled_back", before="2.0.0", after="1.0.0") for h in ("n1", "n2")}
    scripted.script = {
        **scripted.script,
        ("rollback.yml", ("n1",)): {"n1": back["n1"]},
        ("rollback.yml", ("n1", "n2")): back,
    }
    assert _cli(tmp_path, "reconcile", "--yes") == ExitCode.OK
    (undo,) = [c for c in scripted.calls if c[0] == "rollback.yml"]
    assert undo[1] == ("n1", "n2")
    spec = load_spec(tmp_path / "fleet.yml", work_dir=tmp_path / "work")
    assert undo[2]["solfleet_lock_timeout_s"] == deploy_step_lock_s(spec)
    assert _unfinished(tmp_path) == []


def test_a_host_with_no_release_before_whose_node_step_still_runs_stays_owed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first deploy: n2, with nothing before the rollout, reads no release but busy. Nothing can return it
    and its step may still activate 2.0.0: the reconcile leaves it, says why, and the rollout stays
    unfinished, n2's lease kept. Before, n2 counted as on its baseline and the rollout was concluded."""
    links: dict[str, tuple[str | None, str | None]] = dict.fromkeys(("n1", "n2", "n3"), (None, None))
    op_id, scripted = _stopped_in_batch_1(tmp_path, monkeypatch, BusyAfterTheRollout, links=links)
    since = len(scripted.calls)
    assert _cli(tmp_path, "reconcile", "--yes") == ExitCode.OPERATION_FAILED
    assert "rollback.yml" not in [c[0] for c in scripted.calls[since:]]
    message = _newest(tmp_path).message
    assert "n2: none as read, but a node step is still running there (its deploy lock is held)" in message
    assert _unfinished(tmp_path) == [op_id]
    assert ("lease.yml", ("n2",), op_id, [_newest(tmp_path).id]) in _lease_calls(scripted, since)
    spec = load_spec(tmp_path / "fleet.yml", work_dir=tmp_path / "work")
    with Ledger(ledger_path(spec)) as ledger:  # the record says so too, and wants no version of n2
        (row,) = [h for h in ledger.host_outcomes(_newest(tmp_path).id) if h.host == "n2"]
        assert (row.step, row.outcome, row.version_after) == ("undo", "not_finished", None)
        assert "a node step is still running there" in row.message


def test_a_rollback_keeps_owing_a_host_whose_node_step_still_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """n2 reads busy on its baseline; the reconcile run first cannot take n2 (its step holds the lock past
    the undo's wait), and the rollback's own step there is refused the same way. n2 still owes the rollout:
    the rollback keeps its lease as the rollout's, does not conclude it, and its message says why. Before,
    the reconcile left n2 alone as on its baseline and concluded the rollout."""
    op_id, scripted = _stopped_in_batch_1(tmp_path, monkeypatch, BusyAfterTheRollout)
    locked = answered("n2", "refused", before="1.0.0", after="1.0.0")
    back = answered("n1", "rolled_back", before="2.0.0", after="1.0.0")
    scripted.script = {
        **scripted.script,
        ("rollback.yml", ("n1",)): {"n1": back},
        ("rollback.yml", ("n1", "n2")): {"n1": back, "n2": locked},
        ("rollback.yml", ("n1", "n2", "n3")): {
            "n1": answered("n1", "unchanged", before="1.0.0", after="1.0.0"),
            "n2": locked,
            "n3": answered("n3", "unchanged", before="1.0.0", after="1.0.0"),
        },
    }
    since = len(scripted.calls)
    assert _cli(tmp_path, "rollback", "--to", "1.0.0", "--yes") == ExitCode.OPERATION_FAILED
    rollback = _newest(tmp_path)
    assert rollback.kind == "rollback" and _unfinished(tmp_path) == [op_id]
    assert ("lease.yml", ("n2",), op_id, [rollback.id]) in _lease_calls(scripted, since)
    owed = f"unfinished {op_id} stays unfinished (still owes n2 a return to its baseline; n2: a node step"
    why = "at this rollback's lease read (its deploy lock was held)"
    assert owed in rollback.message and why in rollback.message, rollback.message


def test_a_controller_error_mid_rollout_is_exit_1_and_owed_to_reconcile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The controller's disk fills during batch 1, after the canary activated: one line naming the error,
    exit 1 (not 2, "nothing was touched"), and the row is failed and unfinished, so the next run returns n1
    to its baseline (before, the row owed nothing and the policy never ran)."""
    full = OSError(28, "No space left on device", str(tmp_path / "work" / "runs"))
    script = {**CANARY_OK, ("deploy.yml", ("n2", "n3")): full}
    with pytest.raises(ControllerError) as caught:
        run_deploy(tmp_path, monkeypatch, "rollback_fleet", script)
    assert caught.value.exit_code is ExitCode.OPERATION_FAILED
    message = str(caught.value)
    assert "\n" not in message and "OSError: [Errno 28] No space left on device" in message
    assert "`solfleet reconcile`" in message
    (pending,) = _unfinished(tmp_path)
    spec = load_spec(tmp_path / "fleet.yml", work_dir=tmp_path / "work")
    with Ledger(ledger_path(spec)) as ledger:
        row = ledger.operation(pending)
        assert (
            row is not None and row.status == "failed" and row.message.startswith("controller error: OSError")
        )


def test_an_interrupted_rollback_is_never_undone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C while a rollback runs, after n1 went back to 1.0.0: the rollback is the escape hatch, so the
    row owes nothing and no later run returns n1 forward to the 2.0.0 being escaped."""
    (tmp_path / "fleet.yml").write_text(embedded_fleet().read_text())
    spec = load_spec(tmp_path / "fleet.yml", work_dir=tmp_path / "work")
    back = answered("n1", "rolled_back", before="2.0.0", after="1.0.0")
    cut = Interrupted("interrupted", progress={"n1": back})
    scripted = ScriptedRunner(
        {("rollback.yml", ("n1", "n2", "n3")): cut}, {h: ("2.0.0", "1.0.0") for h in ("n1", "n2", "n3")}
    )
    monkeypatch.setattr(runner, "run_playbook", scripted)
    with pytest.raises(Interrupted):
        rollback(spec, plan_rollback(list(spec.nodes), spec.rollout, to=None))
    with Ledger(ledger_path(spec)) as ledger:
        (op,) = ledger.operations()
        assert op.status == "interrupted" and op.recovered_by == op.id
    assert _unfinished(tmp_path) == [] and scripted.links["n1"][0] == "1.0.0"


class SilentAtLease(ScriptedRunner):
    """n2 does not answer the first lease call (the baseline read), then answers everything."""

    def _read(self, host: str) -> HostProgress:
        first_lease = [c[0] for c in self.calls].count("lease.yml") == 1 and self.calls[-1][0] == "lease.yml"
        if host == "n2" and first_lease:
            return HostProgress(host=host, status=HostStatus.UNREACHABLE, message="ssh: connect timed out")
        return super()._read(host)


def test_a_host_silent_when_the_leases_were_taken_is_never_deployed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """n2 missed the lease call, then answers by batch 1: it holds no lease of this rollout and has no
    baseline, so batch 1 deploys n3 alone and counts n2 unreachable (unreachable: fail, max_failures 0), and
    the policy returns n1 and n3. Before, n2 was deployed without a lease, and left on the rejected
    release when the batch failed."""
    script = {
        **CANARY_OK,
        ("deploy.yml", ("n3",)): {"n3": answered("n3", "activated", before="1.0.0", after="2.0.0")},
        ("rollback.yml", ("n1", "n3")): {
            h: answered(h, "rolled_back", before="2.0.0", after="1.0.0") for h in ("n1", "n3")
        },
    }
    result, op, rows, scripted = run_deploy(
        tmp_path, monkeypatch, "rollback_fleet", script, runner_class=SilentAtLease
    )
    assert [c[1] for c in scripted.calls if c[0] == "deploy.yml"] == [("n1",), ("n3",)]
    assert scripted.links["n2"] == ("1.0.0", None)
    assert {h: scripted.links[h][0] for h in ("n1", "n3")} == {"n1": "1.0.0", "n3": "1.0.0"}
    n2 = rows[("batch 1", "n2")]
    assert (n2.outcome, n2.failed_phase) == ("unreachable", "lease")
    assert op.status == "rolled_back" and result.exit_code is ExitCode.UNREACHABLE
    assert "n2: lease: did not answer when this rollout took its leases" in op.message


def test_an_interrupted_batch_undoes_its_hosts_mid_step_after_their_node_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C during batch 1: n2 had activated, n3 was mid-verify (its node module runs on under the node's
    lock and may still activate). The policy's undo takes n3 too, although its state read shows the
    baseline, and waits for its lock as long as a deploy step can hold it (before, n3 was left alone and
    could activate after the rollout was recorded as returned)."""
    mid = HostProgress(host="n3", status=HostStatus.RUNNING, task="solfleet | Verify release")
    cut = Interrupted(
        "interrupted", progress={"n2": answered("n2", "activated", before="1.0.0", after="2.0.0"), "n3": mid}
    )
    undo = {h: answered(h, "rolled_back", before="2.0.0", after="1.0.0") for h in ("n1", "n2")}
    undo["n3"] = answered("n3", "unchanged", before="1.0.0", after="1.0.0")
    script = {**CANARY_OK, ("deploy.yml", ("n2", "n3")): cut, ("rollback.yml", ("n1", "n2", "n3")): undo}
    result, op, rows, scripted = run_deploy(tmp_path, monkeypatch, "rollback_fleet", script)
    assert result.exit_code is ExitCode.INTERRUPTED and op.status == "interrupted"
    assert rows[("batch 1", "n3")].outcome == "interrupted"
    (undo_call,) = [c for c in scripted.calls if c[0] == "rollback.yml"]
    assert undo_call[1] == ("n1", "n2", "n3")
    spec = load_spec(tmp_path / "fleet.yml", work_dir=tmp_path / "work")
    # the deploy step's own bound: the role's lock wait 60 + verify_s + health 120 + 300 (no gates here)
    assert undo_call[2]["solfleet_lock_timeout_s"] == 60 + spec.timeouts.verify_s + 120 + 300
    assert op.recovered_by == op.id and _unfinished(tmp_path) == []


def test_reconcile_leaves_a_host_another_operation_moved_since(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rollout is unfinished (n1 refused its undo), and by the time reconcile runs n1 is on 3.0.0, put
    there by another operation (another controller's rollout): reconcile does not take it back past that
    one to this rollout's baseline. It says so, records n1 `kept`, and the unfinished row is done."""
    _op, scripted, _script = _unfinished_by_a_refused_undo(tmp_path, monkeypatch)
    scripted.links["n1"] = ("3.0.0", "2.0.0")
    calls = len(scripted.calls)
    assert _cli(tmp_path, "reconcile", "--yes") == ExitCode.OPERATION_FAILED
    assert "rollback.yml" not in [c[0] for c in scripted.calls[calls:]]
    assert scripted.links["n1"] == ("3.0.0", "2.0.0") and _unfinished(tmp_path) == []
    spec = load_spec(tmp_path / "fleet.yml", work_dir=tmp_path / "work")
    with Ledger(ledger_path(spec)) as ledger:
        (recon,) = [o for o in ledger.operations() if o.kind == "reconcile"]
        assert "n1: 3.0.0 (moved by another operation since: left where it is)" in recon.message
        kept = [h for h in ledger.host_outcomes(recon.id) if h.host == "n1"]
        assert [(h.outcome, h.version_after) for h in kept] == [("kept", "3.0.0")]
        # this ledger never deployed 3.0.0: the note does not make it what status calls in sync for n1
        assert ledger.artifact_sha("3.0.0") is None and ledger.desired_versions()["n1"] != "3.0.0"


def test_rollback_runs_even_when_an_unfinished_rollout_cannot_be_returned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """n1 keeps refusing its undo, so the return of the unfinished rollout fails again; `rollback`, the
    escape hatch, still runs (before, one node that never answered held every rollback back)."""
    op, scripted, script = _unfinished_by_a_refused_undo(tmp_path, monkeypatch)
    back = {"n1": answered("n1", "rolled_back", before="2.0.0", after="1.0.0")}
    back |= {h: answered(h, "unchanged", before="1.0.0", after="1.0.0") for h in ("n2", "n3")}
    script[("rollback.yml", ("n1", "n2", "n3"))] = back
    assert _cli(tmp_path, "rollback", "--yes") == ExitCode.OK
    assert [c[1] for c in scripted.calls if c[0] == "rollback.yml"][-2:] == [("n1",), ("n1", "n2", "n3")]
    assert scripted.links["n1"][0] == "1.0.0"


def test_a_node_taken_out_of_the_spec_no_longer_holds_its_rollout_unfinished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The canary n1 refused its undo and then died for good; the operator takes it out of the fleet spec.
    reconcile returns the rest, names n1 as no longer in the spec, and the rollout owes nothing more."""
    op, scripted, _script = _unfinished_by_a_refused_undo(tmp_path, monkeypatch)
    spec_file = tmp_path / "fleet.yml"
    data = yaml.safe_load(spec_file.read_text())
    data["nodes"] = [n for n in data["nodes"] if n["name"] != "n1"]
    data["nodes"][0]["labels"] = ["canary"]  # the canary label goes with it: n2 takes it
    spec_file.write_text(yaml.safe_dump(data))
    calls = len(scripted.calls)
    assert _cli(tmp_path, "reconcile", "--yes") == ExitCode.OPERATION_FAILED  # n1 is not on its baseline
    assert all("n1" not in c[1] for c in scripted.calls[calls:])
    assert _unfinished(tmp_path) == []
    spec = load_spec(spec_file, work_dir=tmp_path / "work")
    with Ledger(ledger_path(spec)) as ledger:
        (recon,) = [o for o in ledger.operations() if o.kind == "reconcile"]
        assert "n1: not returned: no longer in the fleet spec" in recon.message


def test_a_rollout_whose_hosts_all_left_the_spec_is_finished_without_a_node_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every host of the unfinished rollout is gone from the spec (the fleet was renamed): reconcile names
    them and finishes without running anything (an empty --limit would have leased every node)."""
    op, scripted, _script = _unfinished_by_a_refused_undo(tmp_path, monkeypatch)
    spec_file = tmp_path / "fleet.yml"
    data = yaml.safe_load(spec_file.read_text())
    for node in data["nodes"]:
        node["name"] = node["name"].replace("n", "m")
    spec_file.write_text(yaml.safe_dump(data))
    calls = len(scripted.calls)
    assert _cli(tmp_path, "reconcile", "--yes") == ExitCode.OPERATION_FAILED  # they are not on the baseline
    assert scripted.calls[calls:] == [] and _unfinished(tmp_path) == []

"""End-to-end: the `solfleet` CLI deploys, rolls back and reports on 3 real sshd nodes on 127.0.0.1.

The tests run in file order and build on each other (a fleet has history): first deploy, a second version,
rollback, rollback --to, idempotence, status, tamper, unreachable, bad specs. Each one asserts what it
needs from the nodes' filesystems, not from what the CLI says about them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_driver import CliResult, E2EFleet

pytestmark = pytest.mark.e2e

V1, V2, V3, V4 = "1.0.0", "1.1.0", "1.2.0", "1.3.0"
NODES = ("node01", "node02", "node03")


def _assert_ok(result: CliResult, what: str) -> None:
    assert result.rc == 0, f"{what} exited {result.rc}:\n{result.output[-3000:]}"


def test_first_deploy_activates_v1_on_every_node(e2e: E2EFleet) -> None:
    result = e2e.deploy(V1)
    _assert_ok(result, f"deploy {V1}")
    for node in NODES:
        root = e2e.root(node)
        assert os.readlink(root / "current") == f"releases/{V1}"
        assert (root / "current").resolve() == (root / "releases" / V1).resolve()
        assert e2e.link(node, "previous") is None
        assert e2e.verified(node, V1), f"{node}: releases/{V1}/verify/verify.json missing or not ok"
        verify = json.loads((root / "releases" / V1 / "verify" / "verify.json").read_text())
        assert verify["simulated"] is True
        events = [(e["event"], e["version"]) for e in e2e.journal(node)]
        # write-ahead: the switch is journaled before it is made, confirmed after, and health closes it
        assert events == [
            ("staged", V1),
            ("verified", V1),
            ("switching", V1),
            ("activated", V1),
            ("healthy", V1),
        ], events
        assert all(e["simulated"] is True for e in e2e.journal(node))
        assert not list((root / "releases").glob("*.partial")), "a .partial dir survived a successful deploy"
        # nothing the node ran wrote into the verified release (bytecode and numba caches live elsewhere)
        assert not list((root / "releases" / V1).rglob("__pycache__"))


def test_second_version_sets_previous(e2e: E2EFleet) -> None:
    _assert_ok(e2e.deploy(V2), f"deploy {V2}")
    for node in NODES:
        assert e2e.link(node, "current") == V2
        assert e2e.link(node, "previous") == V1
        assert [(e["event"], e["version"]) for e in e2e.journal(node)[-2:]] == [
            ("activated", V2),
            ("healthy", V2),
        ]


def test_redeploy_of_current_version_changes_nothing(e2e: E2EFleet) -> None:
    before = {node: e2e.journal(node) for node in NODES}
    _assert_ok(e2e.deploy(V2), f"re-deploy {V2}")
    op = e2e.last_operation()
    stats = e2e.run_stats(op["id"])
    assert set(stats) == set(NODES), stats
    for node in NODES:
        assert stats[node].get("changed", 0) == 0, f"{node} reported changed on a re-deploy: {stats[node]}"
        assert stats[node].get("failures", 0) == 0
        assert e2e.link(node, "current") == V2
        assert e2e.journal(node) == before[node], "an already-current deploy must not journal anything"
    with e2e.ledger() as conn:
        outcomes = {
            r["host"]: r["outcome"]
            for r in conn.execute(
                "SELECT host, outcome FROM host_outcomes WHERE operation_id = ?", (op["id"],)
            )
        }
    assert outcomes == dict.fromkeys(NODES, "already_current")


def test_rollback_returns_every_node_to_v1_and_ledger_holds_both(e2e: E2EFleet) -> None:
    deploy_op = e2e.last_operation()
    _assert_ok(e2e.cli("rollback", "--yes"), "rollback")
    for node in NODES:
        root = e2e.root(node)
        assert (root / "current").resolve() == (root / "releases" / V1).resolve()
        assert e2e.link(node, "previous") == V2
        moved, health = e2e.journal(node)[-2:]
        assert (moved["event"], moved["version"]) == ("rolled_back", V1)
        assert (health["event"], health["version"]) == ("healthy", V1)
    rollback_op = e2e.last_operation()
    assert rollback_op["kind"] == "rollback" and rollback_op["id"] != deploy_op["id"]
    with e2e.ledger() as conn:
        kinds = [r["kind"] for r in conn.execute("SELECT kind FROM operations ORDER BY started, rowid")]
        assert kinds.count("deploy") >= 2 and "rollback" in kinds, kinds
        for op_id, expected in ((rollback_op["id"], "rolled_back"),):
            rows = conn.execute(
                "SELECT host, outcome, version_after FROM host_outcomes WHERE operation_id = ?", (op_id,)
            ).fetchall()
            assert {r["host"]: r["outcome"] for r in rows} == dict.fromkeys(NODES, expected)
            assert {r["version_after"] for r in rows} == {V1}
        v2_rows = conn.execute(
            "SELECT h.host, h.outcome FROM host_outcomes h JOIN operations o ON o.id = h.operation_id"
            " WHERE o.kind = 'deploy' AND o.version = ? AND h.outcome = 'activated'",
            (V2,),
        ).fetchall()
        assert {r["host"] for r in v2_rows} == set(NODES)


def test_rollback_again_is_a_no_op(e2e: E2EFleet) -> None:
    journals = {node: e2e.journal(node) for node in NODES}
    _assert_ok(e2e.cli("rollback", "--yes"), "second rollback")
    for node in NODES:
        assert e2e.link(node, "current") == V1, "a repeated plain rollback flipped forward again"
        assert e2e.journal(node) == journals[node]


def test_rollback_to_named_version(e2e: E2EFleet) -> None:
    _assert_ok(e2e.cli("rollback", "--to", V2, "--yes"), f"rollback --to {V2}")
    for node in NODES:
        assert e2e.link(node, "current") == V2
        assert e2e.link(node, "previous") == V1
    refused = e2e.cli("rollback", "--to", "9.9.9", "--yes")
    # docs/cli.md: 1 = an operation failed on a host (the node refused the target)
    assert refused.rc == 1, f"rollback to a version no node has must exit 1, got {refused.rc}"
    assert "9.9.9" in refused.output and "not a verified release" in refused.output, refused.output[-2000:]
    for node in NODES:
        assert e2e.link(node, "current") == V2, "a refused rollback moved current"
    # `--to V2` was not a plain rollback, so the repeat no-op rule must not apply: plain goes to V2's previous
    _assert_ok(e2e.cli("rollback", "--yes"), f"plain rollback after --to {V2}")
    for node in NODES:
        assert e2e.link(node, "current") == V1, "a plain rollback after --to was a no-op"
        assert e2e.link(node, "previous") == V2
    _assert_ok(e2e.cli("rollback", "--to", V1, "--yes"), f"rollback --to {V1}")
    assert all(e2e.link(node, "current") == V1 for node in NODES)


def test_status_json_agrees_with_node_filesystems(e2e: E2EFleet) -> None:
    result = e2e.cli("status", "--json")
    _assert_ok(result, "status --json")
    status = json.loads(result.stdout)
    records = {r["name"]: r for r in status["nodes"]}
    assert set(records) == set(NODES)
    for node in NODES:
        record = records[node]
        assert record["current"] == e2e.link(node, "current")
        assert record["previous"] == e2e.link(node, "previous")
        on_disk = [v for v in e2e.releases(node) if e2e.verified(node, v)]
        assert sorted(record["releases"]) == sorted(on_disk)
        current = record["current"]
        assert record["current_verified"] is bool(current and e2e.verified(node, current))
        assert record["drift"] != "unverified" or not record["current_verified"]
        # the stack current was built for, as its MANIFEST on the node says
        manifest = json.loads((e2e.root(node) / "releases" / current / "MANIFEST.json").read_text())
        assert record["stack_id"] == manifest["stack_id"] and record["spec_stack_id"], record
        # what the node's verify found auto runs there (simulated nodes: no fallback, every tier simulated)
        verify = json.loads((e2e.root(node) / "releases" / current / "verify" / "verify.json").read_text())
        assert {r["tier"] for r in verify["coverage"]["rows"]} == {"simulated"}, verify["coverage"]
        assert record["fallback_only"] == verify["coverage"]["fallback_only"] == [], record
        last = e2e.journal(node)[-1]
        assert record["last_event"]["event"] == last["event"]
        assert record["last_event"]["version"] == last["version"]


def test_status_names_the_ops_a_node_runs_only_on_a_fallback(e2e: E2EFleet) -> None:
    # what a cc 8.x node's verify writes (bf16 gemm has tensor-core code for cc 9.0 only), on one node
    node = NODES[-1]
    current = e2e.link(node, "current")
    path = e2e.root(node) / "releases" / current / "verify" / "verify.json"
    original = path.read_text()
    record = json.loads(original)
    record["coverage"]["fallback_only"] = ["gemm bfloat16", "o_proj bfloat16"]
    path.write_text(json.dumps(record))
    try:
        text = e2e.cli("status")
        as_json = e2e.cli("status", "--json")
    finally:
        path.write_text(original)
    nodes = {r["name"]: r for r in json.loads(as_json.stdout)["nodes"]}
    assert nodes[node]["fallback_only"] == ["gemm bfloat16", "o_proj bfloat16"]
    assert all(nodes[n]["fallback_only"] == [] for n in NODES[:-1]), nodes
    flat = " ".join(text.stdout.split())
    assert f"{node}: {current} runs only a fallback kernel for gemm bfloat16, o_proj bfloat16" in flat, flat
    assert text.rc == as_json.rc == 0, text.output  # informational: the fleet stays in sync, exit 0


def test_tampered_staged_release_is_refused_on_that_node_only(e2e: E2EFleet) -> None:
    _assert_ok(e2e.deploy(V3, "--stage"), f"deploy --stage {V3}")
    for node in NODES:
        assert e2e.verified(node, V3), f"{node}: {V3} not staged and verified"
        assert e2e.link(node, "current") == V1, "--stage must not switch current"
    victim = "node02"
    target = e2e.root(victim) / "releases" / V3 / "kernels" / "__init__.py"
    # Verified releases are read-only on the node; an attacker (or a bad disk) does not care.
    target.chmod(0o644)
    target.write_text(target.read_text() + "\n# tampered\n")

    result = e2e.deploy(V3)
    assert result.rc != 0, "a fleet with a refused node must not report success"
    assert victim in result.output and "sha256 mismatch" in result.output, result.output[-3000:]
    assert e2e.link(victim, "current") == V1, "the tampered node left its prior release"
    assert not (e2e.root(victim) / "releases" / V3).exists(), "the never-activated tampered release was kept"
    last = e2e.journal(victim)[-1]
    assert last["event"] == "failed" and last["version"] == V3 and "sha256 mismatch" in str(last["detail"])
    # on_failure: halt -> the other nodes of the batch proceed and stay on V3
    for node in NODES:
        if node != victim:
            assert e2e.link(node, "current") == V3
            assert e2e.link(node, "previous") == V1
    op = e2e.last_operation()
    with e2e.ledger() as conn:
        rows = {
            r["host"]: r
            for r in conn.execute("SELECT * FROM host_outcomes WHERE operation_id = ?", (op["id"],))
        }
    assert rows[victim]["outcome"] == "refused"
    assert "sha256 mismatch" in rows[victim]["message"]
    # every node is where the ledger wants it (the victim on its prior release), not all on one: split
    status = e2e.cli("status")
    assert status.rc == 8 and "split" in status.output, status.output[-3000:]


def test_unreachable_node_fails_cleanly(e2e: E2EFleet) -> None:
    down = "node03"
    before = e2e.tree(down)
    e2e.sshd.stop_node(down)
    try:
        result = e2e.deploy(V4)
    finally:
        e2e.sshd.restart_node(down)
    # docs/cli.md: 3 = the only failures were unreachable hosts
    assert result.rc == 3, f"a deploy whose only failure is an unreachable node must exit 3, got {result.rc}"
    assert down in result.output and "unreachable" in result.output.lower(), result.output[-3000:]
    assert e2e.tree(down) == before, "the unreachable node's root changed"
    for node in NODES:
        current = e2e.link(node, "current")
        assert current is not None and e2e.verified(node, current), f"{node} is not on a verified release"
        assert not list((e2e.root(node) / "releases").glob("*.partial"))
    # back up, the node is where the ledger left it (its prior release), the others on V4: split, exit 8
    status = e2e.cli("status")
    assert status.rc == 8 and "split" in status.output, status.output[-3000:]
    op = e2e.last_operation()
    with e2e.ledger() as conn:
        rows = {
            r["host"]: r["outcome"]
            for r in conn.execute(
                "SELECT host, outcome FROM host_outcomes WHERE operation_id = ?", (op["id"],)
            )
        }
    assert rows.get(down) == "unreachable", rows


# mistake -> (how to make it, the field path and the bad value the one error line must name)
BAD_SPECS: dict[str, tuple[Callable[[dict[str, Any]], None], str, str]] = {
    "unknown key": (lambda s: s["defaults"].update(colour="blue"), "defaults.colour", "colour"),
    "duplicate node name": (lambda s: s["nodes"].append(dict(s["nodes"][0])), "nodes[3].name", "node01"),
    "relative root": (lambda s: s["nodes"][0].update(root="relative/root"), "nodes[0].root", "relative/root"),
    "root with ..": (lambda s: s["nodes"][1].update(root="/tmp/../etc"), "nodes[1].root", "/tmp/../etc"),
    "port out of range": (lambda s: s["nodes"][0].update(port=70000), "nodes[0].port", "70000"),
    "port wrong type": (lambda s: s["nodes"][2].update(port="twenty-two"), "nodes[2].port", "twenty-two"),
    "bad connection": (lambda s: s["defaults"].update(connection="telnet"), "defaults.connection", "telnet"),
    "bad compute capability": (
        lambda s: s["defaults"].update(gpu={"count": 1, "model": "H200", "cc": "nine"}),
        "defaults.gpu.cc",
        "nine",
    ),
    "bad on_failure": (lambda s: s["rollout"].update(on_failure="panic"), "rollout.on_failure", "panic"),
}


@pytest.mark.parametrize("mistake", sorted(BAD_SPECS))
def test_bad_spec_exits_2_and_touches_no_node(e2e: E2EFleet, tmp_path: Path, mistake: str) -> None:
    spec = e2e.sshd.spec()
    mutate, field, value = BAD_SPECS[mistake]
    mutate(spec)
    path = tmp_path / "bad.yml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    before = {node: e2e.tree(node) for node in NODES}
    result = e2e.cli("deploy", "--version", V2, "--artifact", str(e2e.artifact(V2)), "--yes", spec=path)
    assert result.rc == 2, f"{mistake}: exit {result.rc}\n{result.output[-2000:]}"
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"{mistake}: expected one line on stderr, got {lines}"
    assert field in lines[0] and value in lines[0], (
        f"{mistake}: the line must name {field} and {value!r}: {lines[0]}"
    )
    assert {node: e2e.tree(node) for node in NODES} == before, f"{mistake}: a node was touched"


def test_bad_version_string_exits_2(e2e: E2EFleet) -> None:
    before = {node: e2e.tree(node) for node in NODES}
    result = e2e.cli("deploy", "--version", "../1.0", "--artifact", str(e2e.artifact(V2)), "--yes")
    assert result.rc == 2, result.output[-2000:]
    assert {node: e2e.tree(node) for node in NODES} == before

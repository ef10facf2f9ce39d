"""Fleet spec validation: every mistake is one line naming the field path, the bad value and what is
allowed; through the CLI it exits 2 and creates nothing."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest

from fleet.errors import SpecError, UsageError
from fleet.policy import OnFailure
from fleet.spec import Connection, embedded_fleet, load_spec, project_root

VALID = {
    "fleet": "t",
    "defaults": {
        "connection": "ssh",
        "user": "ops",
        "python": "/usr/bin/python3",
        "ssh": {"private_key_file": "keys/id", "known_hosts_file": "/etc/kh"},
    },
    "nodes": [
        {
            "name": "a1",
            "host": "10.0.0.1",
            "labels": ["canary"],
            "gpu": {"count": 8, "model": "H200", "cc": "9.0"},
        },
        {"name": "a2", "host": "10.0.0.2", "port": 2222},
        {"name": "a3", "host": "10.0.0.3", "root": "/srv/solfleet"},
    ],
    "stack": {"python": "3.11", "numba": "0.68.*", "numba_cuda": "0.30.4", "numpy": "2.4.*"},
    "rollout": {"canary": {"labels": ["canary"]}, "batches": [1, "50%"], "max_failures": 0},
}


def mutate(path: str, value: object) -> dict:
    """Copy VALID and set `a.b[2].c` to value (`<del>` removes the key)."""
    data = copy.deepcopy(VALID)
    keys = path.replace("]", "").replace("[", ".").split(".")
    cur: object = data
    for k in keys[:-1]:
        cur = cur[int(k)] if isinstance(cur, list) else cur.setdefault(k, {})
    last = keys[-1]
    if value == "<del>":
        del cur[last]
    elif isinstance(cur, list):
        cur[int(last)] = value
    else:
        cur[last] = value
    return data


def test_valid_spec_resolves_defaults_and_paths(tmp_path: Path, make_spec) -> None:
    spec = make_spec(copy.deepcopy(VALID))
    a1, a2, a3 = spec.nodes
    assert [n.name for n in spec.nodes] == ["a1", "a2", "a3"]
    assert a1.connection is Connection.SSH and a1.user == "ops" and a1.port == 22 and a2.port == 2222
    assert str(a1.root) == "/opt/solfleet" and str(a3.root) == "/srv/solfleet"
    # controller paths: relative to the spec file's directory; absolute ones kept
    assert a1.ssh.private_key_file == str(tmp_path / "keys" / "id")
    assert a1.ssh.known_hosts_file == "/etc/kh"
    assert a1.gpu is not None and a1.gpu.cc == "9.0" and a2.gpu is None
    assert spec.compute_capabilities == ("9.0",)
    assert spec.rollout.on_failure is OnFailure.ROLLBACK_FLEET and spec.rollout.batches == (1, "50%")
    assert len(spec.stack_id) == 12


def test_embedded_local_fleet_loads(tmp_path: Path) -> None:
    spec = load_spec(embedded_fleet(), work_dir=tmp_path)
    assert len(spec.nodes) == 3
    assert all(n.connection is Connection.LOCAL and n.simulated for n in spec.nodes)
    assert [str(n.root) for n in spec.nodes] == [str(tmp_path / "local-fleet" / f"n{i}") for i in (1, 2, 3)]
    assert all(n.python == sys.executable for n in spec.nodes)  # `python: auto`
    assert "auto" not in spec.stack.values()


def test_baremetal_example_loads(tmp_path: Path) -> None:
    spec = load_spec(project_root() / "inventory" / "fleets" / "baremetal.example.yml", work_dir=tmp_path)
    assert spec.compute_capabilities == ("8.0", "9.0")
    assert spec.gates.min_sol["gemm"] == 0.5


MISTAKES = [
    # (kind, field path to change, bad value, expected field in the message, expected "allowed" fragment)
    ("unknown top-level key", "colour", "blue", "colour", "unknown key; allowed keys: fleet"),
    ("unknown node key", "nodes[1].hots", "x", "nodes[1].hots", "unknown key"),
    ("port wrong type", "nodes[1].port", "22", "nodes[1].port", "integer 1..65535"),
    ("port out of range", "nodes[2].port", 70000, "nodes[2].port", "integer 1..65535"),
    ("port is a bool", "nodes[2].port", True, "nodes[2].port", "integer 1..65535"),
    ("relative root", "nodes[0].root", "opt/solfleet", "nodes[0].root", "absolute path"),
    ("root with ..", "nodes[2].root", "/srv/../etc", "nodes[2].root", "without `..`"),
    ("root is /", "defaults.root", "/", "defaults.root", "not `/`"),
    ("bad connection", "defaults.connection", "telnet", "defaults.connection", "one of: ssh, local"),
    ("bad cc", "nodes[0].gpu.cc", "9", "nodes[0].gpu.cc", "compute capability"),
    ("cc as a float", "nodes[0].gpu.cc", 9.0, "nodes[0].gpu.cc", "quoted"),
    (
        "bad on_failure",
        "rollout.on_failure",
        "panic",
        "rollout.on_failure",
        "rollback_fleet, rollback_batch, halt",
    ),
    ("bad batch percentage", "rollout.batches", [1, "150%"], "rollout.batches[1]", "percentage"),
    ("zero batch", "rollout.batches", [0], "rollout.batches[0]", "integer >= 1"),
    (
        "canary label unused",
        "rollout.canary",
        {"labels": ["nope"]},
        "rollout.canary.labels",
        "labels in use: canary",
    ),
    ("canary both", "rollout.canary", {"labels": ["canary"], "count": 1}, "rollout.canary", "exactly one"),
    ("bad version pin", "stack.numba", "latest!", "stack.numba", "version pin"),
    ("pin as a float", "stack.python", 3.12, "stack.python", "quoted"),
    ("bad node name", "nodes[1].name", "Bad Name", "nodes[1].name", "node name"),
    ("missing host", "nodes[1].host", "<del>", "nodes[1].host", "required for connection ssh"),
    ("missing python for ssh", "defaults.python", "<del>", "nodes[0].python", "required for connection ssh"),
    ("relative python", "defaults.python", "python3", "defaults.python", "absolute path"),
    ("keep_releases too small", "rollout.keep_releases", 1, "rollout.keep_releases", "integer 2..100"),
    (
        "unset env var",
        "nodes[0].root",
        "/srv/${NO_SUCH_VAR_SOLFLEET}",
        "nodes[0].root",
        "NO_SUCH_VAR_SOLFLEET is not set",
    ),
    ("labels not a list", "nodes[0].labels", "canary", "nodes[0].labels", "list of labels"),
    ("nodes empty", "nodes", [], "nodes", "non-empty list"),
    ("min_sol out of range", "gates.min_sol", {"gemm": 1.5}, "gates.min_sol.gemm", "number 0.0..1.0"),
    # the docs' old example gated `sgemm`, which is no op: the message lists the registry's ops
    ("min_sol unknown op", "gates.min_sol", {"sgemm": 0.5}, "gates.min_sol.sgemm", "allowed ops: cast,"),
    (
        "min_sol unknown dtype",
        "gates.min_sol",
        {"gemm": {"float8": 0.5}},
        "gates.min_sol.gemm.float8",
        "gemm has dtypes bfloat16, float16, float32",
    ),  # fmt: skip
    (
        "min_sol per-dtype out of range",
        "gates.min_sol",
        {"gemm": {"float16": 2}},
        "gates.min_sol.gemm.float16",
        "number 0.0..1.0",
    ),  # fmt: skip
]


@pytest.mark.parametrize(
    ("kind", "path", "value", "field", "allowed"), MISTAKES, ids=[m[0] for m in MISTAKES]
)
def test_each_mistake_is_one_line_naming_the_field(
    make_spec, kind: str, path: str, value: object, field: str, allowed: str
) -> None:
    with pytest.raises(SpecError) as info:
        make_spec(mutate(path, value))
    message = str(info.value)
    assert "\n" not in message
    assert f": {field}: " in message, message
    assert allowed in message, message


def test_min_sol_per_op_and_per_dtype(make_spec) -> None:
    spec = make_spec(mutate("gates.min_sol", {"gemm": {"float16": 0.3, "float32": 0.6}, "softmax": 0.7}))
    assert spec.gates.min_sol == {"gemm": {"float16": 0.3, "float32": 0.6}, "softmax": 0.7}
    assert spec.gates.bench_ops == "gemm,softmax"
    assert spec.gates.describe() == ["min_sol gemm.float16=0.3, gemm.float32=0.6, softmax=0.7"]


def test_unknown_gate_op_exits_2_naming_the_allowed_ops(spec_file, tmp_path: Path) -> None:
    import subprocess
    import sys

    from kernels.registry import all_ops

    path = spec_file(
        "fleet: t\nnodes:\n  - {name: a, connection: local, root: /tmp/a}\ngates:\n  min_sol: {sgemm: 0.5}\n"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fleet.cli",
            "--fleet",
            str(path),
            "--work-dir",
            str(tmp_path / "w"),
            "status",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "gates.min_sol.sgemm: 'sgemm' is not allowed; not a registered op; allowed ops: " in line
    assert line.endswith(", ".join(sorted(all_ops())))


def test_duplicate_node_names(make_spec) -> None:
    data = mutate("nodes[2].name", "a1")
    with pytest.raises(
        SpecError, match=r"nodes\[2\]\.name: 'a1' is not allowed; duplicate of nodes\[0\]\.name"
    ):
        make_spec(data)


def test_duplicate_yaml_key_is_reported_with_its_line(spec_file, tmp_path: Path) -> None:
    path = spec_file("fleet: t\nnodes:\n  - name: a\n    connection: local\n    name: b\n")
    with pytest.raises(SpecError, match=r"line 5: 'name' is not allowed; each key may appear once"):
        load_spec(path, work_dir=tmp_path)


def test_two_local_nodes_may_not_share_a_root(make_spec) -> None:
    data = {
        "fleet": "t",
        "defaults": {"connection": "local", "root": "/tmp/x"},
        "nodes": [{"name": "a"}, {"name": "b"}],
    }
    with pytest.raises(SpecError, match=r"nodes\[1\]\.root.*already uses this root"):
        make_spec(data)


def test_not_yaml(spec_file, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"not valid YAML at line [23]"):
        load_spec(spec_file("fleet: t\nnodes: [a, b\nrollout: {}\n"), work_dir=tmp_path)


# Through the real CLI, as a subprocess: exit 2, one line on stderr, no work dir created (nothing touched).
CLI_CASES = [
    ("port", "nodes[1].port", 0, ["deploy", "--version", "1.0.0", "--dry-run"]),
    ("unknown key", "rollout.serial", 2, ["render"]),
    ("relative root", "nodes[0].root", "rel/dir", ["status"]),
    ("bad batches", "rollout.batches", "all", ["deploy", "--version", "1.0.0", "--yes"]),
    ("dup name", "nodes[1].name", "a1", ["rollback", "--yes"]),
    ("bad cc", "nodes[0].gpu.cc", "9.x", ["build", "--version", "1.0.0"]),
    ("bad unreachable", "rollout.unreachable", "ignore", ["history"]),
    ("bad type gpu", "nodes[0].gpu", "H200", ["deploy", "--version", "1.0.0", "--dry-run"]),
]


@pytest.mark.parametrize(("kind", "path", "value", "argv"), CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_cli_exits_2_and_touches_nothing(spec_file, tmp_path: Path, kind, path, value, argv) -> None:
    spec = spec_file(mutate(path, value))
    work = tmp_path / "work"
    proc = subprocess.run(
        [sys.executable, "-m", "fleet.cli", "--fleet", str(spec), "--work-dir", str(work), *argv],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("solfleet: error: "), proc.stderr
    assert f"{path}: " in lines[0], proc.stderr  # the line names the bad field
    assert proc.stdout == ""
    assert not work.exists() and not (tmp_path / "dist").exists()


@pytest.mark.parametrize("version", ["1.0", "v1.0.0", "1.0.0/../x", "01.2.3", ""])
def test_bad_version_strings_exit_2(tmp_path: Path, version: str) -> None:
    from fleet.cli import main

    work = tmp_path / "work"
    code = main(["--work-dir", str(work), "build", "--version", version, "--out", str(tmp_path / "dist")])
    assert code == 2
    assert not work.exists() and not (tmp_path / "dist").exists()


def test_the_documented_example_is_valid(tmp_path: Path) -> None:
    """docs/fleet-spec.md's complete example must load as written."""
    import re

    import yaml

    from fleet.spec import parse_spec

    text = (project_root() / "docs" / "fleet-spec.md").read_text()
    example = text.split("## A complete example", 1)[1]
    block = re.search(r"```yaml\n(.*?)```", example, re.S)
    assert block is not None
    spec = parse_spec(
        yaml.safe_load(block.group(1)), source=tmp_path / "x.yml", label="doc", work_dir=tmp_path
    )
    assert [n.name for n in spec.nodes] == ["gpu-a01", "gpu-a02", "gpu-b01"]

"""CLI edges that need no Ansible run: dry run, confirmation, artifact checks, render, history, exit codes.
Each command runs as a real subprocess with its own work dir."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleet.artifact import tar_gz
from fleet.spec import project_root


def solfleet(*args: str, cwd: Path, work: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SOLFLEET_WORK"}
    return subprocess.run(
        [sys.executable, "-m", "fleet.cli", "--work-dir", str(work), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=120,
        input=stdin,
    )


@pytest.fixture
def fake_artifact(tmp_path: Path) -> Path:
    """A tarball with a MANIFEST claiming version 1.0.0 (deploy reads only the manifest before planning)."""
    dist = tmp_path / "dist"
    dist.mkdir()
    manifest = {"version": "1.0.0", "stack": {}, "stack_id": "x", "files": {}, "targets": []}
    path = dist / "solfleet-ops-1.0.0.tar.gz"
    path.write_bytes(tar_gz({"MANIFEST.json": json.dumps(manifest).encode()}, mtime=0))
    return path


def test_dry_run_prints_the_plan_and_touches_nothing(tmp_path: Path, fake_artifact: Path) -> None:
    work = tmp_path / "work"
    proc = solfleet("deploy", "--version", "1.0.0", "--dry-run", cwd=tmp_path, work=work)
    assert proc.returncode == 0, proc.stderr
    assert "canary   n1" in proc.stdout and "batch 1  n2, n3" in proc.stdout
    assert "on failure: rollback_fleet" in proc.stdout and "dry run: nothing was changed" in proc.stdout
    assert "differs from the spec" in proc.stdout  # the fake manifest's stack is not the spec's: a note
    assert not work.exists()  # no ledger, no run dir, no node root


def test_without_yes_and_without_a_terminal_it_refuses(tmp_path: Path, fake_artifact: Path) -> None:
    work = tmp_path / "work"
    proc = solfleet("deploy", "--version", "1.0.0", cwd=tmp_path, work=work, stdin="y\n")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "solfleet: error: refusing to deploy 1.0.0 to 3 node(s) without --yes: "
        "stdin is not a terminal to ask on"
    )
    assert not work.exists()
    proc = solfleet("rollback", cwd=tmp_path, work=work)
    assert proc.returncode == 2 and "without --yes" in proc.stderr and not work.exists()


def test_artifact_problems_exit_2(tmp_path: Path, fake_artifact: Path) -> None:
    work = tmp_path / "work"
    missing = solfleet("deploy", "--version", "2.0.0", "--yes", cwd=tmp_path, work=work)
    assert missing.returncode == 2
    assert "dist/solfleet-ops-2.0.0.tar.gz does not exist; build it with `solfleet build`" in missing.stderr
    wrong = solfleet(
        "deploy", "--version", "2.0.0", "--artifact", str(fake_artifact), "--yes", cwd=tmp_path, work=work
    )
    assert wrong.returncode == 2 and "holds version '1.0.0', not '2.0.0'" in wrong.stderr
    bad_limit = solfleet("deploy", "--version", "1.0.0", "--limit", "n9", "--yes", cwd=tmp_path, work=work)
    assert (
        bad_limit.returncode == 2 and "--limit: 'n9' matches no node; nodes: n1, n2, n3" in bad_limit.stderr
    )
    assert not work.exists()


def test_operator_strings_that_reach_ansible_are_data(tmp_path: Path, fake_artifact: Path) -> None:
    """--verify-ops and --artifact reach the nodes' playbooks as extra vars, which Ansible templates: an op
    name that is not registered, or a path with a Jinja2 opener, is one line and exit 2, nothing touched."""
    work = tmp_path / "work"
    evil = "{{ 6 * 7 }}"
    ops = solfleet(
        "deploy", "--version", "1.0.0", "--verify-ops", f"rmsnorm,{evil}", "--yes", cwd=tmp_path, work=work
    )
    assert ops.returncode == 2
    (line,) = ops.stderr.strip().splitlines()
    assert (
        line.startswith(f"solfleet: error: --verify-ops: {evil!r} is not an op; allowed: cast,")
        and "rmsnorm" in line
    )
    path = solfleet(
        "deploy", "--version", "1.0.0", "--artifact", f"/tmp/{evil}.tar.gz", "--yes", cwd=tmp_path, work=work
    )
    assert path.returncode == 2 and "--artifact: " in path.stderr and "holds a Jinja2 opener" in path.stderr
    assert not work.exists()
    # as the node reads the list: items stripped, empty ones ignored
    spaced = solfleet(
        "deploy",
        "--version",
        "1.0.0",
        "--verify-ops",
        "rmsnorm, softmax,",
        "--dry-run",
        cwd=tmp_path,
        work=work,
    )
    assert spaced.returncode == 0, spaced.stderr
    none = solfleet(
        "deploy", "--version", "1.0.0", "--verify-ops", " , ", "--dry-run", cwd=tmp_path, work=work
    )
    assert none.returncode == 2 and "names no op" in none.stderr


def test_argparse_errors_are_one_line_exit_2(tmp_path: Path) -> None:
    proc = solfleet("deploy", cwd=tmp_path, work=tmp_path / "w")
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "--version" in proc.stderr
    proc = solfleet("frobnicate", cwd=tmp_path, work=tmp_path / "w")
    assert proc.returncode == 2 and "invalid choice" in proc.stderr


def test_render_writes_a_private_data_dir(tmp_path: Path) -> None:
    out = tmp_path / "rendered"
    proc = solfleet("render", "--out", str(out), cwd=tmp_path, work=tmp_path / "work")
    assert proc.returncode == 0, proc.stderr
    assert (out / "inventory" / "hosts.yml").is_file() and (out / "env" / "envvars").is_file()
    assert (out / "project").resolve() == project_root() / "playbooks"
    assert str(out / "inventory" / "hosts.yml") in proc.stdout


def test_history_of_a_new_fleet_is_empty_json(tmp_path: Path) -> None:
    proc = solfleet("history", "--json", cwd=tmp_path, work=tmp_path / "work")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"operations": []}


def test_fleet_option_is_accepted_after_the_command(tmp_path: Path) -> None:
    spec = project_root() / "inventory" / "fleets" / "baremetal.example.yml"
    proc = solfleet(
        "render", "--fleet", str(spec), "--out", str(tmp_path / "r"), cwd=tmp_path, work=tmp_path / "w"
    )
    assert proc.returncode == 0, proc.stderr
    assert "gpu-b02" in (tmp_path / "r" / "inventory" / "hosts.yml").read_text()


def test_missing_controller_files_stop_a_real_run_before_anything(
    tmp_path: Path, fake_artifact: Path
) -> None:
    from fleet.spec import embedded_fleet

    spec = tmp_path / "fleet.yml"
    spec.write_text(
        embedded_fleet()
        .read_text()
        .replace('/local-fleet/n2"}', '/local-fleet/n2", python: /nonexistent/bin/python3}')
    )
    work = tmp_path / "work"
    proc = solfleet("--fleet", str(spec), "deploy", "--version", "1.0.0", "--yes", cwd=tmp_path, work=work)
    assert proc.returncode == 2
    assert "nodes[1].python (or defaults.python): '/nonexistent/bin/python3' is not allowed" in proc.stderr
    assert not work.exists()
    dry = solfleet("--fleet", str(spec), "deploy", "--version", "1.0.0", "--dry-run", cwd=tmp_path, work=work)
    assert dry.returncode == 0 and "a real run would stop here" in dry.stdout


def test_unwritable_controller_paths_are_one_line_exit_2(tmp_path: Path) -> None:
    """--out or --work-dir under a regular file: the path and the reason on one line, no traceback."""
    plain = tmp_path / "plain-file"
    plain.write_text("not a directory\n")
    cases = [
        (("render", "--out", str(plain / "rendered")), tmp_path / "w1", plain / "rendered"),
        (("build", "--version", "1.0.0", "--out", str(plain / "dist")), tmp_path / "w2", plain / "dist"),
        (("history",), plain / "work", plain / "work"),
    ]
    for argv, work, bad in cases:
        proc = solfleet(*argv, cwd=tmp_path, work=work)
        assert proc.returncode == 2, (argv, proc.stderr)
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith(f"solfleet: error: {bad}") and line.endswith(": Not a directory"), line
        assert proc.stdout == ""


@pytest.mark.parametrize("n", ["0", "-5", "x"])
def test_history_n_must_be_at_least_one(tmp_path: Path, n: str) -> None:
    work = tmp_path / "work"
    proc = solfleet("history", "-n", n, cwd=tmp_path, work=work)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert f"argument -n: {n}" in line.replace("'", "") and "expected N >= 1" in line
    assert not work.exists()


def test_deploy_plan_shows_each_nodes_performance_gates(tmp_path: Path, fake_artifact: Path) -> None:
    from fleet.spec import embedded_fleet

    work = tmp_path / "work"
    plain = solfleet("deploy", "--version", "1.0.0", "--dry-run", cwd=tmp_path, work=work)
    assert plain.returncode == 0, plain.stderr
    assert "gates" not in plain.stdout  # the embedded fleet sets correctness only
    spec = tmp_path / "fleet.yml"
    text = embedded_fleet().read_text()
    gates = "gates:\n  correctness: required\n"
    assert gates in text
    spec.write_text(
        text.replace(gates, gates + "  min_sol: {gemm: 0.5}\n  max_regression_vs_previous: 0.1\n")
    )
    gated = solfleet(
        "--fleet", str(spec), "deploy", "--version", "1.0.0", "--dry-run", cwd=tmp_path, work=work
    )
    assert gated.returncode == 0, gated.stderr
    # the embedded fleet's nodes are simulated: a performance gate is never `passed` there
    text = " ".join(gated.stdout.split())
    for node in ("n1", "n2", "n3"):
        assert f"on {node}: not_evaluated (" in text, text
    assert not work.exists()

"""The node side on its failure paths: real Ansible (ansible-runner, connection local) runs playbooks/*.yml
against node roots under tmp_path, with artifacts built by `solfleet build` and then damaged on purpose.

Every refusal must leave the node on its prior release, leave no `.partial` behind, and say why in one line
that names the node and the phase.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ansible_runner
import pytest
import yaml
from e2e_driver import REPO, break_residual_add, wrap_health

from fleet.status import SUSPECT_STATES, _move_detail, drift_of

# Real Ansible but no SSH (connection local): slow, not `e2e`.
pytestmark = pytest.mark.slow

PLAYBOOKS = REPO / "playbooks"
V1, V2 = "1.0.0", "2.0.0"


@dataclass
class PlayResult:
    status: str
    stats: dict[str, Any]
    results: dict[str, dict[str, Any]]  # host -> the node module's `solfleet` dict
    messages: dict[str, str]  # host -> msg of the last failed task


def run_play(tmp: Path, playbook: str, roots: dict[str, Path], **extra: Any) -> PlayResult:
    hosts = {
        name: {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "solfleet_root": str(root),
            "solfleet_python": sys.executable,
            "solfleet_simulated": True,
        }
        for name, root in roots.items()
    }
    pdd = tmp / "pdd"
    (pdd / "inventory").mkdir(parents=True, exist_ok=True)
    (pdd / "inventory" / "hosts.json").write_text(json.dumps({"all": {"hosts": hosts}}))
    env = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    runner = ansible_runner.run(
        private_data_dir=str(pdd),
        project_dir=str(PLAYBOOKS),
        playbook=playbook,
        extravars={"solfleet_verify_ops": "residual_add", **extra},
        envvars=env,
        quiet=True,
        timeout=300,
        cancel_callback=lambda: False,  # else ansible-runner takes over this test process's SIGINT
    )
    results: dict[str, dict[str, Any]] = {}
    messages: dict[str, str] = {}
    for event in runner.events:
        data = event.get("event_data", {})
        res = data.get("res") or {}
        if event.get("event") in ("runner_on_ok", "runner_on_failed") and "solfleet" in res:
            results[data["host"]] = res["solfleet"]
        if event.get("event") == "runner_on_failed":
            messages[data["host"]] = str(res.get("msg", ""))
    return PlayResult(runner.status, runner.stats or {}, results, messages)


def repack(
    src: Path,
    dst: Path,
    mutate: Callable[[Path], None] | None = None,
    *,
    fix_manifest: bool = True,
    extra_members: list[tarfile.TarInfo] | None = None,
) -> Path:
    """Unpack a real artifact, change it, and pack it again (re-hashing MANIFEST files when fix_manifest)."""
    work = dst.with_suffix(".d")
    with tarfile.open(src, "r:gz") as archive:
        archive.extractall(work, filter="data")
    if mutate:
        mutate(work)
    manifest = json.loads((work / "MANIFEST.json").read_text())
    if fix_manifest:
        manifest["files"] = {
            str(p.relative_to(work)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(work.rglob("*"))
            if p.is_file() and p.name != "MANIFEST.json"
        }
    (work / "MANIFEST.json").write_text(json.dumps(manifest, sort_keys=True))
    with tarfile.open(dst, "w:gz") as archive:
        for path in sorted(work.rglob("*")):
            archive.add(path, str(path.relative_to(work)), recursive=False)
        for member in extra_members or []:
            archive.addfile(member, io.BytesIO(b"x" * member.size) if member.isfile() else None)
    return dst


def failing_health(detail: str) -> Callable[[Path], None]:
    """A repack mutation: the release's `kernels health` fails once activated, with one injected check
    whose detail is `detail`."""

    def mutate(d: Path) -> None:
        wrap_health(
            d,
            "this release is unhealthy once activated",
            "    report = _real_run()\n"
            "    report['ok'] = False\n"
            "    report['checks'].append(\n"
            f"        {{'name': 'injected', 'status': 'failed', 'ok': False, 'detail': {detail!r}}}\n"
            "    )\n"
            "    return report\n",
        )

    return mutate


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def deploy_vars(version: str, artifact: Path, **extra: Any) -> dict[str, Any]:
    return {
        "solfleet_version": version,
        "solfleet_artifact": str(artifact),
        "solfleet_artifact_sha256": sha256(artifact),
        **extra,
    }


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Real artifacts of V1 and V2 from `solfleet build` (a spec without GPU targets: no PTX needed here)."""
    base = tmp_path_factory.mktemp("build")
    spec = base / "fleet.yml"
    spec.write_text(
        yaml.safe_dump(
            {
                "fleet": "node-module",
                "defaults": {"connection": "local", "simulated": True, "python": sys.executable},
                "stack": {"python": "auto", "numba": "auto", "numba_cuda": "auto", "numpy": "auto"},
                "nodes": [{"name": "n1", "root": str(base / "unused")}],
            }
        )
    )
    out = {}
    for version in (V1, V2):
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "fleet.cli",
                "--fleet",
                str(spec),
                "build",
                "--version",
                version,
                "--out",
                str(base / "dist"),
            ],
            cwd=REPO,
            env={**os.environ, "SOLFLEET_WORK": str(base / "work")},
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        out[version] = base / "dist" / f"solfleet-ops-{version}.tar.gz"
    return out


@pytest.fixture(scope="module")
def v1_template(tmp_path_factory: pytest.TempPathFactory, built: dict[str, Path]) -> Path:
    """A node root with V1 deployed for real, once; each test gets a copy (links are relative)."""
    base = tmp_path_factory.mktemp("template")
    root = base / "n1"
    first = run_play(base, "deploy.yml", {"n1": root}, **deploy_vars(V1, built[V1]))
    assert first.status == "successful", first.messages
    return root


@pytest.fixture
def node_on_v1(tmp_path: Path, v1_template: Path) -> Path:
    root = tmp_path / "n1"
    shutil.copytree(v1_template, root, symlinks=True)
    assert os.readlink(root / "current") == f"releases/{V1}"
    return root


def assert_refused_and_unchanged(
    result: PlayResult, root: Path, phase: str, needle: str, event: str = "refused"
) -> None:
    assert result.status == "failed"
    assert result.results["n1"]["failed_phase"] == phase, result.results["n1"]
    message = result.messages["n1"]
    assert "n1" in message and needle in message, message
    assert os.readlink(root / "current") == f"releases/{V1}", "the node left its prior release"
    assert not list((root / "releases").glob("*.partial")), "a .partial dir was left behind"
    assert sorted(p.name for p in (root / "releases").iterdir()) == [V1]
    # the node's own record says so too (issue: every refusal is journaled whenever the root exists)
    last = json.loads((root / "journal.jsonl").read_text().splitlines()[-1])
    assert last["event"] == event and last["version"] == V2 and needle in last["detail"], last


@pytest.mark.parametrize(
    ("kind", "member"),
    [
        ("dot-dot", tarfile.TarInfo("kernels/../../escaped.txt")),
        ("absolute", tarfile.TarInfo("/tmp/solfleet-absolute-escape.txt")),
        ("symlink", tarfile.TarInfo("kernels/link")),
        ("fifo", tarfile.TarInfo("kernels/fifo")),
    ],
)
def test_unsafe_member_refused_before_anything_is_written(
    tmp_path: Path, built: dict[str, Path], node_on_v1: Path, kind: str, member: tarfile.TarInfo
) -> None:
    if kind == "symlink":
        member.type, member.linkname = tarfile.SYMTYPE, "/etc/passwd"
    elif kind == "fifo":
        member.type = tarfile.FIFOTYPE
    else:
        member.size = 1
    bad = repack(built[V2], tmp_path / f"bad-{kind}.tar.gz", extra_members=[member])
    result = run_play(tmp_path, "deploy.yml", {"n1": node_on_v1}, **deploy_vars(V2, bad))
    assert_refused_and_unchanged(result, node_on_v1, "unpack_check", "refused")
    assert not (node_on_v1 / "escaped.txt").exists() and not (node_on_v1.parent / "escaped.txt").exists()
    assert not Path("/tmp/solfleet-absolute-escape.txt").exists()


def test_artifact_sha256_mismatch_refused(tmp_path: Path, built: dict[str, Path], node_on_v1: Path) -> None:
    result = run_play(
        tmp_path,
        "deploy.yml",
        {"n1": node_on_v1},
        **deploy_vars(V2, built[V2], solfleet_artifact_sha256="0" * 64),
    )
    # the push itself refuses: the bytes that arrived are not the controller's artifact, so none are written
    assert_refused_and_unchanged(result, node_on_v1, "push", "the controller's artifact")
    assert not (node_on_v1 / "artifacts" / built[V2].name).exists()
    assert not [p for p in (node_on_v1 / "artifacts").iterdir() if p.name.endswith(".tmp")]


def test_file_not_in_manifest_refused(tmp_path: Path, built: dict[str, Path], node_on_v1: Path) -> None:
    bad = repack(
        built[V2],
        tmp_path / "extra.tar.gz",
        lambda d: (d / "kernels" / "extra.py").write_text("x = 1\n"),
        fix_manifest=False,
    )
    result = run_play(tmp_path, "deploy.yml", {"n1": node_on_v1}, **deploy_vars(V2, bad))
    assert_refused_and_unchanged(
        result, node_on_v1, "unpack_check", "file not in MANIFEST.json: kernels/extra.py"
    )


def test_stack_pin_mismatch_refused(tmp_path: Path, built: dict[str, Path], node_on_v1: Path) -> None:
    def pin_old_numpy(d: Path) -> None:
        manifest = json.loads((d / "MANIFEST.json").read_text())
        manifest["stack"]["numpy"] = "1.21.*"
        (d / "MANIFEST.json").write_text(json.dumps(manifest))

    bad = repack(built[V2], tmp_path / "pins.tar.gz", pin_old_numpy)
    result = run_play(tmp_path, "deploy.yml", {"n1": node_on_v1}, **deploy_vars(V2, bad))
    assert_refused_and_unchanged(result, node_on_v1, "stack_check", "stack pin numpy=1.21.*")


def test_broken_kernel_fails_verify_and_is_removed(
    tmp_path: Path, built: dict[str, Path], node_on_v1: Path
) -> None:

    bad = repack(built[V2], tmp_path / "broken.tar.gz", break_residual_add)
    result = run_play(tmp_path, "deploy.yml", {"n1": node_on_v1}, **deploy_vars(V2, bad))
    assert_refused_and_unchanged(result, node_on_v1, "verify", "residual_add", event="failed")
    assert result.results["n1"]["outcome"] == "verify_failed"
    assert result.results["n1"]["verify"]["ok"] is False
    journal = [json.loads(line) for line in (node_on_v1 / "journal.jsonl").read_text().splitlines()]
    assert (journal[-1]["event"], journal[-1]["version"]) == ("failed", V2)
    # the `failed` line is V2's verify, not a health result of current (V1): status stays clear
    sf = run_play(tmp_path, "status.yml", {"n1": node_on_v1}).results["n1"]
    assert sf["current"] == V1 and sf["health_failed"] is None and not sf["health_pending"]


def test_health_failure_after_activation_restores_prior_release(
    tmp_path: Path, built: dict[str, Path], node_on_v1: Path
) -> None:
    bad = repack(built[V2], tmp_path / "unhealthy.tar.gz", failing_health("broken"))
    result = run_play(tmp_path, "deploy.yml", {"n1": node_on_v1}, **deploy_vars(V2, bad))
    assert result.status == "failed"
    assert result.results["n1"]["outcome"] == "health_failed"
    assert "health" in result.messages["n1"] and "restored current -> 1.0.0" in result.messages["n1"]
    # the failing check's own detail reaches the operator, not just "exit 1"
    assert "injected: broken" in result.messages["n1"], result.messages["n1"]
    assert os.readlink(node_on_v1 / "current") == f"releases/{V1}"
    assert not (node_on_v1 / "previous").exists(), "previous must be restored exactly as it was (absent)"
    assert (node_on_v1 / "releases" / V2).is_dir(), "a release that failed after activation is kept"
    events = [json.loads(line)["event"] for line in (node_on_v1 / "journal.jsonl").read_text().splitlines()]
    # the failure, then the restore: journaled before (switching) and after (rolled_back) the switch, and
    # health run again on the restored release (healthy)
    assert events[-4:] == ["failed", "switching", "rolled_back", "healthy"]
    failed = json.loads((node_on_v1 / "releases" / V2 / "verify" / "failed.json").read_text())
    assert failed["reason"].startswith("health after activation")

    # Kept for inspection is not verified: no rollback target, not listed by status.
    refused = run_play(tmp_path, "rollback.yml", {"n1": node_on_v1}, solfleet_rollback_to=V2)
    assert refused.status == "failed"
    assert refused.results["n1"]["failed_phase"] == "rollback"
    why = f"{V2} is not a verified release on this node: it failed after activation"
    assert why in refused.messages["n1"]
    assert "\n" not in refused.messages["n1"]
    assert os.readlink(node_on_v1 / "current") == f"releases/{V1}"
    status = run_play(tmp_path, "status.yml", {"n1": node_on_v1})
    assert status.status == "successful"
    assert status.results["n1"]["releases"] == [V1]
    assert status.results["n1"]["current"] == V1 and status.results["n1"]["current_verified"] is True


def test_health_failure_restores_the_prior_release_even_when_the_journal_cannot_be_written(
    tmp_path: Path, built: dict[str, Path], node_on_v1: Path
) -> None:
    """The release's health check fails, and by then the node's journal cannot take a line: the journal
    lives on a 1 MiB tmpfs that the release's health fills to the last byte, after padding the journal to a
    page boundary (so an append needs a page the disk no longer has: a real ENOSPC). The restore to the
    prior release must not wait on the journal: the node ends on V1, the outcome is health_failed, and the
    result and message name every line that was lost (before, the lost `failed` line became an internal
    error; a lost intent alone left the node on V2, still counted verified)."""
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(tiny)], check=False).returncode:
        why = "no tmpfs could be mounted (needs root and mount rights)"
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but {why}: the full-journal case would test nothing")
        pytest.skip(why)
    try:
        journal = node_on_v1 / "journal.jsonl"
        shutil.move(journal, tiny / "journal.jsonl")
        journal.symlink_to(tiny / "journal.jsonl")

        def break_health_and_fill(d: Path) -> None:
            wrap_health(
                d,
                "unhealthy, after filling the journal's disk",
                "    import os\n"
                "    journal = os.path.realpath(os.path.join(os.environ['SOLFLEET_ROOT'], 'journal.jsonl'))\n"
                '    empty = \'{"event": "pad", "rollout_id": "", "detail": ""}\\n\'\n'
                "    need = -os.path.getsize(journal) % 4096\n"
                "    need += 4096 if need < len(empty) else 0\n"
                "    with open(journal, 'a') as fh:\n"
                "        fh.write(empty.replace('\"\"}', '\"' + 'x' * (need - len(empty)) + '\"}'))\n"
                "    for name, block in (('filler-64k', 65536), ('filler-4k', 4096), ('filler-1', 1)):\n"
                "        path = os.path.join(os.path.dirname(journal), name)\n"
                "        fd = os.open(path, os.O_WRONLY | os.O_CREAT)\n"
                "        try:\n"
                "            while os.write(fd, bytes(block)) == block:\n"
                "                pass\n"
                "        except OSError:\n"
                "            pass\n"
                "        os.close(fd)\n"
                "    report = _real_run()\n"
                "    report['ok'] = False\n"
                "    check = {'name': 'injected', 'status': 'failed', 'ok': False, 'detail': 'x'}\n"
                "    report['checks'].append(check)\n"
                "    return report\n",
            )

        bad = repack(built[V2], tmp_path / "unhealthy-full.tar.gz", break_health_and_fill)
        result = run_play(tmp_path, "deploy.yml", {"n1": node_on_v1}, **deploy_vars(V2, bad))
        assert (tiny / "filler-4k").exists(), "the health injection did not run"
        assert "n1" in result.results, result.messages
        outcome = result.results["n1"]
        assert result.status == "failed"
        assert (outcome["outcome"], outcome["failed_phase"]) == ("health_failed", "health"), outcome
        assert os.readlink(node_on_v1 / "current") == f"releases/{V1}"
        assert not (node_on_v1 / "previous").exists()
        lost = outcome["journal_error"]
        assert "failed not journaled" in lost and "switching not journaled" in lost, lost
        assert "rolled_back not journaled" in lost and "restored current -> 1.0.0" in result.messages["n1"]
        assert "failed not journaled" in result.messages["n1"]
        assert "switching not journaled" in result.messages["n1"]
        events = [json.loads(line)["event"] for line in (tiny / "journal.jsonl").read_text().splitlines()]
        assert events[-2:] == ["activated", "pad"], events[-4:]  # nothing after the disk filled
    finally:
        subprocess.run(["umount", "-l", str(tiny)], check=False)


def test_a_journal_line_cut_short_does_not_swallow_the_next_record(
    tmp_path: Path, built: dict[str, Path], node_on_v1: Path
) -> None:
    """A line an earlier full disk cut short (no newline) stays the only unreadable line: the next run's
    first record starts on a line of its own instead of being glued to it."""
    journal = node_on_v1 / "journal.jsonl"
    torn = '{"event": "activ'
    with journal.open("a") as fh:
        fh.write(torn)
    result = run_play(tmp_path, "deploy.yml", {"n1": node_on_v1}, **deploy_vars(V2, built[V2]))
    assert result.status == "successful", result.messages
    unreadable, events = [], []
    for line in journal.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            unreadable.append(line)
    assert unreadable == [torn]
    mine = [(e["event"], e["version"]) for e in events if e["rollout_id"] == ""]
    assert ("switching", V2) in mine and mine[-2:] == [("activated", V2), ("healthy", V2)], mine


def test_rollback_runs_health_and_an_unhealthy_node_stays_on_the_target(
    tmp_path: Path, built: dict[str, Path]
) -> None:
    """Rollback checks health like an activation. V1's health here fails once <root>/unhealthy exists (a
    node fault, not a release fault: V1 was healthy when it was activated). Rolling back from V2 must leave
    the node on V1 (verified; switching back to V2 would undo the rollback the operator asked for), fail the
    host with the health message, and journal the failure after the switch."""

    def health_reads_a_node_marker(d: Path) -> None:
        wrap_health(
            d,
            "unhealthy while <root>/unhealthy exists",
            "    from pathlib import Path\n"
            "    report = _real_run()\n"
            "    if (Path(__file__).resolve().parents[4] / 'unhealthy').exists():\n"
            "        report['ok'] = False\n"
            "        report['checks'].append(\n"
            "            {'name': 'injected', 'status': 'failed', 'ok': False, 'detail': 'marker'}\n"
            "        )\n"
            "    return report\n",
        )

    v1 = repack(built[V1], tmp_path / "v1-marker-health.tar.gz", health_reads_a_node_marker)
    root = tmp_path / "n1"
    for version, artifact in ((V1, v1), (V2, built[V2])):
        done = run_play(tmp_path, "deploy.yml", {"n1": root}, **deploy_vars(version, artifact))
        assert done.status == "successful", done.messages
    (root / "unhealthy").touch()

    result = run_play(tmp_path, "rollback.yml", {"n1": root})
    assert result.status == "failed"
    assert result.results["n1"]["outcome"] == "health_failed"
    assert result.results["n1"]["failed_phase"] == "health"
    message = result.messages["n1"]
    assert message.startswith("solfleet: n1: health: rolled back 2.0.0 -> 1.0.0, but health fails"), message
    assert "node left on 1.0.0" in message
    assert os.readlink(root / "current") == f"releases/{V1}"
    assert os.readlink(root / "previous") == f"releases/{V2}"
    assert not (root / "releases" / V1 / "verify" / "failed.json").exists(), "a node fault marks no release"
    journal = [json.loads(line) for line in (root / "journal.jsonl").read_text().splitlines()]
    assert [(e["event"], e["version"]) for e in journal[-2:]] == [("rolled_back", V1), ("failed", V1)]
    assert "health after rollback" in journal[-1]["detail"]
    # status hears it: the node is on a verified release whose health fails, not in sync (exit 7)
    sf = run_play(tmp_path, "status.yml", {"n1": root}).results["n1"]
    assert sf["current"] == V1 and sf["current_verified"] is True and not sf["health_pending"]
    assert sf["health_failed"]["version"] == V1 and "health after rollback" in sf["health_failed"]["detail"]
    assert drift_of(V1, V1, reachable=True, current_verified=True, health_failed=True) == "health_failed"
    assert "health after rollback" in (_move_detail(sf, V1, "solfleet", "n1") or "")
    assert f"solfleet rollback --to {V1} --limit n1" in (_move_detail(sf, V1, "solfleet", "n1") or "")

    # Node fixed: the same rollback switches nothing, checks health again, and status is clear.
    (root / "unhealthy").unlink()
    again = run_play(tmp_path, "rollback.yml", {"n1": root})
    assert again.status == "successful", again.messages
    assert again.results["n1"]["outcome"] == "rolled_back", again.results["n1"]
    assert "health now passed" in again.results["n1"]["message"]
    assert os.readlink(root / "current") == f"releases/{V1}"
    sf = run_play(tmp_path, "status.yml", {"n1": root}).results["n1"]
    assert sf["health_failed"] is None and not sf["health_pending"]
    assert _move_detail(sf, V1, "solfleet", "n1") is None
    # and once healthy, a re-run is a no-op
    third = run_play(tmp_path, "rollback.yml", {"n1": root})
    assert third.results["n1"]["outcome"] == "unchanged", third.results["n1"]


def test_a_first_release_that_fails_health_leaves_no_current_and_status_names_it(
    tmp_path: Path, built: dict[str, Path]
) -> None:
    """A first deploy (no earlier release) whose health fails: nothing to return to, so `current` is removed
    and the removal is confirmed in the journal (`deactivated`, naming the release and the failed check).
    status reports `health_failed` with that reason (exit 7), not an unconfirmed switch with no cause; the
    next deploy that passes clears it."""

    bad = repack(built[V1], tmp_path / "unhealthy-first.tar.gz", failing_health("first-broken"))
    root = tmp_path / "n1"
    result = run_play(tmp_path, "deploy.yml", {"n1": root}, **deploy_vars(V1, bad))
    assert result.status == "failed"
    assert result.results["n1"]["outcome"] == "health_failed"
    assert "restored current -> none" in result.messages["n1"], result.messages["n1"]
    assert not (root / "current").exists() and not (root / "current").is_symlink()
    journal = [json.loads(line) for line in (root / "journal.jsonl").read_text().splitlines()]
    assert [(e["event"], e["version"]) for e in journal[-4:]] == [
        ("activated", V1),
        ("failed", V1),
        ("switching", "none"),
        ("deactivated", V1),
    ]
    sf = run_play(tmp_path, "status.yml", {"n1": root}).results["n1"]
    assert sf["current"] is None and not sf["unconfirmed"] and not sf["health_pending"]
    assert sf["deactivated"]["version"] == V1
    drift = drift_of(None, V1, reachable=True, current_verified=False, health_failed=True)
    assert drift == "health_failed" and drift in SUSPECT_STATES
    detail = _move_detail(sf, None, "solfleet", "n1") or ""
    assert f"{V1} failed health after activation" in detail and "first-broken" in detail, detail
    assert "no earlier release to return to" in detail

    # a good release clears it
    done = run_play(tmp_path, "deploy.yml", {"n1": root}, **deploy_vars(V2, built[V2]))
    assert done.status == "successful", done.messages
    sf = run_play(tmp_path, "status.yml", {"n1": root}).results["n1"]
    assert sf["current"] == V2 and sf["deactivated"] is None and sf["health_failed"] is None
    assert _move_detail(sf, V2, "solfleet", "n1") is None


def deploy_then_mark_failed(tmp_path: Path, root: Path, version: str, artifact: Path) -> None:
    """Deploy `version` to the node at `root`, then record it failed after activation (verify/failed.json,
    as the node writes it before a health-failure restore switches back): what a kill right after that
    leaves."""
    done = run_play(tmp_path, "deploy.yml", {"n1": root}, **deploy_vars(version, artifact))
    assert done.status == "successful", done.messages
    verify = root / "releases" / version / "verify"
    verify.chmod(0o755)
    (verify / "failed.json").write_text(json.dumps({"time": "2026-12-07T00:00:00Z", "reason": "health"}))
    verify.chmod(0o555)


def test_rollback_to_current_never_confirms_a_current_release_that_is_not_verified(
    tmp_path: Path, built: dict[str, Path], node_on_v1: Path
) -> None:
    """A kill inside a health-failure restore, after V2 was marked failed and the restore's intent journaled
    but before the switch back: current is still V2, which is no longer verified. `rollback --to V2` must
    not confirm it or call it healthy; it refuses, naming the verified releases, and nothing moves."""
    deploy_then_mark_failed(tmp_path, node_on_v1, V2, built[V2])
    line = {"event": "switching", "version": V1, "time": "2026-12-07T00:00:01Z", "detail": "restore"}
    with (node_on_v1 / "journal.jsonl").open("a") as fh:
        fh.write(json.dumps(line) + "\n")
    before = (node_on_v1 / "journal.jsonl").read_text()

    refused = run_play(tmp_path, "rollback.yml", {"n1": node_on_v1}, solfleet_rollback_to=V2)
    assert refused.status == "failed"
    assert refused.results["n1"]["failed_phase"] == "rollback"
    message = refused.messages["n1"]
    assert f"{V2} is current but not a verified release on this node: it failed after activation" in message
    assert f"verified: {V1}" in message, message
    assert os.readlink(node_on_v1 / "current") == f"releases/{V2}"
    after = (node_on_v1 / "journal.jsonl").read_text()
    assert after.startswith(before) and "rolled_back" not in after[len(before) :]
    assert "healthy" not in after[len(before) :]
    # and status offers no command the node would refuse (its table says `unverified`)
    sf = run_play(tmp_path, "status.yml", {"n1": node_on_v1}).results["n1"]
    assert sf["current"] == V2 and sf["current_verified"] is False
    assert "rollback --to" not in (_move_detail(sf, None, "solfleet", "n1") or "")


def test_rollback_to_current_finishes_a_move_whose_confirmation_was_lost(
    tmp_path: Path, built: dict[str, Path], node_on_v1: Path
) -> None:
    """The journal's last move names another release than current: a health-failure restore switched back
    to V1, but the disk was full, so every line after `activated V2` was lost (the end state of the
    journal-full test above). status asks for `rollback --to V1 --limit n1`; that must finish it: a line
    saying where current is, then health, and status is clear (before, health ran but its line, for V1,
    did not count against the last move to V2, and status asked for the same command for ever)."""
    for line in (
        {"event": "switching", "version": V2, "time": "2026-12-07T00:00:00Z", "detail": "activate"},
        {"event": "activated", "version": V2, "time": "2026-12-07T00:00:01Z", "detail": "switched"},
    ):
        with (node_on_v1 / "journal.jsonl").open("a") as fh:
            fh.write(json.dumps(line) + "\n")
    sf = run_play(tmp_path, "status.yml", {"n1": node_on_v1}).results["n1"]
    assert sf["current"] == V1 and sf["health_pending"] is True
    assert "solfleet rollback --to 1.0.0 --limit n1" in (_move_detail(sf, V1, "solfleet", "n1") or "")

    done = run_play(tmp_path, "rollback.yml", {"n1": node_on_v1}, solfleet_rollback_to=V1)
    assert done.status == "successful", done.messages
    assert done.results["n1"]["outcome"] == "rolled_back"
    journal = [json.loads(line) for line in (node_on_v1 / "journal.jsonl").read_text().splitlines()]
    assert [(e["event"], e["version"]) for e in journal[-2:]] == [("rolled_back", V1), ("healthy", V1)]
    assert "last move was to 2.0.0" in journal[-2]["detail"]
    sf = run_play(tmp_path, "status.yml", {"n1": node_on_v1}).results["n1"]
    assert not sf["health_pending"] and not sf["unconfirmed"]
    assert _move_detail(sf, V1, "solfleet", "n1") is None


def test_a_plain_rollback_that_finishes_a_move_stays_plain_and_never_flips_forward(
    tmp_path: Path, built: dict[str, Path], node_on_v1: Path
) -> None:
    """A plain rollback to V1, then a deploy killed after its intent line: the journal ends `switching V2`
    with current V1. Re-running the plain rollback confirms V1 (and runs health); its line must stay
    `plain`, or the next plain rollback would go to previous, forward to V2."""
    done = run_play(tmp_path, "deploy.yml", {"n1": node_on_v1}, **deploy_vars(V2, built[V2]))
    assert done.status == "successful", done.messages
    back = run_play(tmp_path, "rollback.yml", {"n1": node_on_v1})
    assert back.results["n1"]["outcome"] == "rolled_back" and os.readlink(node_on_v1 / "current") == (
        f"releases/{V1}"
    )
    line = {"event": "switching", "version": V2, "time": "2026-12-07T00:00:00Z", "detail": "activate"}
    with (node_on_v1 / "journal.jsonl").open("a") as fh:
        fh.write(json.dumps(line) + "\n")
    again = run_play(tmp_path, "rollback.yml", {"n1": node_on_v1})
    assert again.results["n1"]["outcome"] == "rolled_back", again.results["n1"]
    journal = [json.loads(line) for line in (node_on_v1 / "journal.jsonl").read_text().splitlines()]
    confirm = journal[-2]
    assert (confirm["event"], confirm["version"], confirm.get("plain")) == ("rolled_back", V1, True)
    third = run_play(tmp_path, "rollback.yml", {"n1": node_on_v1})
    assert third.results["n1"]["outcome"] == "unchanged", third.results["n1"]
    assert os.readlink(node_on_v1 / "current") == f"releases/{V1}"


def test_rollback_to_current_confirms_a_switch_the_journal_never_confirmed(
    tmp_path: Path, built: dict[str, Path], node_on_v1: Path
) -> None:
    """A kill (or a full disk) between a switch's intent line and its confirmation leaves the journal
    unconfirmed while current is a verified release. `rollback --to <current>` (what status tells the
    operator to run) confirms it where current really is and runs health; status is then clear."""
    line = {"event": "switching", "version": V2, "time": "2026-12-07T00:00:00Z", "detail": "activate"}
    with (node_on_v1 / "journal.jsonl").open("a") as fh:
        fh.write(json.dumps(line) + "\n")  # the intent, as the node writes it, with nothing after
    sf = run_play(tmp_path, "status.yml", {"n1": node_on_v1}).results["n1"]
    assert sf["unconfirmed"] is True and sf["current"] == V1
    assert f"solfleet rollback --to {V1} --limit n1" in (_move_detail(sf, V1, "solfleet", "n1") or "")

    done = run_play(tmp_path, "rollback.yml", {"n1": node_on_v1}, solfleet_rollback_to=V1)
    assert done.status == "successful", done.messages
    assert done.results["n1"]["outcome"] == "rolled_back" and os.readlink(node_on_v1 / "current") == (
        f"releases/{V1}"
    )
    journal = [json.loads(line) for line in (node_on_v1 / "journal.jsonl").read_text().splitlines()]
    assert [(e["event"], e["version"]) for e in journal[-2:]] == [("rolled_back", V1), ("healthy", V1)]
    sf = run_play(tmp_path, "status.yml", {"n1": node_on_v1}).results["n1"]
    assert not sf["unconfirmed"] and not sf["health_pending"]
    assert _move_detail(sf, V1, "solfleet", "n1") is None


def test_lock_held_elsewhere_refuses(tmp_path: Path, built: dict[str, Path], node_on_v1: Path) -> None:
    fd = os.open(node_on_v1 / ".lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        result = run_play(
            tmp_path,
            "deploy.yml",
            {"n1": node_on_v1},
            **deploy_vars(V2, built[V2], solfleet_lock_timeout_s=1),
        )
    finally:
        os.close(fd)
    assert_refused_and_unchanged(result, node_on_v1, "lock", "another deploy or rollback holds")


def test_the_lease_and_status_reads_say_whether_a_node_step_holds_the_lock(
    tmp_path: Path, node_on_v1: Path
) -> None:
    """A deploy or rollback step holds `<root>/.lock` for its whole locked section, and one whose controller
    is gone runs on to its end. While the lock is held (here by this test process) the lease call and status
    answer without waiting and say `busy`: the node may still move, so a reconcile does not take that read
    for where it stays. Once the lock is let go they say false, and a root no step ever locked reads not
    busy, its read making no lock file."""

    def lease() -> PlayResult:
        # every var named: run_play's private data dir keeps the extravars of the run before it
        return run_play(
            tmp_path,
            "lease.yml",
            {"n1": node_on_v1},
            solfleet_rollout_id="r-mine",
            solfleet_controller="me@here:1",
            solfleet_lease_s=60,
            solfleet_lease_state="running",
            solfleet_take_over=[],
            solfleet_lease_health=[],
        )

    fd = os.open(node_on_v1 / ".lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        held = lease()
        status = run_play(tmp_path, "status.yml", {"n1": node_on_v1})
    finally:
        os.close(fd)
    assert held.status == "successful", held.messages
    assert (held.results["n1"]["busy"], held.results["n1"]["current"]) == (True, V1), held.results
    assert status.status == "successful" and status.results["n1"]["busy"] is True, status.results

    free = lease()
    assert free.status == "successful" and free.results["n1"]["busy"] is False, free.results
    bare = tmp_path / "bare"
    bare.mkdir()
    fresh = run_play(tmp_path, "status.yml", {"n1": bare})
    assert fresh.results["n1"]["busy"] is False, fresh.results
    assert not (bare / ".lock").exists(), "a read made the lock file"


def test_tampered_current_release_fails_redeploy_without_switching(
    tmp_path: Path, built: dict[str, Path], node_on_v1: Path
) -> None:
    target = node_on_v1 / "releases" / V1 / "kernels" / "__init__.py"
    target.chmod(0o644)
    target.write_text(target.read_text() + "# tampered\n")
    result = run_play(tmp_path, "deploy.yml", {"n1": node_on_v1}, **deploy_vars(V1, built[V1]))
    assert result.status == "failed"
    assert "current release 1.0.0 failed its re-check" in result.messages["n1"]
    assert os.readlink(node_on_v1 / "current") == f"releases/{V1}"


def test_rollback_refuses_unverified_target_and_keeps_current(
    tmp_path: Path, built: dict[str, Path], node_on_v1: Path
) -> None:
    (node_on_v1 / "releases" / "0.9.0").mkdir()  # present, but never verified
    result = run_play(tmp_path, "rollback.yml", {"n1": node_on_v1}, solfleet_rollback_to="0.9.0")
    assert result.status == "failed"
    assert result.results["n1"]["failed_phase"] == "rollback"
    assert "0.9.0 is not a verified release" in result.messages["n1"]
    assert os.readlink(node_on_v1 / "current") == f"releases/{V1}"


def test_prune_keeps_current_previous_and_the_newest(tmp_path: Path, built: dict[str, Path]) -> None:
    root = tmp_path / "n1"
    versions = ["3.0.0", "3.1.0", "3.2.0", "3.3.0"]
    for version in versions:
        artifact = repack(
            built[V1], tmp_path / f"solfleet-ops-{version}.tar.gz", lambda d, v=version: _set_version(d, v)
        )
        result = run_play(
            tmp_path, "deploy.yml", {"n1": root}, **deploy_vars(version, artifact, solfleet_keep_releases=2)
        )
        assert result.status == "successful", result.messages
    # keep_releases 2, plus the previous this last deploy found (3.1.0): the rollout's baseline previous,
    # which an undo to the baseline restores, stays until a later deploy; 3.0.0 is gone
    assert sorted(p.name for p in (root / "releases").iterdir()) == ["3.1.0", "3.2.0", "3.3.0"]
    assert os.readlink(root / "current") == "releases/3.3.0"
    assert os.readlink(root / "previous") == "releases/3.2.0"
    assert sorted(p.name for p in (root / "artifacts").iterdir()) == [
        "solfleet-ops-3.1.0.tar.gz",
        "solfleet-ops-3.2.0.tar.gz",
        "solfleet-ops-3.3.0.tar.gz",
    ]


def _set_version(d: Path, version: str) -> None:
    manifest = json.loads((d / "MANIFEST.json").read_text())
    manifest["version"] = version
    (d / "MANIFEST.json").write_text(json.dumps(manifest))


def test_prune_keeps_only_the_newest_failed_release(
    tmp_path: Path, built: dict[str, Path], node_on_v1: Path
) -> None:
    """Two deploys that fail health after activation leave two failed releases (a failed run prunes
    nothing); the next good deploy keeps only the newest failure for inspection."""

    def unhealthy(d: Path, version: str) -> None:
        _set_version(d, version)
        wrap_health(d, "always unhealthy", "    return {'ok': False}\n")

    for version in ("4.0.0", "4.1.0"):
        bad = repack(
            built[V1], tmp_path / f"solfleet-ops-{version}.tar.gz", lambda d, v=version: unhealthy(d, v)
        )
        failed = run_play(tmp_path, "deploy.yml", {"n1": node_on_v1}, **deploy_vars(version, bad))
        assert failed.results["n1"]["outcome"] == "health_failed", failed.messages
        time.sleep(0.05)  # failed.json mtimes order the failures
    assert {"4.0.0", "4.1.0"} <= {p.name for p in (node_on_v1 / "releases").iterdir()}

    good = run_play(tmp_path, "deploy.yml", {"n1": node_on_v1}, **deploy_vars(V2, built[V2]))
    assert good.status == "successful", good.messages
    assert sorted(p.name for p in (node_on_v1 / "releases").iterdir()) == [V1, V2, "4.1.0"]
    assert (node_on_v1 / "releases" / "4.1.0" / "verify" / "failed.json").exists()
    assert good.results["n1"]["pruned"] == ["4.0.0"]


def test_tampered_previous_release_is_refused_but_never_removed(
    tmp_path: Path, built: dict[str, Path], node_on_v1: Path
) -> None:
    second = run_play(tmp_path, "deploy.yml", {"n1": node_on_v1}, **deploy_vars(V2, built[V2]))
    assert second.status == "successful", second.messages
    target = node_on_v1 / "releases" / V1 / "kernels" / "__init__.py"
    target.chmod(0o644)
    target.write_text(target.read_text() + "# tampered\n")
    result = run_play(tmp_path, "deploy.yml", {"n1": node_on_v1}, **deploy_vars(V1, built[V1]))
    assert result.status == "failed"
    assert "previous release 1.0.0 failed its re-check" in result.messages["n1"]
    assert os.readlink(node_on_v1 / "current") == f"releases/{V2}"
    assert os.readlink(node_on_v1 / "previous") == f"releases/{V1}"
    assert (node_on_v1 / "releases" / V1).is_dir(), "previous must never be removed"


def test_truncated_artifact_refused_when_no_sha256_was_given(
    tmp_path: Path, built: dict[str, Path], node_on_v1: Path
) -> None:
    truncated = tmp_path / "solfleet-ops-2.0.0.tar.gz"
    truncated.write_bytes(built[V2].read_bytes()[: built[V2].stat().st_size // 2])
    result = run_play(
        tmp_path, "deploy.yml", {"n1": node_on_v1}, **deploy_vars(V2, truncated, solfleet_artifact_sha256="")
    )
    assert_refused_and_unchanged(result, node_on_v1, "unpack_check", "artifact")
    assert result.results["n1"]["outcome"] == "refused"


def _opened_elsewhere(path: Path, by: str = "solfleet_release") -> bool:
    """A process running `by` (its command line names it: the node module, AnsiballZ_solfleet_release.py)
    holds `path` open (Linux: /proc/<pid>/fd links). Not just any other process: a child forked from this
    one holds this process's descriptors until it execs, and under load that came seconds before the module
    itself opened the lock (the releaser then let go before the module tried: lock_wait 0.0)."""
    target = str(path)
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        if fd_dir.parent.name == str(os.getpid()):
            continue
        try:
            opened = any(os.readlink(fd) == target for fd in fd_dir.iterdir())
            if opened and by.encode() in (fd_dir.parent / "cmdline").read_bytes():
                return True
        except OSError:
            continue  # gone, or not ours to read
    return False


def test_second_deploy_waits_for_the_node_lock(
    tmp_path: Path, built: dict[str, Path], node_on_v1: Path
) -> None:
    lock = node_on_v1 / ".lock"
    fd = os.open(lock, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)

    def release_once_the_module_waits() -> None:
        # The module opens the lock file and polls for it: once another process has it open, hold the lock
        # 1.5 s more, then let go.
        deadline = time.monotonic() + 120
        while not _opened_elsewhere(lock) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.5)
        os.close(fd)

    releaser = threading.Thread(target=release_once_the_module_waits)
    releaser.start()
    try:
        result = run_play(
            tmp_path,
            "deploy.yml",
            {"n1": node_on_v1},
            **deploy_vars(V2, built[V2], solfleet_lock_timeout_s=60),
        )
    finally:
        releaser.join()
    assert result.status == "successful", result.messages
    # one failed try + one 0.2 s poll at least: the module did find the lock taken and waited for it
    assert result.results["n1"]["phases"]["lock_wait"] >= 0.2
    assert os.readlink(node_on_v1 / "current") == f"releases/{V2}"


def _moves(root: Path) -> list[tuple[str, str, bool]]:
    """(event, version, plain) of every journal line that moved `current`."""
    lines = [json.loads(line) for line in (root / "journal.jsonl").read_text().splitlines()]
    return [
        (e["event"], e["version"], e.get("plain") is True)
        for e in lines
        if e["event"] in ("activated", "rolled_back")
    ]


def test_plain_rollback_after_rollback_to_goes_to_previous(
    tmp_path: Path, built: dict[str, Path], node_on_v1: Path
) -> None:
    second = run_play(tmp_path, "deploy.yml", {"n1": node_on_v1}, **deploy_vars(V2, built[V2]))
    assert second.status == "successful", second.messages
    plain = run_play(tmp_path, "rollback.yml", {"n1": node_on_v1}, solfleet_rollback_to="")
    assert plain.results["n1"]["outcome"] == "rolled_back", plain.messages
    again = run_play(tmp_path, "rollback.yml", {"n1": node_on_v1}, solfleet_rollback_to="")
    assert again.results["n1"]["outcome"] == "unchanged", "a repeated plain rollback must not flip forward"
    assert os.readlink(node_on_v1 / "current") == f"releases/{V1}"
    named = run_play(tmp_path, "rollback.yml", {"n1": node_on_v1}, solfleet_rollback_to=V2)
    assert named.results["n1"]["outcome"] == "rolled_back", named.messages
    assert (os.readlink(node_on_v1 / "current"), os.readlink(node_on_v1 / "previous")) == (
        f"releases/{V2}",
        f"releases/{V1}",
    )
    # `--to V2` was an explicit move, not a plain rollback: a plain rollback now goes to V2's previous.
    after = run_play(tmp_path, "rollback.yml", {"n1": node_on_v1}, solfleet_rollback_to="")
    assert after.status == "successful", after.messages
    assert after.results["n1"]["outcome"] == "rolled_back", after.results["n1"]
    assert os.readlink(node_on_v1 / "current") == f"releases/{V1}"
    assert os.readlink(node_on_v1 / "previous") == f"releases/{V2}"
    assert _moves(node_on_v1)[-3:] == [
        ("rolled_back", V1, True),
        ("rolled_back", V2, False),
        ("rolled_back", V1, True),
    ]


def test_signals_during_the_locked_section_do_not_interrupt_the_switch(
    tmp_path: Path, built: dict[str, Path], node_on_v1: Path
) -> None:
    def slow_health(d: Path) -> None:
        wrap_health(
            d,
            "health takes long enough to be interrupted",
            "    import time\n    time.sleep(4)\n    return _real_run()\n",
        )

    slow = repack(built[V2], tmp_path / "slow-health.tar.gz", slow_health)
    journal = node_on_v1 / "journal.jsonl"
    sent: list[str] = []

    def interrupt_once_activated() -> None:
        # A controller Ctrl-C reaches a connection-local module as SIGINT/SIGHUP/SIGTERM: send all three to
        # the module (its pid is in .lock) after `current` was switched, while health still runs.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            moves = [json.loads(line) for line in journal.read_text().splitlines()]
            if any((m["event"], m["version"]) == ("activated", V2) for m in moves):
                break
            time.sleep(0.05)
        else:
            return
        pid = int((node_on_v1 / ".lock").read_text().split()[0])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        assert "AnsiballZ_solfleet_release" in cmdline, cmdline
        for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
            os.kill(pid, sig)
            sent.append(sig.name)
            time.sleep(0.2)

    sender = threading.Thread(target=interrupt_once_activated)
    sender.start()
    try:
        result = run_play(tmp_path, "deploy.yml", {"n1": node_on_v1}, **deploy_vars(V2, slow))
    finally:
        sender.join()
    assert sent == ["SIGHUP", "SIGINT", "SIGTERM"], f"the signals were not all sent: {sent}"
    assert result.status == "successful", result.messages
    assert result.results["n1"]["outcome"] == "activated"
    assert os.readlink(node_on_v1 / "current") == f"releases/{V2}"
    assert os.readlink(node_on_v1 / "previous") == f"releases/{V1}"
    assert _moves(node_on_v1)[-1] == ("activated", V2, False)


def test_activation_reports_prior_current_not_a_stale_previous(
    tmp_path: Path, built: dict[str, Path], node_on_v1: Path
) -> None:
    """`current` gone (a hand-edited or half-provisioned node), `previous` still -> V1: the module must say it
    ran nothing before, or the controller's undo would move it to V1, a release it was not running."""
    os.symlink(f"releases/{V1}", node_on_v1 / "previous")
    os.unlink(node_on_v1 / "current")
    result = run_play(tmp_path, "deploy.yml", {"n1": node_on_v1}, **deploy_vars(V2, built[V2]))
    assert result.status == "successful", result.messages
    sf = result.results["n1"]
    assert (sf["outcome"], sf["current"], sf["previous"]) == ("activated", V2, V1)
    assert "prior_current" in sf and sf["prior_current"] is None
    again = run_play(tmp_path, "rollback.yml", {"n1": node_on_v1}, solfleet_rollback_to=V1)
    assert (again.results["n1"]["outcome"], again.results["n1"]["prior_current"]) == ("rolled_back", V2)


def test_a_lease_whose_expiry_is_not_a_time_refuses_naming_the_file(
    tmp_path: Path, built: dict[str, Path], node_on_v1: Path
) -> None:
    """A lease.json damaged by hand says nothing about whether its rollout still runs: the node neither
    guesses it expired (letting a second rollout in) nor fails with a bare ValueError. Both the deploy's
    lease check and the lease call refuse in one line that names the file, and nothing moves."""
    lease = {"rollout_id": "r-other", "controller": "bob@laptop:4242", "expires": "tomorrow"}
    (node_on_v1 / "lease.json").write_text(json.dumps(lease))
    why = f"{node_on_v1 / 'lease.json'} holds rollout r-other with an expiry that is not a time ('tomorrow')"

    result = run_play(
        tmp_path, "deploy.yml", {"n1": node_on_v1}, **deploy_vars(V2, built[V2], solfleet_rollout_id="r-mine")
    )
    assert result.status == "failed"
    assert result.results["n1"]["failed_phase"] == "lease", result.results["n1"]
    assert why in result.messages["n1"] and "\n" not in result.messages["n1"], result.messages["n1"]
    assert os.readlink(node_on_v1 / "current") == f"releases/{V1}"

    taken = run_play(
        tmp_path,
        "lease.yml",
        {"n1": node_on_v1},
        solfleet_rollout_id="r-mine",
        solfleet_controller="me@here:1",
        solfleet_lease_s=60,
        solfleet_take_over=[],
        solfleet_lease_health=[],
    )
    assert taken.status == "failed"
    assert taken.results["n1"]["failed_phase"] == "lease", taken.results["n1"]
    assert why in taken.results["n1"]["message"], taken.results["n1"]
    assert json.loads((node_on_v1 / "lease.json").read_text()) == lease, "the file is left as it was"


def test_a_lease_kept_by_an_unfinished_rollout_says_so_and_still_expires(
    tmp_path: Path, built: dict[str, Path], node_on_v1: Path
) -> None:
    """A rollout that ended owing its hosts a return to its baseline renews its leases marked `unfinished`
    (fleet/recovery.py conclude_leases). The node writes the state into lease.json, a second rollout's lease
    call and its deploy are refused naming the unfinished rollout and `solfleet reconcile`, a state the node
    does not know is refused with nothing changed, and the lease still expires."""

    def lease(rollout_id: str, lease_s: int = 600, state: str = "running") -> PlayResult:
        # every var named: run_play's private data dir keeps the extravars of the run before it
        return run_play(
            tmp_path,
            "lease.yml",
            {"n1": node_on_v1},
            solfleet_rollout_id=rollout_id,
            solfleet_controller="me@here:1",
            solfleet_lease_s=lease_s,
            solfleet_lease_state=state,
            solfleet_take_over=[],
            solfleet_lease_health=[],
        )

    kept = lease("r-first", state="unfinished")
    assert kept.status == "successful", kept.messages
    record = json.loads((node_on_v1 / "lease.json").read_text())
    assert (record["rollout_id"], record["state"]) == ("r-first", "unfinished"), record
    why = "rollout r-first of me@here:1 (unfinished: it owes its hosts a return to its baseline;"
    fix = "`solfleet reconcile` from its work dir finishes it)"

    refused = lease("r-second")
    assert refused.status == "failed" and refused.results["n1"]["failed_phase"] == "lease", refused.results
    message = refused.results["n1"]["message"]
    assert why in message and fix in message and "\n" not in message, message
    deploy = run_play(
        tmp_path, "deploy.yml", {"n1": node_on_v1}, **deploy_vars(V2, built[V2], solfleet_rollout_id="r-2")
    )
    assert deploy.status == "failed" and why in deploy.messages["n1"], deploy.messages

    bogus = lease("r-first", state="resting")
    assert bogus.status == "failed", bogus.messages
    assert "lease_state" in bogus.messages["n1"] and "unfinished" in bogus.messages["n1"], bogus.messages
    assert json.loads((node_on_v1 / "lease.json").read_text()) == record, "a refused state changed the lease"

    # it still expires: a vanished work dir does not hold the node for ever
    assert lease("r-first", lease_s=0, state="unfinished").status == "successful"
    taken = lease("r-second")
    assert taken.status == "successful", taken.messages
    assert taken.results["n1"]["lease_replaced"]["state"] == "unfinished", taken.results["n1"]
    assert json.loads((node_on_v1 / "lease.json").read_text())["state"] == "running"


def _marker_health(d: Path) -> None:
    """A release whose health fails while <root>/unhealthy exists (a node fault), and which journals a move
    of `current` while it checks when <root>/move-while-checking exists (a rollback that ran meanwhile)."""
    wrap_health(
        d,
        "unhealthy while <root>/unhealthy exists; a journaled move while <root>/move-while-checking exists",
        "    import json\n"
        "    from pathlib import Path\n"
        "    root = Path(__file__).resolve().parents[4]\n"
        "    report = _real_run()\n"
        "    if (root / 'unhealthy').exists():\n"
        "        report['ok'] = False\n"
        "        report['checks'].append(\n"
        "            {'name': 'injected', 'status': 'failed', 'ok': False, 'detail': 'marker'}\n"
        "        )\n"
        "    if (root / 'move-while-checking').exists():\n"
        "        line = {'event': 'rolled_back', 'version': '1.0.0', 'rollout_id': 'r-meanwhile',\n"
        "                'node': 'n1', 'simulated': True, 'detail': 'a move while health ran'}\n"
        "        with open(root / 'journal.jsonl', 'a') as fh:\n"
        "            fh.write(json.dumps(line) + '\\n')\n"
        "    return report\n",
    )


def test_solfleet_health_journals_its_result_so_status_follows_the_latest_check(
    tmp_path: Path, built: dict[str, Path]
) -> None:
    """health.yml with solfleet_health_journal (what `solfleet health` passes) journals its result for the
    release it checked: a failure on current makes status's verdict `health_failed` naming the check, a pass
    clears it. The same result twice adds no line; without the flag (a deploy's preflight) nothing is
    written; and the line is not written while another step holds the node's lock, nor when `current`
    moved while health ran (that move's own health stands)."""
    v1 = repack(built[V1], tmp_path / "v1-marker-health.tar.gz", _marker_health)
    root = tmp_path / "n1"
    done = run_play(tmp_path, "deploy.yml", {"n1": root}, **deploy_vars(V1, v1))
    assert done.status == "successful", done.messages

    def journal() -> list[dict[str, Any]]:
        return [json.loads(line) for line in (root / "journal.jsonl").read_text().splitlines()]

    def health(**extra: Any) -> PlayResult:
        return run_play(tmp_path, "health.yml", {"n1": root}, **extra)

    def status() -> dict[str, Any]:
        return run_play(tmp_path, "status.yml", {"n1": root}).results["n1"]

    (root / "unhealthy").touch()
    before = journal()
    assert health().status == "failed" and journal() == before, "a health run without the flag journaled"
    sick = health(solfleet_health_journal=True)
    assert sick.status == "failed" and sick.results["n1"]["health_journaled"] is True, sick.results
    last = journal()[-1]
    assert (last["event"], last["version"]) == ("failed", V1) and "injected: marker" in last["detail"], last
    sf = status()
    assert sf["health_failed"]["version"] == V1 and "solfleet health" in sf["health_failed"]["detail"], sf
    assert drift_of(V1, V1, reachable=True, current_verified=True, health_failed=True) == "health_failed"
    assert "solfleet health --limit n1" in (_move_detail(sf, V1, "solfleet", "n1") or "")
    again = journal()
    assert health(solfleet_health_journal=True).results["n1"]["health_journaled"] is True
    assert journal() == again, "the same result twice added a line"

    (root / "unhealthy").unlink()
    well = health(solfleet_health_journal=True)
    assert well.status == "successful", well.messages
    assert [(e["event"], e["version"]) for e in journal()[-1:]] == [("healthy", V1)]
    sf = status()
    assert sf["health_failed"] is None and not sf["health_pending"], sf
    assert _move_detail(sf, V1, "solfleet", "n1") is None

    # a deploy or rollback holds the node's lock: the result is not journaled, and the answer says why
    (root / "unhealthy").touch()
    fd = os.open(root / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        before = journal()
        held = health(solfleet_health_journal=True)
    finally:
        os.close(fd)
    assert held.status == "failed" and held.results["n1"]["health_journaled"] is False, held.results
    assert "another deploy or rollback holds" in held.results["n1"]["health_journal_error"], held.results
    assert journal() == before and status()["health_failed"] is None

    # current moved while health ran: the older result must not overtake the move's own health line
    (root / "move-while-checking").touch()
    moved = health(solfleet_health_journal=True)
    after = journal()
    assert moved.results["n1"]["health_journaled"] is False, moved.results
    assert "current moved while health ran" in moved.results["n1"]["health_journal_error"], moved.results
    assert after[-1]["rollout_id"] == "r-meanwhile", after[-2:]  # nothing was appended after the move


def test_solfleet_health_journals_nothing_for_a_current_that_is_not_verified(
    tmp_path: Path, built: dict[str, Path]
) -> None:
    """A kill between marking a release failed and the switch back leaves current on a release that is not
    verified, the journal's last move naming it. `solfleet health` there fails (its release.current check
    names failed.json) and journals nothing: status's verdict is `unverified` whatever health says, and no
    health line may ever let `rollback --to` that release confirm it. The answer says why, the journal is
    unchanged, and the rollback still refuses."""
    root = tmp_path / "n1"
    deploy_then_mark_failed(tmp_path, root, V1, built[V1])
    before = (root / "journal.jsonl").read_text()
    checked = run_play(tmp_path, "health.yml", {"n1": root}, solfleet_health_journal=True)
    assert checked.status == "failed", checked.messages
    assert "failed after activation" in checked.messages["n1"], checked.messages
    sf = checked.results["n1"]
    assert sf["health_journaled"] is False, sf
    assert f"current {V1} is not a verified release" in sf["health_journal_error"], sf
    assert (root / "journal.jsonl").read_text() == before
    refused = run_play(tmp_path, "rollback.yml", {"n1": root}, solfleet_rollback_to=V1)
    assert refused.status == "failed", refused.messages

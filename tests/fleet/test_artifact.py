"""The artifact: a real tarball, built twice byte-identical, every file's sha256 in the manifest."""

from __future__ import annotations

import gzip
import hashlib
import json
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from fleet.artifact import build, read_manifest
from fleet.errors import ArtifactError, BuildFailed, SpecError
from fleet.spec import embedded_fleet, load_spec


def _git(root: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(root), *args],
        check=True,
        capture_output=True,
        env={
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@t",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t",
            "GIT_AUTHOR_DATE": "2026-01-02T03:04:05Z",
            "GIT_COMMITTER_DATE": "2026-01-02T03:04:05Z",
            "PATH": "/usr/bin:/bin",
        },
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A small committed project with a kernels package, bytecode caches and an op subpackage."""
    root = tmp_path / "src"
    (root / "kernels" / "ops" / "__pycache__").mkdir(parents=True)
    (root / "kernels" / "__init__.py").write_text('"""k"""\n')
    (root / "kernels" / "ops" / "__init__.py").write_text("")
    (root / "kernels" / "ops" / "add.py").write_text("def add(a, b):\n    return a + b\n")
    (root / "kernels" / "ops" / "add.cu").write_text("// device code\n")
    (root / "kernels" / "ops" / "__pycache__" / "add.cpython-311.pyc").write_bytes(b"\0junk")
    (root / "kernels" / "stale.pyc").write_bytes(b"\0junk")
    _git(root, "init", "-q")
    _git(
        root,
        "add",
        "kernels/__init__.py",
        "kernels/ops/__init__.py",
        "kernels/ops/add.py",
        "kernels/ops/add.cu",
    )
    _git(root, "commit", "-q", "-m", "k")
    return root


@pytest.fixture
def spec(tmp_path: Path):
    return load_spec(embedded_fleet(), work_dir=tmp_path / "work")


def test_same_tree_and_version_give_identical_bytes(tree: Path, spec, tmp_path: Path) -> None:
    a = build(spec=spec, version="1.2.0", out_dir=tmp_path / "a", root=tree)
    (tree / "kernels" / "ops" / "add.py").touch()  # a new mtime must not matter
    b = build(spec=spec, version="1.2.0", out_dir=tmp_path / "b", root=tree)
    assert a.path.name == "solfleet-ops-1.2.0.tar.gz"
    assert a.path.read_bytes() == b.path.read_bytes()
    assert a.sha256 == hashlib.sha256(a.path.read_bytes()).hexdigest()
    c = build(spec=spec, version="1.2.1", out_dir=tmp_path / "c", root=tree)
    assert c.path.read_bytes() != a.path.read_bytes()


def test_manifest_lists_every_file_with_its_sha256(tree: Path, spec, tmp_path: Path) -> None:
    result = build(spec=spec, version="1.2.0", out_dir=tmp_path / "out", root=tree)
    with tarfile.open(result.path) as tar:
        members = tar.getmembers()
        names = [m.name for m in members]
        contents = {m.name: tar.extractfile(m).read() for m in members if m.isfile()}
    assert names == sorted(names)
    manifest = json.loads(contents.pop("MANIFEST.json"))
    assert manifest == read_manifest(result.path)
    assert set(manifest["files"]) == set(contents)
    assert set(contents) == {
        "kernels/__init__.py",
        "kernels/ops/__init__.py",
        "kernels/ops/add.py",
        "kernels/ops/add.cu",
    }  # no __pycache__, no .pyc
    for name, data in contents.items():
        assert manifest["files"][name] == hashlib.sha256(data).hexdigest()
    assert manifest["version"] == "1.2.0" and manifest["name"] == "solfleet-ops"
    assert len(manifest["git"]["commit"]) == 40 and manifest["git"]["dirty"] is False
    assert manifest["build_time"] == "2026-01-02T03:04:05Z"  # the commit time, not the clock
    assert set(manifest["stack"]) >= {"python", "numba", "numba_cuda", "numpy"}
    assert manifest["stack_id"] == spec.stack_id
    assert [t["cc"] for t in manifest["targets"]] == ["9.0"]
    for m in members:
        assert m.uid == 0 and m.gid == 0 and m.uname == "" and m.mtime == 1767323045
        assert m.mode == (0o755 if m.isdir() else 0o644)
        assert not m.issym() and not m.name.startswith("/") and ".." not in m.name.split("/")


def test_gzip_header_has_no_mtime_or_name(tree: Path, spec, tmp_path: Path) -> None:
    blob = build(spec=spec, version="1.2.0", out_dir=tmp_path / "out", root=tree).path.read_bytes()
    assert blob[:2] == b"\x1f\x8b"
    assert blob[4:8] == b"\0\0\0\0"  # MTIME
    assert not blob[3] & 0x08  # FLG.FNAME unset
    gzip.decompress(blob)


def test_dirty_tree_is_recorded(tree: Path, spec, tmp_path: Path) -> None:
    (tree / "kernels" / "ops" / "add.py").write_text("def add(a, b):\n    return b + a\n")
    manifest = build(spec=spec, version="1.2.0", out_dir=tmp_path / "out", root=tree).manifest
    assert manifest["git"]["dirty"] is True


def test_ptx_targets_follow_the_spec(tree: Path, spec, tmp_path: Path) -> None:
    """Without kernels/ptx.py in the tree the build still packages the kernels and says PTX is missing."""
    manifest = build(spec=spec, version="1.2.0", out_dir=tmp_path / "out", root=tree).manifest
    (target,) = manifest["targets"]
    assert spec.compute_capabilities == tuple(sorted({n.gpu.cc for n in spec.nodes if n.gpu}))
    assert (target["cc"],) == spec.compute_capabilities  # the embedded fleet's one cc, "9.0"
    assert target["ptx_status"].startswith("unavailable") and target["kernels"] == []


def test_no_git_and_no_source_date_epoch_is_an_error(tmp_path: Path, spec, monkeypatch) -> None:
    root = tmp_path / "plain"
    (root / "kernels").mkdir(parents=True)
    (root / "kernels" / "__init__.py").write_text("")
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    with pytest.raises(ArtifactError, match="SOURCE_DATE_EPOCH"):
        build(spec=spec, version="1.0.0", out_dir=tmp_path / "out", root=root)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    m = build(spec=spec, version="1.0.0", out_dir=tmp_path / "out", root=root).manifest
    assert m["build_time"] == "2023-11-14T22:13:20Z" and m["git"]["commit"] is None


def test_bad_version_is_rejected(tree: Path, spec, tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="--version: '1.0' is not allowed"):
        build(spec=spec, version="1.0", out_dir=tmp_path / "out", root=tree)
    assert not (tmp_path / "out").exists()


def test_read_manifest_rejects_a_non_artifact(tmp_path: Path) -> None:
    bogus = tmp_path / "x.tar.gz"
    bogus.write_bytes(b"not a tarball")
    with pytest.raises(ArtifactError, match="not a solfleet artifact"):
        read_manifest(bogus)
    with pytest.raises(ArtifactError, match="does not exist"):
        read_manifest(tmp_path / "missing.tar.gz")


FAKE_PTX = '''"""A stand-in compiler for the cache test: counts its runs, returns one kernel record per cc."""
from pathlib import Path

from kernels.ops.add import add  # the tree's own code: a change to it must change the cache key


def compile_all(cc):
    counter = Path(__file__).resolve().parents[3] / "compiles.txt"
    counter.write_text(counter.read_text() + "x" if counter.exists() else "x")
    return {"add_kernel": {"op": "add", "ptx": f"// ptx for sm_{cc[0]}{cc[1]} of add({add(1, 2)})"}}
'''


def test_ptx_comes_from_the_cache_only_for_the_same_tree_and_compiler(
    tree: Path, spec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tree / "kernels" / "runtime").mkdir()
    (tree / "kernels" / "runtime" / "__init__.py").write_text("")
    (tree / "kernels" / "runtime" / "ptx.py").write_text(FAKE_PTX)
    _git(tree, "add", "kernels/runtime")
    _git(tree, "commit", "-q", "-m", "ptx")
    compiles = tree.parent / "compiles.txt"
    monkeypatch.setenv("SOLFLEET_PTX_CACHE", str(tmp_path / "ptx-cache"))

    first = build(spec=spec, version="1.0.0", out_dir=tmp_path / "a", root=tree)
    assert first.ptx_cached == () and compiles.read_text() == "x"
    again = build(spec=spec, version="1.0.0", out_dir=tmp_path / "b", root=tree)
    assert again.ptx_cached == ("9.0",) and compiles.read_text() == "x", "the same tree compiled again"
    assert again.path.read_bytes() == first.path.read_bytes(), "a cached build differs from a fresh one"
    assert len(list((tmp_path / "ptx-cache").glob("*.json"))) == 1

    # a kernel source change is a new key: compiled, and its PTX is the new code's
    (tree / "kernels" / "ops" / "add.py").write_text("def add(a, b):\n    return a + b + 1\n")
    changed = build(spec=spec, version="1.0.1", out_dir=tmp_path / "c", root=tree)
    assert changed.ptx_cached == () and compiles.read_text() == "xx"
    with tarfile.open(changed.path) as tar:
        ptx = tar.extractfile("ptx/sm_90/add.add_kernel.ptx").read().decode()  # type: ignore[union-attr]
    assert ptx.endswith("add(4)")

    # a different compiler environment (a NUMBA_ setting) is a new key too; `off` always compiles
    monkeypatch.setenv("NUMBA_OPT", "1")
    assert build(spec=spec, version="1.0.1", out_dir=tmp_path / "d", root=tree).ptx_cached == ()
    monkeypatch.setenv("SOLFLEET_PTX_CACHE", "off")
    assert build(spec=spec, version="1.0.1", out_dir=tmp_path / "e", root=tree).ptx_cached == ()
    assert compiles.read_text() == "xxxx"


GATED_PTX = '''"""A stand-in compiler that holds its compile until the test says go; counts its runs."""
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[3]


def compile_all(cc):
    counter = HERE / "compiles.txt"
    counter.write_text(counter.read_text() + "x" if counter.exists() else "x")
    (HERE / "started").touch()
    deadline = time.monotonic() + 120
    while not (HERE / "go").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return {"k": {"op": "add", "ptx": f"// ptx for sm_{cc[0]}{cc[1]}"}}
'''


def _gated_tree(tree: Path, monkeypatch: pytest.MonkeyPatch, cache: Path) -> Path:
    (tree / "kernels" / "runtime").mkdir()
    (tree / "kernels" / "runtime" / "__init__.py").write_text("")
    (tree / "kernels" / "runtime" / "ptx.py").write_text(GATED_PTX)
    monkeypatch.setenv("SOLFLEET_PTX_CACHE", str(cache))
    return tree.parent  # where compiles.txt, started and go live


def _wait_for(what: str, check, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_parallel_builds_of_one_tree_compile_its_ptx_once(
    tree: Path, spec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marks = _gated_tree(tree, monkeypatch, tmp_path / "ptx-cache")
    results: dict[str, Any] = {}
    said: dict[str, list[str]] = {"a": [], "b": []}

    def run(name: str) -> None:
        results[name] = build(
            spec=spec, version="1.0.0", out_dir=tmp_path / name, root=tree, progress=said[name].append
        )

    first = threading.Thread(target=run, args=("a",))
    first.start()
    _wait_for("the first build's compile", (marks / "started").exists)
    second = threading.Thread(target=run, args=("b",))
    second.start()
    _wait_for("the second build to wait on the lock", lambda: any("waiting" in s for s in said["b"]))
    (marks / "go").touch()
    first.join(60)
    second.join(60)
    assert (marks / "compiles.txt").read_text() == "x", "both builds compiled the same tree"
    assert said["a"] == ["cc 9.0: compiling PTX"]
    assert said["b"][0].startswith("cc 9.0: waiting for another build of this tree (") and len(said["b"]) == 1
    assert results["a"].ptx_cached == () and results["b"].ptx_cached == ("9.0",)
    assert results["a"].path.read_bytes() == results["b"].path.read_bytes()


def test_a_killed_builds_compile_holds_the_lock_until_it_ends_then_the_next_build_compiles(
    tree: Path, spec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marks = _gated_tree(tree, monkeypatch, tmp_path / "ptx-cache")
    code = (
        "import sys; from pathlib import Path; from fleet.artifact import build\n"
        "from fleet.spec import load_spec, embedded_fleet\n"
        "spec = load_spec(embedded_fleet(), work_dir=Path(sys.argv[1]))\n"
        "build(spec=spec, version='1.0.0', out_dir=Path(sys.argv[2]), root=Path(sys.argv[3]))"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path / "work"), str(tmp_path / "killed"), str(tree)],
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        _wait_for("the holder's compile", (marks / "started").exists)
        (marks / "started").unlink()
        holder.kill()  # SIGKILL: no cleanup runs; its compiling child lives on, holding the lock
        holder.wait(30)
    finally:
        holder.kill()
    said: list[str] = []
    results: list[Any] = []
    after = threading.Thread(
        target=lambda: results.append(
            build(spec=spec, version="1.0.0", out_dir=tmp_path / "after", root=tree, progress=said.append)
        )
    )
    after.start()
    try:
        # no second compile beside the orphaned one: the next build waits for it
        _wait_for("the next build to wait on the lock", lambda: any("waiting" in x for x in said))
        assert not (marks / "started").exists()
    finally:
        (marks / "go").touch()  # the orphan ends (its result is never stored: its build is gone)
        after.join(60)
    assert said[-1] == "cc 9.0: compiling PTX" and len(said) == 2, said
    assert results and results[0].ptx_cached == () and (marks / "compiles.txt").read_text() == "xx"
    assert not list((tmp_path / "killed").glob("*.tar.gz")), "the killed build wrote an artifact"


BROKEN_PTX = '''"""A stand-in compiler whose second kernel does not compile."""


def compile_all(cc):
    return {
        "good": {"op": "add", "ptx": "// ptx", "error": None},
        "bad": {"op": "add", "ptx": None, "error": "TypingError: no such attribute"},
    }
'''


def test_a_kernel_that_does_not_compile_fails_the_build_naming_it(
    tree: Path, spec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tree / "kernels" / "runtime").mkdir()
    (tree / "kernels" / "runtime" / "__init__.py").write_text("")
    (tree / "kernels" / "runtime" / "ptx.py").write_text(BROKEN_PTX)
    monkeypatch.setenv("SOLFLEET_PTX_CACHE", str(tmp_path / "ptx-cache"))
    with pytest.raises(
        BuildFailed, match=r"1 kernel\(s\) failed to compile for 9.0: add.bad: TypingError: no such"
    ):
        build(spec=spec, version="1.0.0", out_dir=tmp_path / "out", root=tree)
    assert not list((tmp_path / "out").glob("*.tar.gz")) and not list((tmp_path / "ptx-cache").glob("*.json"))


def test_a_build_waits_for_another_builds_compile_only_as_long_as_it_is_told(
    tree: Path, spec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marks = _gated_tree(tree, monkeypatch, tmp_path / "ptx-cache")
    results: list[Any] = []
    first = threading.Thread(
        target=lambda: results.append(build(spec=spec, version="1.0.0", out_dir=tmp_path / "a", root=tree))
    )
    first.start()
    try:
        _wait_for("the first build's compile", (marks / "started").exists)
        monkeypatch.setenv("SOLFLEET_PTX_LOCK_WAIT_S", "1")
        start = time.monotonic()
        with pytest.raises(BuildFailed) as err:
            build(spec=spec, version="1.0.0", out_dir=tmp_path / "b", root=tree)
        assert 1 <= time.monotonic() - start < 30
        msg = str(err.value)
        assert "another build of this tree held" in msg
        assert ".json.lock for 1 s (SOLFLEET_PTX_LOCK_WAIT_S)" in msg
        assert not list((tmp_path / "b").glob("*.tar.gz"))
    finally:
        (marks / "go").touch()
        first.join(60)
    assert results and results[0].ptx_cached == ()  # the first build was not disturbed


def test_a_compile_past_its_time_limit_is_stopped_and_fails_the_build(
    tree: Path, spec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marks = _gated_tree(tree, monkeypatch, tmp_path / "ptx-cache")
    monkeypatch.setenv("SOLFLEET_PTX_COMPILE_TIMEOUT_S", "2")
    with pytest.raises(BuildFailed, match=r"PTX for cc 9\.0: the compile ran past 2 s "):
        build(spec=spec, version="1.0.0", out_dir=tmp_path / "a", root=tree)
    assert (marks / "compiles.txt").read_text() == "x"
    # the stopped compile holds no lock and left no cache entry: the next build compiles at once
    monkeypatch.delenv("SOLFLEET_PTX_COMPILE_TIMEOUT_S")
    (marks / "go").touch()
    said: list[str] = []
    done = build(spec=spec, version="1.0.0", out_dir=tmp_path / "b", root=tree, progress=said.append)
    assert said == ["cc 9.0: compiling PTX"] and done.ptx_cached == ()


@pytest.mark.parametrize("name", ["SOLFLEET_PTX_LOCK_WAIT_S", "SOLFLEET_PTX_COMPILE_TIMEOUT_S"])
@pytest.mark.parametrize("value", ["soon", "0", "-5", "inf", "nan"])
def test_a_bad_time_limit_is_refused_naming_it(
    name: str, value: str, tree: Path, spec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marks = _gated_tree(tree, monkeypatch, tmp_path / "ptx-cache")
    monkeypatch.setenv(name, value)
    with pytest.raises(ArtifactError) as err:
        build(spec=spec, version="1.0.0", out_dir=tmp_path / "a", root=tree)
    assert str(err.value) == f"{name}: {value!r} is not allowed; give a number of seconds > 0"
    assert not (marks / "compiles.txt").exists()


SPAWNING_PTX = '''"""A stand-in compiler that starts a helper process (as ptx_export's workers) and hangs."""
import subprocess, sys, time
from pathlib import Path

HERE = Path(__file__).resolve().parents[3]


def compile_all(cc):
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    (HERE / "helper.pid").write_text(str(helper.pid))
    time.sleep(300)
'''


def test_a_stopped_compile_takes_the_processes_it_started_with_it(
    tree: Path, spec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tree / "kernels" / "runtime").mkdir()
    (tree / "kernels" / "runtime" / "__init__.py").write_text("")
    (tree / "kernels" / "runtime" / "ptx.py").write_text(SPAWNING_PTX)
    monkeypatch.setenv("SOLFLEET_PTX_CACHE", "off")
    monkeypatch.setenv("SOLFLEET_PTX_COMPILE_TIMEOUT_S", "3")
    with pytest.raises(BuildFailed, match="the compile ran past 3 s"):
        build(spec=spec, version="1.0.0", out_dir=tmp_path / "a", root=tree)
    pid = int((tree.parent / "helper.pid").read_text())
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and b"Z" not in _proc_state(pid):
        assert time.monotonic() < deadline, "the compile's helper process outlived the stopped compile"
        time.sleep(0.05)


def _proc_state(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().split(b") ", 1)[1][:1]
    except (OSError, IndexError):
        return b"Z"

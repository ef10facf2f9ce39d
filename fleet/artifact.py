"""`solfleet build`: the versioned, reproducible operator artifact.

dist/solfleet-ops-<V>.tar.gz holds MANIFEST.json, the kernels package and offline-compiled PTX per target
compute capability. Same tree + same version -> the same bytes: sorted entries, mtime = the commit time,
uid/gid 0, fixed modes, gzip mtime 0 and no file name in the gzip header. Layout: docs/node-contract.md."""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet import stack as stk
from fleet.errors import ArtifactError, BuildFailed
from fleet.spec import FleetSpec, check_version, project_root

ARTIFACT_NAME = "solfleet-ops"
MANIFEST = "MANIFEST.json"
MANIFEST_FORMAT = 1
_SKIP_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"}
_SKIP_SUFFIXES = (".pyc", ".pyo", ".swp", "~")


@dataclass(frozen=True)
class Provenance:
    commit: str | None
    dirty: bool
    epoch: int  # build time: the commit time (or SOURCE_DATE_EPOCH), never the clock


@dataclass(frozen=True)
class BuildResult:
    path: Path
    sha256: str
    size: int
    manifest: Mapping[str, Any]
    ptx_cached: tuple[str, ...] = ()  # the ccs whose PTX came from the build cache (ptx_cache_dir)


def artifact_path(out_dir: Path, version: str) -> Path:
    return out_dir / f"{ARTIFACT_NAME}-{version}.tar.gz"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _dirty(root: Path, packaged: set[str]) -> bool:
    """True when a packaged file is modified or untracked, or a tracked kernels/ file is deleted: then the
    commit alone does not describe the artifact. Ignored caches (__pycache__) are not packaged, so they
    do not count."""
    out = subprocess.run(
        ["git", "-C", str(root), "status", "--porcelain", "-z", "--untracked-files=all", "--", "kernels"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout  # not stripped: the first entry's status column may be a space
    return any(len(e) > 3 and ("D" in e[:2] or e[3:] in packaged) for e in out.split("\0"))


def provenance(root: Path, packaged: set[str]) -> Provenance:
    """Git commit, whether kernels/ differs from it, and the commit time. SOURCE_DATE_EPOCH (the
    reproducible-builds convention) overrides the time, e.g. when building outside a git checkout."""
    commit: str | None = None
    dirty = False
    epoch: int | None = None
    try:
        commit = _git(root, "rev-parse", "HEAD")
        epoch = int(_git(root, "log", "-1", "--format=%ct", "HEAD"))
        dirty = _dirty(root, packaged)
    except (OSError, subprocess.CalledProcessError, ValueError):
        commit = None
    if os.environ.get("SOURCE_DATE_EPOCH"):
        try:
            epoch = int(os.environ["SOURCE_DATE_EPOCH"])
        except ValueError:
            raise ArtifactError(
                f"SOURCE_DATE_EPOCH: {os.environ['SOURCE_DATE_EPOCH']!r} is not allowed; expected seconds "
                "since 1970 as an integer"
            ) from None
    if epoch is None:
        raise ArtifactError(
            f"{root}: not a git checkout with a commit, and SOURCE_DATE_EPOCH is unset; the build time must "
            "come from one of them (never the clock)"
        )
    return Provenance(commit=commit, dirty=dirty, epoch=epoch)


def _git(root: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def package_files(root: Path) -> dict[str, bytes]:
    """Every file of the kernels package by posix relative path; caches and bytecode excluded."""
    pkg = root / "kernels"
    if not (pkg / "__init__.py").is_file():
        raise ArtifactError(f"{pkg}: no kernels package to build (kernels/__init__.py missing)")
    files: dict[str, bytes] = {}
    for dirpath, dirnames, filenames in os.walk(pkg):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
        for name in sorted(filenames):
            if name.endswith(_SKIP_SUFFIXES) or name.startswith("."):
                continue
            path = Path(dirpath) / name
            if path.is_symlink() or not path.is_file():
                raise ArtifactError(f"{path}: links and special files cannot go into an artifact")
            files[path.relative_to(root).as_posix()] = path.read_bytes()
    return files


# the pins that decide the PTX a build emits; python and the platform pins do not
PTX_PINS = ("numba", "numba_cuda", "llvmlite", "numpy")


def _ptx_env() -> dict[str, str]:
    env = {k: val for k, val in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def check_ptx_stack(spec: FleetSpec, *, python: str, root: Path) -> dict[str, str | None]:
    """The versions the PTX compiler child will load, compared with the spec's pins; a difference refuses
    the build and names the field, since PTX from another numba-cuda is not what the nodes will verify."""
    stack = spec.resolved_stack
    request = {k: v for k, v in stk.probe_request(stack).items() if k in PTX_PINS}
    try:
        proc = subprocess.run(
            [python, "-c", stk.PROBE, json.dumps(request)],
            capture_output=True,
            text=True,
            env=_ptx_env(),
            cwd=str(root),
            check=False,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildFailed(f"--ptx-python {python}: cannot run it: {exc}") from None
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise BuildFailed(f"--ptx-python {python}: version probe failed: {tail}")
    actual: dict[str, str | None] = json.loads(proc.stdout)
    expected = {k: v for k, v in stack.pins.items() if k in PTX_PINS}
    result = stk.compare(expected=expected, actual=actual)
    if not result.ok:
        raise BuildFailed(
            f"PTX would be compiled by {python}, which differs from the spec: {result}; "
            "build with an interpreter holding the pinned stack (--ptx-python, e.g. a provisioned runtime)"
        )
    return actual


# What decides a kernel's PTX besides its source: the compiler child's interpreter and every distribution it
# can import (numba, numba-cuda, llvmlite, the NVVM/NVRTC wheels, numpy), ptxas for the register report, and
# NUMBA_* settings. Printed by the child's interpreter itself, so a --ptx-python runtime answers for itself.
_PTX_FINGERPRINT = r"""
import importlib.metadata as m, json, os, shutil, subprocess, sys
ptxas = shutil.which("ptxas")
try:
    ptxas_v = ""
    if ptxas:
        ptxas_v = subprocess.run([ptxas, "--version"], capture_output=True, text=True, timeout=30).stdout
except Exception as exc:
    ptxas_v = f"unusable: {exc}"
print(json.dumps({
    "python": sys.version,
    "dists": sorted({(d.metadata["Name"] or "?").lower() + "==" + d.version for d in m.distributions()}),
    "ptxas": ptxas_v,
    "env": sorted((k, v) for k, v in os.environ.items()
                  if k.startswith(("NUMBA_", "CUDA_")) or k in ("CUDA_HOME", "CUDA_PATH", "LD_LIBRARY_PATH")),
}))
"""
PTX_CACHE_ENV = "SOLFLEET_PTX_CACHE"  # a directory, or "off"; default $XDG_CACHE_HOME/solfleet/ptx
# Seconds a build waits for another build's compile of the same tree, and a compile may take, before the build
# fails naming it (a cold compile: 144-275 s on 2 cores; a hung one would otherwise block every later build)
LOCK_WAIT_ENV, COMPILE_TIMEOUT_ENV = "SOLFLEET_PTX_LOCK_WAIT_S", "SOLFLEET_PTX_COMPILE_TIMEOUT_S"
DEFAULT_WAIT_S = 3600.0


def _seconds(name: str) -> float:
    """A positive number of seconds from environment variable `name` (DEFAULT_WAIT_S when unset)."""
    text = os.environ.get(name, "")
    if not text:
        return DEFAULT_WAIT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (0 < value < float("inf")):
        raise ArtifactError(f"{name}: {text!r} is not allowed; give a number of seconds > 0")
    return value


def ptx_cache_dir() -> Path | None:
    """Where builds keep compiled PTX by content key; None when the cache is off."""
    setting = os.environ.get(PTX_CACHE_ENV, "")
    if setting == "off":
        return None
    if setting:
        return Path(setting)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "solfleet" / "ptx"


def _ptx_key(
    cc: str, *, root: Path, python: str, env: Mapping[str, str], kernels: Mapping[str, bytes]
) -> str | None:
    """Content key of one target's PTX: the cc, every file of the tree's kernels/ (what the child compiles),
    fleet/ptx_export.py (how it reports), and the child interpreter's fingerprint. None (no caching, the
    build compiles) when the fingerprint cannot be taken."""
    try:
        proc = subprocess.run(
            [python, "-c", _PTX_FINGERPRINT],
            capture_output=True,
            text=True,
            env=dict(env),
            cwd=str(root),
            check=False,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    h = hashlib.sha256()
    h.update(f"cc={cc}\n".encode())
    h.update(proc.stdout.encode())
    h.update((Path(__file__).parent / "ptx_export.py").read_bytes())
    for rel in sorted(kernels):
        h.update(f"{rel}\0{len(kernels[rel])}\0".encode())
        h.update(kernels[rel])
    return h.hexdigest()


def _cached(entry: Path | None) -> list[dict[str, Any]] | None:
    """The records of a cache entry, or None (absent, unreadable or corrupt: a miss, never an error)."""
    if entry is None:
        return None
    try:
        records = json.loads(entry.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return records if isinstance(records, list) else None


def _compile_one(
    cc: str, *, root: Path, python: str, env: Mapping[str, str], lock_fd: int | None = None
) -> tuple[int, str, str]:
    """`lock_fd`: the cache entry's lock, inherited by the child, so the lock lasts as long as the compile
    does even if this build is killed (a second build then waits instead of compiling beside it)."""
    limit = _seconds(COMPILE_TIMEOUT_ENV)
    # its own process group: a compile past the limit is stopped with the per-op processes it spawned
    with subprocess.Popen(
        [python, "-m", "fleet.ptx_export", cc],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(env),
        cwd=str(root),
        pass_fds=() if lock_fd is None else (lock_fd,),
        start_new_session=True,
    ) as proc:
        try:
            out, err = proc.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise BuildFailed(
                f"PTX for cc {cc}: the compile ran past {limit:g} s ({COMPILE_TIMEOUT_ENV}) and was stopped"
            ) from None
    return proc.returncode, out, err


def compile_targets(
    ccs: tuple[str, ...],
    *,
    root: Path,
    python: str | None = None,
    kernels: Mapping[str, bytes] | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, bytes], list[str]]:
    """PTX of every kernel for each target, compiled offline in child processes (kernels.runtime.ptx, via
    fleet.ptx_export) so a simulator setting or CUDA state of this process cannot leak in. `kernels`: the
    tree's kernels/ files (path -> bytes), the PTX cache's key; without it nothing is cached. Builds of the
    same key serialise on the entry's lock: one compiles, the others wait and read its result. `progress`
    gets one line before a compile or a wait. Returns the targets, the PTX files and the ccs whose PTX came
    from the cache (byte-identical to a fresh compile: the key holds everything the compile reads)."""
    targets: list[dict[str, Any]] = []
    files: dict[str, bytes] = {}
    cached: list[str] = []
    env = _ptx_env()
    # the child imports fleet.ptx_export from this checkout even when it is another interpreter
    env["PYTHONPATH"] = os.pathsep.join([str(project_root()), *filter(None, [env.get("PYTHONPATH")])])
    # `python -m` puts cwd (= root) first on sys.path: the child compiles the kernels being packaged
    python = python or sys.executable
    say = progress or (lambda line: None)
    cache = ptx_cache_dir() if kernels is not None else None
    for cc in ccs:
        entry, fresh = None, False
        if cache is not None and kernels is not None:
            key = _ptx_key(cc, root=root, python=python, env=env, kernels=kernels)
            entry = cache / f"{key}.json" if key else None
        records = _cached(entry)
        if records is None:
            waiting = f"cc {cc}: waiting for another build of this tree"
            with _entry_lock(entry, say, waiting, _seconds(LOCK_WAIT_ENV)) as lock_fd:
                records = _cached(entry)  # that other build may have stored it while this one waited
                if records is None:
                    say(f"cc {cc}: compiling PTX")
                    rc, out, err = _compile_one(cc, root=root, python=python, env=env, lock_fd=lock_fd)
                    if rc == 3:  # kernels.runtime.ptx does not exist (yet): build without PTX, and say so
                        targets.append({"cc": cc, "ptx_status": f"unavailable: {out.strip()}", "kernels": []})
                        continue
                    if rc != 0:
                        tail = (err.strip().splitlines() or ["no output"])[-1].strip()
                        raise BuildFailed(f"PTX for cc {cc} failed to compile: {tail}")
                    records = json.loads(out)
                    # stored only if the tree on disk is still the one the key hashed (not edited mid-build)
                    if entry is not None and kernels is not None and _unchanged(root, kernels):
                        _store(entry, out)
                    fresh = True
        if not fresh:
            cached.append(cc)
        kernels_out = []
        sm = "sm_" + cc.replace(".", "")
        for k in records:
            rel = f"ptx/{sm}/{k['op']}.{k['kernel']}.ptx"
            files[rel] = k["ptx"].encode()
            kernels_out.append({key: val for key, val in k.items() if key != "ptx"} | {"ptx": rel})
        targets.append({"cc": cc, "ptx_status": "ok", "kernels": sorted(kernels_out, key=lambda k: k["ptx"])})
    return targets, files, cached


@contextlib.contextmanager
def _entry_lock(
    entry: Path | None, say: Callable[[str], None], waiting: str, wait_s: float = DEFAULT_WAIT_S
) -> Iterator[int | None]:
    """An exclusive flock on `<entry>.lock` while one build compiles that entry, so parallel builds of one
    tree compile it once (the test suite's workers start several at once). Yields the lock's fd (None
    without a lock) for the compiling child to inherit: the kernel drops the lock when the last holder
    exits, killed or not. Best effort like _store: no entry, or a cache dir or filesystem that cannot hold
    the lock, compiles without it. `say` gets `waiting` and the lock's path when another build holds it;
    after `wait_s` seconds of waiting the build fails (BuildFailed) naming the lock."""
    fd = None
    if entry is not None:
        lock = entry.with_name(entry.name + ".lock")
        try:
            lock.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                say(f"{waiting} ({lock})")
                _wait_lock(fd, lock, wait_s)
        except OSError:  # e.g. ENOLCK on a network filesystem: compile unlocked
            if fd is not None:
                os.close(fd)
            fd = None
        except BuildFailed:  # only _wait_lock raises it, after the open
            if fd is not None:
                os.close(fd)
            raise
    try:
        yield fd
    finally:
        if fd is not None:
            os.close(fd)


def _wait_lock(fd: int, lock: Path, wait_s: float) -> None:
    """flock `fd` exclusively, polling, for at most `wait_s` seconds."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise BuildFailed(
                    f"another build of this tree held {lock} for {wait_s:g} s ({LOCK_WAIT_ENV}): its PTX"
                    " compile may be hung; stop that build and its `python -m fleet.ptx_export`, then build"
                    " again"
                ) from None
            time.sleep(0.2)


def _unchanged(root: Path, kernels: Mapping[str, bytes]) -> bool:
    try:
        return all((root / rel).read_bytes() == data for rel, data in kernels.items())
    except OSError:
        return False


def _store(entry: Path, text: str) -> None:
    """Best effort (a read-only or full cache dir only costs the next build a compile): temp file, rename,
    so concurrent builds never read half an entry."""
    tmp = entry.with_name(f"{entry.name}.{os.getpid()}.tmp")
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, entry)
    except OSError:
        tmp.unlink(missing_ok=True)


def build(
    *,
    spec: FleetSpec,
    version: str,
    out_dir: Path,
    root: Path | None = None,
    ptx_python: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> BuildResult:
    """`ptx_python`: the interpreter that compiles PTX (default: this one); its numba, numba-cuda,
    llvmlite and numpy must match the spec's pins, or the build is refused naming the field. `progress`:
    where the PTX step's lines go (compiling, waiting for another build)."""
    check_version(version)
    root = root or project_root()
    files = package_files(root)
    prov = provenance(root, set(files))
    out_dir.mkdir(parents=True, exist_ok=True)  # before the ~30 s of PTX: a bad --out fails at once
    python = ptx_python or sys.executable
    if spec.compute_capabilities:
        check_ptx_stack(spec, python=python, root=root)
    kernel_files = {rel: data for rel, data in files.items() if rel.startswith("kernels/")}
    targets, ptx_files, cached = compile_targets(
        spec.compute_capabilities, root=root, python=python, kernels=kernel_files, progress=progress
    )
    files.update(ptx_files)
    manifest: dict[str, Any] = {
        "format": MANIFEST_FORMAT,
        "name": ARTIFACT_NAME,
        "version": version,
        "git": {"commit": prov.commit, "dirty": prov.dirty},
        "build_time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(prov.epoch)),
        "stack": spec.resolved_stack.as_manifest(),
        "stack_id": spec.stack_id,
        "targets": targets,
        "files": {rel: hashlib.sha256(data).hexdigest() for rel, data in sorted(files.items())},
    }
    files[MANIFEST] = (json.dumps(manifest, sort_keys=True, indent=1) + "\n").encode()
    blob = tar_gz(files, mtime=prov.epoch)
    target = artifact_path(out_dir, version)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_bytes(blob)
    os.replace(tmp, target)
    digest = hashlib.sha256(blob).hexdigest()
    target.with_name(target.name + ".sha256").write_text(f"{digest}  {target.name}\n")
    return BuildResult(
        path=target, sha256=digest, size=len(blob), manifest=manifest, ptx_cached=tuple(cached)
    )


def tar_gz(files: Mapping[str, bytes], *, mtime: int) -> bytes:
    """Deterministic tar.gz of `files` (posix path -> bytes) with the parent directories as entries."""
    dirs = {str(Path(rel).parents[i].as_posix()) for rel in files for i in range(len(Path(rel).parents) - 1)}
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(dirs | set(files)):
            info = tarfile.TarInfo(name)
            info.mtime = mtime
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if name in files:
                info.mode = 0o644
                info.size = len(files[name])
                tar.addfile(info, io.BytesIO(files[name]))
            else:
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tar.addfile(info)
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0, compresslevel=9) as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


def read_manifest(path: Path) -> dict[str, Any]:
    """MANIFEST.json of an artifact, for `deploy` to check the version before touching anyone."""
    try:
        with tarfile.open(path, mode="r:gz") as tar:
            member = tar.extractfile(MANIFEST)
            if member is None:
                raise KeyError(MANIFEST)
            data: dict[str, Any] = json.loads(member.read())
            return data
    except FileNotFoundError:
        raise ArtifactError(f"--artifact: {path} does not exist; build it with `solfleet build`") from None
    except (OSError, tarfile.TarError, KeyError, ValueError) as exc:
        raise ArtifactError(f"--artifact: {path} is not a solfleet artifact ({exc})") from None

"""A solfleet artifact on a node: safe unpacking, the MANIFEST.json file check, stack pins, compute capability

Stdlib only (runs under the node's Python). What is checked is written down in docs/node-contract.md,
"What the node-side module checks". Every failure raises NodeError(phase, "refused", one line).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import shutil
import stat
import subprocess
import tarfile
import zlib

from ansible.module_utils.solfleet_kernels import kernels_env
from ansible.module_utils.solfleet_layout import VERIFY_DIR, NodeError

MANIFEST = "MANIFEST.json"
CHUNK = 1 << 20
SPACE_MARGIN = 64 << 20  # never fill a node's disk to the last byte with a release
# Stack pins the node checks; manifest key -> (distribution, top-level module) on the node. Driver/CUDA pins
# belong to provision (platform changes roll out separately) and are not compared here. The manifest's
# `requirements` (name==version) are checked too.
STACK_DISTS = {
    "numba": ("numba", "numba"),
    "numba_cuda": ("numba-cuda", "numba_cuda"),
    "numpy": ("numpy", "numpy"),
    "llvmlite": ("llvmlite", "llvmlite"),
}
_MODULES = {"pyyaml": "yaml", "nvidia-ml-py": "pynvml"}

# The same probe as fleet/stack.py PROBE: the version of the distribution that `import <module>` would load
# (its dist-info next to the module), so a shadowed package is reported as the one that actually loads.
_PROBE = r"""
import importlib.metadata as m, importlib.util as u, json, os, re, sys
want = json.loads(sys.argv[1])
out = {"python": "%d.%d.%d" % sys.version_info[:3]}
def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()
def version(dist, module):
    spec = u.find_spec(module) if module else None
    if spec is not None and spec.origin:
        top = spec.origin
        for _ in range(module.count(".") + (2 if os.path.basename(top).startswith("__init__.") else 1)):
            top = os.path.dirname(top)
        # its dist-info found by folder name first (reads one METADATA, not every one there), then by the
        # Name inside any folder (a folder named otherwise)
        for found in (m.distributions(name=dist, path=[top]), m.distributions(path=[top])):
            for d in found:
                if d.metadata["Name"] and norm(d.metadata["Name"]) == norm(dist):
                    return d.version
    try:
        return m.version(dist)
    except m.PackageNotFoundError:
        return None
for key, (dist, module) in want.items():
    out[key] = version(dist, module)
print(json.dumps(out))
"""


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def _member_problem(member: tarfile.TarInfo) -> str | None:
    """Why a tar member may not be unpacked, or None. Checked for every member before anything is written."""
    name = member.name
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        return "absolute path"
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts:
        return "empty name"
    if ".." in parts:
        return "'..' escapes the release dir"
    if "\\" in name or "\x00" in name:
        return "backslash or NUL in name"
    if member.issym() or member.islnk():
        return "link"
    if member.ischr() or member.isblk() or member.isfifo() or member.isdev():
        return "device or fifo"
    if not (member.isfile() or member.isdir()):
        return "not a regular file or directory"
    return None


def safe_unpack(tar_path: str, dest: str) -> None:
    """Unpack a gzip tarball into `dest` (which must not exist), refusing any member that escapes it."""
    try:
        archive = tarfile.open(tar_path, mode="r:gz")  # noqa: SIM115  (closed by the `with` below)
    except (OSError, tarfile.TarError) as exc:
        raise NodeError("unpack_check", "refused", f"cannot open artifact {tar_path}: {exc}") from None
    with archive:
        try:
            members = archive.getmembers()
        except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
            raise NodeError(
                "unpack_check", "refused", f"artifact {tar_path} is not a valid gzip tar: {exc}"
            ) from None
        for member in members:
            problem = _member_problem(member)
            if problem:
                raise NodeError(
                    "unpack_check", "refused", f"artifact member {member.name!r} refused: {problem}"
                )
        # A tarball can expand far beyond its compressed size: check the space before writing a byte.
        need = sum(m.size for m in members if m.isfile())
        free = shutil.disk_usage(os.path.dirname(dest)).free
        if need > free - SPACE_MARGIN:
            raise NodeError(
                "unpack_check",
                "refused",
                f"artifact unpacks to {need >> 20} MiB but {os.path.dirname(dest)} has {free >> 20} MiB free"
                f" (keeping {SPACE_MARGIN >> 20} MiB spare)",
            )
        os.makedirs(dest, mode=0o755)
        try:
            _write_members(archive, members, dest)
        # duplicate member, a file where a directory is expected, disk full, a truncated stream...
        except (OSError, tarfile.TarError, EOFError, zlib.error) as exc:
            raise NodeError("unpack_check", "refused", f"cannot unpack artifact: {exc}") from None


def _write_members(archive: tarfile.TarFile, members: list[tarfile.TarInfo], dest: str) -> None:
    real_dest = os.path.realpath(dest)
    for member in members:
        rel = "/".join(p for p in member.name.split("/") if p not in ("", "."))
        target = os.path.join(dest, rel)
        if member.isdir():
            os.makedirs(target, mode=0o755, exist_ok=True)
            continue
        os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
        # Belt and braces: members were checked above and no links are ever created, so this only trips
        # if something else changes the tree while we unpack.
        parent = os.path.realpath(os.path.dirname(target))
        if os.path.commonpath([parent, real_dest]) != real_dest:
            raise NodeError(
                "unpack_check", "refused", f"artifact member {member.name!r} escapes the release dir"
            )
        source = archive.extractfile(member)
        if source is None:
            raise NodeError("unpack_check", "refused", f"artifact member {member.name!r} has no data")
        # O_EXCL + O_NOFOLLOW: never write through a pre-existing file or link.
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as out, source:
            for block in iter(lambda src=source: src.read(CHUNK), b""):
                out.write(block)


def read_manifest(release: str) -> dict:
    path = os.path.join(release, MANIFEST)
    try:
        with open(path, encoding="utf-8") as fh:
            manifest = json.load(fh)
    except FileNotFoundError:
        raise NodeError("unpack_check", "refused", f"{MANIFEST} is missing from the release") from None
    except (OSError, ValueError) as exc:
        raise NodeError("unpack_check", "refused", f"{MANIFEST} is unreadable: {exc}") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise NodeError("unpack_check", "refused", f"{MANIFEST} has no 'files' object of path -> sha256")
    return manifest


def release_files(release: str) -> tuple[list[str], list[str]]:
    """Relative paths of the regular files of a release (minus MANIFEST.json and verify/), and non-files."""
    files: list[str] = []
    odd: list[str] = []
    for dirpath, dirnames, filenames in os.walk(release):
        rel_dir = os.path.relpath(dirpath, release)
        if rel_dir == ".":
            dirnames[:] = [d for d in dirnames if d != VERIFY_DIR]
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            if os.path.islink(full):
                odd.append(os.path.normpath(os.path.join(rel_dir, name)))
        for name in filenames:
            rel = os.path.normpath(os.path.join(rel_dir, name))
            mode = os.lstat(os.path.join(dirpath, name)).st_mode
            if not stat.S_ISREG(mode):
                if rel not in odd:
                    odd.append(rel)
                continue
            if rel != MANIFEST:
                files.append(rel)
    return files, odd


def check_files(release: str, manifest: dict) -> int:
    """Every file matches the manifest sha256; no file missing, none extra. Returns the number checked."""
    expected: dict[str, str] = manifest["files"]
    present, odd = release_files(release)
    if odd:
        raise NodeError("unpack_check", "refused", f"release holds a link or special file: {sorted(odd)[0]}")
    extra = sorted(set(present) - set(expected))
    if extra:
        raise NodeError("unpack_check", "refused", f"file not in {MANIFEST}: {extra[0]} ({len(extra)} extra)")
    missing = sorted(set(expected) - set(present))
    if missing:
        raise NodeError("unpack_check", "refused", f"file listed in {MANIFEST} is missing: {missing[0]}")
    for rel in sorted(expected):
        actual = sha256_file(os.path.join(release, rel))
        if actual != expected[rel]:
            raise NodeError(
                "unpack_check",
                "refused",
                f"sha256 mismatch for {rel}: manifest {expected[rel][:12]}..., file {actual[:12]}...",
            )
    return len(expected)


def pin_matches(pin: str, actual: str) -> bool:
    """Equal, a prefix at a dot boundary ('3.11' ~ '3.11.7'), or an fnmatch glob ('2.4.*')."""
    return actual == pin or actual.startswith(pin + ".") or fnmatch.fnmatchcase(actual, pin)


def requirements_of(pins: dict) -> dict:
    """The manifest's `requirements` list ("name==version") as dist -> version."""
    out = {}
    for text in pins.get("requirements") or []:
        name, _, version = str(text).partition("==")
        name = name.split("[")[0].strip().lower().replace("_", "-")
        if name and version:
            out[name] = version.strip()
    return out


def node_stack(
    python: str,
    timeout_s: float,
    *,
    release: str | None = None,
    cache_dir: str | None = None,
    simulated: bool = False,
    config: str | None = None,
    requirements: dict | None = None,
) -> dict:
    """Versions of python and the pinned packages as `python -m kernels` will see them: the same clean
    environment (solfleet_kernels.kernels_env) and, when `release` is given, the same cwd and PYTHONPATH."""
    want = dict(STACK_DISTS)
    for dist in requirements or {}:
        want[dist] = (dist, _MODULES.get(dist, dist.replace("-", "_")))
    env = kernels_env(release, cache_dir or os.path.join(os.sep, "tmp"), simulated, config=config)
    try:
        proc = subprocess.run(
            [python, "-c", _PROBE, json.dumps(want)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            env=env,
            cwd=release or None,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NodeError("stack_check", "refused", f"cannot run solfleet_python {python}: {exc}") from None
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise NodeError("stack_check", "refused", f"solfleet_python {python} failed: {tail}")
    return json.loads(proc.stdout)


def stack_difference(pins: dict, actual: dict) -> str | None:
    """The first field where `actual` differs from the pins, as one line naming it; None when they match."""
    expected = {key: pins.get(key) for key in ("python", *STACK_DISTS)}
    expected.update(requirements_of(pins))
    for key, pin in expected.items():
        if pin in (None, "", "auto"):
            continue
        have = actual.get(key)
        if have is None:
            return f"stack pin {key}={pin} but {key} is not installed"
        if not pin_matches(str(pin), have):
            return f"stack pin {key}={pin} but the node has {key} {have}"
    return None


def check_stack(
    manifest: dict,
    python: str,
    timeout_s: float = 30.0,
    *,
    release: str | None = None,
    cache_dir: str | None = None,
    simulated: bool = False,
    config: str | None = None,
) -> dict:
    """Compare the manifest's stack pins with the node; returns the node's versions. Pass the `release`,
    `cache_dir` and `simulated` that verify will use: the check then sees exactly what verify will load."""
    pins = manifest.get("stack") or {}
    actual = node_stack(
        python,
        timeout_s,
        release=release,
        cache_dir=cache_dir,
        simulated=simulated,
        config=config,
        requirements=requirements_of(pins),
    )
    why = stack_difference(pins, actual)
    if why:
        raise NodeError("stack_check", "refused", f"{why} (as {python} sees it, in the verify environment)")
    return actual


def manifest_ccs(manifest: dict) -> list[str]:
    targets = manifest.get("targets") or []
    if isinstance(targets, dict):
        return [str(k) for k in targets]
    return [str(t.get("cc") if isinstance(t, dict) else t) for t in targets]


def check_cc(manifest: dict, gpu_cc: str, simulated: bool) -> None:
    if simulated:
        return  # the simulator has no compute capability; DESIGN: every report says `simulated` instead
    ccs = manifest_ccs(manifest)
    if not gpu_cc:
        raise NodeError("stack_check", "refused", "node is not simulated but solfleet_gpu_cc is empty")
    if gpu_cc not in ccs:
        raise NodeError(
            "stack_check",
            "refused",
            f"node compute capability {gpu_cc} is not among the artifact's targets {ccs}",
        )

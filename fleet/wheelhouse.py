"""`solfleet wheelhouse`: the stack's wheels for the nodes' Python and platform, hashed and locked, as one
artifact per stack (pushed once per stack, never once per release), so air-gapped nodes need no registry.

<out>/solfleet-wheelhouse-<stack-id>/            the wheels, requirements.lock, MANIFEST.json, pip's own wheel
<out>/solfleet-wheelhouse-<stack-id>.tar.gz       the same, deterministic, top dir <stack-id>/ (pushed)

The wheels come from `pip download --only-binary=:all: --platform ... --python-version ...` (a registry, or
`--find-links DIR --no-index` for a directory of wheels), so the controller's own platform does not matter.
requirements.lock pins every wheel with its sha256 for `pip install --no-index --require-hashes --no-deps`.
pip itself travels as a wheel (MANIFEST `installer`) and runs from it on the node: a base interpreter
without ensurepip (Debian's, Ubuntu's) can still build the runtime.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet.artifact import sha256_file, tar_gz
from fleet.errors import BuildFailed, UsageError
from fleet.provision_spec import RuntimeMode
from fleet.spec import FleetSpec
from fleet.stack import PACKAGE_PINS, canonical_name

WHEELHOUSE_FORMAT = 1
LOCK = "requirements.lock"
MANIFEST = "MANIFEST.json"
_WHEEL_RE = re.compile(r"(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-[^-]+-[^-]+-[^-]+\.whl")
_PIN_KEY = {dist: key for key, dist in PACKAGE_PINS.items()}
# pip matches --platform tags exactly: a wheel tagged manylinux_2_17 is only taken when that tag is listed
_LEGACY_MANYLINUX = {"manylinux2014": (2, 17), "manylinux2010": (2, 12), "manylinux1": (2, 5)}


@dataclass(frozen=True)
class Wheelhouse:
    directory: Path
    archive: Path
    sha256: str  # of the archive
    stack_id: str
    manifest: dict[str, Any]


def wheelhouse_name(stack_id: str) -> str:
    return f"solfleet-wheelhouse-{stack_id}"


def archive_path(out_dir: Path, stack_id: str) -> Path:
    return out_dir / f"{wheelhouse_name(stack_id)}.tar.gz"


def platform_tags(platform: str) -> list[str]:
    """`manylinux_2_28_x86_64` -> itself and every older manylinux tag of that arch (2_27..2_5, 2014, 1)."""
    m = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", platform)
    if not m:
        return [platform]
    top, arch = int(m.group(1)), m.group(2)
    tags = [f"manylinux_2_{n}_{arch}" for n in range(top, 4, -1)]
    tags += [f"{legacy}_{arch}" for legacy, (_, n) in _LEGACY_MANYLINUX.items() if n <= top]
    return tags


def requirements(spec: FleetSpec) -> list[str]:
    """What the wheelhouse must hold: every carried package at its pin (numba-cuda with its cu13 extra in
    venv mode, so NVRTC/NVVM/nvJitLink come from wheels too)."""
    stack = spec.resolved_stack
    carry = set(spec.provision.carry) if spec.provision else None
    out: list[str] = []
    for key, dist in PACKAGE_PINS.items():
        if key not in stack.pins or (carry is not None and dist not in carry):
            continue
        extra = "[cu13]" if dist == "numba-cuda" and _mode(spec) is RuntimeMode.VENV else ""
        out.append(f"{dist}{extra}=={stack.pins[key]}")
    for r in stack.requirements:
        if carry is None or r.name in carry:
            out.append(str(r))
    return out


def _mode(spec: FleetSpec) -> RuntimeMode:
    return spec.provision.mode if spec.provision else RuntimeMode.VENV


def _python_version(spec: FleetSpec) -> str:
    parts = spec.stack["python"].split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts[:2]):
        raise UsageError(
            f"stack.python {spec.stack['python']!r}: a wheelhouse needs a MAJOR.MINOR python pin"
        )
    return ".".join(parts[:2])


def _pip(
    python: str, args: Sequence[str], *, what: str, timeout_s: int = 1800
) -> subprocess.CompletedProcess[str]:
    # PYTHONPATH is kept: on a machine without pip in the interpreter, pip itself may come from there
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    try:
        proc = subprocess.run(
            [python, "-m", "pip", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildFailed(f"{what}: {exc}") from None
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()] or ["no output"]
        raise BuildFailed(f"{what} failed: {lines[-1].strip()}")
    return proc


def lock_line(wheel: Path, digest: str) -> tuple[str, str]:
    m = _WHEEL_RE.fullmatch(wheel.name)
    if not m:
        raise BuildFailed(f"{wheel.name}: not a wheel file name (name-version-py-abi-platform.whl)")
    return canonical_name(m.group("name")), m.group("version")


def build_wheelhouse(
    *,
    spec: FleetSpec,
    out_dir: Path,
    find_links: Sequence[str] = (),
    index_url: str | None = None,
    no_index: bool = False,
    python: str | None = None,
) -> Wheelhouse:
    """Download, hash, lock and pack the stack's wheels. Re-running with the same wheels gives the same
    archive bytes (sorted entries, fixed mtimes)."""
    stack = spec.resolved_stack
    sid = stack.id
    reqs = requirements(spec)
    py = python or sys.executable
    platforms = [a for tag in platform_tags(stack.platform) for a in ("--platform", tag)]
    common = [
        "--only-binary=:all:",
        *platforms,
        "--python-version",
        _python_version(spec),
        "--implementation",
        "cp",
    ]
    sources: list[str] = []
    for link in find_links:
        sources += ["--find-links", link]
    if no_index:
        sources.append("--no-index")
    if index_url:
        sources += ["--index-url", index_url]
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="solfleet-wheelhouse-") as tmp:
        tmpdir = Path(tmp)
        if reqs:
            req_file = tmpdir / "requirements.in"
            req_file.write_text("\n".join(reqs) + "\n")
            # layered: exactly the carried wheels (the layer holds their dependencies); venv: resolved deps
            deps = ["--no-deps"] if _mode(spec) is RuntimeMode.LAYERED else []
            _pip(
                py,
                ["download", "--dest", str(tmpdir / "wheels"), *common, *deps, *sources, "-r", str(req_file)],
                what=f"pip download of {', '.join(reqs)}",
            )
        _pip(
            py,
            ["download", "--dest", str(tmpdir / "installer"), "--no-deps", *common, *sources, "pip"],
            what="pip download of pip (the node's installer)",
        )
        wheels = sorted((tmpdir / "wheels").glob("*.whl")) if reqs else []
        installer = sorted((tmpdir / "installer").glob("pip-*.whl"))
        if not installer:
            raise BuildFailed("pip download of pip gave no pip-*.whl")
        files = {w.name: sha256_file(w) for w in [*wheels, installer[-1]]}
        lines = [
            f"# solfleet wheelhouse lock, stack {sid}: pip install --no-index --require-hashes --no-deps"
        ]
        locked: dict[str, str] = {}
        for w in wheels:
            name, version = lock_line(w, files[w.name])
            if name in locked:
                raise BuildFailed(f"two wheels of {name} ({locked[name]}, {version}): keep one version")
            locked[name] = version
            lines.append(f"{name}=={version} --hash=sha256:{files[w.name]}")
        lock_text = "\n".join(lines) + "\n"
        manifest: dict[str, Any] = {
            "format": WHEELHOUSE_FORMAT,
            "kind": "wheelhouse",
            "stack": stack.as_manifest(),
            "stack_id": sid,
            "python": _python_version(spec),
            "platform": stack.platform,
            "mode": _mode(spec).value,
            "requirements": reqs,
            "locked": dict(sorted(locked.items())),
            "lock": LOCK,
            "lock_sha256": hashlib.sha256(lock_text.encode()).hexdigest(),
            "installer": installer[-1].name,
            "files": dict(sorted(files.items())),
        }
        _check_locked_pins(spec, locked)
        blobs = {
            f"{sid}/{name}": (
                tmpdir / ("installer" if name == installer[-1].name else "wheels") / name
            ).read_bytes()
            for name in files
        }
        blobs[f"{sid}/{LOCK}"] = lock_text.encode()
        blobs[f"{sid}/{MANIFEST}"] = (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()
    directory = out_dir / wheelhouse_name(sid)
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir()
    for rel, data in blobs.items():
        (directory / rel.split("/", 1)[1]).write_bytes(data)
    archive = archive_path(out_dir, sid)
    blob = tar_gz(blobs, mtime=0)
    tmp_archive = archive.with_name(archive.name + ".tmp")
    tmp_archive.write_bytes(blob)
    os.replace(tmp_archive, archive)
    return Wheelhouse(
        directory=directory,
        archive=archive,
        sha256=hashlib.sha256(blob).hexdigest(),
        stack_id=sid,
        manifest=manifest,
    )


def _check_locked_pins(spec: FleetSpec, locked: dict[str, str]) -> None:
    """A downloaded wheel must match its pin (a glob pin resolves to one version; the lock keeps it)."""
    from fleet.stack import pin_matches

    stack = spec.resolved_stack
    for name, version in locked.items():
        key = _PIN_KEY.get(name)
        pin = (
            stack.pins.get(key)
            if key
            else next((r.version for r in stack.requirements if r.name == name), None)
        )
        if pin is not None and not pin_matches(pin, version):
            raise BuildFailed(f"wheelhouse: {name} {version} was downloaded but the stack pins {pin}")


def read_wheelhouse(path: Path, *, stack_id: str) -> dict[str, Any]:
    """The MANIFEST of a built wheelhouse archive; refuses one for another stack."""
    import tarfile

    try:
        with tarfile.open(path, "r:gz") as tar:
            member = tar.extractfile(f"{stack_id}/{MANIFEST}")
            if member is None:
                raise KeyError(MANIFEST)
            manifest: dict[str, Any] = json.loads(member.read())
    except FileNotFoundError:
        raise UsageError(
            f"--wheelhouse: {path} does not exist; build it with `solfleet wheelhouse` (one per stack)"
        ) from None
    except KeyError:
        raise UsageError(
            f"--wheelhouse: {path} holds no wheelhouse for stack {stack_id} (another stack?)"
        ) from None
    except (OSError, tarfile.TarError, ValueError) as exc:
        raise UsageError(f"--wheelhouse: {path} is not a solfleet wheelhouse ({exc})") from None
    if manifest.get("kind") != "wheelhouse" or manifest.get("stack_id") != stack_id:
        raise UsageError(f"--wheelhouse: {path} is for stack {manifest.get('stack_id')}, not {stack_id}")
    return manifest

"""The stack: one version combination (driver branch, CUDA, Python, numba, numba-cuda, numpy, llvmlite and
the runtime's other locked requirements), its id, and the comparison of a runtime's versions with it.

The spec's `stack` is the truth. Its id is the sha256 of the fully resolved pins (every `auto` replaced by
a version, the requirements sorted), so two specs that mean the same runtime name the same
`runtimes/<stack-id>` on a node, and changing any pin names a new one.

Pin semantics, shared with the node side (playbooks/module_utils/solfleet_artifact.py `pin_matches`): equal,
a prefix at a dot boundary (`3.12` ~ `3.12.3`), or an fnmatch glob (`2.4.*`).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import metadata

from fleet.errors import SpecError

# spec key -> the distribution whose version a runtime reports for it (python: the interpreter itself)
PACKAGE_PINS: Mapping[str, str] = {
    "numba": "numba",
    "numba_cuda": "numba-cuda",
    "numpy": "numpy",
    "llvmlite": "llvmlite",
}
RUNTIME_PINS = ("python", *PACKAGE_PINS)  # what a node's runtime is checked against
PLATFORM_PINS = ("driver", "cuda")  # managed by provision (driver role); never a pip package
PIN_KEYS = (*RUNTIME_PINS, *PLATFORM_PINS)
REQUIRED_PINS = ("python", "numba", "numba_cuda", "numpy")
# the pip platform tag of the wheelhouse; pip also accepts older manylinux tags of the same arch for it
DEFAULT_PLATFORM = "manylinux_2_28_x86_64"
REQUIREMENT_RE = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)(\[[A-Za-z0-9_,.-]+\])?==([0-9][0-9A-Za-z.+_-]*)")


def canonical_name(name: str) -> str:
    """PEP 503 normalised distribution name (`Numba_CUDA` -> `numba-cuda`)."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Requirement:
    """One locked requirement beyond the named pins: `name[extras]==version`."""

    name: str
    version: str
    extras: str = ""

    def __str__(self) -> str:
        return f"{self.name}{self.extras}=={self.version}"


def parse_requirement(text: str, *, field_path: str) -> Requirement:
    m = REQUIREMENT_RE.fullmatch(text.strip())
    if not m:
        raise SpecError(
            field_path, text, 'expected an exact pin like "pyyaml==6.0.2" (name[extras]==version)'
        )
    return Requirement(name=canonical_name(m.group(1)), version=m.group(3), extras=m.group(2) or "")


@dataclass(frozen=True)
class Stack:
    """Resolved pins (no `auto` left) + locked requirements + the wheelhouse platform tag."""

    pins: Mapping[str, str]
    requirements: tuple[Requirement, ...] = ()
    platform: str = DEFAULT_PLATFORM

    @property
    def id(self) -> str:
        return stack_id(self.pins, self.requirements, self.platform)

    def as_manifest(self) -> dict[str, object]:
        """What an artifact and a wheelhouse record: the pins, plus the requirements when there are any."""
        out: dict[str, object] = dict(self.pins)
        if self.requirements:
            out["requirements"] = [str(r) for r in self.requirements]
        return out

    def expected(self) -> dict[str, str]:
        """Everything a runtime is checked against: runtime pins + each locked requirement (by dist name)."""
        out = {k: v for k, v in self.pins.items() if k in RUNTIME_PINS}
        for r in self.requirements:
            out[r.name] = r.version
        return out


def stack_id(
    pins: Mapping[str, str], requirements: tuple[Requirement, ...] = (), platform: str = DEFAULT_PLATFORM
) -> str:
    """12 hex of the sha256 of the canonical JSON of the resolved stack."""
    doc: dict[str, object] = {"pins": dict(sorted(pins.items()))}
    if requirements:
        doc["requirements"] = sorted(str(r) for r in requirements)
    if platform != DEFAULT_PLATFORM:
        doc["platform"] = platform
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:12]


def resolve_pin(key: str, value: str) -> str:
    """`auto` = the version installed with the controller (python major.minor; the packages exactly)."""
    if value != "auto":
        return value
    if key == "python":
        return f"{sys.version_info.major}.{sys.version_info.minor}"
    dist = PACKAGE_PINS.get(key)
    if dist is None:
        raise SpecError(
            f"stack.{key}", value, "`auto` works for python, numba, numba_cuda, numpy, llvmlite only"
        )
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        raise SpecError(f"stack.{key}", value, f"`auto` needs {dist} installed on the controller") from None


def pin_matches(pin: str, actual: str) -> bool:
    return actual == pin or actual.startswith(pin + ".") or fnmatch.fnmatchcase(actual, pin)


@dataclass(frozen=True)
class Difference:
    """The first field where a runtime differs from the stack. `actual` None = not installed there."""

    field: str
    pin: str
    actual: str | None

    def __str__(self) -> str:
        have = "is not installed" if self.actual is None else f"is {self.actual}"
        return f"stack.{self.field}: pinned {self.pin} but {self.field} {have}"


@dataclass(frozen=True)
class Comparison:
    differences: tuple[Difference, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return not self.differences

    def __str__(self) -> str:
        return "matches the stack" if self.ok else "; ".join(str(d) for d in self.differences)


def compare(*, expected: Mapping[str, str], actual: Mapping[str, str | None]) -> Comparison:
    """Compare a runtime's versions (key -> version, None when absent) with the pins, in pin order."""
    diffs = []
    for key, pin in expected.items():
        if pin in ("", "auto"):
            continue
        have = actual.get(key)
        if have is None or not pin_matches(pin, have):
            diffs.append(Difference(field=key, pin=pin, actual=have))
    return Comparison(differences=tuple(diffs))


# The probe a runtime runs (controller build interpreter or node runtime): the version of the distribution
# that `import <module>` would load, found next to the module itself, so a package shadowed by another
# sys.path entry is reported as the one that loads, not the one whose metadata comes first.
PROBE = r"""
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

# distribution -> top-level module it provides (for the probe); others: the name with - as _
MODULES: Mapping[str, str] = {"numba-cuda": "numba_cuda", "pyyaml": "yaml", "nvidia-ml-py": "pynvml"}


def probe_request(stack: Stack) -> dict[str, tuple[str, str]]:
    """The probe's argument: key -> (distribution, module) for every package the stack pins."""
    out: dict[str, tuple[str, str]] = {}
    for key, dist in PACKAGE_PINS.items():
        if key in stack.pins:
            out[key] = (dist, MODULES.get(dist, dist.replace("-", "_")))
    for r in stack.requirements:
        out[r.name] = (r.name, MODULES.get(r.name, r.name.replace("-", "_")))
    return out

"""Which release this process serves: read from the MANIFEST.json beside the imported `kernels` package.

A node runs `python -m kernels.serve` with PYTHONPATH=<root>/releases/<version> (the unit resolves
`current` once, at start), so the manifest found next to the package is the code actually running. From a
source checkout there is no manifest and the version is the dev marker.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import kernels

DEV_VERSION = "dev"


@dataclass(frozen=True)
class Release:
    version: str
    commit: str
    manifest_sha256: str
    root: str  # the directory holding the kernels package


def detect() -> Release:
    root = Path(kernels.__file__).resolve().parent.parent
    manifest = root / "MANIFEST.json"
    if not manifest.is_file():
        return Release(DEV_VERSION, "", "", str(root))
    raw = manifest.read_bytes()
    try:
        data = json.loads(raw)
        version = str(data["version"])
    except (ValueError, KeyError, TypeError) as e:
        raise RuntimeError(f"{manifest}: not a release manifest ({type(e).__name__}: {e})") from None
    git = data.get("git") or {}
    commit = str(git.get("commit") or "") if isinstance(git, dict) else ""
    return Release(version, commit, hashlib.sha256(raw).hexdigest(), str(root))

"""A tiny, real, pure-python wheel built here with zipfile (no registry): the provisioning tests carry it
in a wheelhouse, install it with `pip install --no-index --require-hashes` and import it."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

PROBE_DIST = "solfleet-probe"
PROBE_MODULE = "solfleet_probe"


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel(out_dir: Path, *, version: str = "1.0.0") -> Path:
    """`solfleet_probe-<version>-py3-none-any.whl`; its module reports the version it was built as."""
    out_dir.mkdir(parents=True, exist_ok=True)
    info = f"{PROBE_MODULE}-{version}.dist-info"
    files = {
        f"{PROBE_MODULE}/__init__.py": f'VERSION = "{version}"\n'.encode(),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {PROBE_DIST}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: solfleet-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
        f"{info}/top_level.txt": f"{PROBE_MODULE}\n".encode(),
    }
    record = [_record_line(n, d) for n, d in files.items()] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    path = out_dir / f"{PROBE_MODULE}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            info_ = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
            zf.writestr(info_, data)
    return path


def pip_wheel_dir() -> Path:
    """The pip wheel that ships with this interpreter (ensurepip): the wheelhouse's installer, offline."""
    import ensurepip

    return Path(ensurepip.__file__).parent / "_bundled"

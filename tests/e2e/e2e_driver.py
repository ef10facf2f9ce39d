"""Drives the `solfleet` CLI against an SshdFleet and reads the results back from the nodes' filesystems, the
controller's ledger (SQLite, read-only) and ansible-runner's kept run artifacts."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sshd_fleet import SshdFleet

REPO = Path(__file__).resolve().parents[2]
# Verify under the CUDA simulator costs seconds per op per node per deploy (FACTS.md); the e2e tests are
# about the fleet machinery, so they verify a small, real subset. Override with SOLFLEET_E2E_VERIFY_OPS.
VERIFY_OPS = os.environ.get("SOLFLEET_E2E_VERIFY_OPS", "residual_add")
CLI_TIMEOUT_S = 600
BUILD_TIMEOUT_S = 1800


def wrap_health(d: Path, why: str, body: str) -> None:
    """Replace `run` in an unpacked release's kernels/harness/health.py with `body` (indented lines of a
    function that may call the original as `_real_run()`); `why` says what the injection is for."""
    path = d / "kernels" / "harness" / "health.py"
    path.write_text(
        path.read_text()
        + f"\n\n_original_run = run\n\n\ndef run(*args, **kwargs):  # injected by a solfleet test: {why}\n"
        + "    def _real_run():\n        return _original_run(*args, **kwargs)\n\n"
        + body
    )


def break_residual_add(release: Path) -> None:
    """A wrong kernel, for verify to refuse: out = x + r becomes out = x - r in residual_add's `_add`, the one
    add that every residual_add kernel (the scalar tiles, the vector tiles' main loop and their tail) inlines,
    so the release is wrong on the simulator and on a GPU alike. Fails loudly when the source no longer has
    it, so a refactor cannot turn this into a release that still adds."""
    path = release / "kernels" / "ops" / "residual_add.py"
    source, inlined = re.subn(r"return a \+ b\b", "return a - b", path.read_text())
    assert inlined == 1 and "fn(a[e], b[e])" in source and "store(fn(load(x[i]), load(r[i])))" in source, (
        f"residual_add's add no longer matches the breakage pattern ({inlined} `_add`, or the vector "
        "tiles no longer call it); update break_residual_add"
    )
    path.write_text(source)


def retag(src: Path, dst: Path, version: str, mutate: Callable[[Path], None] | None = None) -> Path:
    """A copy of a real artifact with MANIFEST version `version` (and `mutate` applied, files re-hashed): a
    valid artifact of another version without another `solfleet build` (which costs a PTX compile)."""
    work = dst.with_suffix(".d")
    shutil.rmtree(work, ignore_errors=True)
    with tarfile.open(src, "r:gz") as archive:
        archive.extractall(work, filter="data")
    if mutate:
        mutate(work)
    manifest = json.loads((work / "MANIFEST.json").read_text())
    manifest["version"] = version
    manifest["files"] = {
        str(p.relative_to(work)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(work.rglob("*"))
        if p.is_file() and p.name != "MANIFEST.json"
    }
    (work / "MANIFEST.json").write_text(json.dumps(manifest, sort_keys=True))
    with tarfile.open(dst, "w:gz") as archive:
        for path in sorted(work.rglob("*")):
            archive.add(path, str(path.relative_to(work)), recursive=False)
    shutil.rmtree(work)
    return dst


@dataclass(frozen=True)
class CliResult:
    rc: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


@dataclass
class E2EFleet:
    """The running sshd fleet, its spec file, and the controller work dir, with helpers to drive the CLI."""

    sshd: SshdFleet
    spec: Path
    work: Path
    dist: Path

    def cli(self, *args: str, spec: Path | None = None, timeout_s: float = CLI_TIMEOUT_S) -> CliResult:
        """Run `solfleet --fleet SPEC ARGS...` as an operator would, in a subprocess."""
        env = dict(os.environ)
        # ansible-playbook lives next to this interpreter; the operator's shell would have it on PATH.
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        env["SOLFLEET_WORK"] = str(self.work)
        env.pop("NUMBA_ENABLE_CUDASIM", None)  # simulated nodes get it from the node module, not from here
        proc = subprocess.run(
            [sys.executable, "-m", "fleet.cli", "--fleet", str(spec or self.spec), *args],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        return CliResult(proc.returncode, proc.stdout, proc.stderr)

    def artifact(self, version: str) -> Path:
        """Build (once) the artifact of `version` with `solfleet build` from this tree."""
        path = self.dist / f"solfleet-ops-{version}.tar.gz"
        if not path.exists():
            # the run's first build of this tree compiles its PTX (~190 kernels, ~11 min seen on 2 cores
            # beside the suite) and the others wait on its cache lock (fleet/artifact.py): more than
            # CLI_TIMEOUT_S
            args = ("build", "--version", version, "--out", str(self.dist))
            result = self.cli(*args, timeout_s=BUILD_TIMEOUT_S)
            assert result.rc == 0, f"solfleet build failed ({result.rc}): {result.output[-2000:]}"
            assert path.exists(), f"solfleet build did not write {path}: {result.output[-500:]}"
        return path

    def deploy(self, version: str, *extra: str) -> CliResult:
        return self.cli(
            "deploy",
            "--version",
            version,
            "--artifact",
            str(self.artifact(version)),
            "--verify-ops",
            VERIFY_OPS,
            "--yes",
            *extra,
        )

    # -- reading the nodes and the controller back ---------------------------------------------------------
    def root(self, node: str) -> Path:
        return self.sshd.node(node).root

    def link(self, node: str, name: str) -> str | None:
        """The version `current`/`previous` points at on the node's filesystem, or None."""
        path = self.root(node) / name
        if not path.is_symlink():
            return None
        target = os.readlink(path)
        assert target.startswith("releases/"), f"{path} -> {target} is not a relative releases/ link"
        assert (self.root(node) / target).is_dir(), f"{path} -> {target} dangles"
        return target.split("/", 1)[1]

    def journal(self, node: str) -> list[dict[str, object]]:
        path = self.root(node) / "journal.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def releases(self, node: str) -> list[str]:
        releases = self.root(node) / "releases"
        return sorted(p.name for p in releases.iterdir()) if releases.is_dir() else []

    def verified(self, node: str, version: str) -> bool:
        verify = self.root(node) / "releases" / version / "verify"
        record, failed = verify / "verify.json", verify / "failed.json"  # failed: health after activation
        return record.is_file() and json.loads(record.read_text()).get("ok") is True and not failed.exists()

    def ledger(self) -> sqlite3.Connection:
        paths = list((self.work / "fleets").glob("*/ledger.sqlite"))
        assert len(paths) == 1, f"expected one ledger under {self.work / 'fleets'}, found {paths}"
        conn = sqlite3.connect(f"file:{paths[0]}?mode=ro", uri=True)
        conn.row_factory = sqlite3.Row
        return conn

    def last_operation(self) -> sqlite3.Row:
        with self.ledger() as conn:
            query = "SELECT * FROM operations ORDER BY started DESC, rowid DESC LIMIT 1"
            row: sqlite3.Row | None = conn.execute(query).fetchone()
        assert row is not None, "the ledger holds no operation"
        return row

    def run_stats(self, op_id: str) -> dict[str, dict[str, int]]:
        """Per-host counters (ok, changed, failures, ...) from every playbook_on_stats event ansible-runner
        recorded for one operation (one runner run per batch), summed over its batches."""
        runs = self.work.glob(f"fleets/*/runs/{op_id}/**/job_events/*.json")
        totals: dict[str, dict[str, int]] = {}
        found = False
        for path in runs:
            event = json.loads(path.read_text())
            if event.get("event") != "playbook_on_stats":
                continue
            found = True
            for counter in ("ok", "changed", "failures", "dark", "rescued", "skipped"):
                for host, n in (event["event_data"].get(counter) or {}).items():
                    totals.setdefault(host, {}).setdefault(counter, 0)
                    totals[host][counter] += int(n)
        assert found, f"no playbook_on_stats event kept for operation {op_id} under {self.work}"
        return totals

    def tree(self, node: str) -> list[tuple[str, int, float]]:
        """Every path under a node root with its size and mtime: equal snapshots mean nothing was touched."""
        root = self.root(node)
        if not root.exists():
            return []
        out = []
        for path in sorted(root.rglob("*")):
            st = path.lstat()
            out.append((str(path.relative_to(root)), st.st_size, st.st_mtime))
        return out

"""The controller's work dir layout for one fleet, and the controller-side lock.

<work>/fleets/<fleet>/ledger.sqlite        the deployment ledger
<work>/fleets/<fleet>/runs/<run id>/       one ansible-runner private_data_dir per operation (artifacts/ kept)
<work>/fleets/<fleet>/controller.lock      flock: one deploy/rollback per fleet per controller at a time
<work>/local-fleet/<node>/                 node roots of the embedded local fleet (the spec puts them there)
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fleet.errors import UsageError
from fleet.spec import FleetSpec


def ledger_path(spec: FleetSpec) -> Path:
    return spec.fleet_dir / "ledger.sqlite"


def run_dir(spec: FleetSpec, run_id: str) -> Path:
    return spec.fleet_dir / "runs" / run_id


@contextmanager
def controller_lock(spec: FleetSpec) -> Iterator[None]:
    """Two deploys of one fleet from one controller would interleave batches and ledger rows; the second
    is refused at once (nothing touched) rather than queued behind an operator who may have walked away."""
    spec.fleet_dir.mkdir(parents=True, exist_ok=True)
    path = spec.fleet_dir / "controller.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            raise UsageError(
                f"fleet {spec.name}: another deploy/rollback holds {path} (pid {holder}); wait for it"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)


def prune_runs(spec: FleetSpec, *, prefix: str, keep: int) -> None:
    """Keep the newest `keep` run dirs starting with `prefix`. Only read-only runs (status) are pruned:
    deploy/rollback run dirs are the evidence behind ledger rows and stay."""
    runs = spec.fleet_dir / "runs"
    if not runs.is_dir():
        return
    old = sorted(p for p in runs.iterdir() if p.name.startswith(prefix) and p.is_dir())[:-keep]
    for path in old:
        shutil.rmtree(path, ignore_errors=True)

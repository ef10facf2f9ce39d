"""The controller's deployment ledger: one SQLite file per fleet (<work>/fleets/<fleet>/ledger.sqlite).

Every deploy and rollback is a row in `operations`, written (status `running`) BEFORE any host is touched,
and every host outcome is committed as soon as its batch ends, so an interrupted run leaves a row that says
so: Ctrl-C marks it `interrupted`; a killed process leaves `running`, which the next open turns into
`interrupted` once the recorded process is gone: its pid no longer runs, or now names another process (the
pid was reused, as after a reboot of the controller host), told apart by the boot id and the process's start
time recorded beside the pid."""

from __future__ import annotations

import json
import os
import secrets
import socket
import sqlite3
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS operations (
    id          TEXT PRIMARY KEY,          -- the rollout id, also passed to nodes and written to journals
    kind        TEXT NOT NULL,             -- deploy | stage | rollback
    version     TEXT,                      -- deploy: the version; rollback: --to, or NULL = each previous
    fleet       TEXT NOT NULL,
    started     TEXT NOT NULL,             -- UTC, ISO 8601; for records only
    finished    TEXT,
    status      TEXT NOT NULL,             -- running | succeeded | failed | rolled_back | interrupted
                                           -- | paused | aborted
    message     TEXT NOT NULL DEFAULT '',
    plan        TEXT NOT NULL,             -- the printed plan, as JSON
    controller  TEXT NOT NULL,             -- hostname:pid, to tell a dead run from a live one
    pid         INTEGER NOT NULL,
    proc_start  TEXT                       -- boot id:start time of that pid (NULL: not known), so a reused
                                           -- pid does not keep a dead run `running`
);
CREATE TABLE IF NOT EXISTS host_outcomes (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    operation_id    TEXT NOT NULL REFERENCES operations(id),
    step            TEXT NOT NULL,         -- "canary", "batch 2", "rollback", "undo"
    host            TEXT NOT NULL,
    outcome         TEXT NOT NULL,         -- the node module's outcome, or unreachable / failed / not_run
    changed         INTEGER NOT NULL,
    version_before  TEXT,
    version_after   TEXT,
    failed_phase    TEXT,
    message         TEXT NOT NULL DEFAULT '',
    phases          TEXT NOT NULL DEFAULT '{}',   -- seconds per phase, JSON
    simulated       INTEGER,               -- 1 when the node verified under the CUDA simulator; NULL unknown
    recorded        TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS host_outcomes_host ON host_outcomes(host, id);
-- Written before the first host is touched: where each targeted host was. Every undo returns to it.
CREATE TABLE IF NOT EXISTS baselines (
    operation_id    TEXT NOT NULL REFERENCES operations(id),
    host            TEXT NOT NULL,
    reachable       INTEGER NOT NULL,      -- 0: the host did not answer; its baseline is unknown
    current         TEXT,                  -- the release `current` pointed at (NULL: none)
    current_sha256  TEXT,                  -- the artifact sha256 that release came from
    previous        TEXT,
    recorded        TEXT NOT NULL,
    PRIMARY KEY (operation_id, host)
);
-- One version string is one artifact, fleet-wide and forever: a rebuild with other bytes needs a new version.
CREATE TABLE IF NOT EXISTS artifacts (
    version         TEXT PRIMARY KEY,
    sha256          TEXT NOT NULL,
    git_commit      TEXT,
    dirty           INTEGER NOT NULL DEFAULT 0,   -- built from a tree with uncommitted changes
    first_operation TEXT NOT NULL,
    recorded        TEXT NOT NULL
);
"""


class OpStatus(StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    ROLLED_BACK = "rolled_back"  # failed, and the failure policy put the hosts back
    INTERRUPTED = "interrupted"
    # stopped after a passing canary (rollout.pause_after_canary); `solfleet promote` continues it, `solfleet
    # abort` applies its failure policy. Not unfinished: nothing is owed until one of them decides.
    PAUSED = "paused"
    ABORTED = "aborted"  # a paused rollout that `solfleet abort` ended with its failure policy


# An operation that ended without finishing its failure policy: the next deploy, rollback or `reconcile`
# returns its hosts to its baseline (and records which operation did, in `recovered_by`). A rollout whose
# policy could not return every host (one unreachable, an undo refused), an abort the same, and one stopped
# by a controller error are owed the same: every operation that owes nothing marks itself recovered by
# itself when it concludes (a success, a halt, a final undo, a rollback), so only rows with no
# `recovered_by` are owed.
# The ledger's schema version (PRAGMA user_version) from which `failed` rows can be owed (above).
FAILED_OWES_SINCE = 1
UNFINISHED = (
    OpStatus.RUNNING.value,
    OpStatus.INTERRUPTED.value,
    OpStatus.ABORTED.value,
    OpStatus.FAILED.value,
)


@dataclass(frozen=True)
class Baseline:
    host: str
    reachable: bool
    current: str | None
    current_sha256: str | None
    previous: str | None
    # A read's, not recorded: a node step held the node's lock when it was read (the node's `busy`), so its
    # `current` may still move. Only the judgement of that read uses it (recovery.owes_nothing); a baseline
    # the ledger holds is read back False.
    busy: bool = False


@dataclass(frozen=True)
class HostRecord:
    step: str
    host: str
    outcome: str
    changed: bool
    version_before: str | None
    version_after: str | None
    failed_phase: str | None
    message: str
    phases: Mapping[str, float]
    simulated: bool | None = None


@dataclass(frozen=True)
class Operation:
    id: str
    kind: str
    version: str | None
    fleet: str
    started: str
    finished: str | None
    status: str
    message: str
    plan: dict[str, Any]
    recovered_by: str | None = None
    controller: str = ""
    # the controller process's boot id and start time (`proc_identity`), None where not known
    proc_start: str | None = None


def _operation(r: sqlite3.Row) -> Operation:
    return Operation(
        id=r["id"],
        kind=r["kind"],
        version=r["version"],
        fleet=r["fleet"],
        started=r["started"],
        finished=r["finished"],
        status=r["status"],
        message=r["message"],
        plan=json.loads(r["plan"]),
        recovered_by=r["recovered_by"],
        proc_start=r["proc_start"],
        controller=r["controller"],
    )


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def new_operation_id() -> str:
    """`r-20261129T230501Z-3fa2c1`: sortable for humans, unique by the random tail (never a version)."""
    return f"r-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(3)}"


def proc_identity(pid: int) -> str | None:
    """`<boot id>:<start time in clock ticks since boot>` of a process on this host (Linux /proc), or None
    where that cannot be read. A pid is reused once its process has ended (after a reboot, within minutes);
    this pair is not, so it tells the process that wrote a ledger row from a later one with its pid."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    # field 2 (the command name, in parentheses) may hold spaces and parentheses: split after the last ')'
    fields = stat[stat.rfind(")") + 2 :].split()
    if len(fields) < 20 or not boot:
        return None
    return f"{boot}:{fields[19]}"  # field 22 of proc(5): starttime


def _pid_alive(pid: int, proc_start: str | None = None) -> bool:
    """Whether the process that recorded (`pid`, `proc_start`) still runs on this host. `proc_start` None
    (a row from before it was recorded, or a host without /proc): the pid alone decides."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if proc_start is None:
        return True
    now = proc_identity(pid)
    # unreadable now (the process ended between the two calls, or /proc is gone): the pid alone decides
    return now is None or now == proc_start


class Ledger:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(str(path), timeout=30, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.executescript(SCHEMA)  # idempotent (IF NOT EXISTS); executescript commits itself
        self._migrate()
        self._mark_dead_runs()

    def _migrate(self) -> None:
        """Columns added after the first schema: a ledger written by an older solfleet keeps working."""
        cols = {r["name"] for r in self._db.execute("PRAGMA table_info(host_outcomes)").fetchall()}
        if "simulated" not in cols:
            self._db.execute("ALTER TABLE host_outcomes ADD COLUMN simulated INTEGER")
        op_cols = {r["name"] for r in self._db.execute("PRAGMA table_info(operations)").fetchall()}
        added = (
            ("recovered_by", "TEXT"),
            ("artifact_sha256", "TEXT"),
            ("dirty", "INTEGER"),
            ("resume", "TEXT"),
            ("proc_start", "TEXT"),
        )
        for col, decl in added:
            if col not in op_cols:
                self._db.execute(f"ALTER TABLE operations ADD COLUMN {col} {decl}")
        if self._db.execute("PRAGMA user_version").fetchone()[0] < FAILED_OWES_SINCE:
            # Before this version a `failed` row owed nothing, whatever its undo had done: a ledger written
            # then must not turn its old failures into returns to old baselines now. Each is marked
            # recovered by itself, as it would have been; failures from here on are judged by the new rule.
            self._db.execute(
                "UPDATE operations SET recovered_by = id WHERE status = ? AND recovered_by IS NULL",
                (OpStatus.FAILED.value,),
            )
            self._db.execute(f"PRAGMA user_version = {FAILED_OWES_SINCE}")

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _mark_dead_runs(self) -> None:
        me = socket.gethostname()
        rows = self._db.execute(
            "SELECT id, controller, pid, proc_start FROM operations WHERE status = ?", ("running",)
        )
        for row in rows.fetchall():
            host = str(row["controller"]).rsplit(":", 1)[0]
            if host == me and not _pid_alive(int(row["pid"]), row["proc_start"]):
                self.finish(row["id"], OpStatus.INTERRUPTED, "controller process ended without finishing")

    def begin(
        self, *, op_id: str, kind: str, version: str | None, fleet: str, plan: Mapping[str, Any]
    ) -> str:
        with self._tx() as db:
            db.execute(
                "INSERT INTO operations (id, kind, version, fleet, started, status, plan, controller, pid,"
                " proc_start) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    op_id,
                    kind,
                    version,
                    fleet,
                    utc_now(),
                    OpStatus.RUNNING.value,
                    json.dumps(plan, sort_keys=True),
                    f"{socket.gethostname()}:{os.getpid()}",
                    os.getpid(),
                    proc_identity(os.getpid()),
                ),
            )
        return op_id

    def record_hosts(self, op_id: str, records: list[HostRecord]) -> None:
        now = utc_now()
        with self._tx() as db:
            db.executemany(
                "INSERT INTO host_outcomes (operation_id, step, host, outcome, changed, version_before,"
                " version_after, failed_phase, message, phases, simulated, recorded)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                [
                    (
                        op_id,
                        r.step,
                        r.host,
                        r.outcome,
                        int(r.changed),
                        r.version_before,
                        r.version_after,
                        r.failed_phase,
                        r.message,
                        json.dumps(dict(r.phases), sort_keys=True),
                        None if r.simulated is None else int(r.simulated),
                        now,
                    )
                    for r in records
                ],
            )

    def finish(self, op_id: str, status: OpStatus, message: str = "") -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE operations SET status = ?, message = ?, finished = ? WHERE id = ?",
                (status.value, message, utc_now(), op_id),
            )

    def operations(self, *, limit: int = 50) -> list[Operation]:
        rows = self._db.execute(
            "SELECT * FROM operations ORDER BY started DESC, rowid DESC LIMIT ?", (limit,)
        )
        return [_operation(r) for r in rows.fetchall()]

    def operation(self, op_id: str) -> Operation | None:
        row = self._db.execute("SELECT * FROM operations WHERE id = ?", (op_id,)).fetchone()
        return None if row is None else _operation(row)

    # -- paused rollouts (fleet/progressive.py) -----------------------------------------------------------
    def paused(self) -> list[Operation]:
        """Rollouts stopped after their canary, waiting for promote or abort; oldest first."""
        rows = self._db.execute(
            "SELECT * FROM operations WHERE status = ? ORDER BY started, rowid", (OpStatus.PAUSED.value,)
        )
        return [_operation(r) for r in rows.fetchall()]

    def record_resume(self, op_id: str, data: Mapping[str, Any]) -> None:
        """What a promote needs to continue exactly this rollout (its node variables and gates), kept with
        the row before the first batch runs."""
        with self._tx() as db:
            db.execute(
                "UPDATE operations SET resume = ? WHERE id = ?", (json.dumps(data, sort_keys=True), op_id)
            )

    def resume_data(self, op_id: str) -> dict[str, Any]:
        row = self._db.execute("SELECT resume FROM operations WHERE id = ?", (op_id,)).fetchone()
        data: dict[str, Any] = {} if row is None or row["resume"] is None else json.loads(row["resume"])
        return data

    def resume(self, op_id: str) -> None:
        """A paused row becomes this process's running operation again (promote, abort): a SIGKILL from here
        on leaves it `running`, which the next open marks interrupted, i.e. owed its baseline."""
        with self._tx() as db:
            cur = db.execute(
                "UPDATE operations SET status = ?, finished = NULL, controller = ?, pid = ?, proc_start = ?"
                " WHERE id = ? AND status = ?",
                (
                    OpStatus.RUNNING.value,
                    f"{socket.gethostname()}:{os.getpid()}",
                    os.getpid(),
                    proc_identity(os.getpid()),
                    op_id,
                    OpStatus.PAUSED.value,
                ),
            )
            if cur.rowcount != 1:
                raise ValueError(f"{op_id} is not a paused operation of this ledger")

    def host_outcomes(self, op_id: str) -> list[HostRecord]:
        rows = self._db.execute("SELECT * FROM host_outcomes WHERE operation_id = ? ORDER BY id", (op_id,))
        return [
            HostRecord(
                step=r["step"],
                host=r["host"],
                outcome=r["outcome"],
                changed=bool(r["changed"]),
                version_before=r["version_before"],
                version_after=r["version_after"],
                failed_phase=r["failed_phase"],
                message=r["message"],
                phases=json.loads(r["phases"]),
                simulated=None if r["simulated"] is None else bool(r["simulated"]),
            )
            for r in rows.fetchall()
        ]

    def desired_versions(self) -> dict[str, str]:
        """Per host, the version the ledger says it should be on: the `version_after` of its latest recorded
        outcome (deploy, rollback or undo) that left a known version. Staged-only outcomes do not move it, nor
        does a `kept` note on a version this ledger never deployed (a reconcile that left a host where another
        controller had moved it since): what another controller put there is not what this one wants, so
        status keeps calling it drift instead of in sync."""
        rows = self._db.execute(
            "SELECT h.host, h.version_after FROM host_outcomes h JOIN operations o ON o.id = h.operation_id"
            " WHERE h.version_after IS NOT NULL AND o.kind != 'stage'"
            " AND NOT (h.outcome = 'kept' AND h.version_after NOT IN (SELECT version FROM artifacts))"
            " ORDER BY h.id"
        )
        desired = {r["host"]: r["version_after"] for r in rows.fetchall()}
        # An unfinished operation is owed a return to its baseline (its default policy): until that has
        # happened, its hosts should be where they were before it, whatever it managed to record.
        for op in self.unfinished():
            for host, base in self.baseline(op.id).items():
                if base.reachable and base.current is not None:
                    desired[host] = base.current
        # A paused rollout's hosts beyond its canary wait on their baseline, which this ledger read from them
        # even when no earlier operation of it put them there.
        for op in self.paused():
            for host, base in self.baseline(op.id).items():
                if host not in desired and base.reachable and base.current is not None:
                    desired[host] = base.current
        return desired

    # -- baselines, artifacts, recovery -------------------------------------------------------------------
    def record_baseline(self, op_id: str, baselines: list[Baseline]) -> None:
        now = utc_now()
        with self._tx() as db:
            db.executemany(
                "INSERT OR REPLACE INTO baselines (operation_id, host, reachable, current, current_sha256,"
                " previous, recorded) VALUES (?,?,?,?,?,?,?)",
                [
                    (op_id, b.host, int(b.reachable), b.current, b.current_sha256, b.previous, now)
                    for b in baselines
                ],
            )

    def baseline(self, op_id: str) -> dict[str, Baseline]:
        rows = self._db.execute("SELECT * FROM baselines WHERE operation_id = ? ORDER BY host", (op_id,))
        return {
            r["host"]: Baseline(
                host=r["host"],
                reachable=bool(r["reachable"]),
                current=r["current"],
                current_sha256=r["current_sha256"],
                previous=r["previous"],
            )
            for r in rows.fetchall()
        }

    def unfinished(self) -> list[Operation]:
        """Operations that stopped before their end and were not recovered since, oldest first. Only those
        with a baseline can be returned to it; a row without one never touched a host."""
        marks = ",".join("?" * len(UNFINISHED))
        ids = [
            r["id"]
            for r in self._db.execute(
                f"SELECT o.id FROM operations o WHERE o.status IN ({marks}) AND o.recovered_by IS NULL"
                " AND EXISTS (SELECT 1 FROM baselines b WHERE b.operation_id = o.id)"
                " ORDER BY o.started, o.rowid",
                UNFINISHED,
            ).fetchall()
        ]
        by_id = {op.id: op for op in self.operations(limit=1_000_000)}
        return [by_id[i] for i in ids if i in by_id and not self._is_live(by_id[i])]

    def _is_live(self, op: Operation) -> bool:
        """A `running` row whose controller process on this host is still alive is someone else's live run."""
        host, _, pid = op.controller.rpartition(":")
        return (
            op.status == OpStatus.RUNNING.value
            and host == socket.gethostname()
            and _pid_alive(int(pid), op.proc_start)
        )

    def running(self, *, limit: int = 50) -> list[Operation]:
        """This ledger's operations whose controller process is alive now (a rollout in progress)."""
        return [op for op in self.operations(limit=limit) if self._is_live(op)]

    def own_stale_rollouts(self, *, limit: int = 50) -> list[str]:
        """Ids of this ledger's recent operations that are not running now: a node lease one of them left
        behind (a dead controller, a node that could not be reached to drop it) is this controller's own and
        may be taken over. A lease of a rollout this ledger does not know stays a refusal."""
        return [
            op.id
            for op in self.operations(limit=limit)
            # a paused rollout's leases are its own until promote or abort (or their expiry)
            if not self._is_live(op) and op.status != OpStatus.PAUSED.value
        ]

    def mark_recovered(self, op_id: str, *, by: str) -> None:
        with self._tx() as db:
            db.execute("UPDATE operations SET recovered_by = ? WHERE id = ?", (by, op_id))

    def artifact_sha(self, version: str) -> str | None:
        row = self._db.execute("SELECT sha256 FROM artifacts WHERE version = ?", (version,)).fetchone()
        return None if row is None else str(row["sha256"])

    def artifact_shas(self) -> dict[str, str]:
        return {r["version"]: r["sha256"] for r in self._db.execute("SELECT version, sha256 FROM artifacts")}

    def record_artifact(
        self, *, version: str, sha256: str, git_commit: str | None, dirty: bool, op_id: str
    ) -> None:
        """First use of a version binds it to its bytes; a later use with other bytes is a caller bug
        (rollout.check_artifact refuses it before anything runs), so it fails loudly here."""
        known = self.artifact_sha(version)
        if known is not None and known != sha256:
            raise ValueError(f"version {version} is already artifact {known}, not {sha256}")
        with self._tx() as db:
            db.execute(
                "INSERT OR IGNORE INTO artifacts (version, sha256, git_commit, dirty, first_operation,"
                " recorded) VALUES (?,?,?,?,?,?)",
                (version, sha256, git_commit, int(dirty), op_id, utc_now()),
            )
            db.execute(
                "UPDATE operations SET artifact_sha256 = ?, dirty = ? WHERE id = ?",
                (sha256, int(dirty), op_id),
            )

"""The node root of a solfleet node: paths, the flock, `current`/`previous` links, the journal, node state.

Shared by the node-side modules (playbooks/library/solfleet_release.py, solfleet_state.py). Stdlib only: this
runs under the node's Python through Ansible's module packaging. Layout (docs/node-contract.md):

    <root>/releases/<V>/  <root>/releases/<V>.partial/  <root>/artifacts/  <root>/cache/
    <root>/current -> releases/<V>   <root>/previous -> releases/<U>   <root>/journal.jsonl   <root>/.lock
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import re
import shutil
import stat
import time

VERSION_RE = re.compile(r"^[0-9A-Za-z][0-9A-Za-z._+-]{0,63}$")
PARTIAL_SUFFIX = ".partial"
VERIFY_DIR = "verify"  # written by the node inside a release after the manifest check; not in MANIFEST files
# In VERIFY_DIR: written when a release failed health after activation. Its verify.json still says ok (verify
# did pass), so this record is what keeps it from counting as verified (rollback target, status, prune).
FAILED_RECORD = "failed.json"

# Journal events that move `current`; the rollback no-op rule reads the last one of these (and its `plain`).
# `deactivated`: `current` removed, because the node's first release failed health after activation and
# there was no earlier release to return to (its message names the release and why).
MOVING_EVENTS = ("activated", "rolled_back", "deactivated")
# Written BEFORE a switch of `current` (write-ahead): a move whose intent is journaled but not confirmed by
# one of MOVING_EVENTS was cut short; a confirmed move not followed by HEALTH_EVENTS never had its health run.
INTENT_EVENT = "switching"
HEALTH_EVENTS = ("healthy", "failed")
LEASE_FILE = "lease.json"  # the rollout holding this node: {rollout_id, controller, state, acquired, expires}
# The holder's state, written in the lease so that a refused second controller reads what the holder is
# doing and what ends it: `running` (a rollout in progress), `paused` after its canary (promote or abort
# ends it), `unfinished` (it ended owing its hosts a return to its baseline: reconcile from its work dir).
# A lease without the field (written before it existed) is a running one.
LEASE_STATES = ("running", "paused", "unfinished")
LEASE_STATE_NOTES = {
    "running": "",
    "paused": " (paused after its canary: `solfleet promote` or `solfleet abort` from its work dir ends it)",
    "unfinished": (
        " (unfinished: it owes its hosts a return to its baseline; `solfleet reconcile` from its work dir"
        " finishes it)"
    ),
}
SUSPECT_FILE = "suspect.json"  # {version, reason, time}: current failed a re-check; cleared when replaced
FAILED_DIR = "failed"  # verify/health records of refused releases, kept after the release is removed


class NodeError(Exception):
    """A refusal or failure on the node: which phase failed, the contract outcome, one line of why."""

    def __init__(self, phase: str, outcome: str, message: str) -> None:
        super().__init__(message)
        self.phase = phase
        self.outcome = outcome
        self.message = message


def check_version(value: str, field: str) -> str:
    """A version becomes a directory name: refuse anything that could escape `releases/`."""
    if not isinstance(value, str) or not VERSION_RE.match(value) or value.endswith(PARTIAL_SUFFIX):
        raise NodeError(
            "input",
            "refused",
            f"{field}={value!r} is not a valid version (allowed: 1-64 chars of [0-9A-Za-z._+-], starting"
            f" with a letter or digit, not ending in {PARTIAL_SUFFIX})",
        )
    return value


def utc_now() -> str:
    # timezone.utc, not datetime.UTC: the node's interpreter may predate Python 3.11.
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")  # noqa: UP017


class NodeLayout:
    """Paths under one node root and the operations that read or move its links."""

    def __init__(self, root: str, node: str, simulated: bool) -> None:
        if not os.path.isabs(root) or ".." in root.split("/"):
            raise NodeError(
                "input", "refused", f"solfleet_root={root!r} must be an absolute path without '..'"
            )
        self.root = os.path.normpath(root)
        self.node = node
        self.simulated = simulated
        self.releases = os.path.join(self.root, "releases")
        self.artifacts = os.path.join(self.root, "artifacts")
        self.cache = os.path.join(self.root, "cache")
        self.journal_path = os.path.join(self.root, "journal.jsonl")
        self.lock_path = os.path.join(self.root, ".lock")
        self.config_path = os.path.join(self.root, "config.yaml")  # written by provision (docs/fleet-spec.md)
        self.lease_path = os.path.join(self.root, LEASE_FILE)
        self.suspect_path = os.path.join(self.root, SUSPECT_FILE)
        self.failed_dir = os.path.join(self.root, FAILED_DIR)

    # -- paths ---------------------------------------------------------------------------------------------
    def release_dir(self, version: str) -> str:
        return os.path.join(self.releases, version)

    def partial_dir(self, version: str) -> str:
        return os.path.join(self.releases, version + PARTIAL_SUFFIX)

    def link_path(self, name: str) -> str:
        return os.path.join(self.root, name)

    def ensure_dirs(self) -> None:
        for path in (self.root, self.releases, self.artifacts, self.cache):
            os.makedirs(path, mode=0o755, exist_ok=True)

    # -- links ---------------------------------------------------------------------------------------------
    def link_version(self, name: str) -> str | None:
        """The version `current`/`previous` points at, or None when the link is absent or dangling."""
        path = self.link_path(name)
        if not os.path.islink(path):
            return None
        target = os.readlink(path)
        parts = target.rstrip("/").split("/")
        if len(parts) != 2 or parts[0] != "releases" or not os.path.isdir(os.path.join(self.root, target)):
            return None
        return parts[1]

    def set_link(self, name: str, version: str | None) -> None:
        """Point `name` at releases/<version> atomically (temp link + rename), or remove it for None."""
        path = self.link_path(name)
        if version is None:
            if os.path.lexists(path):
                os.unlink(path)
            return
        tmp = os.path.join(self.root, f".{name}.tmp.{os.getpid()}")
        if os.path.lexists(tmp):
            os.unlink(tmp)
        # Relative target: the root can be moved or bind-mounted without breaking the link.
        os.symlink(os.path.join("releases", version), tmp)
        os.replace(tmp, path)
        fsync_dir(self.root)

    # -- releases ------------------------------------------------------------------------------------------
    def verify_record(self, version: str) -> dict | None:
        """The saved verify JSON of a release, or None when the release was never verified."""
        path = os.path.join(self.release_dir(version), VERIFY_DIR, "verify.json")
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def failed_record(self, version: str) -> dict | None:
        """The failure record of a release that failed after activation, or None when it never did."""
        path = os.path.join(self.release_dir(version), VERIFY_DIR, FAILED_RECORD)
        if not os.path.lexists(path):
            return None
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError):
            data = None
        # An unreadable record still marks the release failed: its presence is what counts.
        return data if isinstance(data, dict) else {"reason": f"unreadable {FAILED_RECORD}"}

    def mark_failed(self, version: str, reason: str) -> None:
        """Record that `version` failed after activation. The release is sealed read-only, so open its
        verify/ dir for this one write and seal it again."""
        verify_dir = os.path.join(self.release_dir(version), VERIFY_DIR)
        mode = stat.S_IMODE(os.stat(verify_dir).st_mode)
        os.chmod(verify_dir, mode | stat.S_IWUSR)
        try:
            path = os.path.join(verify_dir, FAILED_RECORD)
            with open(path, "w", encoding="utf-8") as fh:
                json.dump({"time": utc_now(), "reason": reason}, fh, sort_keys=True)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(path, 0o444)
        finally:
            os.chmod(verify_dir, mode)

    def is_verified(self, version: str) -> bool:
        """Verify passed (verify.json ok) and the release did not fail after activation since."""
        record = self.verify_record(version)
        return bool(record and record.get("ok") is True) and self.failed_record(version) is None

    def release_sha(self, version: str | None) -> str | None:
        """sha256 of the artifact a release was unpacked from (verify/artifact.json), or None."""
        if not version:
            return None
        try:
            with open(
                os.path.join(self.release_dir(version), VERIFY_DIR, "artifact.json"), encoding="utf-8"
            ) as fh:
                sha = json.load(fh).get("sha256")
        except (OSError, ValueError, AttributeError):
            return None
        return sha if isinstance(sha, str) else None

    # -- records outside releases (they outlive a removed release) -----------------------------------------
    def keep_failed_record(self, version: str, rollout_id: str, kind: str, data: object) -> str:
        """Save the JSON of a refused release's verify/health run under failed/; returns its path."""
        os.makedirs(self.failed_dir, mode=0o755, exist_ok=True)
        tag = re.sub(r"[^0-9A-Za-z._-]+", "_", rollout_id or "no-rollout")
        path = os.path.join(self.failed_dir, f"{version}.{tag}.{kind}.json")
        write_json_atomic(path, data)
        return path

    def suspect(self) -> dict | None:
        """The suspect record, when it names the release `current` points at now."""
        record = read_json(self.suspect_path)
        if not isinstance(record, dict) or record.get("version") != self.link_version("current"):
            return None
        return record

    def mark_suspect(self, version: str, reason: str) -> None:
        write_json_atomic(self.suspect_path, {"version": version, "reason": reason, "time": utc_now()})

    def clear_suspect(self) -> None:
        if os.path.lexists(self.suspect_path):
            os.unlink(self.suspect_path)

    def lease(self) -> dict | None:
        record = read_json(self.lease_path)
        return record if isinstance(record, dict) else None

    def release_stack_id(self, version: str | None) -> str | None:
        """The stack id a release was built for (its MANIFEST.json `stack_id`), or None."""
        if not version:
            return None
        try:
            with open(os.path.join(self.release_dir(version), "MANIFEST.json"), encoding="utf-8") as fh:
                sid = json.load(fh).get("stack_id")
        except (OSError, ValueError, AttributeError):
            return None
        return sid if isinstance(sid, str) else None

    def release_fallback_only(self, version: str | None) -> list[str] | None:
        """The ops and dtypes ("op dtype") that run only a fallback kernel on this node, from the coverage in
        the release's verify record (kernels.harness.coverage); None when the record has none (a release
        built before coverage existed, or never verified)."""
        record = self.verify_record(version) if version else None
        cov = (record or {}).get("coverage")
        names = cov.get("fallback_only") if isinstance(cov, dict) else None
        return [str(n) for n in names] if isinstance(names, list) else None

    def runtime_stack_ids(self) -> list[str]:
        """Stack ids of the runtimes provisioned under <root>/runtimes (each `runtimes/<id>/bin/python`)."""
        base = os.path.join(self.root, "runtimes")
        try:
            names = os.listdir(base)
        except OSError:
            return []
        return sorted(n for n in names if os.path.exists(os.path.join(base, n, "bin", "python")))

    def release_names(self) -> list[str]:
        """Every complete (non-partial) release directory name, unsorted."""
        try:
            names = os.listdir(self.releases)
        except FileNotFoundError:
            return []
        return [
            n
            for n in names
            if not n.endswith(PARTIAL_SUFFIX)
            and VERSION_RE.match(n)
            and os.path.isdir(os.path.join(self.releases, n))
            and not os.path.islink(os.path.join(self.releases, n))
        ]

    def verified_releases(self) -> list[str]:
        """Verified releases, oldest first: by the order of their last `verified` journal event."""
        verified = [n for n in self.release_names() if self.is_verified(n)]
        order: dict[str, int] = {}
        for index, line in enumerate(self.read_journal()):
            if line.get("event") == "verified" and isinstance(line.get("version"), str):
                order[line["version"]] = index
        # Releases with no journal line (journal lost) sort first, by name, so they are pruned first.
        return sorted(verified, key=lambda n: (order.get(n, -1), n))

    def failed_releases(self) -> list[str]:
        """Releases that failed after activation (verify/failed.json), oldest failure first."""
        failed = [n for n in self.release_names() if self.failed_record(n) is not None]

        def failed_at(name: str) -> float:
            try:
                return os.lstat(os.path.join(self.release_dir(name), VERIFY_DIR, FAILED_RECORD)).st_mtime
            except OSError:
                return 0.0

        return sorted(failed, key=lambda n: (failed_at(n), n))

    def remove_release_tree(self, path: str) -> None:
        """Remove a release (verified ones are read-only: give write back to the owner first)."""
        if not os.path.lexists(path):
            return
        for dirpath, dirnames, _ in os.walk(path):
            for d in dirnames:
                full = os.path.join(dirpath, d)
                if not os.path.islink(full):
                    os.chmod(full, 0o755)
        os.chmod(path, 0o755)
        shutil.rmtree(path)

    # -- journal -------------------------------------------------------------------------------------------
    def journal(self, event: str, version: str, rollout_id: str, detail: str, plain: bool = False) -> dict:
        line: dict[str, object] = {
            "time": utc_now(),
            "event": event,
            "version": version,
            "rollout_id": rollout_id,
            "node": self.node,
            "simulated": self.simulated,
            "detail": detail,
        }
        if plain:
            # Only a plain rollback (no target given) sets this: the rollback no-op rule keys on it.
            line["plain"] = True
        data = (json.dumps(line, sort_keys=True) + "\n").encode("utf-8")
        # O_APPEND: one write per line, so concurrent readers never see half a record.
        fd = os.open(self.journal_path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                # an earlier line cut short (a disk that filled mid-write) would swallow this record into
                # one unreadable line: start on a line of its own
                data = b"\n" + data
            written = os.write(fd, data)
            if written != len(data):  # a full disk can take part of a line: that line was not journaled
                raise OSError(errno.ENOSPC, f"journal line cut short ({written} of {len(data)} bytes)")
            os.fsync(fd)
        finally:
            os.close(fd)
        return line

    def read_journal(self) -> list[dict]:
        try:
            with open(self.journal_path, encoding="utf-8") as fh:
                raw = fh.readlines()
        except FileNotFoundError:
            return []
        lines = []
        for text in raw:
            try:
                item = json.loads(text)
            except ValueError:
                continue  # a torn last line after a crash must not hide every other record
            if isinstance(item, dict):
                lines.append(item)
        return lines

    def move_state(self) -> dict:
        """What the journal says of the last move of `current`: `unconfirmed` when its write-ahead intent has
        no confirmation (the switch may or may not have happened), `health_pending` when it was confirmed but
        no health result followed (a kill between switch and health, or a journal write that failed),
        `health_failed` (the journal line) when the last health result after it failed: the node stays on a
        release whose health fails (a rollback's target, or a restore whose health failed too), and
        `deactivated` (the line) when the move removed `current`: a first release that failed health.
        A health result counts only for the version the move put in place: `failed` also records a verify
        or re-check failure of another release (a deploy refused at its verify), which says nothing of
        current's health."""
        last_intent = last_move = last_health = -1
        moved_to = None
        journal = self.read_journal()
        for index, line in enumerate(journal):
            event = line.get("event")
            if event == INTENT_EVENT:
                last_intent = index
            elif event in MOVING_EVENTS:
                last_move, moved_to = index, line.get("version")
            elif event in HEALTH_EVENTS and last_move >= 0 and line.get("version") == moved_to:
                last_health = index
        deactivated = last_move >= 0 and journal[last_move].get("event") == "deactivated"
        failed = last_health > last_move and journal[last_health].get("event") == "failed"
        return {
            "unconfirmed": last_intent > last_move,
            # a move that removed current leaves nothing to check
            "health_pending": last_move >= 0 and last_health < last_move and not deactivated,
            "intent": journal[last_intent] if last_intent > last_move else None,
            "health_failed": journal[last_health] if failed else None,
            # the last health line that counts for current since the last move (healthy or failed), or None
            "last_health": journal[last_health] if last_health > last_move else None,
            "deactivated": journal[last_move] if deactivated else None,
            "moved_to": moved_to,  # the version the journal's last move put in place (None: no move)
        }

    def journaled_switches(self) -> int:
        """How many switches of `current` (intents and confirmations) the journal holds. It is append-only
        and every switch is journaled under the node's lock, so a count that grew means `current` moved."""
        return sum(1 for line in self.read_journal() if line.get("event") in (INTENT_EVENT, *MOVING_EVENTS))

    def last_moving_event(self) -> dict | None:
        for line in reversed(self.read_journal()):
            if line.get("event") in MOVING_EVENTS:
                return line
        return None

    # -- state ---------------------------------------------------------------------------------------------
    def lock_busy(self) -> bool:
        """Whether a step holds the node's lock (`.lock`, NodeLock) right now: a deploy or rollback step, also
        one whose controller is gone (it shields its locked section from signals and runs on to its end), a
        service start, or `solfleet health` writing its journal line. A step still waiting for the lock holds
        nothing and is not seen.
        A probe that never waits and changes nothing: the lock file is opened read-only as it is (no file: no
        step has ever locked this root, so none holds it), a shared lock is tried without blocking and let go
        at once. Shared, so two probes (two reads at once) never see each other as busy; a step that tries the
        lock in that instant waits one poll of NodeLock (or, with lock_timeout_s 0, is refused). Never call it
        under NodeLock: it would see its own caller. A lock file that cannot be opened or probed says
        nothing of what runs here: it reads busy, which keeps a host owed rather than settled."""
        try:
            # O_NONBLOCK: a FIFO put there must not block the read
            fd = os.open(self.lock_path, os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            return False
        except OSError:
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return True  # EWOULDBLOCK: held; anything else: not known, so busy as well
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        finally:
            os.close(fd)

    def state(self) -> dict:
        # Probed before anything else is read: a step that let the lock go by then has written every move it
        # made, so the reads below see them; a read that says `busy` may be overtaken by that step's move.
        busy = self.lock_busy()
        journal = self.read_journal()
        current = self.link_version("current")
        return {
            "node": self.node,
            "root": self.root,
            "current": current,
            # False when current is absent, never verified, or failed after activation (failed.json):
            # status reports such a node as `unverified` rather than in sync.
            "current_verified": bool(current) and self.is_verified(current),
            "previous": self.link_version("previous"),
            "releases": self.verified_releases(),
            "last_event": journal[-1] if journal else None,
            "simulated": self.simulated,
            # sha256 of the artifact each complete release came from: one version, one artifact, fleet-wide
            "current_sha": self.release_sha(current),
            # the stack current was built for, and the runtimes provisioned here (status shows both)
            "current_stack_id": self.release_stack_id(current),
            "runtimes": self.runtime_stack_ids(),
            # ops and dtypes current runs only on a fallback kernel here (status lists them per node)
            "current_fallback_only": self.release_fallback_only(current),
            "release_shas": {n: self.release_sha(n) for n in sorted(self.release_names())},
            "current_suspect": (self.suspect() or {}).get("reason"),
            "lease": self.lease(),
            # a step holds the node's lock: its `current` may still move when that step ends (lock_busy)
            "busy": busy,
            **self.move_state(),
        }


class Lease:
    """The node-side lease of a rollout (docs/node-contract.md): one rollout at a time per node, whichever
    controller or work dir runs it. Held from the baseline read before the first push to the end of the
    rollout; it expires so a controller that vanished does not hold the node forever. Updates take their own
    short flock (`.lease.lock`), never the deploy `.lock`, which a running verify may hold for minutes."""

    def __init__(self, layout: NodeLayout) -> None:
        self.layout = layout
        self.lock_path = os.path.join(layout.root, ".lease.lock")

    def _locked(self) -> int:
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        return fd

    def expires(self, record: dict) -> float:
        """The lease's expiry (seconds since the epoch). One that is not a number (a file edited or damaged
        by hand) says nothing about whether its rollout still runs: refuse, naming the file, rather than
        guess it expired and let a second rollout in, or fail with a bare ValueError."""
        raw = record.get("expires") or 0
        try:
            value = float(raw)
        except (TypeError, ValueError):
            value = float("nan")
        if value != value:  # NaN: not a time
            raise NodeError(
                "lease",
                "refused",
                f"{self.layout.lease_path} holds rollout {record.get('rollout_id')} with an expiry that is"
                f" not a time ({raw!r}); nothing was changed: remove the file once no rollout runs here",
            )
        return value

    def describe(self, record: dict) -> str:
        expires = self.expires(record)
        when = datetime.datetime.fromtimestamp(expires, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")  # noqa: UP017
        state = record.get("state") or "running"
        # a state this node never writes (a file edited by hand) is named as found, not guessed at
        note = LEASE_STATE_NOTES.get(state) if isinstance(state, str) else None
        if note is None:
            note = f" (lease state {state!r}, not one of {', '.join(LEASE_STATES)})"
        holder = f"rollout {record.get('rollout_id')} of {record.get('controller')}"
        return f"{holder}{note} (lease expires {when})"

    def check(self, rollout_id: str) -> None:
        """Refuse when a live lease of another rollout holds this node."""
        held = self.layout.lease()
        if held and held.get("rollout_id") != rollout_id and self.expires(held) > time.time():
            raise NodeError("lease", "refused", f"{self.describe(held)} holds this node; nothing was changed")

    def acquire(
        self,
        *,
        rollout_id: str,
        controller: str,
        expires_in_s: float,
        take_over: list[str],
        state: str = "running",
    ) -> dict:
        """Take (or renew) the lease for `rollout_id`, its holder in `state` (LEASE_STATES). A live lease of
        another rollout is refused unless it is one of `take_over` (an unfinished rollout of this
        controller's ledger that is being reconciled). Returns the lease record replaced, when it was
        another rollout's."""
        if state not in LEASE_STATES:
            raise NodeError(
                "lease",
                "refused",
                f"lease state {state!r} is not one of {', '.join(LEASE_STATES)}; nothing was changed",
            )
        os.makedirs(self.layout.root, mode=0o755, exist_ok=True)
        fd = self._locked()
        try:
            held = self.layout.lease()
            other = held if held and held.get("rollout_id") != rollout_id else None
            if other and other.get("rollout_id") not in take_over and self.expires(other) > time.time():
                raise NodeError(
                    "lease", "refused", f"{self.describe(other)} holds this node; nothing was changed"
                )
            write_json_atomic(
                self.layout.lease_path,
                {
                    "rollout_id": rollout_id,
                    "controller": controller,
                    "state": state,
                    "acquired": utc_now(),
                    "expires": round(time.time() + expires_in_s, 3),
                },
            )
            return other or {}
        finally:
            os.close(fd)

    def release(self, rollout_id: str) -> bool:
        """Drop the lease if `rollout_id` holds it; True when it did."""
        if not os.path.isdir(self.layout.root):
            return False
        fd = self._locked()
        try:
            held = self.layout.lease()
            if held and held.get("rollout_id") == rollout_id:
                os.unlink(self.layout.lease_path)
                fsync_dir(self.layout.root)
                return True
            return False
        finally:
            os.close(fd)


class NodeLock:
    """The flock on <root>/.lock, held for a whole deploy or rollback step on this node."""

    def __init__(self, layout: NodeLayout, timeout_s: float) -> None:
        self.layout = layout
        self.timeout_s = timeout_s
        self.fd: int | None = None
        self.waited_s = 0.0

    def __enter__(self) -> NodeLock:
        fd = os.open(self.layout.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        start = time.monotonic()
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    os.close(fd)
                    raise
                if time.monotonic() - start >= self.timeout_s:
                    os.close(fd)
                    raise NodeError(
                        "lock",
                        "refused",
                        f"another deploy or rollback holds {self.layout.lock_path}"
                        f" (waited {self.timeout_s:g} s)",
                    ) from None
                time.sleep(0.2)
        self.waited_s = time.monotonic() - start
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def fsync_dir(path: str) -> None:
    """Make a rename/symlink in `path` durable (a power cut must not bring back the old `current`)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def seal_tree(path: str) -> None:
    """Make a verified release read-only: files 0444 (0555 if executable), directories 0555."""
    for dirpath, dirnames, filenames in os.walk(path):
        for f in filenames:
            full = os.path.join(dirpath, f)
            mode = os.lstat(full).st_mode
            if stat.S_ISREG(mode):
                os.chmod(full, 0o555 if mode & 0o111 else 0o444)
        for d in dirnames:
            os.chmod(os.path.join(dirpath, d), 0o555)
    os.chmod(path, 0o555)


def read_json(path: str) -> object:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def write_json_atomic(path: str, data: object) -> None:
    """Temp file, fsync, rename: a reader sees the old record or the new one, never half of one."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path))

"""The controller's exception tree. Every error a user can cause is a `FleetError` with one-line text and an
exit code; anything else reaching the CLI is a bug and gets a traceback."""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum
from typing import Any


class ExitCode(IntEnum):
    OK = 0
    OPERATION_FAILED = 1  # a host failed a phase; scheduling stopped and the failure policy ran
    USAGE = 2  # bad spec, bad arguments, missing artifact: nothing was touched
    UNREACHABLE = 3  # hosts could not be reached (and nothing else failed)
    RUNNER = 4  # ansible-runner / Ansible itself could not run (missing playbook, timeout, crash)
    LOCKED = 5  # another rollout (another controller or work dir) holds the nodes' lease: nothing touched
    # `solfleet status` only (docs/cli.md, "Status exit codes"); most severe first: 1, 7, 6, 8, 3
    DRIFT = 6  # a node is not on the release the ledger says it should run (or a rollout is unfinished)
    # a node's current is unverified, tampered, failed a re-check, fails health after its last move (or the
    # node runs none: its first release failed health), or its last move is unconfirmed
    SUSPECT = 7
    SPLIT = 8  # every node is where the ledger says, but they do not all run one release
    UNHEALTHY = 9  # health: a node is unhealthy; deploy: hosts quarantined by their preflight health
    # a deploy stopped after its canary passed (rollout.pause_after_canary) and waits for `solfleet promote`
    # or `solfleet abort`; `status` too while a rollout is paused (after 1, 7 and 6; before 8 and 3)
    PAUSED = 10
    INTERRUPTED = 130  # Ctrl-C; the ledger row is marked `interrupted`


class FleetError(Exception):
    """Base of every error the CLI renders as one line (no traceback)."""

    exit_code: ExitCode = ExitCode.OPERATION_FAILED


class UsageError(FleetError):
    """Bad command-line usage or a missing input file; raised before anything changes."""

    exit_code = ExitCode.USAGE


class SpecError(UsageError):
    """A fleet spec field is wrong. Renders as `<file>: <field path>: <bad value> ...; allowed: ...`."""

    def __init__(self, field: str, value: object, allowed: str, *, source: str = "fleet spec") -> None:
        # a field path is built from the spec's own keys, which may hold a newline: keep the error one line
        field = field if field.isprintable() else repr(field)
        self.field = field
        self.value = value
        self.allowed = allowed
        self.source = source
        super().__init__(f"{source}: {field}: {_short(value)} is not allowed; {allowed}")


class ArtifactError(UsageError):
    """The artifact cannot be built or read (bad version, missing file, broken manifest)."""


class BuildFailed(FleetError):
    """The artifact could not be built from this tree (a kernel that does not compile to PTX)."""

    exit_code = ExitCode.OPERATION_FAILED


class OperationFailed(FleetError):
    """A rollout or rollback failed on at least one host; names the host and phase."""

    exit_code = ExitCode.OPERATION_FAILED


class ControllerError(FleetError):
    """Something on the controller itself (a full disk under the work dir, a ledger that cannot be written)
    stopped an operation after its ledger row existed: hosts may have moved, so this is not exit 2."""

    exit_code = ExitCode.OPERATION_FAILED


class HostsUnreachable(FleetError):
    exit_code = ExitCode.UNREACHABLE


class RunnerError(FleetError):
    """ansible-runner could not run the playbook, or stopped it (job timeout, runner error): not a host
    failure. `progress`: host -> the runner's HostProgress when the run had started (what each host had
    answered by then), else empty. `status`: ansible-runner's status when it stopped the run (`timeout`:
    the job timeout passed), else empty."""

    exit_code = ExitCode.RUNNER

    def __init__(self, message: str, *, progress: Mapping[str, Any] | None = None, status: str = "") -> None:
        super().__init__(message)
        self.progress = progress or {}
        self.status = status


class Interrupted(FleetError):
    """Ctrl-C. `progress`: host -> the runner's HostProgress of the interrupted run (typed loosely here to
    keep errors.py free of imports)."""

    exit_code = ExitCode.INTERRUPTED

    def __init__(self, message: str, *, progress: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.progress = progress or {}


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."

#!/usr/bin/python
"""solfleet_release: deploy or roll back a solfleet release on one node, in one process, under its flock.

One fat module instead of dozens of small tasks: controller-side Ansible costs ~150 ms per task per host
(docs/FACTS.md), so unpack, check, verify, activate, health, journal and prune all happen here.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.solfleet_artifact import (
    check_cc,
    check_files,
    check_stack,
    read_manifest,
    safe_unpack,
    sha256_file,
)
from ansible.module_utils.solfleet_kernels import KernelsRun, health_env, run_kernels, verify_summary
from ansible.module_utils.solfleet_layout import (
    INTENT_EVENT,
    PARTIAL_SUFFIX,
    VERIFY_DIR,
    Lease,
    NodeError,
    NodeLayout,
    NodeLock,
    check_version,
    seal_tree,
)

DOCUMENTATION = r"""
module: solfleet_release
short_description: Deploy (push already done) or roll back a solfleet operator-library release on a node
description:
  - I(mode=deploy) unpacks the pushed artifact into C(releases/V.partial), refusing members that escape it,
    checks every file against C(MANIFEST.json), the node's stack pins and compute capability, renames it to
    C(releases/V), runs C(python -m kernels verify --json) inside it, switches C(current) atomically, sets
    C(previous), runs C(python -m kernels health --json), journals every step and prunes old releases.
  - I(mode=rollback) switches C(current) to I(rollback_to) or the node's C(previous) after re-checking its
    files, then runs health; an unhealthy node stays on the target and the task fails.
  - Everything runs under an flock on C(<root>/.lock). The result key C(solfleet) follows
    docs/node-contract.md on success and on failure.
options:
  mode: {description: "deploy or rollback", type: str, choices: [deploy, rollback], default: deploy}
  root: {description: "absolute node root", type: path, required: true}
  node: {description: "node name for messages and the journal", type: str, required: true}
  python: {description: "interpreter that runs python -m kernels", type: str, required: true}
  simulated: {description: "run verify and health under the CUDA simulator", type: bool, default: false}
  gpu_cc: {description: "compute capability, e.g. 9.0 (empty when simulated)", type: str, default: ""}
  version: {description: "version to deploy (mode=deploy)", type: str, default: ""}
  artifact: {description: "the artifact's path on the node (written from artifact_b64 if given)", type: path}
  artifact_b64:
    description:
      - "the artifact's bytes, base64: the push (written to I(artifact) only when this run stages the release,
        after its sha256 matched I(artifact_sha256)); empty = the artifact is already at I(artifact)"
    type: str
    default: ""
  artifact_sha256: {description: "expected sha256 of the artifact", type: str, default: ""}
  rollout_id: {description: "rollout id for the journal", type: str, default: ""}
  keep_releases: {description: "verified releases kept, current and previous included", type: int, default: 5}
  activate: {description: "switch current after verify (false = stage only)", type: bool, default: true}
  verify_ops: {description: "comma-separated ops for verify (empty = all)", type: str, default: ""}
  verify_timeout_s: {description: "timeout of verify", type: int, default: 600}
  health_timeout_s: {description: "timeout of health", type: int, default: 120}
  lock_timeout_s: {description: "how long to wait for the node lock", type: int, default: 60}
  rollback_to: {description: "rollback target version (empty = previous)", type: str, default: ""}
  restore:
    description: "mode=rollback, an undo to a baseline: current -> rollback_to, previous -> restore_previous"
    type: bool
    default: false
  restore_previous: {description: "with restore: the baseline previous ('' = none)", type: str, default: ""}
  gpu_count: {description: "health: expected GPU count ('' = not set)", type: str, default: ""}
  gpu_model: {description: "health: expected GPU model ('' = not set)", type: str, default: ""}
  stack_driver: {description: "health: the stack's driver pin ('' = none)", type: str, default: ""}
  stack_cuda: {description: "health: the stack's CUDA version ('' = none)", type: str, default: ""}
  bench:
    description: "after a passing verify on a real node, also run kernels bench (performance gates)"
    type: bool
    default: false
  bench_ops: {description: "comma-separated ops to bench (empty = all)", type: str, default: ""}
  bench_timeout_s: {description: "timeout of bench", type: int, default: 900}
"""


# Releases that failed after activation kept for inspection by prune (the newest ones); older ones go.
KEEP_FAILED_RELEASES = 1
ARTIFACT_RECORD = "artifact.json"  # in releases/V/verify/: which artifact sha256 this release came from
BENCH_RECORD = "bench.json"  # in releases/V/verify/: the node's bench of the release (performance gates)

# What a controller Ctrl-C (or a dropped SSH session) delivers to the module: ansible-playbook's cancel, with
# connection local, reaches this process as SIGINT/SIGHUP/SIGTERM.
SHIELDED_SIGNALS = (signal.SIGHUP, signal.SIGINT, signal.SIGTERM)


@contextmanager
def uninterruptible() -> Iterator[None]:
    """Ignore SHIELDED_SIGNALS for the locked section, then restore the previous handlers.

    Dying between the switch of `current`, the restore after a failed health check and the journal line would
    leave a node that says one thing and runs another. The section is still bounded: every subprocess in it
    (verify, health) has its own timeout, and the lock wait has one; SIGKILL still works. Children inherit the
    ignored dispositions, so a verify/health run is not cut short either (it ends at its timeout at worst).
    """
    saved = {sig: signal.signal(sig, signal.SIG_IGN) for sig in SHIELDED_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


class Deployment:
    """One run of the module on one node: the inputs, the layout, and the contract result being built."""

    def __init__(self, params: dict[str, Any]) -> None:
        self.p = params
        self.layout = NodeLayout(params["root"], params["node"], params["simulated"])
        self.phases: dict[str, float] = {}
        self.changed = False
        # set once this run has journaled its own failure, so main() adds a `refused` line only when not
        self.journaled_failure = False
        self.result: dict[str, Any] = {
            "node": params["node"],
            "version": params["version"] or params["rollback_to"] or None,
            "outcome": None,
            "failed_phase": None,
            "message": "",
            # What `current` pointed at when this run took the lock (None: absent or dangling). The controller
            # undoes an activation to this, never to `previous`, which may predate a missing current.
            "prior_current": None,
            "simulated": params["simulated"],
            "phases": self.phases,
            "verify": None,
        }

    # -- helpers -------------------------------------------------------------------------------------------
    def timed(self, phase: str, start: float) -> None:
        self.phases[phase] = round(self.phases.get(phase, 0.0) + time.monotonic() - start, 3)

    def journal(self, event: str, version: str, detail: str, plain: bool = False) -> None:
        self.layout.journal(event, version, self.p["rollout_id"], detail, plain=plain)
        if event in ("failed", "refused"):
            self.journaled_failure = True

    def intend(self, version: str, detail: str) -> None:
        """Journal a switch before making it (write-ahead). When even that line cannot be written (a full
        disk), refuse before anything moves: a switch the journal cannot record is not made."""
        try:
            self.journal(INTENT_EVENT, version, detail)
        except OSError as exc:
            raise NodeError(
                "activate",
                "refused",
                f"cannot journal the switch to {version} ({exc.strerror or exc}); nothing was switched",
            ) from None

    def confirm(self, event: str, version: str, detail: str, plain: bool = False) -> None:
        """Journal a switch already made (or, after a failed health check, the restore that must be made
        whatever the disk can take). If the write fails the node still reports where it really is: the
        result carries `journal_error` (every line that was lost), and status sees an unconfirmed move."""
        try:
            self.journal(event, version, detail, plain=plain)
        except OSError as exc:
            lost = f"{event} not journaled: {exc.strerror or exc}"
            earlier = self.result.get("journal_error")
            self.result["journal_error"] = f"{earlier}; {lost}" if earlier else lost

    def _stack_env(self, release: str) -> dict[str, Any]:
        return {
            "release": release,
            "cache_dir": self.layout.cache,
            "simulated": self.p["simulated"],
            "config": self.layout.config_path,
        }

    def kernels(self, command: str, release: str, args: list[str], timeout_s: int, phase: str) -> KernelsRun:
        return run_kernels(
            config=self.layout.config_path,
            python=self.p["python"],
            release=release,
            command=command,
            args=args,
            cache_dir=self.layout.cache,
            simulated=self.p["simulated"],
            timeout_s=timeout_s,
            phase=phase,
            # health checks the GPUs against the spec and refreshes <root>/metrics/solfleet.prom
            extra_env=health_env(self.layout.root, self.p) if command == "health" else None,
        )

    def finish_state(self) -> dict[str, Any]:
        state = self.layout.state()
        self.result.update(current=state["current"], previous=state["previous"], releases=state["releases"])
        return self.result

    # -- deploy --------------------------------------------------------------------------------------------
    def deploy(self) -> None:
        version = check_version(self.p["version"], "solfleet_version")
        if not self.p["artifact"]:
            raise NodeError("input", "refused", "artifact (the pushed tarball's path on the node) is empty")
        self.layout.ensure_dirs()
        Lease(self.layout).check(self.p["rollout_id"])
        with NodeLock(self.layout, self.p["lock_timeout_s"]) as lock, uninterruptible():
            self.phases["lock_wait"] = round(lock.waited_s, 3)
            Lease(self.layout).check(self.p["rollout_id"])  # again under the lock: it may have changed
            self._remove_stale()
            prior_current = self.layout.link_version("current")
            prior_previous = self.layout.link_version("previous")
            self.result["prior_current"] = prior_current
            self.result["prior_previous"] = prior_previous
            release = self.layout.release_dir(version)
            if os.path.isdir(release) and not self.layout.is_verified(version):
                if version in (prior_current, prior_previous):
                    # Links must never dangle: refuse rather than remove what current/previous point at.
                    raise NodeError(
                        "unpack_check",
                        "refused",
                        f"releases/{version} is current or previous but {self._unverified_why(version)};"
                        " inspect the node",
                    )
                # A crash between rename and verify leaves an unverified release, and one that failed health
                # after activation is marked failed: never trust either, unpack and verify it again.
                self.layout.remove_release_tree(release)
            fresh = not self.layout.is_verified(version)  # unpacked (and stack-checked) by this run
            if not fresh:
                manifest = self._recheck_existing(version, release, prior_current)
                if prior_current == version:
                    self.result.update(outcome="already_current", message=f"{version} is already current")
                    return
                if not self.p["activate"]:
                    self.result.update(outcome="staged", message=f"{version} was already staged and verified")
                    return
            else:
                manifest = self._stage(version, release)
                self._verify(version, release)
                if not self.p["activate"]:
                    self.result.update(outcome="staged", message=f"{version} staged and verified")
                    self._prune(version)
                    return
            try:
                self._activate(version, prior_current, manifest, stack_checked=fresh)
                self._health(version, release, prior_current, prior_previous)
            except NodeError:
                raise  # the phase already restored what it had to
            except Exception as exc:
                # An unexpected error between the switch and a healthy end: put the prior release back.
                self.layout.set_link("current", prior_current)
                self.layout.set_link("previous", prior_previous)
                self.journal("failed", version, f"activation error: {exc}")
                raise NodeError(
                    "activate", "refused", f"{exc}; restored current -> {prior_current or 'none'}"
                ) from exc
            self.result.update(outcome="activated", message=f"{version} activated")
            self._prune(version)

    def _unverified_why(self, version: str) -> str:
        failed = self.layout.failed_record(version)
        if failed is not None:
            return f"it failed after activation ({failed.get('reason', 'no reason recorded')})"
        return "it has no passing verify/verify.json"

    def _remove_stale(self) -> None:
        """Under the lock nothing else can be mid-step here: any .partial, and any release that was renamed
        into place but never verified nor marked failed (its run was killed during verify), is a leftover.
        Releases that current or previous point at are never removed (the re-check handles those)."""
        linked = {self.layout.link_version("current"), self.layout.link_version("previous")}
        for name in os.listdir(self.layout.releases):
            path = os.path.join(self.layout.releases, name)
            if name.endswith(PARTIAL_SUFFIX):
                self.layout.remove_release_tree(path)
            elif (
                name in self.layout.release_names()
                and name not in linked
                and self.layout.verify_record(name) is None
                and self.layout.failed_record(name) is None
            ):
                self.layout.remove_release_tree(path)
                self.journal("removed", name, "left unverified by a run that did not finish; removed")

    def _artifact_record(self, release: str) -> str | None:
        try:
            with open(os.path.join(release, VERIFY_DIR, ARTIFACT_RECORD), encoding="utf-8") as fh:
                return json.load(fh).get("sha256")
        except (OSError, ValueError, AttributeError):
            return None

    def _recheck_existing(self, version: str, release: str, prior_current: str | None) -> dict[str, Any]:
        """An already verified release: same artifact, every file still matches; else refuse activation."""
        start = time.monotonic()
        recorded = self._artifact_record(release)
        expected = self.p["artifact_sha256"]
        if expected and recorded and recorded != expected:
            raise NodeError(
                "unpack_check",
                "refused",
                f"releases/{version} on this node came from artifact {recorded[:12]}..., "
                f"not {expected[:12]}...;"
                " a version is immutable, build a new version",
            )
        try:
            manifest = read_manifest(release)
            check_files(release, manifest)
        except NodeError as exc:
            if version not in (prior_current, self.layout.link_version("previous")):
                # Not current, not previous: remove it so the next deploy unpacks a clean copy.
                self.layout.remove_release_tree(release)
                self.journal("failed", version, f"re-check refused: {exc.message}")
                raise NodeError(
                    exc.phase,
                    exc.outcome,
                    f"releases/{version} failed its re-check: {exc.message};"
                    " removed, node stays on its prior release",
                ) from None
            # current/previous are never removed (a link must not dangle); refuse and say so in the journal.
            role = "current" if version == prior_current else "previous"
            if role == "current":
                # remembered until a good deploy or rollback replaces it: status reports it `suspect`
                self.layout.mark_suspect(version, f"re-check failed: {exc.message}")
            self.journal("failed", version, f"{role} release failed its re-check: {exc.message}")
            raise NodeError(
                exc.phase, exc.outcome, f"{role} release {version} failed its re-check: {exc.message}"
            ) from None
        self.timed("unpack_check", start)
        return manifest

    def _receive_artifact(self) -> None:
        """The push: write the artifact's bytes from the module arguments to `artifact` (temp file, fsync,
        rename), after checking their sha256 against the controller's, unless the same bytes are there."""
        start = time.monotonic()
        artifact = self.p["artifact"]
        try:
            data = base64.b64decode(self.p["artifact_b64"], validate=True)
        except (binascii.Error, ValueError) as exc:
            raise NodeError("push", "refused", f"the pushed artifact is not valid base64: {exc}") from None
        actual = hashlib.sha256(data).hexdigest()
        if self.p["artifact_sha256"] and actual != self.p["artifact_sha256"]:
            raise NodeError(
                "push",
                "refused",
                f"pushed bytes have sha256 {actual[:12]}...,"
                f" the controller's artifact {self.p['artifact_sha256'][:12]}...",
            )
        if os.path.isfile(artifact) and sha256_file(artifact) == actual:
            self.timed("push", start)
            return
        tmp = f"{artifact}.{os.getpid()}.tmp"
        try:
            os.makedirs(os.path.dirname(artifact), exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, artifact)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)  # a full disk gets back what the temp file took
            why = f"cannot write the pushed artifact to {artifact}: {exc}"
            raise NodeError("push", "refused", why) from None
        self.changed = True
        self.timed("push", start)

    def _stage(self, version: str, release: str) -> dict[str, Any]:
        if self.p["artifact_b64"]:
            self._receive_artifact()
        start = time.monotonic()
        artifact = self.p["artifact"]
        if not os.path.isfile(artifact):
            raise NodeError("unpack_check", "refused", f"artifact {artifact} is not on the node")
        if self.p["artifact_sha256"]:
            actual = sha256_file(artifact)
            if actual != self.p["artifact_sha256"]:
                raise NodeError(
                    "unpack_check",
                    "refused",
                    f"artifact sha256 {actual[:12]}... differs from the"
                    f" controller's {self.p['artifact_sha256'][:12]}...",
                )
        partial = self.layout.partial_dir(version)
        try:
            safe_unpack(artifact, partial)
            manifest = read_manifest(partial)
            if manifest.get("version") != version:
                raise NodeError(
                    "unpack_check",
                    "refused",
                    f"MANIFEST.json version {manifest.get('version')!r} is not {version!r}",
                )
            check_files(partial, manifest)
            # in the very environment verify will run in (the release on PYTHONPATH, nothing inherited)
            check_stack(manifest, self.p["python"], **self._stack_env(partial))
            check_cc(manifest, self.p["gpu_cc"], self.p["simulated"])
            os.makedirs(os.path.join(partial, VERIFY_DIR))
            with open(os.path.join(partial, VERIFY_DIR, ARTIFACT_RECORD), "w", encoding="utf-8") as fh:
                json.dump({"sha256": self.p["artifact_sha256"] or sha256_file(artifact)}, fh)
            os.rename(partial, release)
        except BaseException:
            self.layout.remove_release_tree(partial)
            raise
        self.changed = True
        self.journal("staged", version, f"unpacked and checked {len(manifest['files'])} files")
        self.timed("unpack_check", start)
        return manifest

    def _verify(self, version: str, release: str) -> None:
        start = time.monotonic()
        args = ["--ops", self.p["verify_ops"]] if self.p["verify_ops"] else []
        try:
            run = self.kernels("verify", release, args, self.p["verify_timeout_s"], "verify")
        except NodeError as exc:
            self.layout.remove_release_tree(release)
            self.journal("failed", version, exc.message)
            raise
        self.result["verify"] = verify_summary(run, self.p["simulated"])
        if not run.ok:
            self.layout.remove_release_tree(release)
            detail = run.message
            if run.data is not None:
                kept = self.layout.keep_failed_record(version, self.p["rollout_id"], "verify", run.data)
                self.result["failed_record"] = kept
                detail += f"; verify JSON kept at {kept}"
            self.journal("failed", version, detail)
            raise NodeError("verify", "verify_failed", detail + "; release removed")
        with open(os.path.join(release, VERIFY_DIR, "verify.json"), "w", encoding="utf-8") as fh:
            json.dump(run.data, fh, indent=1, sort_keys=True)
        self._bench(release)
        seal_tree(release)
        summary = self.result["verify"]
        self.journal(
            "verified", version, f"{summary['ops']} ops ok" + (" (simulated)" if summary["simulated"] else "")
        )
        self.timed("verify", start)

    def _bench(self, release: str) -> None:
        """Performance gates: bench the gated ops on a real node and keep the report in the release's verify
        record (verify/bench.json), beside the figures of the release current pointed at before. The
        controller judges both (fleet/gating.py); the node only measures. A bench that cannot run leaves
        `bench` None and says why: on a real node a gate without figures fails on the controller."""
        if not self.p["bench"] or self.p["simulated"]:
            return
        start = time.monotonic()
        prior = self.result.get("prior_current")
        if prior:
            try:
                with open(
                    os.path.join(self.layout.release_dir(prior), VERIFY_DIR, BENCH_RECORD), encoding="utf-8"
                ) as fh:
                    self.result["bench_previous"] = json.load(fh)
            except (OSError, ValueError):
                self.result["bench_previous"] = None
        args = ["--ops", self.p["bench_ops"]] if self.p["bench_ops"] else []
        try:
            run = self.kernels("bench", release, args, self.p["bench_timeout_s"], "bench")
        except NodeError as exc:
            self.result.update(bench=None, bench_error=exc.message)
            self.timed("bench", start)
            return
        if run.data is not None and isinstance(run.data.get("results"), list):
            with open(os.path.join(release, VERIFY_DIR, BENCH_RECORD), "w", encoding="utf-8") as fh:
                json.dump(run.data, fh, indent=1, sort_keys=True)
        self.result["bench"] = run.data
        if run.rc != 0:
            self.result["bench_error"] = run.message
        self.timed("bench", start)

    def _activate(
        self, version: str, prior_current: str | None, manifest: dict[str, Any], stack_checked: bool
    ) -> None:
        start = time.monotonic()
        if not stack_checked:
            # Staged by an earlier run: the stack may have changed since, so check it right before the switch.
            check_stack(manifest, self.p["python"], **self._stack_env(self.layout.release_dir(version)))
            check_cc(manifest, self.p["gpu_cc"], self.p["simulated"])
        self.intend(version, f"activate: current -> releases/{version} (was {prior_current or 'none'})")
        # `previous` first, then `current`: a kill between the two renames leaves current on the old verified
        # release (previous = current = old), never current on the new one with a stale previous behind it.
        if prior_current and prior_current != version:
            self.layout.set_link("previous", prior_current)
        self.layout.set_link("current", version)
        self.layout.clear_suspect()
        self.changed = True
        self.confirm("activated", version, f"current -> releases/{version} (was {prior_current or 'none'})")
        self.timed("activate", start)

    def _health(
        self, version: str, release: str, prior_current: str | None, prior_previous: str | None
    ) -> None:
        start = time.monotonic()
        try:
            run = self.kernels(
                "health", self.layout.link_path("current"), [], self.p["health_timeout_s"], "health"
            )
            message = run.message
            healthy = run.ok
        except NodeError as exc:
            message, healthy = exc.message, False
        self.timed("health", start)
        if healthy:
            self.confirm("healthy", version, "health passed after activation")
            return
        # After activation: restore the prior release exactly (current and previous as they were), keep the
        # failed release for inspection but mark it failed (its verify.json still says ok, and it must not
        # count as verified: no rollback target, not in status' releases), and say so in the journal.
        # The restore does not wait on the journal: a disk that fills between two lines (the failure written,
        # the intent not) must not leave the node on the release that failed health, still counted verified.
        # A line that cannot be written is carried in the result's journal_error instead. The release is
        # marked failed before the switch back: a kill between the two then leaves current on a release that
        # is no longer verified (status: unverified), never on one that still passes for verified.
        self.confirm("failed", version, f"health after activation: {message}")
        try:
            self.layout.mark_failed(version, f"health after activation: {message}")
        except OSError as exc:
            message += f"; could not write releases/{version}/verify/failed.json: {exc}"
        self.confirm(INTENT_EVENT, prior_current or "none", f"restore after {version} failed health")
        self.layout.set_link("current", prior_current)
        self.layout.set_link("previous", prior_previous)
        after = ""
        if not prior_current:
            # Nothing to return to: the node now runs no release. Confirmed, so status names the release and
            # the reason instead of an unconfirmed switch.
            self.confirm(
                "deactivated",
                version,
                f"current removed: {version} failed health after activation ({message});"
                " no earlier release to return to",
            )
        else:
            self.confirm("rolled_back", prior_current, f"restored after {version} failed health")
            try:  # health runs after every switch, this one too: a failing node must not look healthy
                again = self.kernels(
                    "health", self.layout.link_path("current"), [], self.p["health_timeout_s"], "health"
                )
                healthy_again, why_again = again.ok, again.message
            except NodeError as exc:
                healthy_again, why_again = False, exc.message
            if healthy_again:
                self.confirm("healthy", prior_current, f"health passed after restoring {prior_current}")
            else:
                self.confirm("failed", prior_current, f"health after restore: {why_again}")
                after = f"; health fails on {prior_current} too ({why_again}): the node itself is suspect"
        if self.result.get("journal_error"):
            after += f"; {self.result['journal_error']}"
        raise NodeError(
            "health",
            "health_failed",
            f"{message}; restored current -> {prior_current or 'none'}, {version} kept for inspection{after}",
        )

    def _prune(self, keep_version: str) -> None:
        start = time.monotonic()
        # current, previous, and what previous was before this run switched anything: the rollout's baseline
        # previous, which an undo to the baseline restores (so it must still be here when the undo comes)
        protected = {
            keep_version,
            self.layout.link_version("current"),
            self.layout.link_version("previous"),
            self.result.get("prior_previous"),
        }
        verified = self.layout.verified_releases()
        candidates = [v for v in verified if v not in protected]
        budget = max(self.p["keep_releases"] - (len(verified) - len(candidates)), 0)
        doomed = candidates[: max(len(candidates) - budget, 0)]
        # Releases that failed after activation are kept for inspection, but only the newest: repeated
        # failed deploys must not fill the node's disk. current/previous are never removed.
        failed = [v for v in self.layout.failed_releases() if v not in protected]
        doomed += failed[:-KEEP_FAILED_RELEASES]
        for version in doomed:
            self.layout.remove_release_tree(self.layout.release_dir(version))
        kept = set(self.layout.release_names())
        this_artifact = os.path.basename(self.p["artifact"] or "")
        for name in os.listdir(self.layout.artifacts):
            stem = name[len("solfleet-ops-") : -len(".tar.gz")] if name.startswith("solfleet-ops-") else None
            if name != this_artifact and stem not in kept:
                os.unlink(os.path.join(self.layout.artifacts, name))
        if doomed:
            self.result["pruned"] = doomed
        self.timed("prune", start)

    # -- rollback ------------------------------------------------------------------------------------------
    def rollback(self) -> None:
        wanted = self.p["rollback_to"]
        restore = self.p["restore"]
        if wanted:
            check_version(wanted, "solfleet_rollback_to")
        if restore:
            if not wanted:
                raise NodeError("input", "refused", "restore needs rollback_to (the baseline's current)")
            if self.p["restore_previous"]:
                check_version(self.p["restore_previous"], "solfleet_restore_previous")
        if not os.path.isdir(self.layout.releases):
            raise NodeError("rollback", "refused", f"no releases under {self.layout.root}")
        if self.p["rollout_id"]:
            Lease(self.layout).check(self.p["rollout_id"])
        with NodeLock(self.layout, self.p["lock_timeout_s"]) as lock, uninterruptible():
            self.phases["lock_wait"] = round(lock.waited_s, 3)
            start = time.monotonic()
            current = self.layout.link_version("current")
            previous = self.layout.link_version("previous")
            self.result["prior_current"] = current
            self.result["prior_previous"] = previous
            if restore:
                target, new_previous = wanted, self.p["restore_previous"] or None
            else:
                target = wanted or previous
                new_previous = current
                last_move = self.layout.last_moving_event()
                if (
                    not wanted
                    and current
                    and last_move
                    and last_move.get("event") == "rolled_back"
                    and last_move.get("plain") is True
                    and last_move.get("version") == current
                ):
                    # Re-running a plain rollback must not flip forward to what the last plain rollback left.
                    # Only a plain one counts: after `--to X` or an undo, a plain rollback means "go to
                    # previous" and must do so.
                    target, new_previous = current, previous
            if not target:
                raise NodeError("rollback", "refused", "no previous release to roll back to (use --to)")
            self.result["version"] = target
            if target == current and (new_previous == previous or not restore):
                # Nothing to switch. A move whose health never ran (a killed run) is finished here, a release
                # whose last health check failed is checked again (status reports it until then), and a
                # switch journaled but never confirmed (a kill, or a full disk, between intent and
                # confirmation) is confirmed where current really is, when that is a verified release.
                moved = self.layout.move_state()
                # a failed health check is checked again for the operator's rollback, not for an undo's
                # restore: the node is on its baseline, and its sickness is status's to report. A move
                # that never finished (health pending, a switch unconfirmed) is finished by either, as
                # before: confirmed, then its health run.
                recheck = moved["health_pending"] or (moved["health_failed"] and not restore)
                # the journal's last move names another release than current: its confirmation (and what
                # followed) was lost, e.g. to a full disk while a failed release was switched back
                last = moved["moved_to"]
                unconfirmed = moved["unconfirmed"] or last != target
                open_move = unconfirmed or recheck
                if (open_move or not restore) and not self.layout.is_verified(target):
                    # never confirm, or call healthy, a current release that is not verified (one that
                    # failed after activation, its restore cut short): the operator must leave it. Nor
                    # answer the operator's rollback to it "unchanged": it is not a release to be on. An
                    # undo's restore to such a baseline leaves it as it found it (status says unverified).
                    why = ": it failed after activation" if self.layout.failed_record(target) else ""
                    verified = ", ".join(self.layout.verified_releases()) or "none"
                    raise NodeError(
                        "rollback",
                        "refused",
                        f"{target} is current but not a verified release on this node{why}; roll back to"
                        f" a verified one (--to; verified: {verified}) or deploy",
                    )
                if unconfirmed:
                    intent = moved["intent"] or {}
                    to = intent.get("version")
                    if not moved["unconfirmed"]:
                        what = f"the journal's last move was to {last or 'none'}; its confirmation was lost"
                    elif to == target:
                        what = f"the switch journaled at {intent.get('time', '?')} took place"
                    else:
                        what = f"the switch to {to} journaled at {intent.get('time', '?')} did not take place"
                    # a plain rollback's own line stays plain: re-running it must never flip forward
                    self.confirm("rolled_back", target, f"current is {target}: {what}", plain=not wanted)
                    recheck = True
                if recheck:
                    self._health_after_rollback(target, current)
                    self.result.update(
                        outcome="rolled_back", message=f"{target} is current; health now passed"
                    )
                    return
                self.result.update(outcome="unchanged", message=f"{target} is already current")
                return
            release = self.layout.release_dir(target)
            if not self.layout.is_verified(target):
                why = ": it failed after activation" if self.layout.failed_record(target) is not None else ""
                raise NodeError(
                    "rollback",
                    "refused",
                    f"{target} is not a verified release on this node{why}"
                    f" (verified: {', '.join(self.layout.verified_releases()) or 'none'})",
                )
            if new_previous and not self.layout.is_verified(new_previous):
                new_previous = None  # never point previous at a release that cannot be rolled back to
            try:
                check_files(release, read_manifest(release))
            except NodeError as exc:
                raise NodeError(
                    "rollback", "refused", f"rollback target {target} failed its re-check: {exc.message}"
                ) from None
            what = "restore" if restore else "rollback"
            self.intend(
                target,
                f"{what}: current -> releases/{target} (was {current or 'none'}),"
                f" previous -> {new_previous or 'none'}",
            )
            # Unlike activation, `current` goes first: a rollback is run to leave the current release, and the
            # target was just re-checked, so a kill between the renames leaves current on a verified release.
            self.layout.set_link("current", target)
            self.layout.set_link("previous", new_previous)
            self.layout.clear_suspect()
            self.changed = True
            self.confirm(
                "rolled_back",
                target,
                f"current -> releases/{target} (was {current or 'none'}),"
                f" previous -> {new_previous or 'none'}",
                plain=not wanted,
            )
            self.timed("activate", start)
            self._health_after_rollback(target, current)
            note = f"; {self.result['journal_error']}" if self.result.get("journal_error") else ""
            self.result.update(
                outcome="rolled_back", message=f"rolled back {current or 'none'} -> {target}{note}"
            )

    def _health_after_rollback(self, target: str, left: str | None) -> None:
        """A rollback is checked like an activation, but a failure does not switch back: the release being
        left is the one the operator is escaping, and the target is verified and re-checked. The node stays
        on the target and the host fails with the health message, so the operator hears that the node (not
        a release) is in trouble."""
        start = time.monotonic()
        try:
            run = self.kernels(
                "health", self.layout.link_path("current"), [], self.p["health_timeout_s"], "health"
            )
            message, healthy = run.message, run.ok
        except NodeError as exc:
            message, healthy = exc.message, False
        self.timed("health", start)
        if healthy:
            self.confirm("healthy", target, "health passed after rollback")
            return
        self.journal("failed", target, f"health after rollback: {message}")
        raise NodeError(
            "health",
            "health_failed",
            f"rolled back {left or 'none'} -> {target}, but health fails: {message};"
            f" node left on {target} (verified), previous {self.layout.link_version('previous') or 'none'}",
        )


def journal_refusal(deployment: Deployment, error: NodeError) -> str | None:
    """Append a `refused` line for a failure this run did not journal itself; returns why it could not."""
    layout = deployment.layout
    if not os.path.isdir(layout.root):
        return None
    version = deployment.result.get("version") or "none"
    try:
        deployment.journal("refused", str(version), f"{error.phase}: {error.message}")
    except OSError as exc:
        return f"refusal not journaled: {exc.strerror or exc}"
    return None


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "mode": {"type": "str", "choices": ["deploy", "rollback"], "default": "deploy"},
            "root": {"type": "path", "required": True},
            "node": {"type": "str", "required": True},
            "python": {"type": "str", "required": True},
            "simulated": {"type": "bool", "default": False},
            "gpu_cc": {"type": "str", "default": ""},
            "version": {"type": "str", "default": ""},
            "artifact": {"type": "path"},
            # no_log: ~0.5 MB of base64 stays out of the invocation echoed back into every job event
            "artifact_b64": {"type": "str", "default": "", "no_log": True},
            "artifact_sha256": {"type": "str", "default": ""},
            "rollout_id": {"type": "str", "default": ""},
            "keep_releases": {"type": "int", "default": 5},
            "activate": {"type": "bool", "default": True},
            "verify_ops": {"type": "str", "default": ""},
            "verify_timeout_s": {"type": "int", "default": 600},
            "health_timeout_s": {"type": "int", "default": 120},
            "lock_timeout_s": {"type": "int", "default": 60},
            "rollback_to": {"type": "str", "default": ""},
            "restore": {"type": "bool", "default": False},
            "restore_previous": {"type": "str", "default": ""},
            "gpu_count": {"type": "str", "default": ""},
            "gpu_model": {"type": "str", "default": ""},
            "stack_driver": {"type": "str", "default": ""},
            "stack_cuda": {"type": "str", "default": ""},
            "bench": {"type": "bool", "default": False},
            "bench_ops": {"type": "str", "default": ""},
            "bench_timeout_s": {"type": "int", "default": 900},
        },
        supports_check_mode=False,
    )
    params = module.params
    if params["keep_releases"] < 1:
        module.fail_json(
            msg=f"solfleet: {params['node']}: input: keep_releases={params['keep_releases']} must be >= 1"
        )
    deployment: Deployment | None = None
    try:
        deployment = Deployment(params)
        if params["mode"] == "rollback":
            deployment.rollback()
        else:
            deployment.deploy()
    except Exception as exc:  # noqa: BLE001  every failure must come back as the contract's result
        error = (
            exc
            if isinstance(exc, NodeError)
            else NodeError("internal", "refused", f"{type(exc).__name__}: {exc}")
        )
        result = deployment.finish_state() if deployment else {"node": params["node"], "phases": {}}
        result.update(outcome=error.outcome, failed_phase=error.phase, message=error.message)
        if deployment is not None and not deployment.journaled_failure:
            # Every refusal and error is journaled whenever the root exists (sha mismatch, disk, stack/cc,
            # lock timeout, lease, internal error): the node's own record must not depend on the controller.
            lost = journal_refusal(deployment, error)
            if lost:  # after any line this run had already lost (a restore's, say)
                earlier = result.get("journal_error")
                result["journal_error"] = f"{earlier}; {lost}" if earlier else lost
        module.fail_json(
            msg=f"solfleet: {params['node']}: {error.phase}: {error.message}",
            changed=bool(deployment and deployment.changed),
            solfleet=result,
        )
    assert deployment is not None  # fail_json above exits; this is for the type checker
    result = deployment.finish_state()
    module.exit_json(
        changed=deployment.changed, msg=f"solfleet: {params['node']}: {result['message']}", solfleet=result
    )


if __name__ == "__main__":
    main()

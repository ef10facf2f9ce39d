"""`python -m kernels health`: the node check a rollout gates on, run inside a release by the node's python.

Checks, in order (each `passed`, `failed` or `skipped` with a one-line detail, see docs/health.md):
  gpu.*              every GPU check of kernels.harness.gpu_health against the node's expectations
                     (`skipped (simulated)` on a simulated node: nothing is read);
  release.integrity  every file of the release this runs from matches its MANIFEST.json;
  release.current    `<root>/current` points at a verified release (verify.json ok, no failed.json), and it is
                     the one this runs from;
  kernel.tiny_op     a small op runs and matches its float64 reference;
  gpu.memory         at least 1 GiB of device memory is free (skipped when simulated).

The node root and the expectations come from the flags or, when a flag is absent, from the environment the
node module sets (SOLFLEET_ROOT, SOLFLEET_HEALTH_EXPECT as JSON {"count", "model", "cc", "driver", "cuda"}).
The environment route is what the node module uses: a release built before these flags existed ignores the
variables instead of refusing an unknown flag, so health after a rollback to it still runs.

With a root, the run also refreshes `<root>/metrics/solfleet.prom` (kernels.harness.metrics): the checks of
this run, and the release `current` points at with its verify and bench records. A metrics write that fails
does not make the node unhealthy; the report's `metrics` key says why.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kernels.harness.gpu_health import Check, CheckStatus, GpuExpectations, run_gpu_checks
from kernels.runtime import device
from kernels.runtime.arrays import SIMULATED

MANIFEST = "MANIFEST.json"
VERIFY_DIR = "verify"  # inside a release: the node's records, not in the MANIFEST
ROOT_ENV = "SOLFLEET_ROOT"
EXPECT_ENV = "SOLFLEET_HEALTH_EXPECT"
EXPECT_KEYS = ("count", "model", "cc", "driver", "cuda")
MIN_FREE_BYTES = 1 << 30  # a node with under 1 GiB free cannot stage even one bench case

P, F, S = CheckStatus.PASSED, CheckStatus.FAILED, CheckStatus.SKIPPED


@dataclass(frozen=True)
class HealthInputs:
    root: Path | None  # the node root; None: not on a node (a dev checkout), node checks are skipped
    expect: GpuExpectations
    release: Path  # the release (or checkout) this runs from: the folder holding the kernels package


def expectations_from(raw: Mapping[str, Any]) -> GpuExpectations:
    """GpuExpectations from a dict; "" and None mean not set. Raises ValueError naming a bad key or value."""
    bad = sorted(set(raw) - set(EXPECT_KEYS))
    if bad:
        raise ValueError(
            f"health expectations: unknown key(s) {', '.join(bad)}; allowed: {', '.join(EXPECT_KEYS)}"
        )
    vals = {k: (None if raw.get(k) in (None, "") else raw[k]) for k in EXPECT_KEYS}
    count = vals["count"]
    if count is not None:
        try:
            count = int(count)
        except (TypeError, ValueError):
            raise ValueError(f"health expectations: count {count!r} is not an integer") from None
    strs = {k: None if vals[k] is None else str(vals[k]) for k in ("model", "cc", "driver", "cuda")}
    return GpuExpectations(count=count, **strs)


def inputs_from(
    *, root: str | None, expect: Mapping[str, Any], env: Mapping[str, str] | None = None
) -> HealthInputs:
    """Flags first, then the node module's environment. `expect` holds the flags that were given."""
    env = os.environ if env is None else env
    from_env: dict[str, Any] = {}
    if env.get(EXPECT_ENV):
        try:
            parsed = json.loads(env[EXPECT_ENV])
        except ValueError as e:
            raise ValueError(f"{EXPECT_ENV} is not JSON: {e}") from None
        if not isinstance(parsed, dict):
            raise ValueError(f"{EXPECT_ENV} must be a JSON object with keys {', '.join(EXPECT_KEYS)}")
        from_env = parsed
    merged = {**from_env, **{k: v for k, v in expect.items() if v is not None}}
    root_s = root or env.get(ROOT_ENV) or None
    release = Path(__file__).resolve().parents[2]  # <release>/kernels/harness/health.py
    return HealthInputs(
        root=None if root_s is None else Path(root_s), expect=expectations_from(merged), release=release
    )


def _timed(name: str, fn: Callable[[], tuple[CheckStatus, str]]) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        status, detail = fn()
    except Exception as e:  # noqa: BLE001  (a health check reports, it does not raise)
        status, detail = F, f"{type(e).__name__}: {e}"
    return {
        "name": name,
        "status": status.value,
        "detail": detail,
        "seconds": round(time.perf_counter() - t0, 3),
    }


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def release_integrity(release: Path) -> tuple[CheckStatus, str]:
    """Every file of `release` (minus MANIFEST.json and verify/) against the MANIFEST: none missing, none
    extra, every sha256 equal. The same rule as the node module's check before activation."""
    manifest_path = release / MANIFEST
    if not manifest_path.is_file():
        return S, f"not running from a release ({release} has no {MANIFEST})"
    expected: dict[str, str] = json.loads(manifest_path.read_text())["files"]
    present = []
    for dirpath, dirnames, filenames in os.walk(release):
        rel_dir = os.path.relpath(dirpath, release)
        if rel_dir == ".":
            dirnames[:] = [d for d in dirnames if d != VERIFY_DIR]
        for name in filenames:
            rel = os.path.normpath(os.path.join(rel_dir, name))
            if rel != MANIFEST:
                present.append(rel)
    extra = sorted(set(present) - set(expected))
    missing = sorted(set(expected) - set(present))
    if extra:
        return F, f"file not in {MANIFEST}: {extra[0]} ({len(extra)} extra)"
    if missing:
        return F, f"file listed in {MANIFEST} is missing: {missing[0]} ({len(missing)} missing)"
    for rel in sorted(expected):
        if _sha256(release / rel) != expected[rel]:
            return F, f"sha256 mismatch for {rel}"
    version = json.loads(manifest_path.read_text()).get("version", "?")
    return P, f"{len(expected)} files of {version} match {MANIFEST}"


def current_valid(root: Path | None, release: Path) -> tuple[CheckStatus, str]:
    if root is None:
        return S, "no node root given (--root or SOLFLEET_ROOT)"
    link = root / "current"
    if not link.is_symlink():
        return F, f"{link} is {'not a link' if link.exists() else 'absent'}"
    target = Path(os.path.realpath(link))
    if not target.is_dir():
        return F, f"current -> {os.readlink(link)} dangles"
    version = target.name
    try:
        record = json.loads((target / VERIFY_DIR / "verify.json").read_text())
    except (OSError, ValueError) as e:
        return F, f"current -> {version} has no readable verify/verify.json ({type(e).__name__})"
    if record.get("ok") is not True:
        return F, f"current -> {version}: its verify record does not pass"
    if (target / VERIFY_DIR / "failed.json").exists():
        return F, f"current -> {version}: it failed after activation (verify/failed.json)"
    if (release / MANIFEST).is_file() and target != release:
        return F, f"current -> {version}, but health runs from {release}"
    return P, f"current -> releases/{version}, verified"


def _tiny_op() -> tuple[CheckStatus, str]:
    from kernels.ops.residual_add import residual_add

    rng = np.random.default_rng()
    x = rng.standard_normal((3, 37)).astype(np.float32)
    r = rng.standard_normal((3, 37)).astype(np.float32)
    out = np.full_like(x, np.nan)
    residual_add(x, r, out)
    ref = x.astype(np.float64) + r
    err = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
    ok = bool(np.isfinite(out).all() and err <= 1e-6)
    return (P if ok else F), f"residual_add 3x37 fp32 rel_err {err:.2e} (tol 1e-06)"


def _memory() -> tuple[CheckStatus, str]:
    if SIMULATED:
        return S, "skipped (simulated)"
    device.require_device()
    d = device.describe()
    free, total = d["memory_free_bytes"], d["memory_total_bytes"]
    return (P if free >= MIN_FREE_BYTES else F), f"{free / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB"


def run(inputs: HealthInputs | None = None) -> dict[str, Any]:
    """Every check; {"ok", "simulated", "checks": [{"name", "status", "detail", "seconds"}], "metrics"}.
    ok: no check failed (skipped is not failed, and never counts as passed either)."""
    inputs = inputs or inputs_from(root=None, expect={})
    state_dir = (inputs.root / "health") if inputs.root else Path(device.cache_dir()) / "health"
    t0 = time.perf_counter()
    try:
        gpu = [
            c.as_dict()
            for c in run_gpu_checks(expect=inputs.expect, state_dir=state_dir, simulated=SIMULATED)
        ]
    except Exception as e:  # noqa: BLE001
        gpu = [Check("gpu", F, f"GPU checks could not run: {type(e).__name__}: {e}").as_dict()]
    per = round((time.perf_counter() - t0) / max(len(gpu), 1), 3)
    checks = [{**c, "seconds": per} for c in gpu]
    checks.append(_timed("release.integrity", lambda: release_integrity(inputs.release)))
    checks.append(_timed("release.current", lambda: current_valid(inputs.root, inputs.release)))
    checks.append(_timed("kernel.tiny_op", _tiny_op))
    checks.append(_timed("gpu.memory", _memory))
    rep: dict[str, Any] = {
        "ok": all(c["status"] != F.value for c in checks),
        "simulated": SIMULATED,
        "checks": checks,
    }
    if inputs.root is not None:
        rep["metrics"] = write_node_metrics(root=inputs.root, checks=checks)
    return rep


# ---- metrics ---------------------------------------------------------------------------------------------


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def last_rollout_s(root: Path) -> float | None:
    """When the journal last recorded a switch of `current` (activated / rolled_back), as epoch seconds."""
    import datetime

    try:
        lines = (root / "journal.jsonl").read_text().splitlines()
    except OSError:
        return None
    for text in reversed(lines):
        try:
            line = json.loads(text)
        except ValueError:
            continue
        if isinstance(line, dict) and line.get("event") in ("activated", "rolled_back") and line.get("time"):
            when = datetime.datetime.strptime(str(line["time"]), "%Y-%m-%dT%H:%M:%SZ")
            return when.replace(tzinfo=datetime.timezone.utc).timestamp()  # noqa: UP017
    return None


def write_node_metrics(*, root: Path, checks: list[dict[str, Any]]) -> dict[str, Any]:
    """Rewrite `<root>/metrics/solfleet.prom` from this run's checks and what `current` holds on disk: its
    MANIFEST (version, stack id), verify/artifact.json (sha256), verify/verify.json and verify/bench.json."""
    try:
        from kernels.harness.metrics import NodeMetrics, ReleaseInfo, write_metrics

        cur = Path(os.path.realpath(root / "current")) if (root / "current").is_symlink() else None
        manifest = _read_json(cur / MANIFEST) if cur else None
        release = None
        if isinstance(manifest, dict):
            art = _read_json(cur / VERIFY_DIR / "artifact.json") if cur else None
            release = ReleaseInfo(
                version=str(manifest.get("version", cur.name if cur else "?")),
                sha256=str((art or {}).get("sha256", "")),
                stack_id=str(manifest.get("stack_id", "")),
            )
        path = write_metrics(
            root=root,
            metrics=NodeMetrics(
                release=release,
                simulated=SIMULATED,
                verify=_read_json(cur / VERIFY_DIR / "verify.json") if cur else None,
                bench=_read_json(cur / VERIFY_DIR / "bench.json") if cur else None,
                checks=[{"name": c["name"], "status": c["status"]} for c in checks],
                last_rollout_s=last_rollout_s(root),
            ),
        )
    except Exception as e:  # noqa: BLE001  (metrics are a report: they never make a node unhealthy)
        return {"written": False, "error": f"{type(e).__name__}: {e}"}
    return {"written": True, "path": str(path)}

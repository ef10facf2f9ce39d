"""Running `<solfleet_python> -m kernels verify|health --json` inside a release on a node.

Stdlib only. The release dir is both cwd and PYTHONPATH, so the node runs exactly the kernels it unpacked and
checked, never an installed copy. Bytecode and numba caches go outside the release (PYTHONDONTWRITEBYTECODE,
NUMBA_CACHE_DIR) so a verified release stays byte-identical to its MANIFEST.
"""

from __future__ import annotations

import json
import os
import subprocess

from ansible.module_utils.solfleet_layout import NodeError


class KernelsRun:
    """The outcome of one `python -m kernels <command> --json`: exit code, parsed JSON, one line of why."""

    def __init__(self, rc: int, data: dict | None, message: str) -> None:
        self.rc = rc
        self.data = data
        self.message = message

    @property
    def ok(self) -> bool:
        return self.rc == 0 and bool(self.data) and self.data.get("ok") is True


def kernels_env(release: str, cache_dir: str, simulated: bool) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = release
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["NUMBA_CACHE_DIR"] = cache_dir
    # Only a node declared simulated runs under the simulator; a real node must never fall back silently.
    if simulated:
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    else:
        env.pop("NUMBA_ENABLE_CUDASIM", None)
    return env


def run_kernels(
    *,
    python: str,
    release: str,
    command: str,
    args: list[str],
    cache_dir: str,
    simulated: bool,
    timeout_s: float,
    phase: str,
) -> KernelsRun:
    """Run one kernels command; a timeout or an unstartable interpreter raises NodeError(phase)."""
    argv = [python, "-m", "kernels", command, "--json", *args]
    try:
        proc = subprocess.run(
            argv,
            cwd=release,
            env=kernels_env(release, cache_dir, simulated),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise NodeError(
            phase, f"{phase}_failed", f"kernels {command} timed out after {timeout_s:g} s"
        ) from None
    except OSError as exc:
        raise NodeError(
            phase, f"{phase}_failed", f"cannot run {python} -m kernels {command}: {exc}"
        ) from None
    data: dict | None = None
    try:
        parsed = json.loads(proc.stdout)
        data = parsed if isinstance(parsed, dict) else None
    except ValueError:
        data = None
    if proc.returncode == 0 and data is not None and data.get("ok") is True:
        return KernelsRun(proc.returncode, data, "ok")
    stderr_tail = (proc.stderr.strip().splitlines() or [""])[-1]
    if data is None:
        why = f"no JSON on stdout (exit {proc.returncode}){': ' + stderr_tail if stderr_tail else ''}"
    else:
        why = f"exit {proc.returncode}, ok={data.get('ok')!r}"
    return KernelsRun(proc.returncode, data, f"kernels {command} failed: {why}")


def verify_summary(run: KernelsRun, simulated: bool) -> dict:
    """The contract's compact `verify` dict: ok, simulated, how many ops, which op/dtype/case failed."""
    results = (run.data or {}).get("results") or []
    results = [r for r in results if isinstance(r, dict)]
    failed = [f"{r.get('op')}/{r.get('dtype')}/{r.get('case')}" for r in results if r.get("ok") is not True]
    return {
        "ok": run.ok,
        "simulated": bool((run.data or {}).get("simulated", simulated)),
        "ops": len({r.get("op") for r in results}),
        "failed": failed,
    }

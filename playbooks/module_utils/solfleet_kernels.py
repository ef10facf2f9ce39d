"""Running `<solfleet_python> -m kernels verify|health --json` inside a release on a node.

Stdlib only. The release dir is both cwd and PYTHONPATH, so the node runs exactly the kernels it unpacked and
checked, never an installed copy. Bytecode and numba caches go outside the release (PYTHONDONTWRITEBYTECODE,
NUMBA_CACHE_DIR) so a verified release stays byte-identical to its MANIFEST.

One environment for everything that decides which packages load: `kernels_env` is built from an allowlist,
not from the inherited environment, and the stack check (solfleet_artifact.node_stack) runs in the very same
one. An inherited PYTHONPATH, PYTHONHOME, user site-packages, VIRTUAL_ENV or NUMBA_* setting can therefore
neither make the stack check pass nor change what verify and health import.
"""

from __future__ import annotations

import json
import os
import subprocess

from ansible.module_utils.solfleet_layout import NodeError

# Inherited as they are: they choose locale, temp dir, GPU visibility and where the CUDA driver's native
# libraries are found, not which Python packages load. Everything else is dropped.
INHERITED = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LANGUAGE",
    "TZ",
    "TMPDIR",
    "LD_LIBRARY_PATH",
    "CUDA_HOME",
    "CUDA_PATH",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
)
INHERITED_PREFIXES = ("LC_", "NVIDIA_")
FAILED_CASES_SHOWN = 3


class KernelsRun:
    """The outcome of one `python -m kernels <command> --json`: exit code, parsed JSON, one line of why."""

    def __init__(self, rc: int, data: dict | None, message: str) -> None:
        self.rc = rc
        self.data = data
        self.message = message

    @property
    def ok(self) -> bool:
        return self.rc == 0 and bool(self.data) and self.data.get("ok") is True


def read_node_config(path: str) -> dict:
    """`<root>/config.yaml` as provision writes it (JSON, which is YAML); {} when absent or unreadable."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def kernels_env(
    release: str | None,
    cache_dir: str,
    simulated: bool,
    *,
    config: str | None = None,
    base: dict[str, str] | None = None,
) -> dict[str, str]:
    """The clean, explicit environment of every `python -m kernels` run and of the stack check.

    release: put on PYTHONPATH (None: nothing is). config: path of <root>/config.yaml; its device_id picks
    the GPU (CUDA_VISIBLE_DEVICES) and the file is named in SOLFLEET_CONFIG for the kernels commands.
    base: the environment to filter (default os.environ; tests pass their own)."""
    inherited = os.environ if base is None else base
    env = {k: v for k, v in inherited.items() if k in INHERITED or k.startswith(INHERITED_PREFIXES)}
    env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    if release:
        env["PYTHONPATH"] = release
    env["PYTHONNOUSERSITE"] = "1"  # ~/.local/lib/pythonX.Y/site-packages would shadow the runtime's packages
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["NUMBA_CACHE_DIR"] = cache_dir
    # Only a node declared simulated runs under the simulator; a real node must never fall back silently.
    if simulated:
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    if config and os.path.isfile(config):
        env["SOLFLEET_CONFIG"] = config
        device_id = read_node_config(config).get("device_id")
        if isinstance(device_id, int) and not isinstance(device_id, bool) and not simulated:
            env["CUDA_VISIBLE_DEVICES"] = str(device_id)
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
    config: str | None = None,
    extra_env: dict | None = None,
) -> KernelsRun:
    """Run one kernels command; a timeout or an unstartable interpreter raises NodeError(phase).
    extra_env: set on top of the clean environment (health_env's variables)."""
    argv = [python, "-m", "kernels", command, "--json", *args]
    env = kernels_env(release, cache_dir, simulated, config=config)
    env.update(extra_env or {})
    try:
        proc = subprocess.run(
            argv,
            cwd=release,
            env=env,
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
    return KernelsRun(proc.returncode, data, f"kernels {command} failed: {failure_reason(proc, data)}")


HEALTH_PARAMS = ("gpu_count", "gpu_model", "gpu_cc", "stack_driver", "stack_cuda")


def health_env(root: str, params: dict) -> dict:
    """What `kernels health` reads from its environment: the node root (release.current, the Xid state, the
    metrics file) and the spec's expectations as JSON. Variables rather than flags, so a release built
    before the flags existed still runs its own health after a rollback to it."""
    expect = {
        "count": params.get("gpu_count") or "",
        "model": params.get("gpu_model") or "",
        "cc": params.get("gpu_cc") or "",
        "driver": params.get("stack_driver") or "",
        "cuda": params.get("stack_cuda") or "",
    }
    return {"SOLFLEET_ROOT": root, "SOLFLEET_HEALTH_EXPECT": json.dumps(expect, sort_keys=True)}


def _error_line(stderr: str) -> str:
    """The line of a traceback that says what went wrong (`AttributeError: ...`), else the last line."""
    lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
    for line in reversed(lines):
        head = line.split(":", 1)[0]
        if head.endswith(("Error", "Exception", "Exit", "Interrupt")) and " " not in head:
            return line[:300]
    return lines[-1][:300] if lines else ""


def failure_reason(proc: subprocess.CompletedProcess, data: dict | None) -> str:
    """Why a kernels command failed, for the operator: an import or compile error (from the traceback),
    no usable GPU (the report's `error`), or the first failing cases with their errors."""
    if data is None:
        err = _error_line(proc.stderr or "")
        return f"no JSON on stdout (exit {proc.returncode}){': ' + err if err else ''}"
    if data.get("error"):
        return f"{str(data['error']).splitlines()[0][:300]} (no case ran)"
    results = [r for r in data.get("results") or [] if isinstance(r, dict)]
    failed = [r for r in results if r.get("ok") is not True]
    if failed:
        shown = []
        for r in failed[:FAILED_CASES_SHOWN]:
            what = r.get("error") or (
                f"rel_err {r.get('rel_err')} > tol {r.get('tol')}"
                if r.get("rel_err") is not None
                else "failed"
            )
            shown.append(f"{r.get('op')}/{r.get('dtype')}/{r.get('case')}: {str(what).splitlines()[0][:160]}")
        more = f" (+{len(failed) - len(shown)} more)" if len(failed) > len(shown) else ""
        return f"{len(failed)} of {len(results)} case(s) failed: " + "; ".join(shown) + more
    checks = [
        c
        for c in data.get("checks") or []
        if isinstance(c, dict) and (c.get("ok") is False or c.get("status") == "failed")
    ]
    if checks:
        return "; ".join(
            f"{c.get('name')}: {c.get('detail') or c.get('reason') or 'failed'}"
            for c in checks[:FAILED_CASES_SHOWN]
        )
    err = _error_line(proc.stderr or "")
    return f"exit {proc.returncode}, ok={data.get('ok')!r}{': ' + err if err else ''}"


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

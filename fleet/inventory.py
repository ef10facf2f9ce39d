"""Render an ansible-runner private_data_dir from a FleetSpec: Jinja2 templates in inventory/templates,
StrictUndefined so a variable the template needs and the context lacks is an error, never an empty string.

`render_files` is pure (spec in, file texts out); `write_private_data_dir` puts them on disk."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from fleet.spec import Connection, FleetSpec, Node, project_root

TEMPLATES = {
    "inventory/hosts.yml": "hosts.yml.j2",
    "env/envvars": "envvars.j2",
    "env/settings": "settings.j2",
    "execution.yml": "execution.yml.j2",  # read by fleet/runner.py, not by ansible-runner
}
# OpenSSH control sockets live in a sockaddr_un (108 bytes incl. the ssh-appended temp suffix); Ansible names
# them <dir>/<10-hex hash>, so a longer dir falls back to a short per-run dir under the system temp dir.
_MAX_CONTROL_DIR = 70
CONTROL_PERSIST_S = 60


@dataclass(frozen=True)
class RenderedDir:
    path: Path
    files: Mapping[str, str]
    control_path_dir: Path


def _tojson(value: Any) -> str:
    """JSON is valid YAML, so every scalar is quoted safely. Jinja2's own `tojson` hands an Undefined to
    json.dumps (a TypeError that names nothing); fail the StrictUndefined way instead, naming the variable."""
    if isinstance(value, jinja2.Undefined):
        value._fail_with_undefined_error()
    return json.dumps(value)


def _unsafe(value: Any) -> str:
    """`!unsafe "..."`: Ansible never templates a value so tagged, so a spec string stays data even if it
    held a Jinja2 opener (the spec loader refuses those too: this is the second wall). Lists tag each item."""
    if isinstance(value, jinja2.Undefined):
        value._fail_with_undefined_error()
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_unsafe(item) for item in value) + "]"
    if not isinstance(value, str):
        raise TypeError(f"unsafe: expected a string or a list of strings, got {type(value).__name__}")
    return "!unsafe " + json.dumps(value)


def template_env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(project_root() / "inventory" / "templates")),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,  # YAML, not HTML; values go through `tojson`
    )
    env.filters["tojson"] = _tojson
    env.filters["unsafe"] = _unsafe
    return env


def control_path_dir(run_dir: Path) -> Path:
    preferred = run_dir / "cp"
    if len(str(preferred)) <= _MAX_CONTROL_DIR:
        return preferred
    digest = hashlib.sha256(str(run_dir).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"solfleet-cp-{digest}"


def _ssh_common_args(node: Node) -> str:
    """Host-key checking first (ssh keeps the first value of an option, so nothing later can turn it off).
    The known_hosts path is quoted twice: for ssh's own option parser (which splits a value on blanks into
    several files) and for Ansible, which splits ssh_common_args with shlex. The spec loader refuses `"` in
    controller paths, so the inner quotes cannot be closed early."""
    args = ["-o", "StrictHostKeyChecking=yes"]
    if node.ssh.known_hosts_file:
        args += ["-o", shlex.quote(f'UserKnownHostsFile="{node.ssh.known_hosts_file}"')]
    return " ".join(args)


def _node_context(node: Node) -> dict[str, Any]:
    return {
        "name": node.name,
        "host": node.host,
        "port": node.port,
        "user": node.user,
        "connection": node.connection.value,
        "python": node.python,
        "private_key_file": node.ssh.private_key_file,
        "ssh_common_args": _ssh_common_args(node) if node.connection is Connection.SSH else "",
        "root": str(node.root),
        "simulated": node.simulated,
        # the contract: "" when the node is simulated or declares no GPU, so the node skips the cc check
        "gpu_cc": "" if node.simulated or node.gpu is None or node.gpu.cc is None else node.gpu.cc,
        "labels": list(node.labels),
        # health expectations (docs/health.md): "" = not set in the spec, its check is skipped
        "gpu_count": "" if node.gpu is None else str(node.gpu.count),
        "gpu_model": "" if node.gpu is None or node.gpu.model == "unknown" else node.gpu.model,
        # the operator service (docs/service.md); gpus [] = none on this node
        "serve_gpus": list(node.service.gpus),
        "serve_manager": node.service.manager.value,
        "serve_port": node.service.port,
        "serve_ready_timeout_s": node.service.ready_timeout_s,
        "serve_exit_timeout_s": node.service.exit_timeout_s,
    }


def context(spec: FleetSpec, *, run_dir: Path) -> dict[str, Any]:
    playbooks = project_root() / "playbooks"
    labels: dict[str, list[str]] = {}
    for node in spec.nodes:
        for label in node.labels:
            labels.setdefault(label, []).append(node.name)
    return {
        "fleet": spec.name,
        "spec_source": str(spec.source),
        "stack_id": spec.stack_id,
        # what health checks the driver against ("" = the stack pins none)
        "stack_driver": str(spec.stack.get("driver", "")),
        "stack_cuda": str(spec.stack.get("cuda", "")),
        "nodes": [_node_context(n) for n in spec.nodes],
        "label_groups": dict(sorted(labels.items())),
        "control_persist_s": CONTROL_PERSIST_S,
        "control_path_dir": str(control_path_dir(run_dir)),
        "connect_timeout_s": spec.timeouts.connect_s,
        "task_timeout_s": spec.timeouts.task_s,
        "forks": max(1, min(64, len(spec.nodes))),
        "local_temp": str(run_dir / "tmp"),
        "roles_path": str(playbooks / "roles"),
        "library_path": str(playbooks / "library"),
        "module_utils_path": str(playbooks / "module_utils"),
        "action_plugins_path": str(playbooks / "action_plugins"),
        "job_timeout_s": spec.timeouts.run_s,
        # idle = no output at all; the slowest single task (verify) prints nothing until it ends
        "idle_timeout_s": spec.timeouts.task_s + 60,
        "execution_mode": spec.execution.mode.value,
    }


def render_files(spec: FleetSpec, *, run_dir: Path, env: jinja2.Environment | None = None) -> dict[str, str]:
    """Pure: the text of every rendered file, keyed by its path inside the private_data_dir."""
    env = env or template_env()
    ctx = context(spec, run_dir=run_dir)
    return {rel: env.get_template(name).render(ctx) for rel, name in TEMPLATES.items()}


def write_private_data_dir(spec: FleetSpec, out: Path) -> RenderedDir:
    """Write inventory/, env/ and a `project` link to playbooks/ under `out` (created if missing)."""
    out = out.resolve()
    files = render_files(spec, run_dir=out)
    for rel, text in files.items():
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(target.suffix + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, target)
    project = out / "project"
    if project.is_symlink() or project.exists():
        project.unlink()
    project.symlink_to(project_root() / "playbooks", target_is_directory=True)
    cp = control_path_dir(out)
    cp.mkdir(parents=True, exist_ok=True, mode=0o700)
    (out / "tmp").mkdir(exist_ok=True)
    return RenderedDir(path=out, files=files, control_path_dir=cp)

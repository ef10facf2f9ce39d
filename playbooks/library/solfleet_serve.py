#!/usr/bin/python
"""solfleet_serve: put the operator service (docs/service.md) of a node on its `current` release, and make its
readiness part of the deploy: a GPU whose new instance does not become ready fails the host.

Zero downtime comes from the service itself: a new instance binds the same port (SO_REUSEPORT), self-tests
the release on its GPU, listens, records itself in `serve-<gpu>.json` and tells the instance that file named
to drain. This module starts the new instances (mode=start) or waits for the ones systemd started
(mode=wait), then checks each over HTTP and waits for the replaced one to exit.

Stdlib only: it runs under the node's Python through Ansible's module packaging.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.solfleet_kernels import kernels_env, read_node_config
from ansible.module_utils.solfleet_layout import NodeError, NodeLayout, NodeLock

DOCUMENTATION = r"""
module: solfleet_serve
short_description: Start (or wait for) the operator service on a node's current release, one instance per GPU
description:
  - >-
    I(mode=start), the supervisor for nodes without systemd: for each GPU in I(gpus) whose state file does not
    already name a ready instance of C(current)'s version, start C(python -m kernels.serve) detached (its own
    session, stdin closed, output appended to C(<root>/logs/serve-<gpu>.log)) with PYTHONPATH = the resolved
    C(current), under C(<root>/.lock). Instances of GPUs not in I(gpus) are told to drain.
  - >-
    I(mode=wait), with systemd (the units were just started): wait for each GPU's state file to name a ready
    instance of C(current)'s version.
  - >-
    Then, both modes: C(/v2/health/ready) answers 200; the replaced instance exits (drained by the handoff;
    killed past I(exit_timeout_s) + 10 s); C(/v2) names C(current)'s version.
  - >-
    A GPU that is not ready within I(ready_timeout_s) (or whose new instance exits first) fails the task
    with the instance's exit status and its last log lines; the new instance is stopped and the old one,
    never signalled, keeps serving. The result key C(solfleet) carries C(phases.service) and C(service).
options:
  mode: {description: "start (no systemd) or wait (systemd started the units)", type: str,
         choices: [start, wait], default: start}
  root: {description: "absolute node root", type: path, required: true}
  node: {description: "node name for messages", type: str, required: true}
  python: {description: "interpreter that runs python -m kernels.serve", type: str, required: true}
  simulated: {description: "run under the CUDA simulator", type: bool, default: false}
  gpus: {description: "GPU indexes that get an instance", type: list, elements: int, required: true}
  port: {description: "base port: GPU i listens on port + i", type: int, default: 8000}
  exit_timeout_s: {description: "longest drain of a replaced instance", type: int, default: 30}
  ready_timeout_s: {description: "longest wait for a new instance to be ready", type: int, default: 300}
  lock_timeout_s: {description: "wait for the node lock (mode=start)", type: int, default: 60}
"""

EXIT_MEANING = {2: "bad configuration", 3: "self-test failed", 4: "port could not be bound"}
LOG_MAX_BYTES = 10 * 1024 * 1024  # one rotation at start: the process-mode log never grows without bound
LOG_LINES_SHOWN = 3
POLL_S = 0.2
START_MARKER = "--- solfleet_serve: starting "


class Instance:
    """One GPU's instance: the one found in the state file before (old) and the one this run wants (new)."""

    def __init__(self, gpu: int, port: int, state_path: str, log_path: str) -> None:
        self.gpu = gpu
        self.port = port
        self.state_path = state_path
        self.log_path = log_path
        self.old: dict[str, Any] | None = None
        self.proc: subprocess.Popen | None = None
        self.pid: int | None = None
        self.started = False
        self.old_exit = "none"

    def report(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu,
            "port": self.port,
            "pid": self.pid,
            "started": self.started,
            "replaced": None
            if not self.old or self.old.get("pid") == self.pid
            else {"pid": self.old.get("pid"), "version": self.old.get("version"), "exit": self.old_exit},
        }


def read_state(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_instance(pid: object) -> bool:
    """A live service process (a recycled pid of anything else is never signalled)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmd = fh.read().split(b"\0")
        with open(f"/proc/{pid}/stat", "rb") as fh:
            zombie = fh.read().rsplit(b")", 1)[-1].split()[0] == b"Z"
    except (OSError, IndexError):
        return False
    return b"kernels.serve" in cmd and not zombie


def http_get(host: str, port: int, path: str, timeout_s: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=timeout_s) as r:  # noqa: S310
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (OSError, ValueError) as exc:
        return 0, str(exc).encode()


def log_tail(path: str) -> str:
    """The last lines this run's instance logged (after its start marker), errors first."""
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, os.path.getsize(path) - 16384))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [ln.strip() for ln in text.split(START_MARKER)[-1].splitlines()[1:] if ln.strip()]
    errors = [ln for ln in lines if " ERROR " in ln or "Error" in ln]
    return " | ".join((errors or lines)[-LOG_LINES_SHOWN:])


class Service:
    def __init__(self, module: AnsibleModule) -> None:
        p = module.params
        self.p = p
        self.layout = NodeLayout(p["root"], p["node"], p["simulated"])
        self.changed = False
        self.version = self.layout.link_version("current")
        if self.version is None:
            raise NodeError("service", "failed", f"{self.layout.link_path('current')} names no release")
        self.release = os.path.realpath(self.layout.link_path("current"))
        self.config = self.layout.config_path if os.path.isfile(self.layout.config_path) else None
        cfg = read_node_config(self.config) if self.config else {}
        svc = cfg.get("service") if isinstance(cfg.get("service"), dict) else {}
        host = str(svc.get("host") or "127.0.0.1")
        # a wildcard bind answers on loopback; the checks run on the node itself
        self.host = {"0.0.0.0": "127.0.0.1", "::": "[::1]"}.get(host, f"[{host}]" if ":" in host else host)
        self.handoff = svc.get("handoff", True) is not False
        state_dir = str(svc.get("state_dir") or os.path.join(self.layout.root, "run"))
        self.state_dir = state_dir if os.path.isabs(state_dir) else os.path.join(self.layout.root, state_dir)
        self.logs = os.path.join(self.layout.root, "logs")
        self.instances = [
            Instance(
                g,
                p["port"] + g,
                os.path.join(self.state_dir, f"serve-{g}.json"),
                os.path.join(self.logs, f"serve-{g}.log"),
            )
            for g in p["gpus"]
        ]

    def fail(self, inst: Instance, why: str) -> NodeError:
        return NodeError("service", "failed", f"GPU {inst.gpu} (port {inst.port}): {why}")

    # -- mode=start ------------------------------------------------------------------------------------------
    def ready_now(self, inst: Instance) -> bool:
        """The GPU already serves this version: a second run changes nothing."""
        st = inst.old
        return bool(
            st
            and st.get("version") == self.version
            and st.get("state") == "ready"
            and is_instance(st.get("pid"))
            and http_get(self.host, inst.port, "/v2/health/ready")[0] == 200
        )

    def spawn(self, inst: Instance) -> None:
        os.makedirs(self.logs, mode=0o755, exist_ok=True)
        with contextlib.suppress(OSError):
            if os.path.getsize(inst.log_path) > LOG_MAX_BYTES:
                os.replace(inst.log_path, inst.log_path + ".1")
        argv = [self.p["python"], "-m", "kernels.serve", "--device-id", str(inst.gpu)]
        argv += ["--port", str(self.p["port"]), "--exit-timeout-s", str(self.p["exit_timeout_s"])]
        if self.config:
            argv += ["--config", self.config]
        env = kernels_env(self.release, self.layout.cache, self.p["simulated"], config=self.config)
        # the service binds its own GPU (service.bind); a device_id picked for verify must not hide it
        env.pop("CUDA_VISIBLE_DEVICES", None)
        if "CUDA_VISIBLE_DEVICES" in os.environ:
            env["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]
        env["PYTHONUNBUFFERED"] = "1"
        # meant to outlive this run: the controller's reaper (fleet/runner.py) never sweeps such a process
        env["SOLFLEET_DETACHED"] = "1"
        with open(inst.log_path, "ab") as log:
            log.write(f"{START_MARKER}{self.version} on GPU {inst.gpu}\n".encode())
            log.flush()
            # its own session: neither the end of this SSH session nor a signal to this module's process
            # group reaches it. cwd = root: with no config.yaml the state file still lands in <root>/run.
            inst.proc = subprocess.Popen(  # noqa: S603
                argv,
                cwd=self.layout.root,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        inst.pid = inst.proc.pid
        inst.started = True
        self.changed = True

    def stop_unlisted(self) -> list[int]:
        """Instances of GPUs no longer in `gpus`: drain them (SIGTERM once)."""
        wanted = {i.gpu for i in self.instances}
        stopped: list[int] = []
        with contextlib.suppress(OSError):
            for name in sorted(os.listdir(self.state_dir)):
                if not (name.startswith("serve-") and name.endswith(".json")):
                    continue
                st = read_state(os.path.join(self.state_dir, name))
                gpu = (st or {}).get("device_id")
                if st and gpu not in wanted and is_instance(st.get("pid")):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(st["pid"], signal.SIGTERM)
                    stopped.append(int(gpu) if isinstance(gpu, int) else -1)
                    self.changed = True
        return stopped

    def kill_new(self) -> None:
        for inst in self.instances:
            if inst.proc is not None and inst.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    inst.proc.terminate()
        deadline = time.monotonic() + 10
        for inst in self.instances:
            if inst.proc is not None:
                try:
                    inst.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    inst.proc.kill()
                    inst.proc.wait()

    # -- both modes ------------------------------------------------------------------------------------------
    def wait_ready(self, pending: list[Instance]) -> None:
        deadline = time.monotonic() + self.p["ready_timeout_s"]
        while pending:
            for inst in list(pending):
                st = read_state(inst.state_path) or {}
                if inst.proc is not None and inst.proc.poll() is not None:
                    rc = inst.proc.returncode
                    why = EXIT_MEANING.get(rc, "exited")
                    raise self.fail(
                        inst, f"{self.version} exited {rc} ({why}) before ready: {log_tail(inst.log_path)}"
                    )
                mine = inst.proc is None or st.get("pid") == inst.proc.pid
                if mine and st.get("state") == "ready" and st.get("version") == self.version:
                    if inst.proc is None and not is_instance(st.get("pid")):
                        continue  # systemd: a stale file of an exited instance; the unit may still start
                    inst.pid = int(st["pid"])
                    pending.remove(inst)
            if pending and time.monotonic() > deadline:
                inst = pending[0]
                where = (
                    inst.log_path if inst.proc is not None else f"journalctl -u 'solfleet-serve@{inst.gpu}-*'"
                )
                raise self.fail(
                    inst,
                    f"{self.version} not ready after {self.p['ready_timeout_s']} s (see {where})"
                    + (f": {log_tail(inst.log_path)}" if inst.proc is not None else ""),
                )
            if pending:
                time.sleep(POLL_S)

    def check(self, inst: Instance) -> None:
        status, body = http_get(self.host, inst.port, "/v2/health/ready")
        if status != 200:
            raise self.fail(inst, f"/v2/health/ready answered {status or 'nothing'}: {body[:200]!r}")
        old_pid = (inst.old or {}).get("pid")
        if old_pid != inst.pid and is_instance(old_pid):
            if not self.handoff:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(old_pid, signal.SIGTERM)
            deadline = time.monotonic() + self.p["exit_timeout_s"] + 10
            while is_instance(old_pid) and time.monotonic() < deadline:
                time.sleep(POLL_S)
            if is_instance(old_pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(old_pid, signal.SIGKILL)
                inst.old_exit = "killed"
            else:
                inst.old_exit = "drained"
        elif inst.old and old_pid != inst.pid:
            inst.old_exit = "gone"
        # the old one no longer listens: this answer comes from the instance just started
        deadline = time.monotonic() + 10
        while True:
            status, body = http_get(self.host, inst.port, "/v2")
            try:
                served = json.loads(body).get("version") if status == 200 else None
            except ValueError:
                served = None
            if served == self.version:
                return
            if time.monotonic() > deadline:
                raise self.fail(
                    inst, f"/v2 names version {served!r} (status {status}), expected {self.version}"
                )
            time.sleep(POLL_S)

    def run(self) -> dict[str, Any]:
        t0 = time.monotonic()
        for inst in self.instances:
            inst.old = read_state(inst.state_path)
        stopped: list[int] = []
        if self.p["mode"] == "start":
            with NodeLock(self.layout, self.p["lock_timeout_s"]):
                todo = [i for i in self.instances if not self.ready_now(i)]
                for inst in self.instances:
                    if inst not in todo:
                        inst.pid = int((inst.old or {})["pid"])
                try:
                    for inst in todo:
                        self.spawn(inst)
                    self.wait_ready(list(todo))
                except NodeError:
                    self.kill_new()  # not ready: the old instance was never signalled and keeps serving
                    raise
                for inst in todo:
                    self.check(inst)
                stopped = self.stop_unlisted()
        else:
            self.wait_ready(list(self.instances))
            for inst in self.instances:
                self.check(inst)
        return {
            "version": self.version,
            "mode": self.p["mode"],
            "instances": [i.report() for i in self.instances],
            "stopped_gpus": stopped,
            "seconds": round(time.monotonic() - t0, 3),
        }


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "mode": {"type": "str", "choices": ["start", "wait"], "default": "start"},
            "root": {"type": "path", "required": True},
            "node": {"type": "str", "required": True},
            "python": {"type": "str", "required": True},
            "simulated": {"type": "bool", "default": False},
            "gpus": {"type": "list", "elements": "int", "required": True},
            "port": {"type": "int", "default": 8000},
            "exit_timeout_s": {"type": "int", "default": 30},
            "ready_timeout_s": {"type": "int", "default": 300},
            "lock_timeout_s": {"type": "int", "default": 60},
        },
        supports_check_mode=False,
    )
    p = module.params
    t0 = time.monotonic()
    try:
        result = Service(module).run()
    except NodeError as exc:
        message = f"service: {exc.message}"
        module.fail_json(
            msg=f"solfleet: {p['node']}: {message}",
            solfleet={
                "failed_phase": "service",
                "message": message,
                "phases": {"service": round(time.monotonic() - t0, 3)},
            },
        )
    changed = any(i["started"] for i in result["instances"]) or bool(result["stopped_gpus"])
    module.exit_json(
        changed=changed,
        msg=f"solfleet: {p['node']}: service {result['version']} ready on GPU(s) {p['gpus']}",
        solfleet={"phases": {"service": result["seconds"]}, "service": result},
    )


if __name__ == "__main__":
    main()

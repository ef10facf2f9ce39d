"""An instance's life: bind the port, self-test, listen and report ready, hand off, drain on SIGTERM, exit.

Zero-downtime handoff, with or without systemd: every instance binds its port with SO_REUSEPORT, so a new
one (a new release) binds while the old one still serves. The new one listens only once its self-test has
passed; it then records itself in the state file `serve-<device>.json` and sends SIGTERM to the instance the
file named. The old one drains: it closes its listening socket (the kernel sends every new connection to
the new instance), serves whatever arrives on connections it already holds, answering each with
`Connection: close` so keep-alive clients reconnect to the new one, waits for its in-flight and queued
requests, and exits 0. Past `exit_timeout_s` it exits 1, leaving what remains.
"""

from __future__ import annotations

import contextlib
import json
import logging
import logging.handlers
import os
import signal
import socket
import struct
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn

from kernels.serve.app import Service, State
from kernels.serve.config import Config

log = logging.getLogger("solfleet.serve")
EXIT_DRAINED, EXIT_CUT, EXIT_CONFIG, EXIT_SELF_TEST, EXIT_BIND = 0, 1, 2, 3, 4
# Linux drops (resets) the connections waiting in a listening socket's accept queue when it is closed, even
# with another SO_REUSEPORT listener on the port. So a successor first steers every new connection to itself
# (a one-instruction classic BPF program on the port's reuseport group), and the instance it replaces keeps
# accepting for LISTEN_GRACE_S, long enough to take what was already queued for it, before it closes.
SO_ATTACH_REUSEPORT_CBPF = 51
LISTEN_GRACE_S = 0.5


def setup_logging(cfg: Config) -> None:
    lc = cfg.service.log
    handler: logging.Handler
    if lc.target == "file":
        Path(lc.file).parent.mkdir(parents=True, exist_ok=True)
        handler = logging.handlers.RotatingFileHandler(lc.file, maxBytes=lc.max_bytes, backupCount=lc.backups)
        fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    elif lc.target == "journald":
        # journald stamps and levels each stdout/stderr line itself; the <N> prefix is sd-daemon's priority
        handler = logging.StreamHandler(sys.stderr)
        fmt = "%(sd_priority)s%(name)s: %(message)s"
        handler.addFilter(_SdPriority())
    else:
        handler = logging.StreamHandler(sys.stderr)
        fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    handler.setFormatter(logging.Formatter(fmt))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(cfg.log_level.upper())


class _SdPriority(logging.Filter):
    _MAP = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}

    def filter(self, record: logging.LogRecord) -> bool:
        record.sd_priority = f"<{self._MAP.get(record.levelno, 6)}>"
        return True


def bind_socket(host: str, port: int) -> socket.socket:
    """Bound, not listening: no connection is queued here before the instance is ready."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.set_inheritable(False)
    return sock


# --- the state file -----------------------------------------------------------------------------------------


def read_state(path: Path) -> dict[str, Any] | None:
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


def write_state(path: Path, state: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(state, sort_keys=True) + "\n")
    os.replace(tmp, path)


def is_instance(pid: int) -> bool:
    """A live process that is a service instance (a recycled pid of anything else is never signalled)."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"kernels.serve" in cmd


# --- the server ---------------------------------------------------------------------------------------------


class Server(uvicorn.Server):
    """uvicorn, with SIGTERM meaning "drain" (see the module docstring) rather than "close everything"."""

    def __init__(self, config: uvicorn.Config, svc: Service) -> None:
        super().__init__(config)
        self.svc = svc
        self.drain_at: float | None = None
        self.idle_since: float | None = None
        self.exit_code = EXIT_DRAINED
        self.successor = False
        self._textfile_at = 0.0

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # not recorded in _captured_signals: uvicorn would re-raise it at exit, and the exit status must be 0
        if self.drain_at is None:
            self.drain_at = time.monotonic()
            # a successor (the state file names another live instance) steers new connections away from
            # this one: keep accepting for LISTEN_GRACE_S so none queued here is reset
            st = read_state(self.svc.cfg.state_file) or {}
            pid = st.get("pid")
            self.successor = isinstance(pid, int) and pid != os.getpid() and is_instance(pid)
            self.svc.set_state(State.DRAINING, f"signal {signal.Signals(sig).name}")
            log.info(
                "%s: draining (exit timeout %.1f s)",
                signal.Signals(sig).name,
                self.svc.cfg.service.exit_timeout_s,
            )
        else:  # a second signal: stop now
            self.exit_code = EXIT_CUT
            self.should_exit = True
            self.force_exit = True

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.should_exit:
            return
        self.svc.set_state(State.READY)
        log.info(
            "ready: %s on %s:%d (pid %d)",
            self.svc.release.version,
            self.svc.cfg.service.host,
            self.svc.cfg.listen_port,
            os.getpid(),
        )
        sock = sockets[0] if sockets else None
        take_over(self.svc.cfg, self.svc, sock)

    async def on_tick(self, counter: int) -> bool:
        stop = await super().on_tick(counter)
        svc = self.svc
        tf = svc.cfg.service.textfile
        if tf and time.monotonic() - self._textfile_at > 15:
            self._textfile_at = time.monotonic()
            with contextlib.suppress(OSError):
                svc.metrics.write_textfile(tf)
        if self.drain_at is None:
            return stop
        now = time.monotonic()
        if self.successor and now - self.drain_at <= LISTEN_GRACE_S:
            return stop  # still accepting (and serving) what was queued here before the steering
        for server in self.servers:  # stop accepting; idempotent
            server.close()
        busy = svc.admission.running + svc.admission.queued
        if busy == 0:
            self.idle_since = self.idle_since or now
            # idle keep-alive connections get idle_grace_ms to send one last request (answered, then closed)
            if (
                not self.server_state.connections
                or now - self.idle_since > svc.cfg.service.idle_grace_ms / 1e3
            ):
                self.should_exit = True
        else:
            self.idle_since = None
        if not self.should_exit and now - self.drain_at > svc.cfg.service.exit_timeout_s:
            log.warning(
                "exit timeout: leaving %d computing and %d queued",
                svc.admission.running,
                svc.admission.queued,
            )
            self.exit_code = EXIT_CUT
            self.should_exit = True
        return self.should_exit


def steer_to_newest(sock: socket.socket) -> bool:
    """Send every new connection on this port to the newest listener. Sockets join the reuseport group in
    listen() order, so with the predecessor at index 0 this one is 1; once the predecessor has closed, index
    1 no longer exists and the kernel falls back to its hash over the one that is left."""
    import ctypes

    insn = ctypes.create_string_buffer(struct.pack("=HBBI", 0x06, 0, 0, 1))  # BPF_RET|BPF_K 1
    prog = struct.pack("HxxxxxxP", 1, ctypes.addressof(insn))  # struct sock_fprog {len, *filter}
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, prog)
    except OSError as e:
        log.warning("cannot steer new connections to this instance (%s): the handoff may reset a few", e)
        return False
    return True


def take_over(cfg: Config, svc: Service, sock: socket.socket | None = None) -> None:
    """Record this instance as the device's, and tell the one it replaces to drain."""
    path = cfg.state_file
    old = read_state(path)
    me = {
        "pid": os.getpid(),
        "version": svc.release.version,
        "port": cfg.listen_port,
        "device_id": cfg.device_id,
        "state": "ready",
        "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_state(path, me)
    if not cfg.service.handoff or old is None:
        return
    pid = old.get("pid")
    if isinstance(pid, int) and pid != os.getpid() and is_instance(pid):
        if sock is not None:
            steer_to_newest(sock)
        log.info("handoff: %s (pid %d) drains now", old.get("version"), pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)


def release_state(cfg: Config) -> None:
    """On exit: drop the state file if it still names this process (a successor has overwritten it)."""
    d = read_state(cfg.state_file)
    if d is not None and d.get("pid") == os.getpid():
        with contextlib.suppress(OSError):
            cfg.state_file.unlink()


def serve(svc: Service, sock: socket.socket) -> int:
    """Run until drained; the process exit status."""
    from kernels.serve.app import build

    cfg = svc.cfg
    try:
        import httptools  # noqa: F401

        http = "httptools"
    except ImportError:
        http = "h11"
    try:
        import uvloop  # noqa: F401

        loop = "uvloop"
    except ImportError:
        loop = "asyncio"
    ucfg = uvicorn.Config(
        build(svc),
        http=http,
        loop=loop,
        lifespan="off",
        access_log=False,
        log_config=None,
        timeout_keep_alive=int(cfg.service.keep_alive_s),
        backlog=2048,
        timeout_graceful_shutdown=max(1, int(cfg.service.exit_timeout_s)),
    )
    server = Server(ucfg, svc)
    try:
        server.run(sockets=[sock])
    finally:
        release_state(cfg)
        svc.engine.pool.shutdown(wait=False, cancel_futures=True)
    log.info("exit %d", server.exit_code)
    return server.exit_code

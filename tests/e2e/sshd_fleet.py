"""A real SSH test fleet on loopback: N `sshd` processes on 127.0.0.1, each with its own port, host key and
config, one client key authorised on all of them, and a known_hosts file, so Ansible connects exactly as it
would to bare-metal nodes (host-key checking on, key auth only).

Used by the e2e fixture (tests/e2e/conftest.py) and by benchmarks/deploy_bench.py. Facts it relies on
(../shared/FACTS.md): `UsePAM no`, key auth, and an ABSOLUTE `-f` path (a relative one resets every
connection).
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from loopback import free_port

SSHD = Path("/usr/sbin/sshd")
SSH_KEYGEN = "ssh-keygen"


class SshdUnavailable(RuntimeError):
    """sshd or ssh-keygen is not installed here; the e2e suite skips (or fails under CI)."""


def sshd_missing_reason() -> str | None:
    if not SSHD.exists():
        return f"{SSHD} is missing (install openssh-server: apt-get install -y openssh-server)"
    if shutil.which(SSH_KEYGEN) is None:
        return "ssh-keygen is missing (install openssh-client)"
    if os.geteuid() != 0 and not Path("/run/sshd").is_dir():
        return "sshd needs its privilege-separation dir /run/sshd (create it as root: mkdir -p /run/sshd)"
    return None


class _PortTaken(RuntimeError):
    """sshd could not bind its port: something took it after `_free_port` checked it."""

    def __init__(self, node: SshdNode, log: str) -> None:
        super().__init__(f"sshd for {node.name} could not bind port {node.port}: {log[-300:]}")
        self.node = node


def _keygen(path: Path, comment: str) -> str:
    subprocess.run(
        [SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
    )
    return path.with_suffix(".pub").read_text().strip()


@dataclass
class SshdNode:
    """One node: its sshd (port, config, process) and the solfleet root it will be given in the spec."""

    name: str
    port: int
    home: Path
    root: Path
    host_pub: str = ""
    proc: subprocess.Popen[bytes] | None = None
    log_offset: int = 0  # where this spawn's lines start in sshd.log (the log is kept across spawns)

    @property
    def config(self) -> Path:
        return self.home / "sshd_config"

    @property
    def pid_file(self) -> Path:
        return self.home / "sshd.pid"

    def owns_port(self) -> bool:
        """This spawn's sshd is up and listening: it writes its PidFile after binding, so another process
        answering on the port (a sshd that took it first) is not mistaken for it."""
        if not self.running or self.proc is None:
            return False
        try:
            return int(self.pid_file.read_text().split()[0]) == self.proc.pid
        except (OSError, ValueError, IndexError):
            return False

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class SshdFleet:
    """N sshd nodes under `workdir`; start() them, write_spec() a fleet spec for them, stop() at the end."""

    workdir: Path
    count: int = 3
    user: str = field(default_factory=getpass.getuser)
    python: str = sys.executable
    nodes: list[SshdNode] = field(default_factory=list)

    @property
    def client_key(self) -> Path:
        return self.workdir / "client_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.workdir / "known_hosts"

    @property
    def authorized_keys(self) -> Path:
        return self.workdir / "authorized_keys"

    # -- lifecycle -----------------------------------------------------------------------------------------
    def start(self, timeout_s: float = 20.0) -> SshdFleet:
        reason = sshd_missing_reason()
        if reason:
            raise SshdUnavailable(reason)
        self.workdir.mkdir(parents=True, exist_ok=True)
        # sshd refuses to start without its privilege-separation directory (root only; Debian creates it
        # from the systemd unit, which never ran in a container).
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        client_pub = _keygen(self.client_key, "solfleet-e2e-client")
        self.authorized_keys.write_text(client_pub + "\n")
        self.authorized_keys.chmod(0o600)
        for i in range(self.count):
            name = f"node{i + 1:02d}"
            home = self.workdir / "sshd" / name
            home.mkdir(parents=True)
            node = SshdNode(name=name, port=free_port(), home=home, root=self.workdir / "roots" / name)
            node.host_pub = _keygen(home / "ssh_host_ed25519_key", name)
            self._write_config(node)
            self.nodes.append(node)
        try:
            for node in self.nodes:
                self._spawn(node)
            for attempt in range(5):
                try:
                    self._wait_ready(timeout_s)
                    break
                except _PortTaken as taken:
                    if attempt == 4:
                        raise
                    taken.node.port = free_port()
                    self._write_config(taken.node)
                    self._spawn(taken.node)
        except BaseException:
            self.stop()  # a fleet that did not start leaves no sshd behind
            raise
        self._write_known_hosts()
        return self

    def _write_config(self, node: SshdNode) -> None:
        node.config.write_text(
            "\n".join(
                [
                    f"Port {node.port}",
                    "ListenAddress 127.0.0.1",
                    f"HostKey {node.home / 'ssh_host_ed25519_key'}",
                    f"PidFile {node.pid_file}",
                    f"AuthorizedKeysFile {self.authorized_keys}",
                    f"AllowUsers {self.user}",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "PermitRootLogin prohibit-password",
                    # the key files live under pytest's tmp dir, whose parents sshd would judge too open
                    "StrictModes no",
                    "Subsystem sftp internal-sftp",
                    # ControlPersist multiplexes every task of a run over one connection per host
                    "MaxSessions 64",
                    "MaxStartups 64:30:128",
                    "LogLevel ERROR",
                    # A node's HOME is its own dir, not the controller user's: the login shell must not run
                    # this machine's dotfiles (here ~/.bashrc runs `pyenv init`, ~0.3 s per SSH command and
                    # a different python on PATH), and caches under ~/.cache stay per node, as on real nodes.
                    f"SetEnv HOME={node.home}",
                    "",
                ]
            )
        )

    def _spawn(self, node: SshdNode) -> None:
        node.pid_file.unlink(missing_ok=True)
        log = open(node.home / "sshd.log", "ab")  # noqa: SIM115  (owned by the child for its lifetime)
        node.log_offset = log.tell()
        # -D: stay in the foreground so we own the process; -e: log to the file above.
        node.proc = subprocess.Popen(
            [str(SSHD), "-D", "-e", "-f", str(node.config.resolve())],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()

    def _write_known_hosts(self) -> None:
        lines = []
        for node in self.nodes:
            key_type, key = node.host_pub.split()[:2]
            lines.append(f"[127.0.0.1]:{node.port} {key_type} {key}")
        self.known_hosts.write_text("\n".join(lines) + "\n")

    def _wait_ready(self, timeout_s: float, nodes: list[SshdNode] | None = None) -> None:
        deadline = time.monotonic() + timeout_s
        pending = list(self.nodes if nodes is None else nodes)
        while pending:
            node = pending[0]
            if node.proc is not None and node.proc.poll() is not None:
                with (node.home / "sshd.log").open("rb") as fh:
                    fh.seek(node.log_offset)
                    log = fh.read().decode(errors="replace").strip()  # this spawn's lines only
                if "Address already in use" in log:
                    raise _PortTaken(node, log)
                raise RuntimeError(f"sshd for {node.name} exited with {node.proc.returncode}: {log[-500:]}")
            if node.owns_port():
                try:
                    with socket.create_connection(("127.0.0.1", node.port), timeout=1.0) as sock:
                        sock.settimeout(2.0)
                        if sock.recv(8).startswith(b"SSH-"):
                            pending.pop(0)
                            continue
                except OSError:
                    pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"sshd for {node.name} on port {node.port} not ready after {timeout_s} s")
            time.sleep(0.1)

    def stop_node(self, name: str) -> None:
        """Stop one node's sshd (an unreachable node); its root stays as it was."""
        node = self.node(name)
        if node.proc is not None and node.proc.poll() is None:
            node.proc.terminate()
            node.proc.wait(timeout=10)

    def restart_node(self, name: str, timeout_s: float = 20.0) -> None:
        """Start a stopped node's sshd again on the same port with the same host key."""
        node = self.node(name)
        if not node.running:
            self._spawn(node)
        self._wait_ready(timeout_s, [node])

    def stop(self) -> None:
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                node.proc.terminate()
        for node in self.nodes:
            if node.proc is not None:
                try:
                    node.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    node.proc.kill()
                    node.proc.wait(timeout=10)

    def node(self, name: str) -> SshdNode:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(f"no node {name!r}; nodes: {', '.join(n.name for n in self.nodes)}")

    # -- what the controller needs ------------------------------------------------------------------------
    def spec(self, *, fleet: str = "e2e", keep_releases: int = 3, **rollout: object) -> dict[str, object]:
        """A fleet spec (docs/fleet-spec.md) for these nodes: ssh, simulated, python = this interpreter."""
        return {
            "fleet": fleet,
            "defaults": {
                "connection": "ssh",
                "user": self.user,
                "simulated": True,
                "python": self.python,
                "ssh": {"private_key_file": str(self.client_key), "known_hosts_file": str(self.known_hosts)},
            },
            "stack": {"python": "auto", "numba": "auto", "numba_cuda": "auto", "numpy": "auto"},
            "nodes": [
                {"name": n.name, "host": "127.0.0.1", "port": n.port, "root": str(n.root)} for n in self.nodes
            ],
            "rollout": {
                "batches": ["100%"],
                "max_failures": 0,
                "unreachable": "fail",
                "on_failure": "halt",
                "keep_releases": keep_releases,
                **rollout,
            },
            "gates": {"correctness": "required"},
        }

    def write_spec(self, path: Path, *, fleet: str = "e2e", keep_releases: int = 3) -> Path:
        path.write_text(yaml.safe_dump(self.spec(fleet=fleet, keep_releases=keep_releases), sort_keys=False))
        return path

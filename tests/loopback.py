"""Loopback ports for the test servers (sshd nodes, inference services, node exporters)."""

from __future__ import annotations

import random
import socket
from pathlib import Path


def _ephemeral_floor() -> int:
    """The lowest port the kernel hands out to outgoing connections (ip_local_port_range)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A loopback port free now, chosen below the kernel's ephemeral range.

    A port from `bind(0)` comes from the ephemeral range, where any outgoing connection (another xdist
    worker's ssh client) may take it between this check and sshd's own bind: CI saw sshd exit with
    "Address already in use" that way. Below the range only another listener can collide, and the
    callers that can (SshdFleet.start) retry with a new port if one does.
    """
    floor = _ephemeral_floor()
    if floor > 12000:
        for _ in range(200):
            port = random.randrange(10000, floor)
            if port in _HANDED:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _HANDED.add(port)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


_HANDED: set[int] = set()  # ports this process was given: never handed out twice (two servers of one test)

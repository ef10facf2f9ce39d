"""Loopback ports for the test servers (sshd nodes, inference services, node exporters)."""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path


def _ephemeral_floor() -> int:
    """The lowest port the kernel hands out to outgoing connections (ip_local_port_range)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _worker_range(lo: int, hi: int) -> tuple[int, int]:
    """This xdist worker's share of [lo, hi): disjoint per worker, so two workers never pick the same port
    (the whole range outside xdist)."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and worker[2:].isdigit() and count.isdigit() and int(count) > 0):
        return lo, hi
    index, n = int(worker[2:]), int(count)
    step = (hi - lo) // n
    return lo + index * step, lo + (index + 1) * step


def free_port() -> int:
    """A loopback port free now, chosen below the kernel's ephemeral range.

    A port from `bind(0)` comes from the ephemeral range, where any outgoing connection (another xdist
    worker's ssh client) may take it between this check and sshd's own bind: CI saw sshd exit with
    "Address already in use" that way. Below the range only another listener can collide: each xdist
    worker picks from its own share of it, and the callers that can (SshdFleet.start) retry with a new
    port if a process outside the suite took one.
    """
    floor = _ephemeral_floor()
    if floor > 12000:
        lo, hi = _worker_range(10000, floor)
        for _ in range(200):
            port = random.randrange(lo, hi)
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

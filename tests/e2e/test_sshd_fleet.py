"""The test fleet itself: a node whose port is taken before its sshd binds comes up on another port.

CI once lost three e2e tests to sshd exiting with "Address already in use": the port was free when picked and
taken before sshd bound it. `SshdFleet.start` now picks again for that node; here the collision is real (a
listening socket on the first port handed out), not simulated.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import loopback
import pytest
import sshd_fleet
from sshd_fleet import SshdFleet, sshd_missing_reason

pytestmark = pytest.mark.e2e


def test_a_taken_port_is_picked_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reason = sshd_missing_reason()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but the SSH e2e fleet cannot start: {reason}")
        pytest.skip(reason)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", loopback.free_port()))
        squatter.listen()
        taken = squatter.getsockname()[1]
        handed = iter([taken])
        monkeypatch.setattr(sshd_fleet, "free_port", lambda: next(handed, None) or loopback.free_port())
        fleet = SshdFleet(tmp_path, count=2)
        try:
            fleet.start()
            ports = [n.port for n in fleet.nodes]
            assert taken not in ports and len(set(ports)) == 2
            assert all(n.running for n in fleet.nodes)
            known = fleet.known_hosts.read_text()
            assert all(f"[127.0.0.1]:{p} " in known for p in ports) and f":{taken} " not in known
        finally:
            fleet.stop()


def test_each_xdist_worker_picks_ports_from_its_own_share(monkeypatch: pytest.MonkeyPatch) -> None:
    shares = []
    for i in range(3):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{i}")
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
        lo, hi = loopback._worker_range(10000, 32768)
        port = loopback.free_port()
        assert lo <= port < hi and hi - lo > 1000
        shares.append(range(lo, hi))
    assert not set(shares[0]) & set(shares[1]) and not set(shares[1]) & set(shares[2])
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert loopback._worker_range(10000, 32768) == (10000, 32768)

"""Fixtures for the end-to-end fleet tests: real sshd nodes on 127.0.0.1 driven through the `solfleet` CLI.

Skipped with a reason when sshd is not installed, except under CI (env CI set), where a missing sshd is a
failure: .ci/run installs openssh-server, so its absence there means the suite silently tested nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

# tests/e2e is on sys.path (rootdir-relative, no __init__.py); module names are unique to this suite.
from e2e_driver import E2EFleet
from sshd_fleet import SshdFleet, sshd_missing_reason


@pytest.fixture(scope="session")
def sshd_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshdFleet]:
    reason = sshd_missing_reason()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but the SSH e2e fleet cannot start: {reason}")
        pytest.skip(reason)
    fleet = SshdFleet(tmp_path_factory.mktemp("sshd-fleet"), count=3)
    try:
        fleet.start()
        yield fleet
    finally:
        fleet.stop()


@pytest.fixture(scope="session")
def e2e(sshd_fleet: SshdFleet, tmp_path_factory: pytest.TempPathFactory) -> E2EFleet:
    base = tmp_path_factory.mktemp("controller")
    spec = sshd_fleet.write_spec(base / "fleet.yml")
    return E2EFleet(sshd=sshd_fleet, spec=spec, work=base / "work", dist=base / "dist")

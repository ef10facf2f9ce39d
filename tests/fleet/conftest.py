"""Shared helpers for the controller's unit tests: real files, real SQLite, real Jinja2, no Ansible run."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fleet.spec import FleetSpec, parse_spec


@pytest.fixture
def spec_file(tmp_path: Path):
    """Write a spec (dict or raw text) to a file; returns its path."""

    def write(data: object, name: str = "fleet.yml") -> Path:
        path = tmp_path / name
        path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
        return path

    return write


def _make_spec(data: dict, tmp_path: Path) -> FleetSpec:
    return parse_spec(data, source=tmp_path / "fleet.yml", label="fleet.yml", work_dir=tmp_path / "work")


@pytest.fixture
def make_spec(tmp_path: Path):
    """Validate a spec dict as if it were tmp_path/fleet.yml, work dir tmp_path/work."""
    return lambda data: _make_spec(data, tmp_path)

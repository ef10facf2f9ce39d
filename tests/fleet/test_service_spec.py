"""The nodes' `service` field: defaults and node merge key by key, GPUs resolve from the node's gpu count,
every mistake names its field, and the inventory carries the role's host vars."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleet.errors import SpecError
from fleet.inventory import render_files
from fleet.service_spec import ServiceManager
from fleet.spec import embedded_fleet, load_spec

BASE: dict[str, Any] = {
    "fleet": "t",
    "defaults": {"connection": "ssh", "python": "/usr/bin/python3", "service": {"enabled": True}},
    "nodes": [
        {"name": "a1", "host": "10.0.0.1", "gpu": {"count": 4, "model": "H200", "cc": "9.0"}},
        {
            "name": "a2",
            "host": "10.0.0.2",
            "simulated": True,
            "service": {"port": 9000, "manager": "process"},
        },
        {"name": "a3", "host": "10.0.0.3", "service": {"enabled": False}},
    ],
}


def spec_with(**node0: Any) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    data["nodes"][0]["service"] = node0
    return data


def test_defaults_merge_with_the_node_and_gpus_resolve(make_spec) -> None:
    a1, a2, a3 = make_spec(copy.deepcopy(BASE)).nodes
    assert (a1.service.enabled, a1.service.gpus, a1.service.ports) == (
        True,
        (0, 1, 2, 3),
        (8000, 8001, 8002, 8003),
    )
    assert a1.service.manager is ServiceManager.SYSTEMD
    # the node overrides port and manager only; enabled still comes from defaults; simulated: GPU 0
    assert (a2.service.enabled, a2.service.port, a2.service.gpus) == (True, 9000, (0,))
    assert a2.service.manager is ServiceManager.PROCESS
    assert (a3.service.enabled, a3.service.gpus) == (False, ())


def test_inventory_carries_the_service_host_vars(make_spec, tmp_path: Path) -> None:
    spec = make_spec(spec_with(gpus=[1, 3], port=7000, exit_timeout_s=5))
    hosts = yaml.safe_load(
        render_files(spec, run_dir=tmp_path)["inventory/hosts.yml"].replace("!unsafe ", "")
    )
    a1 = hosts["all"]["children"]["solfleet_nodes"]["hosts"]["a1"]
    assert (a1["solfleet_serve_gpus"], a1["solfleet_serve_port"], a1["solfleet_serve_exit_timeout_s"]) == (
        [1, 3],
        7000,
        5,
    )
    assert a1["solfleet_serve_manager"] == "systemd" and a1["solfleet_serve_user"] == "solfleet"
    assert hosts["all"]["children"]["solfleet_nodes"]["hosts"]["a3"]["solfleet_serve_gpus"] == []
    # the serve play of deploy.yml and rollback.yml targets this group: the nodes with serve GPUs alone
    serving = hosts["all"]["children"]["solfleet_serving"]["hosts"]
    assert sorted(serving) == sorted(n for n, v in hosts["all"]["children"]["solfleet_nodes"]["hosts"].items()
                                     if v["solfleet_serve_gpus"])  # fmt: skip
    assert "a1" in serving and "a3" not in serving


def test_no_serving_node_renders_an_empty_serving_group(tmp_path: Path) -> None:
    spec = load_spec(embedded_fleet(), work_dir=tmp_path)
    assert not any(n.service.gpus for n in spec.nodes)
    hosts = yaml.safe_load(
        render_files(spec, run_dir=tmp_path)["inventory/hosts.yml"].replace("!unsafe ", "")
    )
    assert hosts["all"]["children"]["solfleet_serving"] == {"hosts": {}}


@pytest.mark.parametrize(
    ("service", "field"),
    [
        ({"enabled": "yes"}, "nodes[0].service.enabled"),
        ({"manager": "supervisord"}, "nodes[0].service.manager"),
        ({"port": 0}, "nodes[0].service.port"),
        ({"port": 65534}, "nodes[0].service.port"),  # GPU 3 would listen on 65537
        ({"gpus": [4]}, "nodes[0].service.gpus[0]"),  # the node declares 4 GPUs
        ({"gpus": [1, 1]}, "nodes[0].service.gpus[1]"),
        ({"gpus": "some"}, "nodes[0].service.gpus"),
        ({"ready_timeout_s": 0}, "nodes[0].service.ready_timeout_s"),
        ({"restart": True}, "nodes[0].service.restart"),
    ],
)
def test_bad_service_fields_are_named(make_spec, service: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as exc:
        make_spec(spec_with(**service))
    assert exc.value.field == field


def test_a_bad_default_is_reported_where_it_came_from(make_spec) -> None:
    data = copy.deepcopy(BASE)
    data["defaults"]["service"]["exit_timeout_s"] = -1
    with pytest.raises(SpecError) as exc:
        make_spec(data)
    assert exc.value.field == "defaults.service.exit_timeout_s"


def test_two_nodes_on_one_host_may_not_share_a_port(make_spec) -> None:
    data = copy.deepcopy(BASE)
    data["nodes"][1].update(host="10.0.0.1", root="/srv/b", simulated=False, gpu={"count": 2})
    data["nodes"][1]["service"] = {"port": 8003}
    with pytest.raises(SpecError) as exc:
        make_spec(data)
    assert exc.value.field == "nodes[1].service.port" and "8003" in exc.value.allowed

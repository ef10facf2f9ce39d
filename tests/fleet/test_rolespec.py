"""The solfleet role's argument spec, checked on the controller once per run (fleet/rolespec.py) where the
controller's playbooks turn Ansible's per-host validation task off: which playbooks do, that the rendered
embedded fleet passes every entry point, and that a missing or mistyped variable stops the run before
ansible-playbook starts, naming the playbook, the entry point, the host and the variable."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fleet import rolespec, runner
from fleet.errors import RunnerError
from fleet.inventory import write_private_data_dir
from fleet.spec import embedded_fleet, load_spec

PLAYBOOKS = Path(__file__).resolve().parents[2] / "playbooks"
# the extravars each run of the rollout code passes that the role's spec requires (fleet/rollout.py)
DEPLOY_VARS = {"solfleet_version": "1.0.0", "solfleet_artifact": "/dist/solfleet-ops-1.0.0.tar.gz"}


@pytest.fixture
def pdd(tmp_path: Path) -> tuple[Path, list[str]]:
    spec = load_spec(embedded_fleet(), work_dir=tmp_path / "work")
    out = tmp_path / "pdd"
    write_private_data_dir(spec, out)
    return out, [n.name for n in spec.nodes]


def test_every_controller_playbook_of_the_role_is_checked_here_not_per_host() -> None:
    specs = yaml.safe_load((PLAYBOOKS / "roles/solfleet/meta/argument_specs.yml").read_text())[
        "argument_specs"
    ]
    found = {}
    for playbook in sorted(PLAYBOOKS.glob("*.yml")):
        plays = yaml.safe_load(playbook.read_text())
        roles = [
            t["ansible.builtin.import_role"]
            for p in plays
            for t in p.get("tasks", [])
            if "ansible.builtin.import_role" in t
        ]
        if any(r["name"] == "solfleet" for r in roles):
            found[playbook.name] = list(rolespec.unvalidated_imports(playbook))
    assert found == {
        "deploy.yml": [("solfleet", "main"), ("solfleet", "serve")],
        "health.yml": [("solfleet", "health")],
        "lease.yml": [("solfleet", "lease")],
        "lease_end.yml": [("solfleet", "lease_end")],
        "rollback.yml": [("solfleet", "rollback"), ("solfleet", "serve")],
        "status.yml": [("solfleet", "status")],
    }
    assert all(entry in specs for imports in found.values() for _, entry in imports)


@pytest.mark.parametrize(
    ("playbook", "extravars"),
    [
        ("deploy.yml", DEPLOY_VARS),
        ("lease.yml", {"solfleet_rollout_id": "r-1", "solfleet_lease_s": 60, "solfleet_take_over": []}),
        ("lease_end.yml", {"solfleet_rollout_id": "r-1"}),
        ("health.yml", {}),
        ("rollback.yml", {"solfleet_rollback_to": "", "solfleet_rollout_id": "r-1"}),
        ("status.yml", {}),
    ],
)
def test_the_rendered_embedded_fleet_passes(
    pdd: tuple[Path, list[str]], playbook: str, extravars: dict
) -> None:
    out, hosts = pdd
    rolespec.check(out / "project", playbook, out / "inventory", hosts, extravars)


@pytest.mark.parametrize(
    ("extravars", "why"),
    [
        ({"solfleet_artifact": "/a.tar.gz"}, "missing required arguments: solfleet_version"),
        (
            {**DEPLOY_VARS, "solfleet_keep_releases": "many"},
            "argument 'solfleet_keep_releases' is of type str",
        ),
        ({**DEPLOY_VARS, "solfleet_serve_manager": "cron"}, "solfleet_serve_manager"),
    ],
)
def test_a_bad_variable_is_refused_before_anything_runs(
    pdd: tuple[Path, list[str]], extravars: dict, why: str
) -> None:
    out, hosts = pdd
    with pytest.raises(RunnerError) as info:
        runner.run_playbook(
            private_data_dir=out,
            playbook="deploy.yml",
            hosts=hosts,
            extravars=extravars,
            ident="t",
            timeout_s=60,
        )
    message = str(info.value)
    assert message.startswith(
        f"deploy.yml: host {hosts[0]}: the role solfleet's variables fail its argument spec"
    )
    assert "(entry point main)" in message and why in message and message.endswith("nothing was run")
    assert not (out / "artifacts" / "t").exists()  # ansible-runner never started


def test_a_host_variable_from_the_inventory_is_checked_too(pdd: tuple[Path, list[str]]) -> None:
    out, hosts = pdd
    hosts_yml = out / "inventory" / "hosts.yml"
    text = hosts_yml.read_text()
    assert "solfleet_serve_port: 8000" in text
    hosts_yml.write_text(
        text.replace("solfleet_serve_port: 8000", 'solfleet_serve_port: !unsafe "eighty"', 1)
    )
    with pytest.raises(RunnerError, match=r"host n1: .*solfleet_serve_port"):
        rolespec.check(out / "project", "deploy.yml", out / "inventory", hosts, DEPLOY_VARS)


def test_an_inventory_it_cannot_read_whole_is_refused(pdd: tuple[Path, list[str]]) -> None:
    out, hosts = pdd
    (out / "inventory" / "group_vars").mkdir()
    with pytest.raises(
        RunnerError, match=r"holds group_vars, hosts\.yml; the controller's role check reads only"
    ):
        rolespec.check(out / "project", "deploy.yml", out / "inventory", hosts, DEPLOY_VARS)


def test_variables_merge_in_ansibles_order(tmp_path: Path) -> None:
    # group vars by depth (all, then children), then the host's own vars, wherever the host is listed
    inv = tmp_path / "inventory"
    inv.mkdir()
    (inv / "hosts.yml").write_text(
        "all:\n"
        "  vars: {port: 8000, zone: a}\n"
        "  children:\n"
        "    nodes:\n"
        "      vars: {zone: b}\n"
        "      hosts: {n1: {port: 9000}, n2: {}}\n"
        "    serving:\n"
        "      hosts: {n1: {}}\n"
    )
    found = rolespec.host_vars(inv)
    assert found["n1"] == {"port": 9000, "zone": "b"}
    assert found["n2"] == {"port": 8000, "zone": "b"}


def test_a_host_the_inventory_no_longer_has_is_left_to_ansible(pdd: tuple[Path, list[str]]) -> None:
    # a reconcile names its baseline's hosts; a node since removed from the spec is Ansible's `not_run`
    out, hosts = pdd
    rolespec.check(out / "project", "lease.yml", out / "inventory", [*hosts, "gone"], {})

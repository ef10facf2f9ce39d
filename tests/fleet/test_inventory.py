"""Rendering the ansible-runner private_data_dir: real Jinja2 with StrictUndefined, parsed back as YAML."""

from __future__ import annotations

import dataclasses
import json
import shlex
import subprocess
import sys
from pathlib import Path, PurePosixPath

import jinja2
import pytest
import yaml

from fleet.inventory import context, control_path_dir, render_files, template_env, write_private_data_dir
from fleet.spec import embedded_fleet, load_spec, project_root


@pytest.fixture
def baremetal(tmp_path: Path):
    return load_spec(project_root() / "inventory" / "fleets" / "baremetal.example.yml", work_dir=tmp_path)


class Unsafe(str):
    """A string the inventory tagged `!unsafe` (Ansible never templates it)."""


class _InventoryLoader(yaml.SafeLoader):
    pass


_InventoryLoader.add_constructor("!unsafe", lambda loader, node: Unsafe(loader.construct_scalar(node)))


def load_inventory(text: str) -> dict:
    return yaml.load(text, Loader=_InventoryLoader)  # noqa: S506 (a SafeLoader subclass)


def test_every_host_has_its_interpreter_and_contract_vars(baremetal, tmp_path: Path) -> None:
    files = render_files(baremetal, run_dir=tmp_path / "run")
    inv = load_inventory(files["inventory/hosts.yml"])
    hosts = inv["all"]["children"]["solfleet_nodes"]["hosts"]
    assert list(hosts) == [n.name for n in baremetal.nodes]
    for node in baremetal.nodes:
        hv = hosts[node.name]
        assert hv["ansible_python_interpreter"] == node.python
        assert hv["ansible_host"] == node.host and hv["ansible_port"] == node.port
        assert hv["ansible_connection"] == "ssh"
        # host-key checking first (ssh keeps the first value), the known_hosts path one quoted token
        args = shlex.split(hv["ansible_ssh_common_args"])
        assert args[:2] == ["-o", "StrictHostKeyChecking=yes"]
        assert args[2:] == ["-o", f'UserKnownHostsFile="{node.ssh.known_hosts_file}"']
        for key in ("ansible_host", "ansible_user", "ansible_python_interpreter", "solfleet_root"):
            assert isinstance(hv[key], Unsafe), f"{key} must be !unsafe: {hv[key]!r}"
        assert hv["ansible_ssh_private_key_file"] == node.ssh.private_key_file
        assert hv["solfleet_root"] == str(node.root) and hv["solfleet_python"] == node.python
        assert hv["solfleet_simulated"] is False
        assert hv["solfleet_gpu_cc"] == node.gpu.cc
    assert set(inv["all"]["children"]["label_canary"]["hosts"]) == {"gpu-a01"}


def test_env_turns_on_pipelining_controlpersist_and_host_key_checking(baremetal, tmp_path: Path) -> None:
    files = render_files(baremetal, run_dir=tmp_path / "run")
    env = yaml.safe_load(files["env/envvars"])
    assert env["ANSIBLE_PIPELINING"] == "True"
    assert "ControlPersist=" in env["ANSIBLE_SSH_ARGS"] and "ControlMaster=auto" in env["ANSIBLE_SSH_ARGS"]
    # the run dir's own cp/ when its socket paths fit the limit, else a short per-run dir under /tmp
    assert env["ANSIBLE_SSH_CONTROL_PATH_DIR"] == str(control_path_dir(tmp_path / "run"))
    assert env["ANSIBLE_HOST_KEY_CHECKING"] == "True"
    assert env["ANSIBLE_TIMEOUT"] == "15" and env["ANSIBLE_TASK_TIMEOUT"] == "1800"
    assert env["ANSIBLE_ROLES_PATH"] == str(project_root() / "playbooks" / "roles")
    assert env["ANSIBLE_LIBRARY"] == str(project_root() / "playbooks" / "library")
    settings = yaml.safe_load(files["env/settings"])
    assert settings["job_timeout"] == 7200 and settings["idle_timeout"] > 1800


def test_local_fleet_renders_local_connection_without_ssh_vars(tmp_path: Path) -> None:
    spec = load_spec(embedded_fleet(), work_dir=tmp_path)
    hosts = load_inventory(render_files(spec, run_dir=tmp_path)["inventory/hosts.yml"])["all"]["children"][
        "solfleet_nodes"
    ]["hosts"]
    for name, hv in hosts.items():
        assert hv["ansible_connection"] == "local"
        assert hv["ansible_python_interpreter"] == sys.executable
        assert "ansible_ssh_common_args" not in hv
        assert hv["solfleet_simulated"] is True and hv["solfleet_gpu_cc"] == ""  # contract: "" when simulated
        assert hv["solfleet_root"] == str(tmp_path / "local-fleet" / name)


@pytest.mark.parametrize("missing", ["control_path_dir", "nodes", "forks", "job_timeout_s"])
def test_strict_undefined_fails_on_a_missing_variable(baremetal, tmp_path: Path, missing: str) -> None:
    ctx = context(baremetal, run_dir=tmp_path)
    del ctx[missing]
    env = template_env()
    with pytest.raises(jinja2.UndefinedError, match=missing):
        for name in ("hosts.yml.j2", "envvars.j2", "settings.j2"):
            env.get_template(name).render(ctx)


def test_strict_undefined_fails_on_a_missing_node_attribute(baremetal, tmp_path: Path) -> None:
    ctx = context(baremetal, run_dir=tmp_path)
    del ctx["nodes"][2]["python"]
    with pytest.raises(jinja2.UndefinedError, match="python"):
        template_env().get_template("hosts.yml.j2").render(ctx)


def test_write_private_data_dir(baremetal, tmp_path: Path) -> None:
    out = write_private_data_dir(baremetal, tmp_path / "pdd")
    assert (out.path / "inventory" / "hosts.yml").is_file()
    assert (out.path / "env" / "envvars").is_file() and (out.path / "env" / "settings").is_file()
    assert (out.path / "project").resolve() == project_root() / "playbooks"
    assert out.control_path_dir.is_dir()
    # re-rendering over an existing dir is fine (the project link is replaced, not nested)
    write_private_data_dir(baremetal, tmp_path / "pdd")
    assert (out.path / "project").resolve() == project_root() / "playbooks"


def test_control_path_dir_stays_short_enough_for_a_unix_socket(tmp_path: Path) -> None:
    deep = tmp_path / ("x" * 80) / "run"
    cp = control_path_dir(deep)
    assert len(str(cp)) + 1 + 10 + 17 < 104  # dir / 10-hex name + ssh's temp suffix, within sun_path
    assert control_path_dir(Path("/w/run")) == Path("/w/run/cp")


def test_ansible_never_templates_a_spec_value(tmp_path: Path) -> None:
    """The second wall behind the spec loader's refusal of `{{`: even a value that got past it (here put
    into the spec object directly) reaches a real ansible-playbook as data, not as a template."""
    spec = load_spec(embedded_fleet(), work_dir=tmp_path / "work")
    evil = PurePosixPath("/tmp/x/{{ 6 * 7 }}/{{ lookup('pipe', 'echo PWNED') }}")
    node = dataclasses.replace(spec.nodes[0], root=evil)
    spec = dataclasses.replace(spec, nodes=(node,))
    pdd = write_private_data_dir(spec, tmp_path / "pdd").path
    play = pdd / "show.yml"
    play.write_text(
        "- hosts: all\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.debug:\n        msg: 'root=[{{ solfleet_root }}]'\n"
    )
    bin_dir = Path(sys.executable).parent
    proc = subprocess.run(
        [str(bin_dir / "ansible-playbook"), "-i", str(pdd / "inventory" / "hosts.yml"), str(play)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "ANSIBLE_NOCOLOR": "1", "HOME": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "{{ 6 * 7 }}" in proc.stdout and "PWNED" not in proc.stdout.replace("echo PWNED", ""), proc.stdout
    assert "/42/" not in proc.stdout


def test_node_names_yaml_would_read_as_other_types_stay_host_names(tmp_path: Path) -> None:
    """`yes`, `null`, `10`, `1_0` (YAML 1.1 reads it as 10 too), `0x1f` and `1.5` are valid node names. The
    inventory quotes every name, so a real ansible-inventory sees each as its own host (unquoted, `10` was
    "Host pattern 10 must be a string" and `1_0` collided with it)."""
    spec = load_spec(embedded_fleet(), work_dir=tmp_path / "work")
    names = ["yes", "null", "10", "1_0", "0x1f", "1.5"]
    nodes = tuple(
        dataclasses.replace(spec.nodes[i % len(spec.nodes)], name=name, labels=("gpu",))
        for i, name in enumerate(names)
    )
    pdd = write_private_data_dir(dataclasses.replace(spec, nodes=nodes), tmp_path / "pdd").path
    bin_dir = Path(sys.executable).parent
    proc = subprocess.run(
        [str(bin_dir / "ansible-inventory"), "-i", str(pdd / "inventory" / "hosts.yml"), "--list"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "ANSIBLE_NOCOLOR": "1", "HOME": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    listed = json.loads(proc.stdout)
    assert sorted(listed["_meta"]["hostvars"]) == sorted(names)
    assert sorted(listed["solfleet_nodes"]["hosts"]) == sorted(names)
    assert sorted(listed["label_gpu"]["hosts"]) == sorted(names)

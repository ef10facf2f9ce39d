"""The driver tasks in Ansible check mode against facts captured from a real H200 node
(tests/fleet/data/h200-node-facts.json, driver 580.159.04): real ansible-playbook (connection local) runs
provision.yml's preflight and driver roles through fleet.runner; only the OS and package facts, which the
capture does not hold, are chosen per case. The four choices: skip (the pin is loaded), refuse (another
driver loaded, policy refuse), install (policy install), reboot (installed, not loaded yet); reboots are then
scheduled in waves of at most provision.max_parallel_reboots."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import ansible.module_utils as amu
import pytest
import yaml

from fleet import provision as prov
from fleet import runner
from fleet.inventory import write_private_data_dir
from fleet.spec import parse_spec

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
amu.__path__.append(str(REPO / "playbooks" / "module_utils"))
from ansible.module_utils import solfleet_provision as sp  # noqa: E402

FIXTURE = json.loads((Path(__file__).parent / "data" / "h200-node-facts.json").read_text())
LOADED = "580.159.04"


def h200_facts(**over: Any) -> dict[str, Any]:
    """The node's facts as solfleet_preflight gathers them, GPU parts parsed from the real capture."""
    facts = {
        "os": {"distribution": "Ubuntu", "version": "24.04", "family": "Debian"},
        "kernel": "6.8.0-49-generic",
        "kernel_headers": True,
        "gpus": sp.parse_nvidia_smi_csv(FIXTURE["nvidia_smi_csv"]),
        "gpu_source": "nvidia-smi",
        "lspci_nvidia": 0,
        "driver_loaded": sp.parse_proc_driver_version(FIXTURE["nvrm_line"]),
        "package_manager": "apt",
        "driver_packages": {"nvidia-driver-580-open": f"{LOADED}-0ubuntu1"},
        "driver_held": ["nvidia-driver-580-open"],
        "free_disk_mb": 50_000,
        "python": "3.12.3",
    }
    return {**facts, **over}


def test_the_capture_parses_to_the_h200_facts() -> None:
    gpus = sp.parse_nvidia_smi_csv(FIXTURE["nvidia_smi_csv"])
    assert gpus == [
        {
            "name": "NVIDIA H200",
            "bus_id": "00000000:00:06.0",
            "driver": LOADED,
            "persistence": True,
            "cc": "9.0",
            "memory_mib": 143771,
        }
    ]
    assert sp.parse_proc_driver_version(FIXTURE["nvrm_line"]) == LOADED == FIXTURE["nvml"]["driver"]


def _spec(tmp_path: Path, names: list[str], *, pin: str, policy: str, max_reboots: int = 2):
    data = {
        "fleet": "drv",
        "defaults": {
            "connection": "local",
            "simulated": False,
            "gpu": {"count": 1, "model": "H200", "cc": "9.0"},
        },
        "stack": {"python": "3.12", "numba": "auto", "numba_cuda": "auto", "numpy": "auto", "driver": pin},
        "provision": {
            "base_python": sys.executable,
            "driver": {"policy": policy},
            "max_parallel_reboots": max_reboots,
        },
        "nodes": [{"name": n, "root": str(tmp_path / "roots" / n)} for n in names],
    }
    return parse_spec(data, source=tmp_path / "fleet.yml", label="fleet.yml", work_dir=tmp_path / "work")


def run_driver_check(
    tmp_path: Path, facts: dict[str, dict[str, Any]], *, pin: str, policy: str, plan_only: bool = False
):
    spec = _spec(tmp_path, list(facts), pin=pin, policy=policy)
    pdd = tmp_path / "pdd"
    write_private_data_dir(spec, pdd)
    for name, f in facts.items():
        host_vars = pdd / "inventory" / "host_vars"
        host_vars.mkdir(parents=True, exist_ok=True)
        (host_vars / f"{name}.yml").write_text(yaml.safe_dump({"solfleet_preflight_facts": f}))
    extra = prov.extravars(
        spec, wheelhouse=tmp_path / "none.tar.gz", check=True, roles=("preflight", "driver")
    )
    extra["ansible_python_interpreter"] = sys.executable
    # plan_only: this test machine has no NVIDIA apt repository, so apt's own check mode would fail here
    extra["solfleet_driver_plan_only"] = plan_only
    result = runner.run_playbook(
        private_data_dir=pdd,
        playbook=prov.PROVISION_PLAYBOOK,
        hosts=list(facts),
        extravars=extra,
        ident=f"check-{policy}",
        timeout_s=300,
    )
    return spec, {n: prov._outcome(result.hosts[n], spec, spec.node(n)) for n in facts}


def test_check_mode_driver_choices_against_the_h200_facts(tmp_path: Path) -> None:
    # policy refuse (a running fleet): the pinned driver is loaded -> skip; another pin -> refused
    _, refuse = run_driver_check(
        tmp_path / "refuse",
        {"loaded": h200_facts(), "other": h200_facts()},
        pin=LOADED,
        policy="refuse",
    )
    assert (refuse["loaded"].driver_action, refuse["loaded"].failed, refuse["loaded"].reboot) == (
        "skip",
        0,
        False,
    )
    assert refuse["loaded"].changed == 0  # persistence is already on in the capture: nothing to do
    _, mismatch = run_driver_check(
        tmp_path / "mismatch", {"n1": h200_facts()}, pin="580.165.02", policy="refuse"
    )
    m = mismatch["n1"]
    assert m.driver_action == "refuse" and m.failed == 1 and not m.reboot
    assert f"driver {LOADED} is loaded but stack.driver pins 580.165.02" in m.message
    assert "policy is refuse" in m.message


def test_check_mode_install_and_reboot_waves(tmp_path: Path) -> None:
    new = "580.165.02"
    facts = {
        "fresh1": h200_facts(),  # 580.159.04 loaded and installed: install 580.165.02
        "fresh2": h200_facts(driver_loaded=None, gpus=[], lspci_nvidia=1, driver_packages={}),  # no driver
        "pending": h200_facts(driver_packages={"nvidia-driver-580-open": f"{new}-0ubuntu1"}),  # reboot due
        "fresh3": h200_facts(),
        "current": h200_facts(driver_loaded=new, gpus=[{**g, "driver": new} for g in h200_facts()["gpus"]]),
    }
    spec, out = run_driver_check(tmp_path, facts, pin=new, policy="install", plan_only=True)
    actions = {n: o.driver_action for n, o in out.items()}
    assert actions == {
        "fresh1": "install",
        "fresh2": "install",
        "pending": "reboot",
        "fresh3": "install",
        "current": "skip",
    }
    assert all(o.failed == 0 for o in out.values()), {n: o.message for n, o in out.items()}
    assert all(o.changed == 0 for o in out.values())  # deciding changes nothing
    due = [n for n, o in out.items() if o.reboot]
    assert due == ["fresh1", "fresh2", "pending", "fresh3"]
    waves = prov.reboot_waves(due, spec.provision.max_parallel_reboots)
    assert waves == (("fresh1", "fresh2"), ("pending", "fresh3"))
    assert max(len(w) for w in waves) <= spec.provision.max_parallel_reboots


def test_missing_kernel_headers_fail_preflight_only_when_a_driver_install_is_due() -> None:
    want = {
        "supported_os": ["Ubuntu 24.04"],
        "min_free_disk_mb": 1,
        "gpu_cc": "9.0",
        "python": "3.12",
        "driver": "580.165.02",
        "driver_policy": "install",
    }
    checks = {c["name"]: c["status"] for c in sp.preflight_checks(h200_facts(kernel_headers=False), want)}
    assert checks["kernel_headers"] == "failed"
    same = {**want, "driver": LOADED}
    checks = {c["name"]: c["status"] for c in sp.preflight_checks(h200_facts(kernel_headers=False), same)}
    assert checks == {
        "os": "passed",
        "disk": "passed",
        "python": "passed",
        "gpu": "passed",
        "compute_capability": "passed",
        "kernel_headers": "skipped",
    }
    wrong_cc = {c["name"]: c for c in sp.preflight_checks(h200_facts(), {**same, "gpu_cc": "8.0"})}
    assert (
        wrong_cc["compute_capability"]["status"] == "failed"
        and "['9.0']" in wrong_cc["compute_capability"]["detail"]
    )


def test_reboot_waves_never_exceed_the_limit() -> None:
    hosts = [f"n{i}" for i in range(7)]
    for limit in (1, 2, 3, 7, 10):
        waves = prov.reboot_waves(hosts, limit)
        assert [h for w in waves for h in w] == hosts
        assert all(1 <= len(w) <= limit for w in waves)
    with pytest.raises(ValueError):
        prov.reboot_waves(hosts, 0)

"""The stack: resolved pins and their id, the comparison that names the differing field, the spec's
`stack`/`provision` sections, the build refusing PTX from another numba-cuda, and the node side's stack check
running in the very environment verify runs in (the real-GPU bug: PYTHONPATH seen by one, not the other)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import ansible.module_utils as amu
import pytest

from fleet import stack as stk
from fleet.artifact import build
from fleet.errors import BuildFailed, SpecError
from fleet.provision_spec import RuntimeMode, runtime_python

REPO = Path(__file__).resolve().parents[2]
amu.__path__.append(
    str(REPO / "playbooks" / "module_utils")
)  # the node side's modules, as Ansible loads them
from ansible.module_utils import solfleet_artifact, solfleet_kernels  # noqa: E402

BASE: dict[str, Any] = {
    "fleet": "t",
    "defaults": {"connection": "local", "simulated": True},
    "stack": {"python": "3.12", "numba": "0.68.*", "numba_cuda": "0.30.4", "numpy": "2.4.*"},
    "nodes": [{"name": "a", "root": "/srv/a"}],
}


def with_(**parts: Any) -> dict[str, Any]:
    return {**BASE, **parts}


def test_stack_id_changes_with_every_pin_and_requirement(make_spec) -> None:
    base = make_spec(BASE).stack_id
    assert len(base) == 12 and make_spec(BASE).stack_id == base
    for key, value in [
        ("numpy", "2.4.6"),
        ("llvmlite", "0.50.0"),
        ("driver", "580.159.04"),
        ("cuda", "13.0"),
    ]:
        other = make_spec(with_(stack={**BASE["stack"], key: value})).stack_id
        assert other != base, key
    req = make_spec(with_(stack={**BASE["stack"], "requirements": ["PyYAML==6.0.2"]}))
    assert req.stack_id != base and [str(r) for r in req.requirements] == ["pyyaml==6.0.2"]


def test_auto_resolves_to_the_same_id_as_the_explicit_versions(make_spec) -> None:
    auto = make_spec(with_(stack={"python": "auto", "numba": "auto", "numba_cuda": "auto", "numpy": "auto"}))
    explicit = {
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "numba": metadata.version("numba"),
        "numba_cuda": metadata.version("numba-cuda"),
        "numpy": metadata.version("numpy"),
    }
    assert dict(auto.stack) == explicit
    assert auto.stack_id == make_spec(with_(stack=explicit)).stack_id


def test_compare_names_the_first_differing_field() -> None:
    expected = {"python": "3.12", "numba_cuda": "0.30.4", "numpy": "2.4.*"}
    ok = stk.compare(expected=expected, actual={"python": "3.12.3", "numba_cuda": "0.30.4", "numpy": "2.4.6"})
    assert ok.ok
    bad = stk.compare(
        expected=expected, actual={"python": "3.12.3", "numba_cuda": "0.30.4", "numpy": "2.5.2"}
    )
    assert not bad.ok and [d.field for d in bad.differences] == ["numpy"]
    assert str(bad) == "stack.numpy: pinned 2.4.* but numpy is 2.5.2"
    missing = stk.compare(expected=expected, actual={"python": "3.11.7", "numpy": "2.4.1"})
    assert [d.field for d in missing.differences] == ["python", "numba_cuda"]
    assert "numba_cuda is not installed" in str(missing)


@pytest.mark.parametrize(
    ("stack", "field"),
    [
        ({"requirements": ["pyyaml>=6"]}, "stack.requirements[0]"),
        ({"requirements": ["numpy==2.4.6"]}, "stack.requirements[0]"),
        ({"requirements": ["a==1", "A==2"]}, "stack.requirements[1]"),
        ({"platform": "win_amd64"}, "stack.platform"),
        ({"llvmlite": "auto", "driver": "auto"}, "stack.driver"),
    ],
)
def test_bad_stack_fields_are_named(make_spec, stack: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as exc:
        make_spec(with_(stack={**BASE["stack"], **stack}))
    assert exc.value.field == field


def test_provision_section_defaults_and_runtime_python(make_spec) -> None:
    spec = make_spec(
        with_(provision={"mode": "layered", "carry": ["numpy"], "base_python": "/usr/bin/python3"})
    )
    p = spec.provision
    assert p is not None and p.mode is RuntimeMode.LAYERED and p.carry == ("numpy",)
    assert p.driver_policy.value == "refuse" and p.max_parallel_reboots == 1
    assert p.config.as_dict()["device_id"] == 0 and p.config.service.max_queue == 32
    assert p.config.memory_limit_mb == 4096  # the service refuses 0
    # a provisioned node's python is its runtime unless the spec names one
    assert spec.nodes[0].python == runtime_python(spec.nodes[0].root, spec.stack_id)
    assert spec.nodes[0].python == f"/srv/a/runtimes/{spec.stack_id}/bin/python"
    named = make_spec(
        with_(provision={}, nodes=[{"name": "a", "root": "/srv/a", "python": "/usr/bin/python3"}])
    )
    assert named.nodes[0].python == "/usr/bin/python3"
    assert make_spec(BASE).nodes[0].python == sys.executable  # no provision: `auto` as before


@pytest.mark.parametrize(
    ("provision", "field"),
    [
        ({"mode": "conda"}, "provision.mode"),
        ({"mode": "layered", "carry": ["torch"]}, "provision.carry[0]"),
        ({"carry": ["numpy"]}, "provision.carry"),
        ({"driver": {"policy": "install"}}, "provision.driver.policy"),
        ({"max_parallel_reboots": 0}, "provision.max_parallel_reboots"),
        ({"config": {"log_level": "loud"}}, "provision.config.log_level"),
        ({"config": {"service": {"max_queue": -1}}}, "provision.config.service.max_queue"),
        # per node now (the node's `service` field): refused here with where to put it
        ({"config": {"service": {"port": 8000}}}, "provision.config.service.port"),
        ({"config": {"memory_limit_mb": 0}}, "provision.config.memory_limit_mb"),
        ({"config": {"gpu": 1}}, "provision.config.gpu"),
        ({"base_python": "python3"}, "provision.base_python"),
    ],
)
def test_bad_provision_fields_are_named(make_spec, provision: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as exc:
        make_spec(with_(provision=provision))
    assert exc.value.field == field


def test_build_refuses_ptx_from_another_numba_cuda(make_spec, tmp_path: Path) -> None:
    spec = make_spec(
        with_(
            defaults={"connection": "local", "simulated": True, "gpu": {"cc": "9.0"}},
            stack={"python": "auto", "numba": "auto", "numba_cuda": "0.29.0", "numpy": "auto"},
        )
    )
    with pytest.raises(BuildFailed) as exc:
        build(spec=spec, version="1.0.0", out_dir=tmp_path / "dist")
    assert f"stack.numba_cuda: pinned 0.29.0 but numba_cuda is {metadata.version('numba-cuda')}" in str(
        exc.value
    )
    assert not list((tmp_path / "dist").glob("*.tar.gz"))


def _shadow_numpy(where: Path, version: str) -> Path:
    """A directory that, on PYTHONPATH, would make `import numpy` load another numpy (metadata included)."""
    (where / "numpy").mkdir(parents=True)
    (where / "numpy" / "__init__.py").write_text(f"__version__ = '{version}'\n")
    info = where / f"numpy-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: numpy\nVersion: {version}\n")
    return where


def test_inherited_pythonpath_reaches_neither_the_stack_check_nor_verify(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shadow = _shadow_numpy(tmp_path / "carried", "9.9.9")
    monkeypatch.setenv("PYTHONPATH", str(shadow))
    monkeypatch.setenv("PYTHONHOME_IS_NOT_SET", "x")
    monkeypatch.setenv("NUMBA_OPT", "0")
    release = tmp_path / "release"
    release.mkdir()
    env = solfleet_kernels.kernels_env(str(release), str(tmp_path / "cache"), False)
    assert env["PYTHONPATH"] == str(release) and env["PYTHONNOUSERSITE"] == "1"
    assert "NUMBA_OPT" not in env and "NUMBA_ENABLE_CUDASIM" not in env
    seen = solfleet_artifact.node_stack(sys.executable, 60, release=str(release), cache_dir=str(tmp_path))
    # what verify will import, in verify's environment
    imported = subprocess.run(
        [sys.executable, "-c", "import numpy; print(numpy.__version__)"],
        env=env,
        cwd=release,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert seen["numpy"] == imported == metadata.version("numpy") != "9.9.9"


def test_a_package_in_the_release_is_seen_by_the_stack_check_as_verify_sees_it(tmp_path: Path) -> None:
    release = _shadow_numpy(tmp_path / "release", "9.9.9")
    manifest = {"stack": {"numpy": metadata.version("numpy")}}
    with pytest.raises(solfleet_artifact.NodeError) as exc:
        solfleet_artifact.check_stack(manifest, sys.executable, release=str(release), cache_dir=str(tmp_path))
    assert "stack pin numpy=" in exc.value.message and "the node has numpy 9.9.9" in exc.value.message


def test_config_device_id_selects_the_gpu(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(json.dumps({"device_id": 3}))
    env = solfleet_kernels.kernels_env(None, str(tmp_path), False, config=str(config), base={"PATH": "/bin"})
    assert env["CUDA_VISIBLE_DEVICES"] == "3" and env["SOLFLEET_CONFIG"] == str(config)
    assert "PYTHONPATH" not in env and env["PATH"] == "/bin"


def test_failure_reason_shows_the_import_error_and_the_first_failing_cases() -> None:
    crash = subprocess.CompletedProcess(
        [],
        1,
        "",
        "Traceback (most recent call last):\n  File x\n"
        "AttributeError: module 'numpy' has no attribute 'row_stack'\n",
    )
    assert solfleet_kernels.failure_reason(crash, None).endswith(
        "AttributeError: module 'numpy' has no attribute 'row_stack'"
    )
    results = [
        {"op": "gemm", "dtype": "fp32", "case": f"c{i}", "ok": False, "rel_err": 0.5, "tol": 1e-5}
        for i in range(5)
    ] + [{"op": "cast", "dtype": "fp32", "case": "x", "ok": True}]
    why = solfleet_kernels.failure_reason(
        subprocess.CompletedProcess([], 1, "", ""), {"ok": False, "results": results}
    )
    assert (
        why.startswith("5 of 6 case(s) failed: gemm/fp32/c0: rel_err 0.5 > tol 1e-05") and "(+2 more)" in why
    )
    gpu = solfleet_kernels.failure_reason(
        subprocess.CompletedProcess([], 1, "", ""),
        {"ok": False, "error": "no CUDA GPU visible", "results": []},
    )
    assert gpu == "no CUDA GPU visible (no case ran)"


def test_probe_reports_the_package_that_loads(tmp_path: Path) -> None:
    shadow = _shadow_numpy(tmp_path / "first", "9.9.9")
    env = {**os.environ, "PYTHONPATH": str(shadow)}
    out = subprocess.run(
        [sys.executable, "-c", stk.PROBE, json.dumps({"numpy": ["numpy", "numpy"]})],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(out.stdout)["numpy"] == "9.9.9"


def test_the_stack_check_finds_the_dist_info_of_the_copy_that_loads_whatever_its_folder_is_called(
    tmp_path: Path,
) -> None:
    """A dist-info folder whose name does not normalise to the project's (an unescaped `foo-bar-2.0`), ahead
    of a properly named one for another copy on the path: the probe reports the copy `import` loads."""
    loads, shadowed = tmp_path / "loads", tmp_path / "shadowed"
    for where, version, folder in (
        (loads, "2.0", "foo-bar-2.0.dist-info"),
        (shadowed, "1.0", "foo_bar-1.0.dist-info"),
    ):
        (where / "foo_bar").mkdir(parents=True)
        (where / "foo_bar" / "__init__.py").write_text("")
        (where / folder).mkdir()
        (where / folder / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: foo-bar\nVersion: {version}\n"
        )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(loads), str(shadowed)]))
    for probe in (stk.PROBE, solfleet_artifact._PROBE):
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                probe,
                json.dumps({"foo-bar": ["foo-bar", "foo_bar"], "numba-cuda": ["numba-cuda", "numba_cuda"]}),
            ],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        seen = json.loads(proc.stdout)
        assert seen["foo-bar"] == "2.0" and seen["numba-cuda"] == metadata.version("numba-cuda")

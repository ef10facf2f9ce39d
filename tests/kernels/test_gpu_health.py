"""GPU health parsers and checks on real H200 output (tests/data/gpu/h200-healthy) and on faulty copies of it
derived by tests/data/gpu/make_variants.sh (see the README there for each edit)."""

from __future__ import annotations

import glob
import json
from pathlib import Path

import pytest

from kernels.harness import gpu_health as gh
from kernels.harness import xid

DATA = Path(__file__).resolve().parents[1] / "data" / "gpu"
HEALTHY = DATA / "h200-healthy"
H200 = gh.GpuExpectations(count=1, model="H200", cc="9.0", driver="580.159.04", cuda="13.0")
P, F, S = gh.CheckStatus.PASSED, gh.CheckStatus.FAILED, gh.CheckStatus.SKIPPED


def sections(path: Path) -> dict[str, str]:
    """queries.txt: the first block (no title) under "", then one block per `## title` line."""
    out: dict[str, list[str]] = {"": []}
    key = ""
    for line in path.read_text().splitlines():
        if line.startswith("## "):
            key = line[3:].strip()
            out[key] = []
        else:
            out[key].append(line)
    return {k: "\n".join(v) for k, v in out.items()}


def nvml(folder: Path) -> gh.NodeFacts:
    return gh.facts_from_nvml_dump(json.loads((folder / "nvml.json").read_text()))


def smi(folder: Path) -> gh.NodeFacts:
    rows = gh.parse_query_csv(sections(HEALTHY / "queries.txt")[""])
    caps = {r["pci.bus_id"] or "": r["compute_cap"] or "" for r in rows}
    return gh.parse_smi_xml((folder / "nvidia-smi-q.xml").read_text(), compute_caps=caps)


def statuses(checks: list[gh.Check]) -> dict[str, gh.CheckStatus]:
    return {c.name: c.status for c in checks}


def by_name(checks: list[gh.Check], name: str) -> gh.Check:
    return next(c for c in checks if c.name == name)


HEALTHY_STATUSES = {name: P for name in gh.FACT_CHECKS} | {"gpu.retired_pages": S}


@pytest.mark.parametrize("read", [nvml, smi], ids=["nvml", "nvidia-smi"])
def test_healthy_h200_passes_every_fact_check(read):
    facts = read(HEALTHY)
    assert [g.name for g in facts.gpus] == ["NVIDIA H200"]
    assert (facts.driver, facts.cuda_driver, facts.gpus[0].cc) == ("580.159.04", "13.0", "9.0")
    checks = gh.check_facts(facts=facts, expect=H200)
    assert [c.name for c in checks] == list(gh.FACT_CHECKS)
    assert statuses(checks) == HEALTHY_STATUSES, [c.as_dict() for c in checks]
    # the H200 remaps rows: retired pages are N/A there, which is not a pass
    assert "remaps rows" in by_name(checks, "gpu.retired_pages").detail
    assert "gpu_idle" in by_name(checks, "gpu.clock_event_reasons").detail


def test_nvml_and_xml_agree_on_the_same_gpu():
    a, b = nvml(HEALTHY).gpus[0], smi(HEALTHY).gpus[0]
    for field in ("name", "cc", "persistence", "ecc_enabled", "ecc_uncorrected_volatile", "remapped_pending",
                  "remapped_failure", "clock_event_reasons", "sm_clock_max_mhz"):  # fmt: skip
        assert getattr(a, field) == getattr(b, field), field
    assert b.pci_bus_id == "00000000:00:06.0"
    assert b.retired_pages_sbe is None and b.retired_pages_pending is None


@pytest.mark.parametrize("read", [nvml, smi], ids=["nvml", "nvidia-smi"])
@pytest.mark.parametrize(
    ("variant", "check", "words"),
    [
        ("remap-pending", "gpu.remapped_rows", ["1 uncorrectable", "remap pending"]),
        ("hw-slowdown", "gpu.clock_event_reasons", ["0x8", "hw_slowdown"]),
        ("ecc-uncorrected", "gpu.ecc", ["2 uncorrected"]),
    ],
)
def test_each_fault_fails_its_check_and_only_that_one(read, variant, check, words):
    checks = gh.check_facts(facts=read(DATA / variant), expect=H200)
    assert statuses(checks) == HEALTHY_STATUSES | {check: F}, [c.as_dict() for c in checks]
    detail = by_name(checks, check).detail
    assert all(w in detail for w in words), detail


def test_pre535_xml_names_read_the_same_reasons():
    old = gh.parse_smi_xml((DATA / "pre535-names" / "nvidia-smi-q.xml").read_text())
    assert "clocks_throttle_reasons" in (DATA / "pre535-names" / "nvidia-smi-q.xml").read_text()
    assert old.gpus[0].clock_event_reasons == 0x1 == smi(HEALTHY).gpus[0].clock_event_reasons


def test_clock_reason_csv_under_both_names():
    q = sections(HEALTHY / "queries.txt")
    new, old = gh.parse_query_csv(q["new names"]), gh.parse_query_csv(q["old names"])
    assert gh.clock_reasons_from_csv(new[0]) == 0x1 == gh.clock_reasons_from_csv(old[0])
    # the same row keyed by the pre-535 names, as older drivers print the header
    renamed = {k.replace("clocks_event_reasons.", "clocks_throttle_reasons."): v for k, v in old[0].items()}
    assert gh.clock_reasons_from_csv(renamed) == 0x1
    slow = gh.parse_query_csv((DATA / "hw-slowdown" / "clocks-new-names.csv").read_text())
    assert gh.clock_reasons_from_csv(slow[0]) == 0x8
    assert gh.clock_reasons(0x8) == ([], ["hw_slowdown"])


def test_clock_reason_classes():
    assert gh.clock_reasons(0x1 | 0x2 | 0x4) == (
        ["gpu_idle", "applications_clocks_setting", "sw_power_cap"],
        [],
    )
    assert gh.clock_reasons(0x20 | 0x40 | 0x80)[1] == ["sw_thermal_slowdown", "hw_thermal_slowdown",
                                                        "hw_power_brake_slowdown"]  # fmt: skip
    assert gh.clock_reasons(0x1 << 20) == ([], ["unknown_0x100000"])


def test_query_csv_units_and_na():
    rows = gh.parse_query_csv(sections(HEALTHY / "queries.txt")[""])
    assert len(rows) == 1
    r = rows[0]
    assert (r["name"], r["persistence_mode"], r["compute_cap"]) == ("NVIDIA H200", "Enabled", "9.0")
    assert r["memory.total"] == "143771 MiB" and r["retired_pages.pending"] is None
    remap = gh.parse_query_csv(sections(HEALTHY / "queries.txt")["remapped rows"])
    assert remap[0]["remapped_rows.pending"] == "No"


def test_mixed_architectures_are_reported():
    facts = nvml(DATA / "mixed-arch")
    checks = gh.check_facts(facts=facts, expect=gh.GpuExpectations(count=2, model="NVIDIA", cc="9.0"))
    cc = by_name(checks, "gpu.compute_capability")
    assert cc.status is F and "mixed" in cc.detail and "GPU 0: 9.0" in cc.detail and "GPU 1: 8.0" in cc.detail
    # no cc in the spec: still a failure, a node must be one architecture
    assert (
        by_name(gh.check_facts(facts=facts, expect=gh.GpuExpectations()), "gpu.compute_capability").status
        is F
    )
    model = by_name(gh.check_facts(facts=facts, expect=gh.GpuExpectations(model="H200")), "gpu.model")
    assert model.status is F and "A100" in model.detail


@pytest.mark.parametrize(
    ("expect", "check", "status"),
    [
        (gh.GpuExpectations(count=8), "gpu.count", F),
        (gh.GpuExpectations(model="B200"), "gpu.model", F),
        (gh.GpuExpectations(cc="10.0"), "gpu.compute_capability", F),
        (gh.GpuExpectations(driver="575.57.08"), "gpu.driver", F),
        (gh.GpuExpectations(driver="580"), "gpu.driver", P),
        (gh.GpuExpectations(driver="580.159"), "gpu.driver", P),
        (gh.GpuExpectations(driver="580.15"), "gpu.driver", F),
        (gh.GpuExpectations(cuda="13.1"), "gpu.cuda", F),
        (gh.GpuExpectations(cuda="12.8"), "gpu.cuda", P),
        (gh.GpuExpectations(), "gpu.count", S),
        (gh.GpuExpectations(), "gpu.driver", S),
    ],
)
def test_expectations_against_the_h200(expect, check, status):
    got = by_name(gh.check_facts(facts=nvml(HEALTHY), expect=expect), check)
    assert got.status is status, got


def test_no_gpu_at_all_fails_every_per_gpu_check():
    checks = gh.check_facts(facts=gh.NodeFacts("nvml", "580.159.04", "13.0", ()), expect=H200)
    st = statuses(checks)
    assert st["gpu.count"] is F and st["gpu.persistence"] is F and st["gpu.compute_capability"] is F


def test_persistence_off_and_ecc_off_fail():
    d = json.loads((HEALTHY / "nvml.json").read_text())
    d["gpus"][0].update(persistence=0, ecc_mode=[0, 0])
    checks = gh.check_facts(facts=gh.facts_from_nvml_dump(d), expect=H200)
    assert by_name(checks, "gpu.persistence").status is F
    assert by_name(checks, "gpu.ecc").status is F and "disabled" in by_name(checks, "gpu.ecc").detail


# ---- Xid -----------------------------------------------------------------------------------------


def test_healthy_kernel_log_has_no_xid():
    assert "NVRM" in (HEALTHY / "dmesg.txt").read_text()
    assert xid.parse_kernel_log((HEALTHY / "dmesg.txt").read_text()) == []


def test_xid_lines_parse_and_classify():
    ev = xid.parse_kernel_log((DATA / "xid79" / "dmesg.txt").read_text())
    assert [(e.code, e.pci, e.xid_class) for e in ev] == [
        (13, "0000:00:06", xid.XidClass.APPLICATION),
        (79, "0000:00:06", xid.XidClass.HARDWARE),
    ]
    assert ev[1].uptime_s == pytest.approx(7301.402117)
    assert "fallen off the bus" in ev[1].message


def test_journalctl_monotonic_format_parses():
    line = (
        "[ 7301.402117] gpu-a01 kernel: NVRM: Xid (PCI:0000:00:06): 94, pid=1, name=x, Contained: SM (0x1)."
    )
    (e,) = xid.parse_kernel_log(line)
    assert (e.code, e.xid_class) == (94, xid.XidClass.HARDWARE)


@pytest.mark.parametrize("code", [13, 31, 43, 45])
def test_application_xids(code):
    assert xid.classify(code) is xid.XidClass.APPLICATION


@pytest.mark.parametrize("code", [48, 63, 64, 74, 79, 92, 94, 95, 119, 120])
def test_hardware_xids(code):
    assert xid.classify(code) is xid.XidClass.HARDWARE


def test_unknown_xid_counts_against_the_node():
    assert xid.classify(9999) is xid.XidClass.UNKNOWN
    c = gh.check_xid([xid.XidEvent(1.0, "0000:00:06", 9999, "")])
    assert c.status is F


def test_application_xid_alone_passes_with_a_note():
    ev = xid.parse_kernel_log((DATA / "xid79" / "dmesg.txt").read_text())
    c = gh.check_xid([e for e in ev if e.code == 13])
    assert c.status is P and "Xid 13" in c.detail
    c = gh.check_xid(ev)
    assert c.status is F and "Xid 79" in c.detail and "1 hardware/unknown, 1 application" in c.detail


def test_only_new_xids_count(tmp_path):
    log = (DATA / "xid79" / "dmesg.txt").read_text()
    first = gh.xid_check(state_dir=tmp_path, log_text=log, log_source="dmesg", boot="boot-a")
    assert first.status is F and "Xid 79" in first.detail
    state = json.loads((tmp_path / gh.XID_STATE_FILE).read_text())
    assert state == {"boot_id": "boot-a", "last_uptime_s": pytest.approx(7301.402117)}
    again = gh.xid_check(state_dir=tmp_path, log_text=log, log_source="dmesg", boot="boot-a")
    assert again.status is P and "no new Xid" in again.detail
    later = log + "[ 8000.000001] NVRM: Xid (PCI:0000:00:06): 48, pid=1, DBE (0x1) detected.\n"
    third = gh.xid_check(state_dir=tmp_path, log_text=later, log_source="dmesg", boot="boot-a")
    assert third.status is F and "Xid 48" in third.detail and "Xid 79" not in third.detail
    # after a reboot the log is the new boot's only: everything in it is new
    rebooted = gh.xid_check(state_dir=tmp_path, log_text=log, log_source="dmesg", boot="boot-b")
    assert rebooted.status is F and "Xid 79" in rebooted.detail


def test_corrupt_xid_state_fails_the_check(tmp_path):
    (tmp_path / gh.XID_STATE_FILE).write_text('{"boot_id": 3}')
    c = gh.xid_check(state_dir=tmp_path, log_text="", log_source="dmesg", boot="b")
    assert c.status is F and "unreadable Xid state" in c.detail


# ---- DCGM ----------------------------------------------------------------------------------------

# Synthetic, in the layout `dcgmi diag -r 1` prints (the H200 node has no DCGM to capture from).
DCGM_TABLE = """\
Successfully ran diagnostic for group.
+---------------------------+------------------------------------------------+
| Diagnostic                | Result                                         |
+===========================+================================================+
|-----  Metadata  ----------+------------------------------------------------|
| DCGM Version              | 3.3.5                                          |
| Number of GPUs Detected   | 1                                              |
|-----  Deployment  --------+------------------------------------------------|
| Denylist                  | Pass                                           |
| NVML Library              | Pass                                           |
| CUDA Main Library         | Pass                                           |
| Permissions and OS Blocks | Pass                                           |
| Persistence Mode          | {persistence}                                           |
| Environment Variables     | Pass                                           |
| Page Retirement/Row Remap | Pass                                           |
| Graphics Processes        | Pass                                           |
| Inforom                   | Pass                                           |
+---------------------------+------------------------------------------------+
"""


def test_dcgm_table():
    rows = gh.parse_dcgmi_diag(DCGM_TABLE.format(persistence="Pass"))
    assert len(rows) == 9 and rows[0] == gh.DcgmResult("Denylist", "Pass")
    assert gh.check_dcgm(0, DCGM_TABLE.format(persistence="Pass")).status is P
    bad = gh.check_dcgm(226, DCGM_TABLE.format(persistence="Fail"))
    assert bad.status is F and "Persistence Mode: Fail" in bad.detail
    assert gh.check_dcgm(0, "Error: unable to connect to host engine").status is F


def test_dcgm_absent_is_skipped(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    c = gh.dcgm_check()
    assert c.status is S and "not installed" in c.detail


# ---- the entry point -----------------------------------------------------------------------------


def test_simulated_node_skips_every_gpu_check_never_passes(tmp_path):
    checks = gh.run_gpu_checks(expect=H200, state_dir=tmp_path, simulated=True)
    assert [c.name for c in checks] == list(gh.ALL_CHECKS)
    assert all(c.status is S and c.detail == "skipped (simulated)" for c in checks)
    assert not any(tmp_path.iterdir()), "a simulated node reads and writes nothing"


@pytest.mark.skipif(bool(glob.glob("/dev/nvidia[0-9]*")), reason="this machine has a GPU")
def test_a_node_without_gpu_fails_the_gpu_checks_with_the_reason(tmp_path):
    checks = gh.run_gpu_checks(expect=H200, state_dir=tmp_path, simulated=False)
    assert [c.name for c in checks] == list(gh.ALL_CHECKS)
    for c in checks[: len(gh.FACT_CHECKS)]:
        assert c.status is F and "NVML" in c.detail and "nvidia-smi" in c.detail, c
    assert by_name(checks, "gpu.xid").status in (P, F)  # depends on whether this kernel log is readable
    assert all(c.status is not P for c in checks if c.name != "gpu.xid")

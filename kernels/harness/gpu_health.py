"""GPU health of a node: the facts NVML (or nvidia-smi) reports, and the checks a rollout gates on.

Facts come from NVML through nvidia-ml-py; where NVML cannot be loaded or initialised, from `nvidia-smi -q -x`
plus one `--query-gpu` CSV for the compute capability (the XML has none). Parsers and checks are pure
functions of text or dicts, so the tests run them on output captured on a real H200; only the `read_*`
functions and `run_gpu_checks` touch the machine.

Every check is passed, failed or skipped. A check that could not run (no NVML and no nvidia-smi, an
unreadable kernel log) is failed with the reason: a node is not called healthy for want of evidence.
Skipped means simulated, not applicable to this GPU, not set in the spec, or a tool (DCGM) not installed.
"""

from __future__ import annotations

import csv
import enum
import io
import json
import os
import shutil
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kernels.harness import xid

SIMULATED_DETAIL = "skipped (simulated)"
XID_STATE_FILE = "xid-state.json"
COMMAND_TIMEOUT_S = 30
DCGM_TIMEOUT_S = 300  # `dcgmi diag -r 1` takes seconds; the margin is for a host engine that starts on demand


class CheckStatus(enum.Enum):
    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class Check:
    name: str
    status: CheckStatus
    detail: str

    def as_dict(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status.value, "detail": self.detail}


@dataclass(frozen=True)
class GpuExpectations:
    """What the fleet spec says a node has. None: not set, and its check is skipped with the facts found."""

    count: int | None = None
    model: str | None = None  # matched case-insensitively inside the GPU name: "H200" in "NVIDIA H200"
    cc: str | None = None  # "9.0"
    driver: str | None = None  # "580.159.04", or a prefix of its dotted parts: "580" (the branch)
    cuda: str | None = None  # the stack's CUDA runtime, "13.0": the driver must support at least this


@dataclass(frozen=True)
class GpuFacts:
    index: int
    name: str
    pci_bus_id: str | None = None
    cc: str | None = None
    persistence: bool | None = None
    ecc_enabled: bool | None = None
    ecc_uncorrected_volatile: int | None = None
    ecc_corrected_volatile: int | None = None
    # Pre-Ampere GPUs retire pages; Ampere and newer remap rows and report retired pages as N/A (None).
    retired_pages_sbe: int | None = None
    retired_pages_dbe: int | None = None
    retired_pages_pending: bool | None = None
    remapped_correctable: int | None = None
    remapped_uncorrectable: int | None = None
    remapped_pending: bool | None = None
    remapped_failure: bool | None = None
    clock_event_reasons: int | None = None  # NVML bitmask, see CLOCK_REASONS
    sm_clock_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None


@dataclass(frozen=True)
class NodeFacts:
    source: str  # "nvml" or "nvidia-smi"
    driver: str | None
    cuda_driver: str | None  # the newest CUDA version the driver supports, "13.0"
    gpus: tuple[GpuFacts, ...] = field(default_factory=tuple)


# NVML's clock event reason bits (nvmlClocksEventReason*, before driver 535 nvmlClocksThrottleReason*: same
# bits). Benign: the clock is low because the GPU is idle, or held where the operator set it, or regulated by
# the power limit under load (the normal governor). Bad: the board, the thermal protection or the power brake
# pulls the clock down, which is what makes a bench slow for reasons no release is to blame for.
CLOCK_REASONS: dict[int, tuple[str, bool]] = {
    0x1: ("gpu_idle", True),
    0x2: ("applications_clocks_setting", True),
    0x4: ("sw_power_cap", True),
    0x8: ("hw_slowdown", False),
    0x10: ("sync_boost", True),
    0x20: ("sw_thermal_slowdown", False),
    0x40: ("hw_thermal_slowdown", False),
    0x80: ("hw_power_brake_slowdown", False),
    0x100: ("display_clocks_setting", True),
    0x200: ("board_limit", False),
    0x400: ("reliability", False),
}
_REASON_BIT = {name: bit for bit, (name, _) in CLOCK_REASONS.items()}


def clock_reasons(mask: int) -> tuple[list[str], list[str]]:
    """(benign, bad) reason names active in an NVML bitmask; a bit this table does not know counts as bad."""
    benign: list[str] = []
    bad: list[str] = []
    for bit in range(mask.bit_length()):
        b = 1 << bit
        if mask & b:
            name, ok = CLOCK_REASONS.get(b, (f"unknown_0x{b:x}", False))
            (benign if ok else bad).append(name)
    return benign, bad


# ---- parsers: pure -------------------------------------------------------------------------------


def facts_from_nvml_dump(dump: dict[str, Any]) -> NodeFacts:
    """NodeFacts from the dict `nvml_dump()` returns (the same shape as tests/data/gpu/*/nvml.json)."""
    cuda = dump.get("cuda_driver")
    gpus = []
    for g in dump.get("gpus", []):
        rr = g.get("remapped_rows")
        rp = g.get("retired_pages")
        ecc = g.get("ecc_mode")
        cc = g.get("cc")
        gpus.append(
            GpuFacts(
                index=int(g["index"]),
                name=str(g["name"]),
                pci_bus_id=g.get("pci_bus_id"),
                cc=f"{cc[0]}.{cc[1]}" if cc else None,
                persistence=None if g.get("persistence") is None else bool(g["persistence"]),
                ecc_enabled=None if ecc is None else bool(ecc[0]),
                ecc_uncorrected_volatile=g.get("ecc_uncorrected_volatile"),
                ecc_corrected_volatile=g.get("ecc_corrected_volatile"),
                retired_pages_sbe=None if rp is None else rp[0],
                retired_pages_dbe=None if rp is None else rp[1],
                retired_pages_pending=None if rp is None else bool(rp[2]),
                remapped_correctable=None if rr is None else rr[0],
                remapped_uncorrectable=None if rr is None else rr[1],
                remapped_pending=None if rr is None else bool(rr[2]),
                remapped_failure=None if rr is None else bool(rr[3]),
                clock_event_reasons=g.get("clock_event_reasons"),
                sm_clock_mhz=g.get("clocks_sm"),
                sm_clock_max_mhz=g.get("clocks_sm_max"),
                temperature_c=g.get("temperature"),
                power_w=None if g.get("power_mw") is None else g["power_mw"] / 1000.0,
            )
        )
    # NVML encodes CUDA 13.0 as 13000 (1000 x major + 10 x minor)
    cuda_s = None if cuda is None else f"{int(cuda) // 1000}.{int(cuda) % 1000 // 10}"
    return NodeFacts("nvml", dump.get("driver"), cuda_s, tuple(gpus))


def _na(text: str | None) -> str | None:
    if text is None:
        return None
    t = text.strip()
    return (
        None
        if t in ("", "N/A", "[N/A]", "Unknown Error", "Requested functionality has been deprecated")
        else t
    )


def _num(text: str | None) -> float | None:
    """'345 MHz' -> 345.0, '99.64 W' -> 99.64, 'N/A' -> None."""
    t = _na(text)
    if t is None:
        return None
    try:
        return float(t.split()[0])
    except ValueError:
        return None


def _int(text: str | None) -> int | None:
    v = _num(text)
    return None if v is None else int(v)


def _yes(text: str | None) -> bool | None:
    t = _na(text)
    if t is None:
        return None
    return t.lower() in ("yes", "enabled", "active", "true")


def _sum(*vals: int | None) -> int | None:
    known = [v for v in vals if v is not None]
    return sum(known) if known else None


def parse_smi_xml(text: str, *, compute_caps: dict[str, str] | None = None) -> NodeFacts:
    """NodeFacts from `nvidia-smi -q -x`. `compute_caps` maps a PCI bus id to its cc (from the CSV query)."""
    root = ET.fromstring(text)
    caps = {k.lower(): v for k, v in (compute_caps or {}).items()}
    gpus = []
    for i, g in enumerate(root.findall("gpu")):
        bus = g.get("id") or g.findtext("pci/pci_bus_id")
        # Hopper reports ECC per SRAM and DRAM; older GPUs as single_bit / double_bit totals
        vol = "ecc_errors/volatile/"
        unc = _sum(
            _int(g.findtext(vol + "dram_uncorrectable")),
            _int(g.findtext(vol + "sram_uncorrectable_parity")),
            _int(g.findtext(vol + "sram_uncorrectable_secded")),
            _int(g.findtext(vol + "sram_uncorrectable")),
            _int(g.findtext(vol + "double_bit/total")),
        )
        corr = _sum(
            _int(g.findtext(vol + "dram_correctable")),
            _int(g.findtext(vol + "sram_correctable")),
            _int(g.findtext(vol + "single_bit/total")),
        )
        # pre-535 drivers name the block clocks_throttle_reasons / clocks_throttle_reason_*
        mask = None
        for block, prefix in (("clocks_event_reasons", "clocks_event_reason_"),
                              ("clocks_throttle_reasons", "clocks_throttle_reason_")):  # fmt: skip
            el = g.find(block)
            if el is None:
                continue
            mask = 0
            for child in el:
                name = child.tag.removeprefix(prefix)
                if _yes(child.text):
                    mask |= _REASON_BIT.get(name, 0)
            break
        pend = _yes(g.findtext("retired_pages/pending_retirement"))
        pend_bl = _yes(g.findtext("retired_pages/pending_blacklist"))
        gpus.append(
            GpuFacts(
                index=i,  # nvidia-smi lists GPUs in PCI bus order, as NVML numbers them
                name=(g.findtext("product_name") or "").strip(),
                pci_bus_id=bus,
                cc=caps.get((bus or "").lower()),
                persistence=_yes(g.findtext("persistence_mode")),
                ecc_enabled=_yes(g.findtext("ecc_mode/current_ecc")),
                ecc_uncorrected_volatile=unc,
                ecc_corrected_volatile=corr,
                retired_pages_sbe=_int(
                    g.findtext("retired_pages/multiple_single_bit_retirement/retired_count")
                ),
                retired_pages_dbe=_int(g.findtext("retired_pages/double_bit_retirement/retired_count")),
                retired_pages_pending=None if pend is None and pend_bl is None else bool(pend or pend_bl),
                remapped_correctable=_int(g.findtext("remapped_rows/remapped_row_corr")),
                remapped_uncorrectable=_int(g.findtext("remapped_rows/remapped_row_unc")),
                remapped_pending=_yes(g.findtext("remapped_rows/remapped_row_pending")),
                remapped_failure=_yes(g.findtext("remapped_rows/remapped_row_failure")),
                clock_event_reasons=mask,
                sm_clock_mhz=_num(g.findtext("clocks/sm_clock")),
                sm_clock_max_mhz=_num(g.findtext("max_clocks/sm_clock")),
                temperature_c=_num(g.findtext("temperature/gpu_temp")),
                power_w=_num(g.findtext("gpu_power_readings/instant_power_draw"))
                or _num(g.findtext("gpu_power_readings/power_draw"))
                or _num(g.findtext("power_readings/power_draw")),
            )
        )
    return NodeFacts("nvidia-smi", _na(root.findtext("driver_version")), _na(root.findtext("cuda_version")),
                     tuple(gpus))  # fmt: skip


def parse_query_csv(text: str) -> list[dict[str, str | None]]:
    """Rows of `nvidia-smi --query-*=... --format=csv`: keys without their unit ('memory.total [MiB]' ->
    'memory.total'), values stripped, 'N/A' / '[N/A]' as None."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return []
    reader = csv.reader(io.StringIO("\n".join(lines)), skipinitialspace=True)
    header = [h.split(" [")[0].strip() for h in next(reader)]
    return [{k: _na(v) for k, v in zip(header, row, strict=False)} for row in reader]


def clock_reasons_from_csv(row: dict[str, str | None]) -> int:
    """The reason bitmask from one CSV row of `--query-gpu=clocks_event_reasons.*` or of the pre-535 names
    `clocks_throttle_reasons.*` (drivers that accept the old names print the new ones in the header)."""
    mask = 0
    for key, val in row.items():
        for prefix in ("clocks_event_reasons.", "clocks_throttle_reasons."):
            if not key.startswith(prefix) or val is None:
                continue
            name = key.removeprefix(prefix)
            if name in ("active", "supported"):
                if name == "active":
                    mask |= int(val, 16)
            elif val.lower() == "active":
                mask |= _REASON_BIT.get(name, 0)
    return mask


@dataclass(frozen=True)
class DcgmResult:
    test: str
    result: str  # Pass | Fail | Warn | Skip, as dcgmi prints it


def parse_dcgmi_diag(text: str) -> list[DcgmResult]:
    """The `| test | result |` rows of `dcgmi diag -r 1`'s table; section rules and metadata are dropped."""
    out = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|+").split("|")]
        if len(cells) != 2 or not cells[0] or cells[0].startswith("-") or cells[0] == "Diagnostic":
            continue
        first = cells[1].split()[0] if cells[1] else ""
        if first in ("Pass", "Fail", "Warn", "Skip"):
            out.append(DcgmResult(cells[0], first))
    return out


# ---- checks: pure --------------------------------------------------------------------------------


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.strip().split(".") if p.isdigit())


def _each(facts: NodeFacts, attr: str) -> list[tuple[GpuFacts, Any]]:
    return [(g, getattr(g, attr)) for g in facts.gpus]


def check_facts(*, facts: NodeFacts, expect: GpuExpectations) -> list[Check]:
    """Every fact-based GPU check, in a fixed order, from facts already read."""
    P, F, S = CheckStatus.PASSED, CheckStatus.FAILED, CheckStatus.SKIPPED
    gpus = facts.gpus
    out: list[Check] = []
    names = sorted({g.name for g in gpus})
    found = f"{len(gpus)} x {', '.join(names) or 'no GPU'}"

    if expect.count is None:
        out.append(Check("gpu.count", S, f"not set in the spec; found {len(gpus)}"))
    else:
        ok = len(gpus) == expect.count
        out.append(Check("gpu.count", P if ok else F, f"{len(gpus)} GPU(s), spec {expect.count}"))

    if expect.model is None:
        out.append(Check("gpu.model", S, f"not set in the spec; found {found}"))
    else:
        wrong = [f"GPU {g.index}: {g.name}" for g in gpus if expect.model.lower() not in g.name.lower()]
        if not gpus:
            out.append(Check("gpu.model", F, f"no GPU found, spec {expect.model}"))
        else:
            det = f"{found}, spec {expect.model}" + (f"; not matching: {', '.join(wrong)}" if wrong else "")
            out.append(Check("gpu.model", F if wrong else P, det))

    ccs = {g.index: g.cc for g in gpus}
    unknown = [i for i, c in ccs.items() if c is None]
    distinct = sorted({c for c in ccs.values() if c is not None})
    per = ", ".join(f"GPU {i}: {c or 'unknown'}" for i, c in ccs.items())
    if not gpus:
        out.append(Check("gpu.compute_capability", F, "no GPU found"))
    elif unknown:
        out.append(Check("gpu.compute_capability", F, f"could not read the compute capability ({per})"))
    elif len(distinct) > 1:
        out.append(Check("gpu.compute_capability", F, f"mixed architectures on one node: {per}"))
    elif expect.cc is not None and distinct != [expect.cc]:
        out.append(Check("gpu.compute_capability", F, f"cc {distinct[0]} on every GPU, spec {expect.cc}"))
    else:
        spec = f", spec {expect.cc}" if expect.cc else " (spec sets none)"
        out.append(Check("gpu.compute_capability", P, f"cc {distinct[0]} on all {len(gpus)} GPU(s){spec}"))

    if facts.driver is None:
        out.append(Check("gpu.driver", F, f"could not read the driver version ({facts.source})"))
    elif expect.driver is None:
        out.append(Check("gpu.driver", S, f"not set in the stack; found {facts.driver}"))
    else:
        want = _version_tuple(expect.driver)
        ok = _version_tuple(facts.driver)[: len(want)] == want
        out.append(Check("gpu.driver", P if ok else F, f"driver {facts.driver}, stack {expect.driver}"))

    if facts.cuda_driver is None:
        out.append(Check("gpu.cuda", F, f"could not read the driver's CUDA version ({facts.source})"))
    elif expect.cuda is None:
        out.append(Check("gpu.cuda", S, f"not set in the stack; driver supports CUDA {facts.cuda_driver}"))
    else:
        # a driver runs any CUDA runtime up to the version it reports, so the stack's must not be newer
        ok = _version_tuple(facts.cuda_driver) >= _version_tuple(expect.cuda)
        out.append(Check("gpu.cuda", P if ok else F,
                         f"driver supports CUDA {facts.cuda_driver}, stack needs {expect.cuda}"))  # fmt: skip

    out.append(_per_gpu("gpu.persistence", gpus, lambda g: None if g.persistence is None else (
        g.persistence, "enabled" if g.persistence else "disabled")))  # fmt: skip

    def ecc(g: GpuFacts) -> tuple[bool, str] | None:
        if g.ecc_enabled is False:
            return False, "ECC disabled (uncorrected errors would go unseen)"
        if g.ecc_uncorrected_volatile is None:
            return None
        n = g.ecc_uncorrected_volatile
        return n == 0, f"{n} uncorrected, {g.ecc_corrected_volatile or 0} corrected (volatile)"

    out.append(_per_gpu("gpu.ecc", gpus, ecc))

    if gpus and all(g.retired_pages_sbe is None and g.retired_pages_pending is None for g in gpus):
        out.append(Check("gpu.retired_pages", S, "not reported by this GPU (it remaps rows instead)"))
    else:
        out.append(_per_gpu("gpu.retired_pages", gpus, _retired))

    def remap(g: GpuFacts) -> tuple[bool, str] | None:
        if g.remapped_pending is None and g.remapped_failure is None:
            return None
        bad = [w for w, on in (("remap pending (reset the GPU)", g.remapped_pending),
                               ("remapping failed", g.remapped_failure)) if on]  # fmt: skip
        base = (
            f"{g.remapped_correctable or 0} correctable, {g.remapped_uncorrectable or 0} uncorrectable rows"
        )
        return not bad, "; ".join([base, *bad])

    if (
        gpus
        and all(g.remapped_pending is None and g.remapped_failure is None for g in gpus)
        and any(g.retired_pages_pending is not None for g in gpus)
    ):
        out.append(Check("gpu.remapped_rows", S, "not reported by this GPU (it retires pages instead)"))
    else:
        out.append(_per_gpu("gpu.remapped_rows", gpus, remap))

    def reasons(g: GpuFacts) -> tuple[bool, str] | None:
        if g.clock_event_reasons is None:
            return None
        benign, bad = clock_reasons(g.clock_event_reasons)
        text = f"0x{g.clock_event_reasons:x} " + (", ".join(bad + benign) or "none")
        clk = (
            f" (SM {g.sm_clock_mhz:.0f}/{g.sm_clock_max_mhz:.0f} MHz)"
            if g.sm_clock_mhz and g.sm_clock_max_mhz
            else ""
        )
        return not bad, text + clk

    out.append(_per_gpu("gpu.clock_event_reasons", gpus, reasons))
    return out


def _retired(g: GpuFacts) -> tuple[bool, str] | None:
    if g.retired_pages_pending is None:
        return None
    text = f"{g.retired_pages_sbe or 0} single-bit, {g.retired_pages_dbe or 0} double-bit retired"
    return not g.retired_pages_pending, text + (
        ", retirement pending (reset the GPU)" if g.retired_pages_pending else ""
    )


def _per_gpu(
    name: str, gpus: tuple[GpuFacts, ...], fn: Callable[[GpuFacts], tuple[bool, str] | None]
) -> Check:
    """One check over every GPU: failed when any GPU fails or could not be read, the detail naming which."""
    if not gpus:
        return Check(name, CheckStatus.FAILED, "no GPU found")
    parts, ok = [], True
    for g in gpus:
        r = fn(g)
        if r is None:
            ok = False
            parts.append(f"GPU {g.index}: could not read")
        else:
            ok &= r[0]
            parts.append(f"GPU {g.index}: {r[1]}")
    return Check(name, CheckStatus.PASSED if ok else CheckStatus.FAILED, "; ".join(parts))


def check_xid(events: list[xid.XidEvent]) -> Check:
    """Failed on any new hardware or unknown Xid; application Xids are listed but pass (the application's
    fault, cleared by restarting it)."""
    hw = [e for e in events if e.xid_class is not xid.XidClass.APPLICATION]
    app = [e for e in events if e.xid_class is xid.XidClass.APPLICATION]
    if not events:
        return Check("gpu.xid", CheckStatus.PASSED, "no new Xid events")
    parts = [e.summary() for e in hw + app]
    head = f"{len(hw)} hardware/unknown, {len(app)} application Xid event(s) new: "
    return Check("gpu.xid", CheckStatus.FAILED if hw else CheckStatus.PASSED, head + "; ".join(parts))


def check_dcgm(rc: int, text: str) -> Check:
    rows = parse_dcgmi_diag(text)
    failed = [f"{r.test}: {r.result}" for r in rows if r.result == "Fail"]
    warned = [f"{r.test}: {r.result}" for r in rows if r.result == "Warn"]
    if rc != 0 or failed or not rows:
        why = "; ".join(failed) or (text.strip().splitlines() or ["no output"])[-1]
        return Check("gpu.dcgm_diag", CheckStatus.FAILED, f"dcgmi diag -r 1 exit {rc}: {why}")
    det = f"{len(rows)} tests passed" + (f"; warnings: {'; '.join(warned)}" if warned else "")
    return Check("gpu.dcgm_diag", CheckStatus.PASSED, det)


FACT_CHECKS = (
    "gpu.count", "gpu.model", "gpu.compute_capability", "gpu.driver", "gpu.cuda", "gpu.persistence",
    "gpu.ecc", "gpu.retired_pages", "gpu.remapped_rows", "gpu.clock_event_reasons",
)  # fmt: skip
ALL_CHECKS = (*FACT_CHECKS, "gpu.xid", "gpu.dcgm_diag")


# ---- I/O -----------------------------------------------------------------------------------------


def nvml_dump() -> dict[str, Any]:
    """The node's GPU facts through NVML, as a plain dict (see facts_from_nvml_dump). Raises when NVML cannot
    be loaded or initialised; a field this GPU does not support is None."""
    import pynvml as n

    def opt(fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except n.NVMLError:
            return None

    n.nvmlInit()
    try:
        out: dict[str, Any] = {
            "driver": _text(n.nvmlSystemGetDriverVersion()),
            "cuda_driver": opt(n.nvmlSystemGetCudaDriverVersion),
            "gpus": [],
        }
        # drivers before 535 have only the "throttle" name of the same call
        reasons_fn = (
            getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or n.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        for i in range(n.nvmlDeviceGetCount()):
            h = n.nvmlDeviceGetHandleByIndex(i)
            pci = opt(n.nvmlDeviceGetPciInfo, h)
            sbe = opt(
                n.nvmlDeviceGetRetiredPages, h, n.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
            )
            dbe = opt(n.nvmlDeviceGetRetiredPages, h, n.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
            pend = opt(n.nvmlDeviceGetRetiredPagesPendingStatus, h)
            power = opt(n.nvmlDeviceGetPowerUsage, h)
            out["gpus"].append({
                "index": i,
                "name": _text(n.nvmlDeviceGetName(h)),
                "pci_bus_id": None if pci is None else _text(pci.busId),
                "cc": opt(n.nvmlDeviceGetCudaComputeCapability, h),
                "persistence": opt(n.nvmlDeviceGetPersistenceMode, h),
                "ecc_mode": opt(n.nvmlDeviceGetEccMode, h),
                "ecc_uncorrected_volatile": opt(n.nvmlDeviceGetTotalEccErrors, h,
                                                n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC),
                "ecc_corrected_volatile": opt(n.nvmlDeviceGetTotalEccErrors, h,
                                              n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC),
                "retired_pages": None if pend is None else [len(sbe or []), len(dbe or []), int(pend)],
                "remapped_rows": opt(n.nvmlDeviceGetRemappedRows, h),
                "clock_event_reasons": opt(reasons_fn, h),
                "clocks_sm": opt(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_SM),
                "clocks_sm_max": opt(n.nvmlDeviceGetMaxClockInfo, h, n.NVML_CLOCK_SM),
                "temperature": opt(n.nvmlDeviceGetTemperature, h, n.NVML_TEMPERATURE_GPU),
                "power_mw": power,
            })  # fmt: skip
        for g in out["gpus"]:
            if g["remapped_rows"] is not None:
                g["remapped_rows"] = list(g["remapped_rows"])
            if g["cc"] is not None:
                g["cc"] = list(g["cc"])
            if g["ecc_mode"] is not None:
                g["ecc_mode"] = list(g["ecc_mode"])
        return out
    finally:
        n.nvmlShutdown()


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _run(cmd: list[str], timeout: float = COMMAND_TIMEOUT_S) -> tuple[int, str]:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        return 127, f"{cmd[0]}: not found"
    except subprocess.TimeoutExpired:
        return 124, f"{' '.join(cmd)}: timed out after {timeout:.0f}s"
    return p.returncode, p.stdout if p.returncode == 0 else (p.stderr or p.stdout)


def read_smi() -> NodeFacts:
    """Facts from nvidia-smi; raises RuntimeError with its message when it cannot run."""
    rc, xml = _run(["nvidia-smi", "-q", "-x"])
    if rc != 0:
        raise RuntimeError(f"nvidia-smi -q -x: exit {rc}: {xml.strip()[:200]}")
    rc, csv_text = _run(["nvidia-smi", "--query-gpu=pci.bus_id,compute_cap", "--format=csv"])
    caps = {}
    if rc == 0:  # compute_cap needs driver 510+; without it the cc check fails as unreadable
        caps = {r["pci.bus_id"] or "": r.get("compute_cap") or "" for r in parse_query_csv(csv_text)}
    return parse_smi_xml(xml, compute_caps={k: v for k, v in caps.items() if v})


def read_facts() -> tuple[NodeFacts | None, str]:
    """(facts, "") from NVML, else from nvidia-smi, else (None, why both failed)."""
    try:
        return facts_from_nvml_dump(nvml_dump()), ""
    except Exception as e:  # noqa: BLE001  (any NVML failure falls back to nvidia-smi)
        nvml_err = f"NVML: {type(e).__name__}: {e}"
    try:
        return read_smi(), ""
    except Exception as e:  # noqa: BLE001
        return None, f"{nvml_err}; nvidia-smi: {e}"


def read_kernel_log() -> tuple[str | None, str]:
    """(text, source) of the kernel log with seconds-since-boot stamps, or (None, why it is unreadable)."""
    errors = []
    for cmd in (["dmesg"], ["journalctl", "-k", "-o", "short-monotonic", "--no-pager", "-q"]):
        rc, out = _run(cmd)
        if rc == 0:
            return out, cmd[0]
        errors.append(f"{cmd[0]}: {out.strip().splitlines()[-1] if out.strip() else f'exit {rc}'}")
    return None, "; ".join(errors)


def boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def xid_check(
    *, state_dir: Path, log_text: str | None = None, log_source: str = "", boot: str | None = None
) -> Check:
    """New Xid events since the last call with the same state_dir, which is then updated (atomically)."""
    if log_text is None:
        log_text, log_source = read_kernel_log()
        if log_text is None:
            return Check("gpu.xid", CheckStatus.FAILED, f"kernel log not readable: {log_source}")
    state_file = state_dir / XID_STATE_FILE
    previous = None
    if state_file.exists():
        try:
            previous = xid.XidState.from_dict(json.loads(state_file.read_text()))
        except (ValueError, OSError) as e:
            return Check("gpu.xid", CheckStatus.FAILED, f"unreadable Xid state {state_file}: {e}")
    fresh, state = xid.new_events(
        xid.parse_kernel_log(log_text), previous=previous, boot_id=boot or boot_id()
    )
    state_dir.mkdir(parents=True, exist_ok=True)
    tmp = state_file.with_name(f".{state_file.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(state.as_dict()))
    tmp.replace(state_file)
    c = check_xid(fresh)
    return Check(c.name, c.status, f"{c.detail} (from {log_source})" if log_source else c.detail)


def dcgm_check() -> Check:
    exe = shutil.which("dcgmi")
    if exe is None:
        return Check("gpu.dcgm_diag", CheckStatus.SKIPPED, "DCGM not installed (no dcgmi on PATH)")
    rc, out = _run([exe, "diag", "-r", "1"], timeout=DCGM_TIMEOUT_S)
    return check_dcgm(rc, out)


def run_gpu_checks(*, expect: GpuExpectations, state_dir: Path, simulated: bool) -> list[Check]:
    """Every GPU check of this node, in ALL_CHECKS order. `state_dir` (the node's root, or a folder under it)
    keeps the Xid state between runs. On a simulated node every check is skipped and nothing is read."""
    if simulated:
        return [Check(name, CheckStatus.SKIPPED, SIMULATED_DETAIL) for name in ALL_CHECKS]
    facts, why = read_facts()
    if facts is None:
        out = [Check(name, CheckStatus.FAILED, f"could not read the GPU: {why}") for name in FACT_CHECKS]
    else:
        out = check_facts(facts=facts, expect=expect)
    return [*out, xid_check(state_dir=state_dir), dcgm_check()]


def checks_as_json(checks: list[Check]) -> str:
    return json.dumps([c.as_dict() for c in checks], indent=1)


def facts_as_dict(facts: NodeFacts) -> dict[str, Any]:
    return asdict(facts)

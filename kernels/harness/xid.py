"""Xid events: NVIDIA's catalogue of driver error codes, the kernel-log parser, and which events are new.

The driver logs every Xid to the kernel ring buffer as
    NVRM: Xid (PCI:0000:2b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
`dmesg` prints it behind the seconds since boot (`[  123.456789] NVRM: ...`), and so does
`journalctl -k -o short-monotonic` (`[  123.456789] host kernel: NVRM: ...`), so one parser reads both.

Classes follow the "Resolution Bucket" of NVIDIA's Xid catalogue (docs.nvidia.com/deploy/xid-errors, Ampere
and newer): an APPLICATION Xid is fixed by restarting the application that caused it (a bad kernel, a fault
in user code) and says nothing against the node; a HARDWARE Xid (memory, bus, NVLink, GSP firmware, driver)
needs a GPU reset, a reboot or a support case, so the node is unhealthy. A code missing from the table below
is UNKNOWN and counted against the node: a gate is safer refusing a node for an unlisted code than
deploying onto it.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass


class XidClass(enum.Enum):
    APPLICATION = "application"
    HARDWARE = "hardware"
    UNKNOWN = "unknown"


# code -> (catalogue description, class). Application: the catalogue's immediate action is RESTART_APP and
# the cause is the program. Hardware: RESET_GPU / RESTART_BM / CONTACT_SUPPORT, or a memory, bus or firmware
# fault even where the application is what the driver kills (94: the contained ECC error still marks a row).
CATALOGUE: dict[int, tuple[str, XidClass]] = {
    8: ("GPU stopped processing (channel idle timeout)", XidClass.APPLICATION),
    13: ("Graphics Engine Exception", XidClass.APPLICATION),
    31: ("GPU memory page fault (MMU fault)", XidClass.APPLICATION),
    43: ("GPU stopped processing (channel reset)", XidClass.APPLICATION),
    45: ("Preemptive cleanup, due to previous errors", XidClass.APPLICATION),
    68: ("Video processor exception (NVDEC)", XidClass.APPLICATION),
    69: ("Graphics Engine class error", XidClass.APPLICATION),
    32: ("Invalid or corrupted push buffer stream", XidClass.HARDWARE),
    38: ("Driver firmware error", XidClass.HARDWARE),
    48: ("Double Bit ECC Error", XidClass.HARDWARE),
    57: ("Error programming video memory interface", XidClass.HARDWARE),
    58: ("Unstable video memory interface detected", XidClass.HARDWARE),
    61: ("Internal micro-controller breakpoint/warning", XidClass.HARDWARE),
    62: ("Internal micro-controller halt", XidClass.HARDWARE),
    63: ("ECC page retirement or row remapping recording event", XidClass.HARDWARE),
    64: ("ECC page retirement or row remapper recording failure", XidClass.HARDWARE),
    74: ("NVLink Error", XidClass.HARDWARE),
    79: ("GPU has fallen off the bus", XidClass.HARDWARE),
    92: ("High single-bit ECC error rate", XidClass.HARDWARE),
    94: ("Contained ECC error", XidClass.HARDWARE),
    95: ("Uncontained ECC error", XidClass.HARDWARE),
    119: ("GSP RPC Timeout", XidClass.HARDWARE),
    120: ("GSP Error", XidClass.HARDWARE),
    121: ("C2C Link corrected error", XidClass.HARDWARE),
    122: ("SPI PMU RPC read failure", XidClass.HARDWARE),
    123: ("SPI PMU RPC write failure", XidClass.HARDWARE),
    140: ("Unrecovered ECC error", XidClass.HARDWARE),
    143: ("GPU initialization failure", XidClass.HARDWARE),
    154: ("GPU recovery action changed (reset or reboot required)", XidClass.HARDWARE),
}


def classify(code: int) -> XidClass:
    return CATALOGUE[code][1] if code in CATALOGUE else XidClass.UNKNOWN


def describe(code: int) -> str:
    return CATALOGUE[code][0] if code in CATALOGUE else "not in this catalogue"


@dataclass(frozen=True)
class XidEvent:
    uptime_s: float  # seconds since boot, as the kernel stamps it
    pci: str  # the GPU's bus id as the driver prints it, e.g. "0000:2b:00"
    code: int
    message: str  # the rest of the line after the code

    @property
    def xid_class(self) -> XidClass:
        return classify(self.code)

    def summary(self) -> str:
        what = f"{describe(self.code)}, {self.xid_class.value}"
        return f"Xid {self.code} ({what}) on {self.pci} at {self.uptime_s:.0f}s"


_LINE = re.compile(
    r"^\[\s*(?P<t>\d+(?:\.\d+)?)\]\s+(?:.*?\bkernel:\s+)?NVRM: Xid \((?:PCI:)?(?P<pci>[^)]*)\):\s*"
    r"(?P<code>\d+)\s*,?\s*(?P<msg>.*)$"
)


def parse_kernel_log(text: str) -> list[XidEvent]:
    """Every Xid line of `dmesg` or `journalctl -k -o short-monotonic` output, in log order. Other kernel
    lines (NVRM's own chatter included) are not events."""
    out = []
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if m:
            out.append(XidEvent(float(m["t"]), m["pci"], int(m["code"]), m["msg"].strip()))
    return out


@dataclass(frozen=True)
class XidState:
    """What the last check saw: the boot it ran in and the latest Xid's time since that boot."""

    boot_id: str
    last_uptime_s: float

    def as_dict(self) -> dict[str, object]:
        return {"boot_id": self.boot_id, "last_uptime_s": self.last_uptime_s}

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> XidState:
        boot, last = d.get("boot_id"), d.get("last_uptime_s")
        if not isinstance(boot, str) or not isinstance(last, int | float):
            raise ValueError(f"Xid state needs boot_id (string) and last_uptime_s (number), got {d!r}")
        return cls(boot, float(last))


def new_events(
    events: list[XidEvent], *, previous: XidState | None, boot_id: str
) -> tuple[list[XidEvent], XidState]:
    """The events not seen by the previous check, and the state to save for the next one.

    The kernel log holds the current boot only, so after a reboot (another boot id) or on a first check
    every event in it is new: an Xid since boot still describes the GPU as it is now."""
    if previous is not None and previous.boot_id == boot_id:
        fresh = [e for e in events if e.uptime_s > previous.last_uptime_s]
        last = previous.last_uptime_s
    else:
        fresh, last = list(events), 0.0
    if events:
        last = max(last, max(e.uptime_s for e in events))
    return fresh, XidState(boot_id, last)

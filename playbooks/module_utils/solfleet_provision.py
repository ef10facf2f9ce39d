"""Provisioning on a node: gather the facts preflight and the driver role decide on, check them, and choose
the driver action. Stdlib only (runs under the node's base interpreter, before any runtime exists).

`gather_facts` is the only part that reads the machine; `preflight_checks` and `driver_decision` are pure
functions of the facts, so they can be run in check mode against facts captured from a real GPU node
(tests/fleet/data/h200-node-facts.json).
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess

NVIDIA_SMI_QUERY = "name,pci.bus_id,driver_version,persistence_mode,compute_cap,memory.total"
# /etc/os-release ID -> the distribution name used in provision.supported_os (Ansible's spelling)
OS_NAMES = {
    "debian": "Debian",
    "ubuntu": "Ubuntu",
    "rhel": "RedHat",
    "rocky": "Rocky",
    "almalinux": "AlmaLinux",
    "centos": "CentOS",
    "fedora": "Fedora",
}
OS_FAMILY = {"Debian": "Debian", "Ubuntu": "Debian"}  # others: RedHat


def pin_matches(pin: str, actual: str) -> bool:
    return actual == pin or actual.startswith(pin + ".") or fnmatch.fnmatchcase(actual, pin)


def _run(argv: list[str], timeout_s: float = 20.0) -> tuple[int, str]:
    if shutil.which(argv[0]) is None and not os.path.isabs(argv[0]):
        return 127, ""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return 127, ""
    return proc.returncode, proc.stdout


def parse_os_release(text: str) -> dict:
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip().strip('"')
    distro = OS_NAMES.get(values.get("ID", "").lower(), values.get("NAME", "unknown").split(" ")[0])
    return {
        "distribution": distro,
        "version": values.get("VERSION_ID", ""),
        "family": OS_FAMILY.get(distro, "RedHat" if distro in OS_NAMES.values() else "unknown"),
    }


def parse_nvidia_smi_csv(text: str) -> list[dict]:
    """`nvidia-smi --query-gpu=NVIDIA_SMI_QUERY --format=csv,noheader` -> one dict per GPU."""
    gpus = []
    for line in text.strip().splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) < 6:
            continue
        memory = re.match(r"(\d+)", cols[5])
        gpus.append(
            {
                "name": cols[0],
                "bus_id": cols[1],
                "driver": cols[2],
                "persistence": cols[3].lower() == "enabled",
                "cc": cols[4],
                "memory_mib": int(memory.group(1)) if memory else None,
            }
        )
    return gpus


def parse_proc_driver_version(text: str) -> str | None:
    """`/proc/driver/nvidia/version`:
    'NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04 ...'"""
    m = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
    return m.group(1) if m else None


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def _free_mb(path: str) -> int:
    while path and not os.path.exists(path):
        path = os.path.dirname(path)
    return shutil.disk_usage(path or "/").free >> 20


def _driver_packages(manager: str) -> tuple[dict, list]:
    """Installed NVIDIA driver packages (name -> version) and the held ones."""
    installed: dict = {}
    held: list = []
    if manager == "apt":
        rc, out = _run(["dpkg-query", "-W", "-f", "${Package} ${Version} ${Status}\n", "nvidia-driver-*"])
        for line in out.splitlines() if rc == 0 else []:
            parts = line.split()
            if len(parts) >= 3 and line.endswith("installed") and "not-installed" not in line:
                installed[parts[0]] = parts[1]
        rc, out = _run(["apt-mark", "showhold"])
        held = [p for p in out.split() if p.startswith("nvidia")] if rc == 0 else []
    elif manager == "dnf":
        rc, out = _run(["rpm", "-qa", "--qf", "%{NAME} %{VERSION}\n", "nvidia-driver*"])
        for line in out.splitlines() if rc == 0 else []:
            parts = line.split()
            if len(parts) == 2:
                installed[parts[0]] = parts[1]
        rc, out = _run(["dnf", "-q", "versionlock", "list"])
        held = [ln.strip() for ln in out.splitlines() if "nvidia" in ln] if rc == 0 else []
    return installed, held


def gather_facts(*, root: str, python_version: str) -> dict:
    """What preflight and the driver role decide on, read from this machine."""
    os_info = parse_os_release(_read("/etc/os-release") or "")
    kernel = os.uname().release
    headers = any(os.path.isdir(p) for p in (f"/lib/modules/{kernel}/build", f"/usr/src/kernels/{kernel}"))
    rc, out = _run(["nvidia-smi", f"--query-gpu={NVIDIA_SMI_QUERY}", "--format=csv,noheader"])
    gpus = parse_nvidia_smi_csv(out) if rc == 0 else []
    source = "nvidia-smi" if gpus else None
    loaded = parse_proc_driver_version(_read("/proc/driver/nvidia/version") or "")
    if loaded is None and gpus:
        loaded = gpus[0]["driver"]
    lspci = 0
    if not gpus:
        rc, out = _run(["lspci", "-nn"])
        lspci = (
            sum(1 for ln in out.splitlines() if "NVIDIA" in ln and ("3D" in ln or "VGA" in ln))
            if rc == 0
            else 0
        )
        source = "lspci" if lspci else None
    manager = "apt" if shutil.which("apt-get") else ("dnf" if shutil.which("dnf") else "none")
    installed, held = _driver_packages(manager)
    return {
        "os": os_info,
        "kernel": kernel,
        "kernel_headers": headers,
        "gpus": gpus,
        "gpu_source": source,
        "lspci_nvidia": lspci,
        "driver_loaded": loaded,
        "package_manager": manager,
        "driver_packages": installed,
        "driver_held": held,
        "free_disk_mb": _free_mb(root),
        "python": python_version,
    }


def _check(name: str, status: str, detail: str) -> dict:
    return {"name": name, "status": status, "detail": detail}


def preflight_checks(facts: dict, want: dict) -> list[dict]:
    """Every check passed, failed (with why) or skipped (with why). `want`: supported_os, min_free_disk_mb,
    gpu_cc ("" = any), gpu_count (0 = any), simulated, python pin, driver pin, driver policy."""
    checks = []
    osf = facts.get("os") or {}
    name = f"{osf.get('distribution', 'unknown')} {osf.get('version', '')}".strip()
    supported = [s for s in want.get("supported_os") or [] if pin_matches(s, name)]
    checks.append(
        _check("os", "passed", f"{name} ({osf.get('family')})")
        if supported
        else _check("os", "failed", f"{name} is not in provision.supported_os {want.get('supported_os')}")
    )
    free, need = int(facts.get("free_disk_mb") or 0), int(want.get("min_free_disk_mb") or 0)
    checks.append(
        _check("disk", "passed" if free >= need else "failed", f"{free} MiB free under the root, need {need}")
    )
    py, py_pin = str(facts.get("python") or ""), str(want.get("python") or "")
    checks.append(
        _check("python", "passed", f"base interpreter {py}")
        if not py_pin or pin_matches(py_pin, py)
        else _check("python", "failed", f"base interpreter is {py}, stack.python pins {py_pin}")
    )
    if want.get("simulated"):
        for what in ("gpu", "compute_capability", "kernel_headers"):
            checks.append(_check(what, "skipped", "node declared simulated"))
        return checks
    gpus = facts.get("gpus") or []
    count = len(gpus) or int(facts.get("lspci_nvidia") or 0)
    want_count = int(want.get("gpu_count") or 0)
    if count == 0:
        checks.append(_check("gpu", "failed", "no NVIDIA GPU visible (nvidia-smi, lspci)"))
    elif want_count and count < want_count:
        checks.append(_check("gpu", "failed", f"{count} GPU(s) visible, the spec declares {want_count}"))
    else:
        checks.append(_check("gpu", "passed", f"{count} x {gpus[0]['name'] if gpus else 'NVIDIA (lspci)'}"))
    cc_want = str(want.get("gpu_cc") or "")
    ccs = sorted({str(g.get("cc")) for g in gpus})
    if not cc_want:
        checks.append(_check("compute_capability", "skipped", "the spec declares no gpu.cc"))
    elif not gpus:
        checks.append(_check("compute_capability", "skipped", "needs a loaded driver (nvidia-smi)"))
    elif ccs == [cc_want]:
        checks.append(_check("compute_capability", "passed", f"cc {cc_want}"))
    else:
        checks.append(
            _check("compute_capability", "failed", f"GPUs report cc {ccs}, the spec declares {cc_want}")
        )
    action = driver_decision(facts, want)["action"]
    if facts.get("kernel_headers"):
        checks.append(_check("kernel_headers", "passed", f"present for {facts.get('kernel')}"))
    elif action == "install":
        checks.append(
            _check(
                "kernel_headers",
                "failed",
                f"missing for {facts.get('kernel')}; a driver install builds against them",
            )
        )
    else:
        checks.append(
            _check(
                "kernel_headers", "skipped", f"missing for {facts.get('kernel')}; no driver install planned"
            )
        )
    return checks


def driver_package(want: dict, manager: str) -> str:
    package = str(want.get("driver_package") or "auto")
    if package != "auto":
        return package
    branch = str(want.get("driver") or "").split(".")[0]
    return f"nvidia-driver-{branch}-open" if manager == "apt" else "nvidia-driver"


def driver_decision(facts: dict, want: dict) -> dict:
    """The driver action for one node:

    none    no driver pin, or the node is simulated
    skip    the pinned version is loaded: nothing to install
    refuse  the loaded driver (or its absence) differs from the pin and driver.policy is refuse
    install install the pinned version (apt/dnf), hold it, then reboot
    reboot  the pinned version is installed but another is loaded: only the reboot is due
    """
    pin = str(want.get("driver") or "")
    loaded = facts.get("driver_loaded")
    manager = facts.get("package_manager") or "none"
    package = driver_package(want, manager)
    base = {"pin": pin, "loaded": loaded, "package": package, "manager": manager, "reboot": False}
    if not pin or want.get("simulated"):
        return {
            **base,
            "action": "none",
            "why": "no stack.driver pin" if not pin else "node declared simulated",
        }
    if loaded and pin_matches(pin, loaded):
        return {**base, "action": "skip", "why": f"driver {loaded} is loaded, as pinned"}
    if want.get("driver_policy", "refuse") == "refuse":
        have = f"driver {loaded} is loaded" if loaded else "no NVIDIA driver is loaded"
        return {
            **base,
            "action": "refuse",
            "why": f"{have} but stack.driver pins {pin}, and provision.driver.policy is refuse "
            "(set it to install to change the driver on this node)",
        }
    if manager not in ("apt", "dnf"):
        return {
            **base,
            "action": "refuse",
            "why": f"stack.driver {pin} needs apt or dnf; the node has neither",
        }
    installed = (facts.get("driver_packages") or {}).get(package)
    if installed and pin_matches(pin, installed.split("-")[0]):
        return {
            **base,
            "action": "reboot",
            "reboot": True,
            "why": f"{package} {installed} installed, {loaded} loaded",
        }
    return {
        **base,
        "action": "install",
        "reboot": True,
        "why": f"install {package} {pin} (loaded: {loaded or 'none'}), hold it, reboot",
    }

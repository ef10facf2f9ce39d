"""The device a node runs on: its facts, the software versions, and the peaks SOL is scored against.

Peaks:
  - fp32 FMA peak = SMs x 128 fp32 lanes x 2 FLOP x clock (the clock the driver reports as the maximum);
  - memory bandwidth = bytes read + bytes written per second of a large device-to-device copy, measured
    two ways (the driver's cuMemcpyDtoD and a numba tiled copy kernel), the higher one kept. It is
    measured once per device and cached in $XDG_CACHE_HOME/solfleet (or ~/.cache/solfleet), keyed by device
    name, PCI bus id and driver version, because a measurement costs a second of GPU time.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
from numba import cuda, float32

from kernels.runtime import launch as _launch
from kernels.runtime.arrays import SIMULATED

FP32_LANES_PER_SM = 128  # Volta .. Hopper: 4 sub-partitions x 32 fp32 lanes
# Dense fp16 tensor-core FLOP per clock per SM with fp32 accumulation: 2048 on Ampere (cc 8.x), 4096 on Hopper
# (cc 9.0): 132 SMs x 4096 x 1.83 GHz is the H100/H200 datasheet's 989 TFLOP/s. Absent for other GPUs.
TENSOR_FP16_FLOP_PER_CLK_PER_SM = {8: 2048, 9: 4096}
COPY_BYTES = 1 << 30  # 1 GiB source: far past any L2, a few hundred microseconds per copy


class NoDevice(RuntimeError):
    """No usable GPU and the simulator was not requested."""


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version(), "numpy": np.__version__}
    for dist in ("numba", "numba-cuda", "cupy-cuda13x", "cupy-cuda12x", "cuda-bindings", "cuda-core"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    if not SIMULATED:
        try:
            from numba.cuda.cudadrv import runtime
            from numba.cuda.cudadrv.driver import driver

            dv = driver.get_version()
            out["cuda_driver"] = f"{dv[0]}.{dv[1]}"
            rv = runtime.get_version()
            out["cuda_runtime"] = f"{rv[0]}.{rv[1]}"
        except Exception as e:  # noqa: BLE001  (a broken driver is reported, not raised, here)
            out["cuda_driver"] = f"unavailable: {e}"
    return out


_CC: dict[int, tuple[int, int] | None] = {}  # by CUDA context (kernels.runtime.launch.context)


def compute_capability(ctx: int | None = None) -> tuple[int, int] | None:
    """The current device's (major, minor) (`ctx`: its context, when the caller asked already), asked once
    per context (a node may hold GPUs of two architectures); None under the simulator or without a usable
    GPU. Kernel selection reads it on every first call of an op in a context (gemm's select_path)."""
    if SIMULATED:
        return None
    if not _CC and not cuda.is_available():
        return None
    if ctx is None:
        ctx = _launch.context()
    if ctx not in _CC:
        major, minor = cuda.get_current_device().compute_capability
        _CC[ctx] = (int(major), int(minor))
    return _CC[ctx]


def require_device() -> None:
    """Raise NoDevice when there is neither a GPU nor a declared simulator."""
    if SIMULATED:
        return
    if not cuda.is_available():
        raise NoDevice(
            "no usable CUDA GPU (numba.cuda.is_available() is False) and the simulator was not requested "
            "(set NUMBA_ENABLE_CUDASIM=1 only on nodes declared simulated)"
        )


def describe() -> dict[str, Any]:
    """Facts about the current device (or the simulator)."""
    if SIMULATED:
        return {"name": "numba CUDA simulator", "simulated": True}
    require_device()
    dev = cuda.get_current_device()
    free, total = cuda.current_context().get_memory_info()
    cc = dev.compute_capability
    name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
    clock = _attr(dev, "CLOCK_RATE")
    mclock = _attr(dev, "MEMORY_CLOCK_RATE")
    return {
        "name": name,
        "simulated": False,
        "compute_capability": f"{cc[0]}.{cc[1]}",
        "sm_count": int(dev.MULTIPROCESSOR_COUNT),
        "clock_mhz": None if clock is None else clock / 1000.0,
        "memory_clock_mhz": None if mclock is None else mclock / 1000.0,
        "memory_bus_bits": _attr(dev, "GLOBAL_MEMORY_BUS_WIDTH"),
        "l2_bytes": _attr(dev, "L2_CACHE_SIZE"),
        "memory_total_bytes": int(total),
        "memory_free_bytes": int(free),
        "pci_bus_id": f"{_attr(dev, 'PCI_DOMAIN_ID') or 0:04x}:{_attr(dev, 'PCI_BUS_ID') or 0:02x}:"
        f"{_attr(dev, 'PCI_DEVICE_ID') or 0:02x}",
    }


def _attr(dev: Any, name: str) -> int | None:
    """A device attribute, or None where this driver no longer reports it (CUDA 13 dropped some)."""
    try:
        return int(getattr(dev, name))
    except Exception:  # noqa: BLE001
        return None


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "solfleet"


def _cache_key(dev: dict[str, Any], vers: dict[str, str | None]) -> str:
    raw = f"{dev['name']}-{dev['pci_bus_id']}-{vers.get('cuda_driver')}"
    return "".join(c if c.isalnum() or c in "-." else "_" for c in raw)


def _make_copy(unroll: int):  # type: ignore[no-untyped-def]
    """One block per contiguous tile of 256 x unroll elements, all loads in flight before the first store
    (the layout that measured best on the H200, benchmarks/notes-memory.md). Two depths are timed because
    the deeper copy is not always the faster one there (the figures are in the notes)."""

    @cuda.jit
    def k(src, dst):  # type: ignore[no-untyped-def]
        v = cuda.local.array(unroll, float32)
        n = src.shape[0]
        base = cuda.blockIdx.x * 256 * unroll + cuda.threadIdx.x
        if base + (unroll - 1) * 256 < n:
            for u in range(unroll):
                v[u] = src[base + u * 256]
            for u in range(unroll):
                dst[base + u * 256] = v[u]
        else:
            for u in range(unroll):
                i = base + u * 256
                if i < n:
                    dst[i] = src[i]

    return k


COPY_KERNELS = {4: _make_copy(4), 8: _make_copy(8)}


def _time_ms(fn: Any, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        a, b = cuda.event(), cuda.event()
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(cuda.event_elapsed_time(a, b))
    return out


def measure_copy_bandwidth() -> dict[str, float]:
    """GB/s (read + written) of a 1 GiB device-to-device copy: the driver's memcpy, numba tiled copy kernels
    4 and 8 deep, and CuPy's copy where CuPy is installed. Each result is checked at both ends."""
    from numba.cuda.cudadrv.driver import device_memset

    from kernels.runtime.arrays import operand
    from kernels.runtime.launch import kernel

    n = COPY_BYTES // 4
    host = np.random.default_rng().standard_normal(n, dtype=np.float32)
    src = cuda.to_device(host)
    dst = cuda.device_array(n, dtype=np.float32)
    so, do = operand("src", src), operand("dst", dst)
    cands: list[tuple[str, Any]] = [("memcpy", lambda: dst.copy_to_device(src))]
    for depth, disp in COPY_KERNELS.items():
        k = kernel(disp, "void(float32[::1], float32[::1])")
        grid = (n + 256 * depth - 1) // (256 * depth)
        cands.append((f"numba_copy_{depth}", lambda k=k, grid=grid: k.launch(grid, 256, (so, do))))
    try:
        import cupy as cp

        cs, cd = cp.asarray(src), cp.asarray(dst)
        cands.append(("cupy_copy", lambda: cp.copyto(cd, cs)))
    except ImportError:
        pass
    res = {}
    ends = np.concatenate([host[:1024], host[-1024:]])
    for label, fn in cands:
        device_memset(dst, 0, COPY_BYTES)  # so the check below sees only what this candidate wrote
        _time_ms(fn, 3)
        ms = float(np.median(_time_ms(fn, 20)))
        got = dst.copy_to_host()
        if not np.array_equal(np.concatenate([got[:1024], got[-1024:]]), ends):
            raise RuntimeError(f"copy-bandwidth candidate {label} produced wrong data")
        res[label] = 2 * COPY_BYTES / (ms * 1e-3) / 1e9
    return res


def peaks(*, remeasure: bool = False) -> dict[str, Any]:
    """Ceilings for SOL. None under the simulator."""
    if SIMULATED:
        return {"fp32_tflops": None, "mem_gbs": None, "source": "simulator: no peaks"}
    dev = describe()
    vers = versions()
    clock = dev["clock_mhz"]
    fp32 = None if clock is None else dev["sm_count"] * FP32_LANES_PER_SM * 2 * clock * 1e6 / 1e12
    tc_rate = TENSOR_FP16_FLOP_PER_CLK_PER_SM.get(int(str(dev["compute_capability"]).split(".")[0]))
    fp16_tc = None if clock is None or tc_rate is None else dev["sm_count"] * tc_rate * clock * 1e6 / 1e12
    path = cache_dir() / f"copy-bw-{_cache_key(dev, vers)}.json"
    bw: dict[str, Any] | None = None
    if path.exists() and not remeasure:
        try:
            bw = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            bw = None
    cached = bw is not None
    if bw is None:
        bw = dict[str, Any](measure_copy_bandwidth())
        bw["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(bw, indent=1))
        except OSError as e:
            print(f"warning: could not cache copy bandwidth at {path}: {e}", file=sys.stderr)
    mem = max(float(v) for k, v in bw.items() if k != "measured_at")
    return {
        "fp32_tflops": None if fp32 is None else round(fp32, 2),
        "fp16_tensor_tflops": None if fp16_tc is None else round(fp16_tc, 1),
        "mem_gbs": round(mem, 1),
        "copy_gbs": {k: round(float(v), 1) for k, v in bw.items() if k != "measured_at"},
        "copy_measured_at": bw.get("measured_at"),
        "copy_cached": cached,
        "cache_file": str(path),
    }

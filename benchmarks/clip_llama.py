"""clip_grad_norm over Llama-3-8B's 291 gradient tensors (8.03 B elements) on the GPU, beside torch, in one
process: ours "auto" (the table path: two launches), ours "per_array" (1 + 2N launches, what ran before the
table path), and `torch.nn.utils.clip_grad_norm_(foreach=True)` (multi-tensor apply).

    python benchmarks/clip_llama.py --out DIR [--dtypes bfloat16,float32] [--iters 10] [--div 1]

Method (kernels.harness.bench.time_interleaved): the providers' calls interleaved call by call, every call
on the same gradients restored from a pristine copy first (the op is in place), L2 flushed, a short device
spin so that the events time the device, not the host's launches; the median of `--iters` calls. The set is
16 GB (bf16) / 32 GB (fp32): far past L2, one set is enough. Bytes: the norm reads every element once; a
clipping call reads and writes them again (3 x N x itemsize; 1 x when nothing is clipped). SOL = GB/s over
the measured device-to-device copy bandwidth (kernels.runtime.device.peaks).

Host time: the median wall time of one of our calls up to its return, queued behind the restore's copies
(milliseconds of device work, so nothing waits for the device): what the caller's thread pays per step.

Checks (on the device, in float64, after one call of each provider from the pristine gradients): the norm
against sqrt(sum g^2), and every tensor against pristine x coef to ours tolerances (kernels.ops.clip_grad_norm
SPEC: fp32 1e-5, bf16 4e-3 relative per tensor). torch's results are checked and recorded the same way.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from kernels.ops import clip_grad_norm as cg
from kernels.runtime import device
from kernels.runtime.arrays import BF16

T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", flush=True)


def _torch_dtype(name: str) -> Any:
    import torch

    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


def _as_ours(t: Any, dtype: np.dtype) -> Any:
    """A numba device array over a torch tensor's memory (bf16 through its int16 view: torch exports no
    __cuda_array_interface__ for bf16)."""
    import torch
    from numba import cuda

    if t.dtype == torch.bfloat16:
        return cuda.as_cuda_array(t.view(torch.int16)).view(dtype)
    return cuda.as_cuda_array(t)


def run_dtype(name: str, div: int, iters: int, mem_gbs: float | None) -> list[dict[str, Any]]:
    import torch
    from numba import cuda

    from kernels.harness.bench import time_interleaved

    tdt = _torch_dtype(name)
    ndt = BF16 if name == "bfloat16" else np.dtype(name)
    sizes = cg.llama3_8b_sizes(div)
    n_all = sum(sizes)
    gen = torch.Generator(device="cuda").manual_seed(0)
    pristine = [(torch.randn(n, device="cuda", generator=gen) * 1e-3).to(tdt) for n in sizes]
    work = [p.clone() for p in pristine]
    ours_arrays = [_as_ours(w, ndt) for w in work]
    no = cuda.device_array(1, np.float32)
    norm64 = math.sqrt(sum(float(p.double().square().sum()) for p in pristine))
    log(f"{name}: {len(sizes)} tensors, {n_all / 1e9:.3f} G elements, norm {norm64:.6f}")
    params = [torch.nn.Parameter(torch.empty(0, device="cuda")) for _ in work]
    for p, w in zip(params, work, strict=True):
        p.data = w.detach()  # the parameter shares the gradient's memory: no extra 16-32 GB
        p.grad = w

    def restore(_a: Any) -> None:
        for w, p in zip(work, pristine, strict=True):
            w.copy_(p)

    def check(norm_got: float, coef: float) -> dict[str, Any]:
        worst = 0.0
        for p, w in zip(pristine, work, strict=True):
            ref = p.double() * coef
            den = float(ref.norm())
            worst = max(worst, float((w.double() - ref).norm()) / den if den else float((w.double()).norm()))
        return {
            "norm": norm_got,
            "norm_rel_err": abs(norm_got - norm64) / norm64,
            "worst_tensor_rel_err": worst,
        }

    rows = []
    for clip in (1, 0):
        max_norm = norm64 * (0.37 if clip else 2.0)
        coef = max_norm / (norm64 + cg.CLIP_EPS) if clip else 1.0
        provs = {
            "ours": lambda _a, mx=max_norm: cg.clip_grad_norm(ours_arrays, mx, norm_out=no),
            "ours_per_array": lambda _a, mx=max_norm: cg.clip_grad_norm(
                ours_arrays, mx, norm_out=no, path="per_array"
            ),
            "torch": lambda _a, mx=max_norm: torch.nn.utils.clip_grad_norm_(params, mx, foreach=True),
        }
        row: dict[str, Any] = {"dtype": name, "case": f"llama3-8b-div{div}-{'clip' if clip else 'noclip'}",
                               "tensors": len(sizes), "elements": n_all}  # fmt: skip
        for pname, fn in provs.items():  # one checked call each, from the pristine gradients
            restore(None)
            out = fn(None)
            torch.cuda.synchronize()
            got = float(no.copy_to_host()[0]) if pname.startswith("ours") else float(out)
            row[f"{pname}_check"] = check(got, coef)
        times = time_interleaved([(fn, [None], restore) for fn in provs.values()], iters)
        nbytes = (3 if clip else 1) * n_all * np.dtype(ndt).itemsize
        for pname, ts in zip(provs, times, strict=True):
            med = statistics.median(ts)
            row[f"{pname}_us"] = round(med, 1)
            row[f"{pname}_gbs"] = round(nbytes / med / 1e3, 1)
            if mem_gbs:
                row[f"{pname}_sol"] = round(nbytes / med / 1e3 / mem_gbs, 3)
        row["torch_ratio"] = round(row["torch_us"] / row["ours_us"], 3)
        row["per_array_ratio"] = round(row["ours_per_array_us"] / row["ours_us"], 3)
        # host time of one call of ours (auto), the device kept busy so that nothing waits on it
        host = []
        for _ in range(20):
            restore(None)
            t = time.perf_counter()
            cg.clip_grad_norm(ours_arrays, max_norm, norm_out=no)
            host.append((time.perf_counter() - t) * 1e6)
        torch.cuda.synchronize()
        row["ours_host_us"] = round(statistics.median(host), 1)
        e = row["ours_check"]
        tol = float(cg.SPEC.tolerance[name])
        row["ok"] = e["norm_rel_err"] <= 1e-5 and e["worst_tensor_rel_err"] <= tol
        log(json.dumps(row))
        rows.append(row)
    for held in (pristine, work, ours_arrays, params):
        held.clear()  # free the 32-64 GB before the next dtype
    torch.cuda.empty_cache()
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'dtype':9} {'case':24} {'ours us':>9} {'SOL':>5} {'per_array us':>12} {'x':>5} "
            f"{'torch us':>9} {'x torch':>7} {'host us':>8} {'norm err':>9} {'elem err':>9} ok")  # fmt: skip
    out = [head]
    for r in rows:
        out.append(
            f"{r['dtype']:9} {r['case']:24} {r['ours_us']:9.1f} {r.get('ours_sol', 0):5.2f} "
            f"{r['ours_per_array_us']:12.1f} {r['per_array_ratio']:5.2f} {r['torch_us']:9.1f} "
            f"{r['torch_ratio']:7.2f} {r['ours_host_us']:8.1f} {r['ours_check']['norm_rel_err']:9.1e} "
            f"{r['ours_check']['worst_tensor_rel_err']:9.1e} {'ok' if r['ok'] else 'FAIL'}"
        )
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--div", type=int, default=1, help="divide every tensor's size (1: the real model)")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    import torch

    peaks = device.peaks()
    mem = float(peaks["mem_gbs"]) if peaks.get("mem_gbs") else None
    info = {"device": device.describe(), "torch": torch.__version__, "peaks": peaks}
    log(json.dumps(info, default=str))
    rows = []
    for name in a.dtypes.split(","):
        rows += run_dtype(name, a.div, a.iters, mem)
    (a.out / "clip-llama.json").write_text(json.dumps({"info": info, "rows": rows}, indent=1, default=str))
    t = table(rows)
    (a.out / "clip-llama.txt").write_text(t + "\n")
    print(t)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())

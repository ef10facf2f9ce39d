"""bf16 / wgmma on the H200, side by side with torch in one process: every timed output checked against
float64 (gemm / o_proj on 64 sampled rows), then a short table last and the full results in $OUT.

    python benchmarks/h200_bf16.py --out DIR [--only 'STEP,STEP']   (h200_bf16.sh sets up the stack first)

On cc 9.0 gemm, o_proj and linear are also timed on the cp.async tile, the explicit "wgmma" path (steps
"... wgmma"), beside auto's TMA tile.

Anchors: cuBLAS through torch (mm with fp32 output for gemm, addmm for o_proj) and torch eager for the
memory-bound ops. Timing: CUDA events around each call, ours and torch's interleaved call by call, medians;
each call preceded by the bench's device-side pause (kernels.harness.bench.SPIN_US), so the events time the
device, not the host's launch.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kernels.harness.bench import SPIN_US, spin_kernel
from kernels.ops import cast as cast_op
from kernels.ops import gemm as gemm_op
from kernels.ops import linear as linear_op
from kernels.ops import o_proj as o_proj_op
from kernels.ops import residual_add as radd_op
from kernels.runtime import arrays, device
from kernels.runtime.arrays import BF16

F16 = np.dtype(np.float16)
CALLS = 30
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", flush=True)


def torch_of(host: np.ndarray) -> torch.Tensor:
    if host.dtype in (BF16, F16):
        t = torch.from_numpy(np.ascontiguousarray(host).view(np.int16)).cuda()
        return t.view(torch.bfloat16 if host.dtype == BF16 else torch.float16)
    return torch.from_numpy(host).cuda()


def host_of(t: torch.Tensor) -> np.ndarray:
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).cpu().numpy().view(BF16)
    return t.cpu().numpy()


def timed(fns: dict[str, Callable[[], None]]) -> dict[str, float]:
    """Median microseconds per call of each fn, the fns interleaved call by call."""
    ev = {
        k: [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(CALLS)
        ]
        for k in fns
    }
    for f in fns.values():
        f()
        f()
    torch.cuda.synchronize()
    spin = spin_kernel()  # on the legacy default stream, torch's current one here
    for i in range(CALLS):
        for k, f in fns.items():
            spin[1, 1](SPIN_US)
            ev[k][i][0].record()
            f()
            ev[k][i][1].record()
    torch.cuda.synchronize()
    return {k: float(np.median([a.elapsed_time(b) * 1e3 for a, b in v])) for k, v in ev.items()}


def rel(out: np.ndarray, ref: np.ndarray) -> float:
    d = out.astype(np.float64) - ref
    fin = np.isfinite(ref)
    if not np.isfinite(out.astype(np.float64)[fin]).all():
        return float("inf")
    return float(np.linalg.norm(d[fin]) / max(np.linalg.norm(ref[fin]), 1e-300))


ROWS: list[dict[str, Any]] = []


def record(
    op: str,
    dt: str,
    shape: str,
    path: str,
    us: dict[str, float],
    ref_name: str,
    flops: float,
    nbytes: float,
    errs: dict[str, float],
    tol: float,
    peak: float | None,
    bound: str,
) -> None:
    ours = us["ours"]
    row = {
        "op": op,
        "dtype": dt,
        "shape": shape,
        "path": path,
        "ours_us": round(ours, 2),
        "ref": ref_name,
        "ref_us": round(us["ref"], 2),
        "ratio": round(us["ref"] / ours, 3),
        "ours_tflops": round(flops / ours / 1e6, 1),
        "ours_gbs": round(nbytes / ours / 1e3, 1),
        "rel_err": errs["ours"],
        "ref_rel_err": errs["ref"],
        "tol": tol,
        "ok": errs["ours"] <= tol,
    }
    if peak:  # compute: TFLOP/s over the tensor peak (TFLOP/s); memory: GB/s over the copy (GB/s)
        row["sol"] = round((row["ours_tflops"] if bound == "compute" else row["ours_gbs"]) / peak, 3)
    row["flops"], row["bytes"] = flops, nbytes
    ROWS.append(row)
    log(json.dumps(row))


def bench_gemm(
    rng: np.random.Generator, m: int, n: int, k: int, dt: np.dtype, peaks: dict[str, Any], path: str = "auto"
) -> None:
    a = rng.standard_normal((m, k), dtype=np.float32).astype(dt)
    b = rng.standard_normal((k, n), dtype=np.float32).astype(dt)
    da, db = arrays.to_device(a), arrays.to_device(b)
    dc = arrays.to_device(np.full((m, n), np.nan, np.float32))
    ta, tb = torch_of(a), torch_of(b)
    held: dict[str, torch.Tensor] = {}
    ref_name = "torch.mm(out_dtype=fp32) (cuBLAS)"
    try:  # the same computation as ours: 16-bit inputs, fp32 accumulate and output
        torch.mm(ta[:8], tb[:, :8], out_dtype=torch.float32)

        def theirs() -> None:
            held["c"] = torch.mm(ta, tb, out_dtype=torch.float32)
    except (TypeError, RuntimeError):  # older torch: 16-bit output (less to write than ours)
        ref_name = "torch.mm (cuBLAS, 16-bit out)"

        def theirs() -> None:
            held["c"] = torch.mm(ta, tb)

    fns = {"ours": lambda: gemm_op.gemm(da, db, dc, path=path), "ref": theirs}
    us = timed(fns)
    rows = rng.choice(m, 64, replace=False)
    ref = a[rows].astype(np.float64) @ b.astype(np.float64)
    errs = {"ours": rel(arrays.to_host(dc)[rows], ref), "ref": rel(host_of(held["c"].float())[rows], ref)}
    path = gemm_op.shape_path(gemm_op.resolve_path(path, dt), dt, n, k)
    shape = "4096^3" if m == n == k == 4096 else f"{m}x{n}x{k}"
    record(
        "gemm",
        str(dt),
        shape,
        path,
        us,
        ref_name,
        2.0 * m * n * k,
        (m * k + k * n) * 2 + 4 * m * n,
        errs,
        1e-4,
        peaks.get("fp16_tensor_tflops"),
        "compute",
    )


def bench_o_proj(
    rng: np.random.Generator,
    bs: int,
    s: int,
    k: int,
    n: int,
    dt: np.dtype,
    peaks: dict[str, Any],
    path: str = "auto",
) -> None:
    m = bs * s
    attn = rng.standard_normal((m, k), dtype=np.float32).astype(dt)
    w = (rng.standard_normal((k, n), dtype=np.float32) / np.sqrt(k)).astype(dt)
    res = rng.standard_normal((m, n), dtype=np.float32).astype(dt)
    d = [arrays.to_device(x) for x in (attn, w, res)]
    dout = arrays.to_device(np.full((m, n), np.nan, dt))
    ta, tw, tr = torch_of(attn), torch_of(w), torch_of(res)
    tout = torch.empty_like(tr)
    fns = {
        "ours": lambda: o_proj_op.o_proj(d[0], d[1], d[2], None, dout, path=path),
        "ref": lambda: torch.addmm(tr, ta, tw, out=tout),
    }
    us = timed(fns)
    rows = rng.choice(m, 64, replace=False)
    ref = attn[rows].astype(np.float64) @ w.astype(np.float64) + res[rows].astype(np.float64)
    errs = {"ours": rel(arrays.to_host(dout)[rows], ref), "ref": rel(host_of(tout)[rows], ref)}
    path = gemm_op.shape_path(gemm_op.resolve_path(path, dt), dt, n, k)
    record(
        "o_proj",
        str(dt),
        f"{bs}x{s}x{k}",
        path,
        us,
        "torch.addmm (cuBLAS)",
        2.0 * m * n * k + m * n,
        (m * k + k * n + 2 * m * n) * 2,
        errs,
        1e-3 if dt == F16 else 8e-3,
        peaks.get("fp16_tensor_tflops"),
        "compute",
    )


def bench_linear(
    rng: np.random.Generator, m: int, k: int, n: int, dt: np.dtype, peaks: dict[str, Any], path: str = "auto"
) -> None:
    """linear (x @ W.T with W [N, K], the activation or the bias fused) against torch's F.linear then the
    activation (cuBLAS, then an elementwise kernel) or F.linear with the bias (cuBLAS's own epilogue), and
    against our own linear without either, all three interleaved: `epilogue_cost` is ours-with-epilogue /
    ours-plain - 1 (issue 13: <= 3 %)."""
    x = rng.standard_normal((m, k), dtype=np.float32).astype(dt)
    w = (rng.standard_normal((n, k), dtype=np.float32) / np.sqrt(k)).astype(dt)
    dx, dw = arrays.to_device(x), arrays.to_device(w)
    tx, tw = torch_of(x), torch_of(w)
    rows = rng.choice(m, 64, replace=False)
    plain = arrays.to_device(np.full((m, n), np.nan, dt))
    f = torch.nn.functional
    bias = rng.standard_normal(n, dtype=np.float32).astype(dt)
    dbias, tbias = arrays.to_device(bias), torch_of(bias)
    cases = (  # (name, our activation, torch's, bias or None)
        ("silu", "silu", f.silu, None),
        ("gelu_tanh", "gelu_tanh", lambda t: f.gelu(t, approximate="tanh"), None),
        ("bias", "none", lambda t: t, bias),
    )
    for name, act, torch_act, b in cases:
        dout = arrays.to_device(np.full((m, n), np.nan, dt))
        held: dict[str, torch.Tensor] = {}
        db, tb = (dbias, tbias) if b is not None else (None, None)

        def theirs(torch_act: Any = torch_act, held: dict[str, torch.Tensor] = held, tb: Any = tb) -> None:
            held["y"] = torch_act(f.linear(tx, tw, tb))

        fns = {
            "ours": lambda a=act, o=dout, db=db: linear_op.linear(dx, dw, db, o, activation=a, path=path),
            "ref": theirs,
            "plain": lambda: linear_op.linear(dx, dw, None, plain, path=path),
        }
        us = timed(fns)
        ref = linear_op.reference(x[rows], w, b, act)
        errs = {"ours": rel(arrays.to_host(dout)[rows], ref), "ref": rel(host_of(held["y"])[rows], ref)}
        their_name = {"silu": "then F.silu", "gelu_tanh": "then F.gelu(tanh)", "bias": "with its bias"}[name]
        record(
            "linear",
            str(dt),
            f"{m}x{n}x{k}-{name}",
            linear_op.shape_path(linear_op._resolve(path, dt), n, k),
            us,
            f"torch F.linear {their_name} (cuBLAS{' + eager' if name != 'bias' else ''})",
            2.0 * m * n * k + {"silu": 4, "gelu_tanh": 9, "bias": 1}[name] * m * n,
            (m * k + n * k + m * n + (n if b is not None else 0)) * 2,
            errs,
            1e-3 if dt == F16 else 8e-3,
            peaks.get("fp16_tensor_tflops"),
            "compute",
        )
        ROWS[-1]["plain_us"] = round(us["plain"], 2)
        ROWS[-1]["epilogue_cost"] = round(us["ours"] / us["plain"] - 1.0, 4)


def bench_memory(rng: np.random.Generator, peaks: dict[str, Any]) -> None:
    shape = (16384, 4096)
    n = shape[0] * shape[1]
    x = rng.standard_normal(shape, dtype=np.float32).astype(BF16)
    r = rng.standard_normal(shape, dtype=np.float32).astype(BF16)
    dx, dr = arrays.to_device(x), arrays.to_device(r)
    dout = arrays.to_device(np.full(shape, np.nan, BF16))
    tx, tr = torch_of(x), torch_of(r)
    tout = torch.empty_like(tx)
    us = timed(
        {"ours": lambda: radd_op.residual_add(dx, dr, dout), "ref": lambda: torch.add(tx, tr, out=tout)}
    )
    ref = x.astype(np.float64) + r.astype(np.float64)
    errs = {"ours": rel(arrays.to_host(dout), ref), "ref": rel(host_of(tout), ref)}
    record(
        "residual_add",
        "bfloat16",
        "16384x4096",
        "auto",
        us,
        "torch.add",
        n,
        6 * n,
        errs,
        4e-3,
        peaks.get("mem_gbs"),
        "memory",
    )

    xf = rng.standard_normal(shape, dtype=np.float32) * np.exp(rng.uniform(-40, 40, shape).astype(np.float32))
    dxf = arrays.to_device(xf)
    dcast = arrays.to_device(np.full(shape, np.nan, BF16))
    txf = torch.from_numpy(xf).cuda()
    tcast = torch.empty(shape, dtype=torch.bfloat16, device="cuda")
    us = timed({"ours": lambda: cast_op.cast(dxf, dcast), "ref": lambda: tcast.copy_(txf)})
    ref = xf.astype(BF16).astype(np.float64)
    ours_h = arrays.to_host(dcast)
    errs = {"ours": rel(ours_h, ref), "ref": rel(host_of(tcast), ref)}
    exact = bool(np.array_equal(ours_h.view(np.uint16), xf.astype(BF16).view(np.uint16)))
    log(f"cast fp32->bf16 bit-exact vs ml_dtypes: {exact}")
    record(
        "cast",
        "float32->bfloat16",
        "16384x4096",
        "auto",
        us,
        "tensor.copy_ (to bf16)",
        n,
        6 * n,
        errs,
        0.0,
        peaks.get("mem_gbs"),
        "memory",
    )
    ROWS[-1]["ok"] = ROWS[-1]["ok"] and exact


def table() -> str:
    head = (
        f"{'op':13} {'dtype':18} {'shape':15} {'path':9} {'ours us':>9} {'ref us':>9} {'ratio':>6} "
        f"{'SOL':>6} {'TF/s':>6} {'GB/s':>7} {'err':>9} ok   reference"
    )
    lines = [head]
    for r in ROWS:
        lines.append(
            f"{r['op']:13} {r['dtype']:18} {r['shape']:15} {r['path']:9} "
            f"{r['ours_us']:9.1f} {r['ref_us']:9.1f} {r['ratio']:6.3f} {r.get('sol', float('nan')):6.3f} "
            f"{r['ours_tflops']:6.0f} {r['ours_gbs']:7.0f} "
            f"{r['rel_err']:9.2e} {'ok' if r['ok'] else 'FAIL'} {r['ref']}"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--only", default="", help="comma-separated step names to run (e.g. 'o_proj bfloat16'); "
                    "default: every step")  # fmt: skip
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(13)
    peaks = device.peaks()
    log(f"device {device.describe().get('name')} peaks {peaks}")
    errors: list[str] = []
    steps: list[tuple[str, Callable[[], None]]] = []
    for dt in (BF16, F16):
        steps += [
            (f"gemm 4096^3 {dt}", lambda dt=dt: bench_gemm(rng, 4096, 4096, 4096, dt, peaks)),
            (f"gemm 8192x2560x2560 {dt}", lambda dt=dt: bench_gemm(rng, 8192, 2560, 2560, dt, peaks)),
            (f"o_proj {dt}", lambda dt=dt: bench_o_proj(rng, 16, 512, 2560, 2560, dt, peaks)),
            (f"linear {dt}", lambda dt=dt: bench_linear(rng, 4096, 4096, 14336, dt, peaks)),
        ]
        if gemm_op.wgmma.available():  # the cp.async tile (explicit path) beside auto's TMA tile
            t = "wgmma"
            steps += [
                (f"gemm 4096^3 {dt} {t}", lambda dt=dt, t=t: bench_gemm(rng, 4096, 4096, 4096, dt, peaks, t)),
                (f"gemm 8192x2560x2560 {dt} {t}",
                 lambda dt=dt, t=t: bench_gemm(rng, 8192, 2560, 2560, dt, peaks, t)),
                (f"o_proj {dt} {t}", lambda dt=dt, t=t: bench_o_proj(rng, 16, 512, 2560, 2560, dt, peaks, t)),
                (f"linear {dt} {t}", lambda dt=dt, t=t: bench_linear(rng, 4096, 4096, 14336, dt, peaks, t)),
            ]  # fmt: skip
    steps.append(("memory-bound bf16", lambda: bench_memory(rng, peaks)))
    only = [x.strip() for x in args.only.split(",") if x.strip()]
    if only:
        unknown = sorted(set(only) - {name for name, _ in steps})
        if unknown:
            ap.error(f"--only: no step named {unknown}; steps: {[name for name, _ in steps]}")
        steps = [(name, fn) for name, fn in steps if name in only]
    dev = device.describe()
    for name, fn in steps:
        try:
            fn()
        except Exception as e:  # noqa: BLE001  (one failure must not hide the other figures)
            errors.append(f"{name}: {type(e).__name__}: {e}")
            log(f"ERROR {errors[-1]}")
        # after every step: a run stopped at its deadline keeps what it measured
        result = {"peaks": peaks, "rows": ROWS, "errors": errors, "device": dev}
        (args.out / "h200_bf16.json").write_text(json.dumps(result, indent=1, default=str))
    print(table())
    print(f"checks: {sum(r['ok'] for r in ROWS)}/{len(ROWS)} ok; errors: {errors}")
    return 0 if not errors and all(r["ok"] for r in ROWS) else 1


if __name__ == "__main__":
    raise SystemExit(main())

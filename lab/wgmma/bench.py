"""Device check + bench of the wgmma GEMM (run by lab/wgmma/run.sh on the H200).

1. environment facts: versions, device, whether numba takes ml_dtypes.bfloat16 device arrays;
2. correctness against float64 numpy on the bf16 / fp16-rounded inputs: small odd-ish shapes in full, 4096^3
   and 8192x2560x2560 on sampled rows; every output poisoned with NaN first;
3. timing at 4096^3, 8192x2560x2560 (M x N x K) and the o_proj shape (attn [16, 512, 2560] @ W [2560, 2560]
   + residual: M = 8192, N = K = 2560) side by side with cuBLAS through torch, interleaved in rounds (the
   board's clock sags under load), CUDA events around every call, medians;
4. SASS facts of the default kernel (HGMMA count, registers).

    python lab/wgmma/bench.py --out $OUT [--quick]
Prints a short table last; writes $OUT/wgmma.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import wgmma  # noqa: E402

T0 = time.time()
RESULTS: dict[str, Any] = {"env": {}, "checks": [], "timings": [], "sass": {}, "errors": []}
# max |out - ref| / max |ref| allowed, by output type (ref: float64 product of the rounded inputs)
TOL = {"f32": 1e-4, "bf16": 1e-2, "f16": 2e-3}


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def env() -> None:
    import numba
    import torch
    from numba import cuda

    e = RESULTS["env"]
    e.update(
        python=platform.python_version(),
        numpy=np.__version__,
        numba=numba.__version__,
        torch=torch.__version__,
    )
    try:
        import numba_cuda

        e["numba_cuda"] = getattr(numba_cuda, "__version__", "?")
    except ImportError:
        e["numba_cuda"] = None
    import ml_dtypes

    e["ml_dtypes"] = ml_dtypes.__version__
    dev = cuda.get_current_device()
    e["device"] = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
    e["cc"] = list(dev.compute_capability)
    e["available"] = wgmma.available()
    e["torch_device"] = torch.cuda.get_device_name(0)
    log(f"env {e}")


# ---------------------------------------------------------------- operands


class Dev:
    """A numba device array typed with the host array's dtype (ml_dtypes.bfloat16 included: numba-cuda types
    it as __nv_bfloat16). Host transfers of 16-bit arrays go through a uint16 view of it: numpy's buffer
    protocol, which numba's copies use, refuses ml_dtypes' bfloat16 ("cannot include dtype 'E' in a
    buffer")."""

    def __init__(self, host: np.ndarray) -> None:
        from numba import cuda

        self.shape = host.shape
        self.dtype = host.dtype
        self.arr = cuda.device_array(host.shape, dtype=host.dtype)
        self.raw = self.arr.view(np.uint16) if host.itemsize == 2 else self.arr
        self.raw.copy_to_device(np.ascontiguousarray(host).view(self.raw.dtype))
        self.__cuda_array_interface__ = dict(self.arr.__cuda_array_interface__)

    def poison(self) -> None:
        if self.dtype == np.float32:
            fill = np.full(self.shape, np.nan, np.float32)
        else:
            fill = np.full(self.shape, 0x7FFF if self.dtype != np.float16 else 0x7E00, np.uint16)
        self.raw.copy_to_device(fill)

    def host(self) -> np.ndarray:
        return self.raw.copy_to_host().view(self.dtype)


def rand(rng: np.random.Generator, shape: tuple[int, ...], dt: np.dtype[Any]) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32).astype(dt)


def torch_of(host: np.ndarray) -> Any:
    import torch

    t = torch.from_numpy(np.ascontiguousarray(host.view(np.int16))).cuda()
    return t.view(torch.bfloat16 if host.dtype == wgmma.bf16_dtype() else torch.float16)


def rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    o = out.astype(np.float64)
    if not np.all(np.isfinite(o)):
        return float("inf")
    return float(np.max(np.abs(o - ref)) / max(np.max(np.abs(ref)), 1e-30))


# ---------------------------------------------------------------- correctness


def check(
    rng: np.random.Generator,
    *,
    m: int,
    n: int,
    k: int,
    dtype: str,
    out16: bool,
    layout: str,
    res: bool,
    sample: int = 0,
    variant: wgmma.Variant | None = None,
) -> dict[str, Any]:
    dt = wgmma.np_dtype(dtype)
    a = rand(rng, (m, k), dt)
    b = rand(rng, (k, n) if layout == "nn" else (n, k), dt)
    r = rand(rng, (m, n), dt) if res else None
    odt = dt if out16 else np.dtype(np.float32)
    da, db = Dev(a), Dev(b)
    dr = Dev(r) if r is not None else None
    dout = Dev(np.zeros((m, n), odt))
    dout.poison()
    t = time.time()
    wgmma.gemm(a=da, b=db, out=dout, res=dr, layout=layout, variant=variant)
    from numba import cuda

    cuda.synchronize()
    first_call_s = time.time() - t
    got = dout.host()
    rows = np.arange(m) if not sample or sample >= m else np.sort(rng.choice(m, sample, replace=False))
    bt = b.astype(np.float64) if layout == "nn" else b.astype(np.float64).T
    ref = a[rows].astype(np.float64) @ bt
    if r is not None:
        ref += r[rows].astype(np.float64)
    oname = "f32" if not out16 else dtype
    err = rel_err(got[rows], ref)
    nan_left = int(np.sum(~np.isfinite(got.astype(np.float32))))
    rec = dict(
        m=m,
        n=n,
        k=k,
        dtype=dtype,
        out=oname,
        layout=layout,
        res=res,
        rows_checked=len(rows),
        variant=(variant or wgmma.Variant(dtype=dtype, out16=out16, layout=layout, res=res)).tag,
        rel_err=err,
        tol=TOL[oname],
        nonfinite=nan_left,
        ok=bool(err <= TOL[oname] and nan_left == 0),
        first_call_s=round(first_call_s, 3),
    )
    if not rec["ok"]:
        bad = np.argwhere(
            ~np.isclose(got[rows].astype(np.float64), ref, rtol=0.05, atol=0.05 * np.abs(ref).max())
        )
        rec["first_bad"] = [[int(rows[i]), int(j)] for i, j in bad[:8]]
        rec["bad_fraction"] = float(len(bad) / ref.size)
    RESULTS["checks"].append(rec)
    log(
        f"check {rec['variant']:34s} {m}x{n}x{k} err {err:.2e} {'ok' if rec['ok'] else 'FAIL'}"
        + ("" if rec["ok"] else f" bad {rec.get('bad_fraction', 0):.3f} at {rec.get('first_bad', [])[:4]}")
    )
    return rec


def checks(rng: np.random.Generator, quick: bool) -> None:
    small = [(128, 256, 64), (129, 200, 136), (77, 264, 72), (300, 392, 1000), (1, 8, 8), (256, 512, 192)]
    if quick:
        small = small[:3]
    for dtype in wgmma.DTYPES:
        for out16, layout, res in (
            (False, "nn", False),
            (True, "nn", False),
            (True, "nn", True),
            (True, "nt", False),
        ):
            for m, n, k in small:
                try:
                    check(rng, m=m, n=n, k=k, dtype=dtype, out16=out16, layout=layout, res=res)
                except Exception as ex:  # noqa: BLE001
                    err(f"check {dtype} {out16} {layout} {res} {m}x{n}x{k}", ex)
    nn_bad = [x for x in RESULTS["checks"] if x["layout"] == "nn" and not x["ok"]]
    if nn_bad:
        # diagnostic for the one descriptor the documentation is least clear about (N-major B, trans-b 1)
        log(f"{len(nn_bad)} nn checks failed: trying the N-major B descriptor with LBO / SBO exchanged")
        v = wgmma.Variant(out16=True, swap_nn=True)
        for m, n, k in small[:3]:
            try:
                check(rng, m=m, n=n, k=k, dtype="bf16", out16=True, layout="nn", res=False, variant=v)
            except Exception as ex:  # noqa: BLE001
                err(f"check swap_nn {m}x{n}x{k}", ex)
    for dtype in wgmma.DTYPES:
        for m, n, k in ((4096, 4096, 4096), (8192, 2560, 2560)):
            for out16, layout in ((True, "nn"), (False, "nn")):
                try:
                    check(rng, m=m, n=n, k=k, dtype=dtype, out16=out16, layout=layout, res=False, sample=64)
                except Exception as ex:  # noqa: BLE001
                    err(f"check {dtype} {m}x{n}x{k}", ex)


def err(where: str, ex: BaseException) -> None:
    tb = traceback.format_exc().strip().splitlines()[-6:]
    RESULTS["errors"].append({"where": where, "error": f"{type(ex).__name__}: {ex}", "tb": tb})
    log(f"ERROR {where}: {type(ex).__name__}: {str(ex)[:300]}")


# ---------------------------------------------------------------- timing


def events_time(fn: Callable[[], None], calls: int) -> list[float]:
    import torch

    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(calls)]
    for s, e in ev:
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in ev]  # ms


def compare(
    label: str,
    fns: dict[str, Callable[[], None]],
    flops: float,
    rounds: int = 4,
    calls: int = 8,
    warmup: int = 5,
) -> dict[str, Any]:
    """Every candidate `warmup` calls, then `rounds` rounds of `calls` timed calls each, interleaved."""
    import torch

    for fn in fns.values():
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize()
    per: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            per[name] += events_time(fn, calls)
    out = {}
    for name, ts in per.items():
        med = float(np.median(ts))
        out[name] = {"median_ms": med, "min_ms": float(min(ts)), "n": len(ts), "tflops": flops / med / 1e9}
    log(
        f"time {label}: "
        + ", ".join(f"{k} {v['median_ms'] * 1e3:.1f} us {v['tflops']:.0f} TF" for k, v in out.items())
    )
    return out


def cublas_fns(a: Any, b: Any, r: Any, out16: bool, layout: str) -> dict[str, Callable[[], None]]:
    import torch

    bb = b if layout == "nn" else b.t()
    m, n = a.shape[0], bb.shape[1]
    fns: dict[str, Callable[[], None]] = {}
    if r is not None:
        o = torch.empty((m, n), dtype=a.dtype, device="cuda")
        fns["cublas_addmm"] = lambda: torch.addmm(r, a, bb, out=o)
        return fns
    if out16:
        o = torch.empty((m, n), dtype=a.dtype, device="cuda")
        fns["cublas"] = lambda: torch.mm(a, bb, out=o)
    else:
        try:
            torch.mm(a[:8], bb[:, :8], out_dtype=torch.float32)
            fns["cublas_f32out"] = lambda: torch.mm(a, bb, out_dtype=torch.float32)
        except Exception:  # noqa: BLE001
            o = torch.empty((m, n), dtype=a.dtype, device="cuda")
            fns["cublas_16out"] = lambda: torch.mm(a, bb, out=o)
    return fns


def bench_shape(
    rng: np.random.Generator,
    *,
    label: str,
    m: int,
    n: int,
    k: int,
    dtype: str,
    out16: bool,
    layout: str,
    res: bool,
    variants: list[wgmma.Variant],
) -> None:
    dt = wgmma.np_dtype(dtype)
    a = rand(rng, (m, k), dt)
    b = rand(rng, (k, n) if layout == "nn" else (n, k), dt)
    r = rand(rng, (m, n), dt) if res else None
    odt = dt if out16 else np.dtype(np.float32)
    da, db = Dev(a), Dev(b)
    dr = Dev(r) if r is not None else None
    dout = Dev(np.zeros((m, n), odt))
    ta, tb = torch_of(a), torch_of(b)
    tr = torch_of(r) if r is not None else None
    fns: dict[str, Callable[[], None]] = {}
    for v in variants:
        fns[v.tag] = lambda v=v: wgmma.gemm(a=da, b=db, out=dout, res=dr, layout=layout, variant=v)
    fns.update(cublas_fns(ta, tb, tr, out16, layout))
    flops = 2.0 * m * n * k
    t = compare(f"{label} {dtype}", fns, flops)
    # the timed outputs, checked: ours (last variant's output is in dout; re-run each once, sampled rows)
    rows = np.sort(rng.choice(m, min(m, 64), replace=False))
    bt = b.astype(np.float64) if layout == "nn" else b.astype(np.float64).T
    ref = a[rows].astype(np.float64) @ bt + (r[rows].astype(np.float64) if r is not None else 0.0)
    for v in variants:
        dout.poison()
        fns[v.tag]()
        t[v.tag]["rel_err"] = rel_err(dout.host()[rows], ref)
    import torch

    cub = [x for x in t if x.startswith("cublas")][0]
    torch.cuda.synchronize()
    bb = tb if layout == "nn" else tb.t()
    ct = torch.addmm(tr, ta, bb) if tr is not None else torch.mm(ta, bb)
    t[cub]["rel_err"] = rel_err(ct.float().cpu().numpy()[rows], ref)
    oname = "f32" if not out16 else dtype
    for v in variants:
        RESULTS["timings"].append(
            dict(
                shape=label,
                m=m,
                n=n,
                k=k,
                dtype=dtype,
                out=oname,
                layout=layout,
                res=res,
                variant=v.tag,
                ours=t[v.tag],
                cublas_name=cub,
                cublas=t[cub],
                ratio=t[cub]["median_ms"] / t[v.tag]["median_ms"],
                ok=bool(t[v.tag]["rel_err"] <= TOL[oname]),
            )
        )


def timings(rng: np.random.Generator, quick: bool) -> None:
    shapes = [
        ("4096^3", 4096, 4096, 4096, False),
        ("8192x2560x2560", 8192, 2560, 2560, False),
        ("o_proj 16x512x2560", 8192, 2560, 2560, True),
    ]
    for dtype in wgmma.DTYPES:
        for label, m, n, k, res in shapes:
            base = wgmma.Variant(dtype=dtype, out16=True, res=res)
            vs = [base]
            if dtype == "bf16" and not res and not quick:
                vs += [
                    wgmma.Variant(dtype=dtype, out16=True, inflight=0),
                    wgmma.Variant(dtype=dtype, out16=True, bn=128, stages=6),
                ]
            try:
                bench_shape(
                    rng,
                    label=label,
                    m=m,
                    n=n,
                    k=k,
                    dtype=dtype,
                    out16=True,
                    layout="nn",
                    res=res,
                    variants=vs,
                )
            except Exception as ex:  # noqa: BLE001
                err(f"bench {label} {dtype}", ex)
        # fp32 output and the NT layout at 4096^3, default tile
        for out16, layout in ((False, "nn"), (True, "nt")):
            v = wgmma.Variant(dtype=dtype, out16=out16, layout=layout)
            try:
                bench_shape(
                    rng,
                    label="4096^3",
                    m=4096,
                    n=4096,
                    k=4096,
                    dtype=dtype,
                    out16=out16,
                    layout=layout,
                    res=False,
                    variants=[v],
                )
            except Exception as ex:  # noqa: BLE001
                err(f"bench 4096^3 {dtype} {out16} {layout}", ex)


def sass() -> None:
    v = wgmma.Variant(out16=True)
    try:
        kern = wgmma.compiled(v)
        s = RESULTS["sass"]
        try:
            s["registers"] = int(kern._codelibrary.get_cufunc().attrs.regs)
            s["shared_static"] = int(kern._codelibrary.get_cufunc().attrs.shared)
            s["local"] = int(kern._codelibrary.get_cufunc().attrs.local)
        except Exception as ex:  # noqa: BLE001
            s["attrs_error"] = str(ex)
        text = kern.inspect_sass()
        s["HGMMA"] = text.count("HGMMA")
        s["HMMA"] = text.count("HMMA")
        s["LDL_STL"] = text.count("LDL") + text.count("STL")
        s["WARPGROUP"] = text.count("WARPGROUP")
        s["lines"] = len(text.splitlines())
        s["hgmma_lines"] = [ln.strip() for ln in text.splitlines() if "HGMMA" in ln][:8]
        log(f"sass {v.tag}: { ({k: s[k] for k in s if k != 'hgmma_lines'}) }")
    except Exception as ex:  # noqa: BLE001
        err("sass", ex)


def table() -> str:
    lines = [
        "shape               dtype out  lay variant                             ours TF  cuBLAS TF  ratio  "
        "ours err  cuBLAS err  ok"
    ]
    for t in RESULTS["timings"]:
        lines.append(
            f"{t['shape']:19s} {t['dtype']:5s} {t['out']:4s} {t['layout']:3s} {t['variant']:34s} "
            f"{t['ours']['tflops']:7.0f} {t['cublas']['tflops']:10.0f} {t['ratio']:6.3f} "
            f"{t['ours'].get('rel_err', float('nan')):9.2e} {t['cublas'].get('rel_err', float('nan')):11.2e}"
            f"  {'ok' if t['ok'] else 'FAIL'}"
        )
    c = RESULTS["checks"]
    nok = sum(x["ok"] for x in c)
    failed = [(x["variant"], x["m"], x["n"], x["k"]) for x in c if not x["ok"]]
    lines.append(f"checks: {nok}/{len(c)} ok; failed: {failed}")
    lines.append(f"errors: {len(RESULTS['errors'])} {[e['where'] for e in RESULTS['errors']]}")
    lines.append(f"sass: { ({k: v for k, v in RESULTS['sass'].items() if k != 'hgmma_lines'}) }")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--skip-bench", action="store_true")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(13)
    try:
        env()
    except Exception as ex:  # noqa: BLE001
        err("env", ex)
    if not RESULTS["env"].get("available"):
        log("wgmma not available on this device: stopping")
    else:
        checks(rng, args.quick)
        (args.out / "wgmma.json").write_text(json.dumps(RESULTS, indent=1, default=str))
        # no timing of a kernel that computes wrong values
        if not args.skip_bench and any(x["ok"] for x in RESULTS["checks"]):
            timings(rng, args.quick)
        sass()
    RESULTS["wall_s"] = time.time() - T0
    (args.out / "wgmma.json").write_text(json.dumps(RESULTS, indent=1, default=str))
    print(table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

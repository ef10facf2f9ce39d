"""Device script for the matmul ops (gemm, o_proj): correctness of every path, timing side by side with
cuBLAS, tile-configuration sweep of the tensor-core kernel, host overhead, and a SASS summary, in one call.

    python benchmarks/matmul_probe.py [--out DIR] [--iters N] [--configs 128x128s3w2x2,...] [--no-sass]

Method (../.library/device/METHOD.md): fresh random inputs per case, outputs poisoned with NaN before each
checked launch and checked to be fully written; references in float64 on the GPU through CuPy (upcast
inputs); timing with CUDA events around each call after warm-up, rotating over 3 input sets (every bench
case is larger than the 60 MB L2), medians with p10/p90. Writes DIR/matmul.json; prints a table last.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cupy as cp
import numpy as np
from numba import cuda

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.ops import gemm as g  # noqa: E402
from kernels.ops import o_proj as op  # noqa: E402
from kernels.ops.cuda import mma  # noqa: E402

SETS = 3
WARMUP = 3


def log(msg: str) -> None:
    print(msg, flush=True)


def time_us(fn: Callable[[int], None], iters: int) -> dict[str, float]:
    """Per-call device time (us) of fn(i) (i picks the input set), CUDA events around each call; a failing
    implementation gives {"error": ...} and nan times instead of stopping the sweep."""
    try:
        return _time_us(fn, iters)
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        return {"median_us": float("nan"), "p10_us": float("nan"), "p90_us": float("nan"), "error": repr(e)}


def _time_us(fn: Callable[[int], None], iters: int) -> dict[str, float]:
    for i in range(WARMUP):
        fn(i)
    evs = []
    for i in range(iters):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        fn(i)
        b.record()
        evs.append((a, b))
    cp.cuda.runtime.deviceSynchronize()
    us = np.array([cp.cuda.get_elapsed_time(a, b) * 1e3 for a, b in evs])
    return {
        "median_us": float(np.median(us)),
        "p10_us": float(np.percentile(us, 10)),
        "p90_us": float(np.percentile(us, 90)),
    }


def rel_err(out: Any, ref: Any) -> float | None:
    o = out.astype(cp.float64)
    if not bool(cp.isfinite(o).all()):
        return None  # unwritten (NaN poison survived) or overflow
    return float(cp.linalg.norm(o - ref) / cp.linalg.norm(ref))


# --- gemm -------------------------------------------------------------------------------------------------


def gemm_inputs(m: int, n: int, k: int, dt: str, rng: np.random.Generator) -> list[tuple[Any, Any]]:
    sets = []
    for _ in range(SETS):
        a = cp.asarray(rng.standard_normal((m, k), dtype=np.float32)).astype(dt)
        b = cp.asarray(rng.standard_normal((k, n), dtype=np.float32)).astype(dt)
        sets.append((a, b))
    return sets


def gemm_paths(dt: str) -> list[str]:
    return ["portable", "simt", "simt_wide"] + (["mma"] if dt == "float16" else [])


def check_gemm(m: int, n: int, k: int, dt: str, path: str, rng: np.random.Generator, cfg: Any = None) -> Any:
    a, b = gemm_inputs(m, n, k, dt, rng)[0]
    c = cp.full((m, n), cp.nan, dtype=cp.float32)
    if cfg is None:
        g.gemm(a, b, c, path=path)
    else:
        mma.launch(a=a.data.ptr, b=b.data.ptr, bias=0, res=0, out=c.data.ptr, m=m, n=n, k=k, out_half=False,
                   cfg=cfg)  # fmt: skip
    ref = a.astype(cp.float64) @ b.astype(cp.float64)
    return rel_err(c, ref)


def bench_gemm(
    m: int, n: int, k: int, dt: str, iters: int, rng: np.random.Generator, cfgs: list[Any],
    paths: list[str] | None = None,
) -> list[dict[str, Any]]:  # fmt: skip
    sets = gemm_inputs(m, n, k, dt, rng)
    outs = [cp.empty((m, n), dtype=cp.float32) for _ in range(SETS)]
    flops = 2.0 * m * n * k
    rows = []

    def row(name: str, st: dict[str, float]) -> dict[str, Any]:
        r = {"op": "gemm", "dtype": dt, "shape": f"{m}x{n}x{k}", "impl": name, **st}
        r["tflops"] = flops / (st["median_us"] * 1e-6) / 1e12
        return r

    def ours(path: str) -> Callable[[int], None]:
        def f(i: int) -> None:
            a, b = sets[i % SETS]
            g.gemm(a, b, outs[i % SETS], path=path)

        return f

    for path in gemm_paths(dt) if paths is None else paths:
        slow = path == "portable" and m * n * k > 2**34
        iters_p = max(5, iters // 4) if slow else iters  # the slow path: fewer calls
        rows.append(row(path, time_us(ours(path), iters_p)))
    if dt == "float16":
        for cfg in cfgs:

            def fc(i: int, cfg: Any = cfg) -> None:
                a, b = sets[i % SETS]
                c = outs[i % SETS]
                mma.launch(a=a.data.ptr, b=b.data.ptr, bias=0, res=0, out=c.data.ptr, m=m, n=n, k=k,
                           out_half=False, cfg=cfg)  # fmt: skip

            try:
                rows.append(row(f"mma[{cfg.tag}]", time_us(fc, iters)))
            except Exception as e:  # noqa: BLE001
                rows.append({"op": "gemm", "dtype": dt, "impl": f"mma[{cfg.tag}]", "error": repr(e)})

    def cub(i: int) -> None:
        a, b = sets[i % SETS]
        g._cupy({"a": a, "b": b, "c": outs[i % SETS]})

    rows.append(row("cublas", time_us(cub, iters)))
    if dt == "float16":  # cupy's own a @ b: fp16 output (the figure FACTS.md quotes)
        rows.append(row("cublas_f16out", time_us(lambda i: sets[i % SETS][0] @ sets[i % SETS][1], iters)))
    # cuBLAS result correctness (same reference) so the baseline is known to compute the same thing
    a, b = sets[0]
    c = cp.full((m, n), cp.nan, dtype=cp.float32)
    g._cupy({"a": a, "b": b, "c": c})
    rows[-1 if dt == "float32" else -2]["rel_err"] = rel_err(c, a.astype(cp.float64) @ b.astype(cp.float64))
    return rows


# --- o_proj -----------------------------------------------------------------------------------------------


def oproj_inputs(
    bs: int, s: int, k: int, n: int, dt: str, bias: bool, rng: np.random.Generator
) -> list[dict]:
    sets = []
    for _ in range(SETS):
        d = {
            "attn": cp.asarray(rng.standard_normal((bs, s, k), dtype=np.float32)).astype(dt),
            "w": cp.asarray(rng.standard_normal((k, n), dtype=np.float32) / np.sqrt(k)).astype(dt),
            "residual": cp.asarray(rng.standard_normal((bs, s, n), dtype=np.float32)).astype(dt),
            "bias": cp.asarray(rng.standard_normal(n, dtype=np.float32)).astype(dt) if bias else None,
            "out": cp.empty((bs, s, n), dtype=dt),
        }
        sets.append(d)
    return sets


def oproj_ref(d: dict) -> Any:
    attn, w = d["attn"], d["w"]
    y = (attn.reshape(-1, attn.shape[-1]).astype(cp.float64) @ w.astype(cp.float64)).reshape(d["out"].shape)
    y += d["residual"].astype(cp.float64)
    if d["bias"] is not None:
        y += d["bias"].astype(cp.float64)
    return y


def check_oproj(shape: tuple[int, int, int, int], dt: str, bias: bool, path: str, rng: np.random.Generator):
    d = oproj_inputs(*shape, dt, bias, rng)[0]
    d["out"].fill(cp.nan)
    op.o_proj(d["attn"], d["w"], d["residual"], d["bias"], d["out"], path=path)
    return rel_err(d["out"], oproj_ref(d))


def bench_oproj(
    shape: tuple[int, int, int, int], dt: str, iters: int, rng: np.random.Generator
) -> list[dict]:
    bs, s, k, n = shape
    sets = oproj_inputs(bs, s, k, n, dt, False, rng)
    flops = 2.0 * bs * s * n * k + bs * s * n
    rows = []

    def row(name: str, st: dict[str, float]) -> dict[str, Any]:
        r = {"op": "o_proj", "dtype": dt, "shape": f"[{bs},{s},{k}]x[{k},{n}]", "impl": name, **st}
        r["tflops"] = flops / (st["median_us"] * 1e-6) / 1e12
        return r

    for path in gemm_paths(dt):

        def f(i: int, path: str = path) -> None:
            d = sets[i % SETS]
            op.o_proj(d["attn"], d["w"], d["residual"], None, d["out"], path=path)

        rows.append(row(path, time_us(f, iters if path != "portable" else max(5, iters // 4))))

    def cub(i: int) -> None:
        op._cupy(sets[i % SETS])

    rows.append(row("cublas+add", time_us(cub, iters)))

    def mm_only(i: int) -> None:
        d = sets[i % SETS]
        cp.matmul(d["attn"].reshape(-1, k), d["w"])

    rows.append(row("cublas_matmul_only", time_us(mm_only, iters)))
    d = sets[0]
    d["out"].fill(cp.nan)
    op._cupy(d)
    rows[-2]["rel_err"] = rel_err(d["out"], oproj_ref(d))
    return rows


# --- host overhead, SASS ----------------------------------------------------------------------------------


def host_overhead(n_calls: int = 2000) -> list[dict[str, Any]]:
    """Wall time per launcher call on device arrays at a tiny shape (GPU time per call ~ few us, so the host
    is the bottleneck): median over 5 batches of n_calls, each batch synchronised once at the end."""
    out = []
    for dt, path in (("float32", "simt"), ("float32", "auto"), ("float16", "auto"), ("float32", "portable")):
        a = cp.ones((64, 64), dtype=dt)
        b = cp.ones((64, 64), dtype=dt)
        c = cp.empty((64, 64), dtype=cp.float32)
        for _ in range(50):
            g.gemm(a, b, c, path=path)
        cp.cuda.runtime.deviceSynchronize()
        per = []
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(n_calls):
                g.gemm(a, b, c, path=path)
            cp.cuda.runtime.deviceSynchronize()
            per.append((time.perf_counter() - t) / n_calls * 1e6)
        # the same with numba device arrays
        na, nb, nc = cuda.to_device(np.ones((64, 64), dt)), cuda.to_device(np.ones((64, 64), dt)), None
        nc = cuda.device_array((64, 64), np.float32)
        t = time.perf_counter()
        for _ in range(n_calls):
            g.gemm(na, nb, nc, path=path)
        cuda.synchronize()
        numba_us = (time.perf_counter() - t) / n_calls * 1e6
        out.append({"call": f"gemm 64^3 {dt} {path}", "us_per_call_cupy_arrays": float(np.median(per)),
                    "us_per_call_numba_arrays": numba_us})  # fmt: skip
    attn = cp.ones((1, 64, 64), dtype=cp.float16)
    w = cp.ones((64, 64), dtype=cp.float16)
    r = cp.ones((1, 64, 64), dtype=cp.float16)
    o = cp.empty((1, 64, 64), dtype=cp.float16)
    for _ in range(50):
        op.o_proj(attn, w, r, None, o)
    cp.cuda.runtime.deviceSynchronize()
    t = time.perf_counter()
    for _ in range(n_calls):
        op.o_proj(attn, w, r, None, o)
    cp.cuda.runtime.deviceSynchronize()
    out.append({"call": "o_proj [1,64,64] fp16 mma", "us_per_call_cupy_arrays":
                (time.perf_counter() - t) / n_calls * 1e6})  # fmt: skip
    return out


def sass_summary(outdir: Path) -> dict[str, Any]:
    """Resource use (registers, shared, local) and instruction mix of the production kernels, from the cubins
    numba built, with cuobjdump."""
    res: dict[str, Any] = {}
    exe = shutil.which("cuobjdump")
    kernels: list[tuple[str, Any, str]] = [
        ("simt_f32", g._simt(False, False), g._sig(g.F32, g.F32)),
        ("simt_oproj_f32", g._simt(False, True), g._sig(g.F32, g.F32)),
    ]
    ds = mma.dispatchers(mma.DEFAULT)
    kernels += [
        ("mma_f32out", ds[(False, True)], mma.KERNEL_SIG),
        ("mma_f16out", ds[(True, True)], mma.KERNEL_SIG),
        ("mma_f32out_unaligned", ds[(False, False)], mma.KERNEL_SIG),
    ]
    kernels += [("simt_wide_f32", g._simt_wide(False, False), g._sig(g.F32, g.F32)),
                ("simt_wide_oproj_f32", g._simt_wide(False, True), g._sig(g.F32, g.F32))]  # fmt: skip
    pats = {
        "FFMA": r"\bFFMA\b", "HMMA": r"\bHMMA\.16816", "LDS.128": r"\bLDS\.128\b", "LDS": r"\bLDS\b",
        "LDSM": r"\bLDSM\b", "LDGSTS": r"\bLDGSTS\b", "LDG": r"\bLDG\b", "LDL": r"\bLDL\b", "STL": r"\bSTL\b",
        "BAR": r"\bBAR\b",
    }  # fmt: skip
    for name, disp, sig in kernels:
        try:
            kern = disp.compile(sig)
            cufunc = kern._codelibrary.get_cufunc()
            info: dict[str, Any] = {"regs": cufunc.attrs.regs, "local_bytes": cufunc.attrs.local,
                                    "shared_static": cufunc.attrs.shared}  # fmt: skip
            cubin = kern._codelibrary.get_cubin()
            data = bytes(getattr(cubin, "code", cubin))
            path = outdir / f"{name}.cubin"
            path.write_bytes(data)
            if exe:
                sass = subprocess.run(
                    [exe, "-sass", str(path)], capture_output=True, text=True, check=False
                ).stdout
                info["sass_counts"] = {k: len(re.findall(p, sass)) for k, p in pats.items()}
                (outdir / f"{name}.sass.txt").write_text(sass) if name.startswith("mma_f32") else None
            path.unlink()
            res[name] = info
        except Exception as e:  # noqa: BLE001
            res[name] = {"error": repr(e)}
    return res


# --- main -------------------------------------------------------------------------------------------------


def parse_cfg(s: str) -> Any:
    m_ = re.fullmatch(r"(\d+)x(\d+)s(\d+)w(\d+)x(\d+)(?:k(\d+))?", s)
    if not m_:
        raise SystemExit(f"--configs: {s!r} is not BMxBNsSTAGESwWMxWN[kBK] (e.g. 128x128s3w2x2k64)")
    bm, bn, st, wm, wn = map(int, m_.groups()[:5])
    return mma.Config(bm, bn, st, wm, wn, int(m_.group(6) or 32))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument(
        "--configs", default="128x128s3w2x2,128x128s3w2x2k64,128x128s4w2x2,128x256s3w2x4k64,256x128s3w4x2k64"
    )
    ap.add_argument(
        "--mma-only", action="store_true", help="only the tile-config sweep: checks + fp16 gemm bench"
    )
    ap.add_argument("--no-sass", action="store_true")
    ap.add_argument("--skip", default="", help="comma list of stages to skip: check,bench,overhead,sass")
    args = ap.parse_args()
    outdir = Path(args.out)
    outdir.mkdir(parents=True, exist_ok=True)
    skip = set(filter(None, args.skip.split(",")))
    cfgs = [parse_cfg(s) for s in args.configs.split(",") if s]
    rng = np.random.default_rng()
    dev = cuda.get_current_device()
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(["python", *sys.argv]),
        "device": {
            "name": dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name),
            "cc": list(dev.compute_capability),
            "sms": dev.MULTIPROCESSOR_COUNT,
        },  # fmt: skip
        "versions": {
            "numpy": np.__version__,
            "cupy": cp.__version__,
            "numba_cuda": __import__("importlib.metadata").metadata.version("numba-cuda"),
            "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(),
            "driver": cp.cuda.runtime.driverGetVersion(),
        },  # fmt: skip
        "method": {"sets": SETS, "warmup": WARMUP, "iters": args.iters, "timer": "cuda events per call"},
    }
    log(json.dumps({k: report[k] for k in ("date", "device", "versions")}))

    # 1. correctness of every path, verify + bench shapes
    checks = []
    if args.mma_only:
        skip |= {"overhead", "sass"}
    if "check" not in skip:
        gshapes = [(c.params["M"], c.params["N"], c.params["K"]) for c in g.SPEC.verify_cases[::2]]
        gshapes += [(c.params["M"], c.params["N"], c.params["K"]) for c in g.SPEC.bench_cases[::2]]
        for m, n, k in [] if args.mma_only else gshapes:
            for dt in ("float32", "float16"):
                for path in gemm_paths(dt):
                    try:
                        e = check_gemm(m, n, k, dt, path, rng)
                    except Exception as ex:  # noqa: BLE001
                        traceback.print_exc()
                        e = repr(ex)
                    ok = isinstance(e, float) and e <= g.SPEC.tolerance[dt]
                    checks.append({"op": "gemm", "shape": f"{m}x{n}x{k}", "dtype": dt, "path": path,
                                   "rel_err": e, "ok": ok})  # fmt: skip
                    log(f"check gemm {m}x{n}x{k} {dt} {path}: {e} {'ok' if ok else 'FAIL'}")
        for cfg in cfgs:  # every tile config at an unaligned, an edge and a bench shape
            for m, n, k in [(257, 129, 67), (520, 392, 264), (8192, 2560, 2560)]:
                try:
                    e = check_gemm(m, n, k, "float16", "mma", rng, cfg)
                except Exception as ex:  # noqa: BLE001
                    traceback.print_exc()
                    e = repr(ex)
                ok = isinstance(e, float) and e <= g.SPEC.tolerance["float16"]
                checks.append({"op": "gemm", "shape": f"{m}x{n}x{k}", "dtype": "float16",
                               "path": f"mma[{cfg.tag}]", "rel_err": e, "ok": ok})  # fmt: skip
                log(f"check gemm {m}x{n}x{k} mma[{cfg.tag}]: {e} {'ok' if ok else 'FAIL'}")
        oshapes = [(c.params["B"], c.params["S"], c.params["K"], c.params["N"], bool(c.params["bias"]))
                   for c in op.SPEC.verify_cases[::2] + op.SPEC.bench_cases[::2]]  # fmt: skip
        for bs, s, k, n, bias in [] if args.mma_only else oshapes:
            for dt in ("float32", "float16"):
                for path in gemm_paths(dt):
                    try:
                        e = check_oproj((bs, s, k, n), dt, bias, path, rng)
                    except Exception as ex:  # noqa: BLE001
                        traceback.print_exc()
                        e = repr(ex)
                    ok = isinstance(e, float) and e <= op.SPEC.tolerance[dt]
                    checks.append({"op": "o_proj", "shape": f"[{bs},{s},{k}]x[{k},{n}]", "bias": bias,
                                   "dtype": dt, "path": path, "rel_err": e, "ok": ok})  # fmt: skip
                    log(
                        f"check o_proj [{bs},{s},{k}]x[{k},{n}] bias={bias} {dt} {path}: {e} "
                        + ("ok" if ok else "FAIL")
                    )
    report["checks"] = checks

    # 2. timing side by side with cuBLAS
    bench: list[dict[str, Any]] = []
    if "bench" not in skip:
        for c in g.SPEC.bench_cases:
            m, n, k = c.params["M"], c.params["N"], c.params["K"]
            if args.mma_only and c.dtype != "float16":
                continue
            try:
                bench += bench_gemm(m, n, k, c.dtype, args.iters, rng, cfgs if c.dtype == "float16" else [],
                                    ["mma"] if args.mma_only else None)  # fmt: skip
            except Exception as ex:  # noqa: BLE001
                traceback.print_exc()
                bench.append({"op": "gemm", "dtype": c.dtype, "shape": f"{m}x{n}x{k}", "error": repr(ex)})
            log(f"bench gemm {m}x{n}x{k} {c.dtype} done")
        for c in [] if args.mma_only else op.SPEC.bench_cases:
            shape = (c.params["B"], c.params["S"], c.params["K"], c.params["N"])
            try:
                bench += bench_oproj(shape, c.dtype, args.iters, rng)
            except Exception as ex:  # noqa: BLE001
                traceback.print_exc()
                bench.append({"op": "o_proj", "dtype": c.dtype, "error": repr(ex)})
            log(f"bench o_proj {c.dtype} done")
        cp.get_default_memory_pool().free_all_blocks()
    report["bench"] = bench

    if "overhead" not in skip:
        try:
            report["host_overhead"] = host_overhead()
        except Exception as ex:  # noqa: BLE001
            traceback.print_exc()
            report["host_overhead"] = repr(ex)
    if "sass" not in skip and not args.no_sass:
        report["sass"] = sass_summary(outdir)

    (outdir / "matmul.json").write_text(json.dumps(report, indent=1, default=str))

    # table last (the device tool returns the tail of the output)
    log("\n== correctness ==")
    bad = [c for c in checks if not c["ok"]]
    log(f"{len(checks) - len(bad)}/{len(checks)} checks pass" + (f"; FAILED: {bad}" if bad else ""))
    log("\n== bench (median us, TFLOP/s, vs cuBLAS) ==")
    base: dict[tuple[str, str, str], float] = {}
    for r in bench:
        if r.get("impl") in ("cublas", "cublas+add"):
            base[(r["op"], r["dtype"], r["shape"])] = r["median_us"]
    for r in bench:
        if "error" in r:
            log(f"{r['op']:7s} {r['dtype']:8s} {r.get('impl', '')}: ERROR {r['error']}")
            continue
        b = base.get((r["op"], r["dtype"], r["shape"]))
        ratio = f"{b / r['median_us']:.3f}x" if b else ""
        log(f"{r['op']:7s} {r['dtype']:8s} {r['shape']:22s} {r['impl']:26s} {r['median_us']:10.1f} "
            f"{r['tflops']:8.1f}  {ratio}")  # fmt: skip
    if isinstance(report.get("host_overhead"), list):
        log("\n== host overhead (us per call) ==")
        for h in report["host_overhead"]:
            log(json.dumps(h))
    if "sass" in report:
        log("\n== resources / SASS ==")
        for k_, v in report["sass"].items():
            log(f"{k_}: {json.dumps(v)}")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())

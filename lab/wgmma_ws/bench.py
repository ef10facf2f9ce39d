"""Device check + bench of the warp-specialized TMA GEMM (run by lab/wgmma_ws/run.sh on the H200).

Orchestrator (default): starts one worker subprocess per variant family at once, so that the numba + NVRTC +
LTO compiles run in parallel on the CPU; each worker, once compiled, writes `ready_<name>` and waits for
`go_<name>`; the orchestrator lets one worker at a time onto the GPU (priority order, the next ready one),
waits for it to exit (GPU-phase timeout), then the next. A worker that hangs, traps or corrupts its context
takes only itself down. Results: $OUT/part_<name>.json per worker, merged into $OUT/ws.json; table last.

Worker (--worker NAME): correctness against float64 (small shapes in full, every output poisoned with NaN
first), then timing at 4096^3, 8192x2560x2560 and o_proj (M 8192, N = K = 2560, + residual), side by side
with cuBLAS (torch), interleaved rounds, CUDA events per call, medians; the timed outputs checked on sampled
rows; SASS facts.

    python lab/wgmma_ws/bench.py --out $OUT [--budget 215] [--only ws_p,base]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import traceback
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).parent
T0 = time.time()
TOL = {"f32": 1e-4, "bf16": 1e-2, "f16": 2e-3}

# name -> (kind, tile options, layout); GPU order = this order
WORKERS: dict[str, tuple[str, dict[str, Any], str]] = {
    "ws_p": ("ws", {"persist": True}, "nn"),
    "base": ("cpasync", {"bn": 128, "stages": 6}, "nn"),  # the product tile (kernels/ops/gemm default)
    "ws": ("ws", {"persist": False}, "nn"),
    "ws_p128": ("ws", {"persist": True, "bn": 128, "stages": 7}, "nn"),
    "ws_nt": ("ws", {"persist": True}, "nt"),
    "ws_c2": ("ws", {"cluster": 2}, "nn"),  # 2-CTA clusters, B multicast (cuLaunchKernelEx): last, riskiest
}
LAST = {"ws_c2"}
SMALL = [(256, 512, 128), (129, 200, 136), (77, 264, 72), (300, 392, 1000), (1, 8, 8), (1000, 1000, 64)]
SHAPES = [  # label, m, n, k, res, out16
    ("4096^3", 4096, 4096, 4096, False, True),
    ("8192x2560x2560", 8192, 2560, 2560, False, True),
    ("o_proj 16x512x2560", 8192, 2560, 2560, True, True),
    ("4096^3", 4096, 4096, 4096, False, False),
]

R: dict[str, Any] = {"env": {}, "checks": [], "timings": [], "sass": {}, "errors": []}


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def err(where: str, ex: BaseException) -> None:
    tb = traceback.format_exc().strip().splitlines()[-6:]
    R["errors"].append({"where": where, "error": f"{type(ex).__name__}: {ex}", "tb": tb})
    log(f"ERROR {where}: {type(ex).__name__}: {str(ex)[:400]}")


# ================================================================ worker


class Dev:
    """numba device array typed with the host dtype (bf16 via ml_dtypes); host copies through a uint16 view."""

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


def rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    o = out.astype(np.float64)
    if not np.all(np.isfinite(o)):
        return float("inf")
    return float(np.max(np.abs(o - ref)) / max(np.max(np.abs(ref)), 1e-30))


class Family:
    """One worker's kernels: `variant(out16, res)` and `run(v, a, b, out, res)`."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.kind, self.opts, self.layout = WORKERS[name]
        if self.kind == "ws":
            import ws

            self.mod = ws
        else:
            sys.path.insert(0, str(HERE.parent / "wgmma"))
            import wgmma

            self.mod = wgmma

    def variant(self, out16: bool, res: bool) -> Any:
        return self.mod.Variant(out16=out16, res=res, layout=self.layout, **self.opts)

    def run(self, v: Any, a: Any, b: Any, out: Any, res: Any) -> None:
        if self.kind == "ws":
            self.mod.gemm(a=a, b=b, out=out, res=res, variant=v)
        else:
            self.mod.gemm(a=a, b=b, out=out, res=res, layout=self.layout, variant=v)

    def needed(self) -> list[Any]:
        if self.layout == "nt":
            return [self.variant(True, False)]
        return [self.variant(True, False), self.variant(True, True), self.variant(False, False)]


def check(fam: Family, rng: np.random.Generator, v: Any, m: int, n: int, k: int) -> dict[str, Any]:
    from numba import cuda

    dt = fam.mod.np_dtype(v.dtype)
    a = rand(rng, (m, k), dt)
    b = rand(rng, (k, n) if fam.layout == "nn" else (n, k), dt)
    r = rand(rng, (m, n), dt) if v.res else None
    odt = dt if v.out16 else np.dtype(np.float32)
    da, db = Dev(a), Dev(b)
    dr = Dev(r) if r is not None else None
    dout = Dev(np.zeros((m, n), odt))
    dout.poison()
    fam.run(v, da, db, dout, dr)
    cuda.synchronize()
    got = dout.host()
    bt = b.astype(np.float64) if fam.layout == "nn" else b.astype(np.float64).T
    ref = a.astype(np.float64) @ bt + (r.astype(np.float64) if r is not None else 0.0)
    oname = v.dtype if v.out16 else "f32"
    e = rel_err(got, ref)
    nonfinite = int(np.sum(~np.isfinite(got.astype(np.float32))))
    rec = dict(worker=fam.name, variant=v.tag, m=m, n=n, k=k, rel_err=e, tol=TOL[oname], nonfinite=nonfinite,
               ok=bool(e <= TOL[oname] and nonfinite == 0))  # fmt: skip
    if not rec["ok"]:
        bad = np.argwhere(~np.isclose(got.astype(np.float64), ref, rtol=0.05, atol=0.05 * np.abs(ref).max()))
        rec["first_bad"] = [[int(i), int(j)] for i, j in bad[:8]]
        rec["bad_fraction"] = float(len(bad) / ref.size)
    R["checks"].append(rec)
    log(f"check {v.tag:40s} {m}x{n}x{k} err {e:.2e} {'ok' if rec['ok'] else 'FAIL'}"
        + ("" if rec["ok"] else f" nonfinite {nonfinite} bad {rec.get('bad_fraction', 0):.3f} at {rec['first_bad'][:4]}"))  # fmt: skip
    return rec


def events_time(fn: Callable[[], None], calls: int) -> list[float]:
    import torch

    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(calls)]
    for s, e in ev:
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in ev]


def compare(fns: dict[str, Callable[[], None]], flops: float, rounds: int = 6, calls: int = 8) -> dict[str, Any]:
    import torch

    for fn in fns.values():
        for _ in range(5):
            fn()
    torch.cuda.synchronize()
    per: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            per[name] += events_time(fn, calls)
    return {
        name: {"median_ms": float(np.median(ts)), "min_ms": float(min(ts)), "n": len(ts),
               "tflops": flops / float(np.median(ts)) / 1e9,
               "median_first_half_ms": float(np.median(ts[: len(ts) // 2])),
               "median_second_half_ms": float(np.median(ts[len(ts) // 2 :]))}
        for name, ts in per.items()
    }  # fmt: skip


def cublas_fn(a: Any, bb: Any, r: Any, out16: bool) -> tuple[str, Callable[[], None]]:
    """As lab/wgmma/bench.py: addmm for the residual, mm into a 16-bit out, mm(out_dtype=fp32) for fp32 out."""
    import torch

    m, n = a.shape[0], bb.shape[1]
    if r is not None:
        o = torch.empty((m, n), dtype=a.dtype, device="cuda")
        return "cublas_addmm", lambda: torch.addmm(r, a, bb, out=o)
    if out16:
        o = torch.empty((m, n), dtype=a.dtype, device="cuda")
        return "cublas", lambda: torch.mm(a, bb, out=o)
    try:
        torch.mm(a[:8], bb[:, :8], out_dtype=torch.float32)
        return "cublas_f32out", lambda: torch.mm(a, bb, out_dtype=torch.float32)
    except Exception:  # noqa: BLE001
        o = torch.empty((m, n), dtype=a.dtype, device="cuda")
        return "cublas_16out", lambda: torch.mm(a, bb, out=o)


def torch_of(host: np.ndarray) -> Any:
    import torch

    t = torch.from_numpy(np.ascontiguousarray(host.view(np.int16))).cuda()
    return t.view(torch.float16 if host.dtype == np.float16 else torch.bfloat16)


def bench_shape(fam: Family, rng: np.random.Generator, label: str, m: int, n: int, k: int, res: bool,
                out16: bool) -> None:  # fmt: skip
    import torch

    v = fam.variant(out16, res)
    dt = fam.mod.np_dtype(v.dtype)
    a = rand(rng, (m, k), dt)
    b = rand(rng, (k, n) if fam.layout == "nn" else (n, k), dt)
    r = rand(rng, (m, n), dt) if res else None
    da, db = Dev(a), Dev(b)
    dr = Dev(r) if r is not None else None
    dout = Dev(np.zeros((m, n), dt if out16 else np.dtype(np.float32)))
    ta, tb = torch_of(a), torch_of(b)
    tr = torch_of(r) if r is not None else None
    bb = tb if fam.layout == "nn" else tb.t()
    cname, cfn = cublas_fn(ta, bb, tr, out16)
    fns = {v.tag: lambda: fam.run(v, da, db, dout, dr), cname: cfn}
    t = compare(fns, 2.0 * m * n * k)
    rows = np.sort(rng.choice(m, min(m, 64), replace=False))
    btf = b.astype(np.float64) if fam.layout == "nn" else b.astype(np.float64).T
    ref = a[rows].astype(np.float64) @ btf + (r[rows].astype(np.float64) if r is not None else 0.0)
    dout.poison()
    fam.run(v, da, db, dout, dr)
    torch.cuda.synchronize()
    got = dout.host()
    t[v.tag]["rel_err"] = rel_err(got[rows], ref)
    t[v.tag]["nonfinite"] = int(np.sum(~np.isfinite(got.astype(np.float32))))
    ct = torch.addmm(tr, ta, bb) if tr is not None else torch.mm(ta, bb)
    t[cname]["rel_err"] = rel_err(ct.float().cpu().numpy()[rows], ref)
    oname = v.dtype if out16 else "f32"
    rec = dict(worker=fam.name, shape=label, m=m, n=n, k=k, out=oname, layout=fam.layout, res=res, variant=v.tag,
               ours=t[v.tag], cublas_name=cname, cublas=t[cname], ratio=t[cname]["median_ms"] / t[v.tag]["median_ms"],
               ok=bool(t[v.tag]["rel_err"] <= TOL[oname] and t[v.tag]["nonfinite"] == 0))  # fmt: skip
    R["timings"].append(rec)
    log(f"time {label} {v.tag}: ours {t[v.tag]['median_ms'] * 1e3:.1f} us {t[v.tag]['tflops']:.0f} TF, "
        f"{cname} {t[cname]['median_ms'] * 1e3:.1f} us, ratio {rec['ratio']:.3f}, err {t[v.tag]['rel_err']:.2e}")  # fmt: skip


def sass(fam: Family, v: Any) -> None:
    try:
        kern = fam.mod.compiled(v)
        s: dict[str, Any] = {}
        try:
            f = kern._codelibrary.get_cufunc()
            s.update(registers=int(f.attrs.regs), local=int(f.attrs.local), shared_static=int(f.attrs.shared))
        except Exception as ex:  # noqa: BLE001
            s["attrs_error"] = str(ex)[:200]
        text = kern.inspect_sass()
        for key in ("HGMMA", "HMMA", "UTMALDG", "MULTICAST", "USETMAXREG", "UCGABAR", "SYNCS", "LDL", "STL"):
            s[key] = text.count(key)
        s["lines"] = len(text.splitlines())
        R["sass"][v.tag] = s
        log(f"sass {v.tag}: {s}")
    except Exception as ex:  # noqa: BLE001
        err(f"sass {v.tag}", ex)


def _flag(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)  # atomic: the orchestrator never reads a half-written flag


def _fatal(ex: BaseException) -> bool:
    """An error after which this process's CUDA context is unusable (trap, bad address, ...)."""
    s = str(ex)
    return any(w in s for w in ("CUDA_ERROR", "CUDA error", "launch failure", "LAUNCH_FAILED", "ILLEGAL"))


def worker(name: str, out: Path, sync: Path) -> int:
    try:
        import ml_dtypes
        import numba
        import torch
        from numba import cuda

        dev = cuda.get_current_device()
        R["env"] = dict(python=platform.python_version(), numpy=np.__version__, numba=numba.__version__,
                        torch=torch.__version__, ml_dtypes=ml_dtypes.__version__, device=str(dev.name),
                        cc=list(dev.compute_capability), sms=int(dev.MULTIPROCESSOR_COUNT))  # fmt: skip
        torch.cuda.init()
        fam = Family(name)
        if not fam.mod.available():
            raise RuntimeError("not a cc 9.0 device")
        t = time.time()
        for v in fam.needed():
            tc = time.time()
            fam.mod.compiled(v)
            log(f"compiled {v.tag} in {time.time() - tc:.1f} s")
        R["compile_s"] = time.time() - t
    except Exception as ex:  # noqa: BLE001
        err(f"{name} setup/compile", ex)
        (out / f"part_{name}.json").write_text(json.dumps(R, indent=1, default=str))
        _flag(sync / f"ready_{name}", "failed")
        return 1
    _flag(sync / f"ready_{name}", "ok")
    while not (sync / f"go_{name}").exists():
        time.sleep(0.05)
    log(f"{name}: on the GPU")
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    try:
        for v in fam.needed():
            for m, n, k in SMALL if v == fam.needed()[0] else SMALL[:4]:
                try:
                    check(fam, rng, v, m, n, k)
                except Exception as ex:  # noqa: BLE001
                    err(f"check {v.tag} {m}x{n}x{k}", ex)
                    if _fatal(ex):
                        raise  # the context is gone
            (out / f"part_{name}.json").write_text(json.dumps(R, indent=1, default=str))
        for label, m, n, k, res, out16 in SHAPES if fam.layout == "nn" else SHAPES[:2]:
            try:
                bench_shape(fam, rng, label, m, n, k, res, out16)
            except Exception as ex:  # noqa: BLE001
                err(f"bench {name} {label} res={res} out16={out16}", ex)
                if _fatal(ex):
                    raise
            (out / f"part_{name}.json").write_text(json.dumps(R, indent=1, default=str))
        sass(fam, fam.needed()[0])
    except Exception as ex:  # noqa: BLE001
        err(f"{name} gpu phase aborted", ex)
    (out / f"part_{name}.json").write_text(json.dumps(R, indent=1, default=str))
    return 0


# ================================================================ orchestrator


def table(parts: dict[str, Any]) -> str:
    lines = [f"{'variant':44s} {'shape':19s} {'out':4s} {'ours us':>8s} {'TF':>5s} {'cuBLAS us':>9s} "
             f"{'ratio':>6s} {'max err':>9s} ok"]  # fmt: skip
    for name, p in parts.items():
        for t in p.get("timings", []):
            lines.append(
                f"{t['variant']:44s} {t['shape']:19s} {t['out']:4s} {t['ours']['median_ms'] * 1e3:8.1f} "
                f"{t['ours']['tflops']:5.0f} {t['cublas']['median_ms'] * 1e3:9.1f} {t['ratio']:6.3f} "
                f"{t['ours'].get('rel_err', float('nan')):9.2e} {'ok' if t['ok'] else 'FAIL'}"
            )
    for name, p in parts.items():
        c = p.get("checks", [])
        bad = [(x["variant"], x["m"], x["n"], x["k"]) for x in c if not x["ok"]]
        lines.append(f"{name}: checks {sum(x['ok'] for x in c)}/{len(c)} ok, failed {bad[:6]}; "
                     f"errors {[e['where'] for e in p.get('errors', [])][:6]}; status {p.get('status')}; "
                     f"sass {list(p.get('sass', {}).values())[:1]}")  # fmt: skip
    return "\n".join(lines)


def orchestrate(out: Path, budget: float, only: list[str], gpu_timeout: float) -> int:
    sync = out / "sync"
    sync.mkdir(parents=True, exist_ok=True)
    for f in sync.iterdir():
        f.unlink()
    names = [n for n in WORKERS if not only or n in only]
    procs: dict[str, subprocess.Popen[bytes]] = {}
    for n in names:
        logf = open(out / f"worker_{n}.txt", "wb")  # noqa: SIM115
        procs[n] = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--worker", n, "--out", str(out), "--sync", str(sync)],
            stdout=logf, stderr=subprocess.STDOUT,
        )  # fmt: skip
    log(f"started workers {names}")
    status: dict[str, str] = {}
    pending = list(names)
    deadline = T0 + budget
    while pending and time.time() < deadline:
        ready = [n for n in pending if (sync / f"ready_{n}").exists() or procs[n].poll() is not None]
        if any(n not in LAST for n in pending):  # the riskiest family goes on the GPU after all the others
            ready = [n for n in ready if n not in LAST]
        if not ready:
            time.sleep(0.1)
            continue
        n = ready[0]
        pending.remove(n)
        if procs[n].poll() is not None or (sync / f"ready_{n}").read_text() != "ok":
            procs[n].wait()
            status[n] = f"failed before the GPU phase (rc {procs[n].returncode})"
            log(f"{n}: {status[n]}")
            continue
        log(f"{n}: GPU phase")
        _flag(sync / f"go_{n}", "go")
        try:
            rc = procs[n].wait(timeout=max(1.0, min(gpu_timeout, deadline - time.time())))
            status[n] = f"rc {rc}"
        except subprocess.TimeoutExpired:
            procs[n].kill()
            procs[n].wait()
            status[n] = "KILLED: GPU-phase timeout (hang?)"
        log(f"{n}: {status[n]}")
    for n in pending:
        procs[n].kill()
        procs[n].wait()
        status[n] = "KILLED: overall budget"
        log(f"{n}: {status[n]}")
    parts: dict[str, Any] = {}
    for n in names:
        f = out / f"part_{n}.json"
        try:
            parts[n] = json.loads(f.read_text()) if f.exists() else {}
        except Exception as ex:  # noqa: BLE001
            parts[n] = {"errors": [{"where": "part json", "error": str(ex)}]}
        parts[n]["status"] = status.get(n)
        tail = (out / f"worker_{n}.txt").read_bytes().decode(errors="replace").splitlines()[-8:]
        parts[n]["log_tail"] = tail
        if not status.get(n, "").startswith("rc 0"):
            print(f"---- {n} log tail ({status.get(n)})\n" + "\n".join(tail))
    (out / "ws.json").write_text(json.dumps({"wall_s": time.time() - T0, "parts": parts}, indent=1, default=str))
    print(table(parts))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--worker")
    ap.add_argument("--sync", type=Path)
    ap.add_argument("--budget", type=float, default=215.0)
    ap.add_argument("--gpu-timeout", type=float, default=45.0)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.worker:
        sys.path.insert(0, str(HERE))
        return worker(args.worker, args.out, args.sync)
    return orchestrate(args.out, args.budget, [s for s in args.only.split(",") if s], args.gpu_timeout)


if __name__ == "__main__":
    raise SystemExit(main())

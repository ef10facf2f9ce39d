"""Device probe of the fp16 tensor-core tile (kernels/ops/cuda/hgemm_mma.cu): every candidate configuration
checked against a float64 reference and timed side by side with cublasGemmEx in one process.

    python3 benchmarks/probe_mma.py --out DIR [--variants base,k64,...] [--no-ncu]

Method (../.library/device/METHOD.md): inputs drawn fresh on the GPU (standard normal, fp16), outputs poisoned
with NaN before each checked launch (an unwritten element fails the check), error ||out - ref|| / ||ref||
against float64 products of the same fp16 inputs; each timing is CUDA events around every call after 3
warm-ups, 20 calls rotating over 3 input sets (each set > 60 MB L2), median / p10 / p90. The production path
and cuBLAS are timed first and again last, so their drift bounds the noise. Optionally an ncu pass (stall
reasons) on the production kernel at 4096^3 in a child process. Writes DIR/mma.json and DIR/mma.txt; prints
a short table last.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cupy as cp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.ops import gemm as g  # noqa: E402
from kernels.ops import o_proj as op  # noqa: E402
from kernels.ops.cuda import mma  # noqa: E402

SETS, WARMUP = 3, 3
INTERLEAVE = 0  # --interleave R: rounds of round-robin timing (0: one batch of 20 calls per candidate)
T0 = time.time()
LOG: list[str] = []

# every candidate of round 1, most important first (the time guard drops the tail, never the baseline)
VARIANTS: dict[str, mma.Config] = {
    # Config() is the production default since round 1: k64 + late + cpy32 + epi; "old" is the production
    # tile before (run 3 of notes-matmul.md). The mbarrier / persistent variants of rounds 1-2 lost and their
    # switches were removed (notes-mma.md).
    "old": mma.Config(bk=32, late=False, cpy32=False, epi=False),
    "k64_lc": mma.Config(epi=False),  # round 1's k64_late_c32
    "lc_epi": mma.Config(bk=32),  # 32-wide slices with late + cpy32 + epi
    "prod_g16": mma.Config(group_m=16),
}
OPROJ_VARIANTS = ("old", "lc_epi")
BENCH = [(4096, 4096, 4096), (8192, 2560, 2560)]
# aligned: partial M / N tiles, partial and short K (KT < stages); grids of many tiles with long and short K
CHECK = [(520, 392, 264), (136, 264, 40), (2056, 2056, 264), (2056, 2056, 40)]
ODD = (257, 129, 67)  # unaligned kernel (K, N not multiples of 8)


def log(msg: str) -> None:
    LOG.append(msg)
    print(msg, flush=True)


def elapsed() -> float:
    return time.time() - T0


def time_us(fn: Callable[[int], None], iters: int = 20) -> dict[str, float]:
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
    return {"median_us": float(np.median(us)), "p10_us": float(np.percentile(us, 10)),
            "p90_us": float(np.percentile(us, 90))}  # fmt: skip


def time_interleaved(
    cands: list[tuple[str, Callable[[int], None]]], rounds: int, per: int = 5
) -> dict[str, Any]:
    """Round 1 (2026-11-30) saw the same kernel drift by up to 13 % between batches seconds apart (clock
    under load), so candidates are timed round-robin: `rounds` rounds of `per` calls each, CUDA events per
    call; the median over all of a candidate's calls. Drift then lands on every candidate alike."""
    times: dict[str, list[float]] = {name: [] for name, _ in cands}
    for _name, fn in cands:
        for i in range(WARMUP):
            fn(i)
    for r in range(rounds):
        for name, fn in cands:
            evs = []
            for i in range(per):
                a, b = cp.cuda.Event(), cp.cuda.Event()
                a.record()
                fn(r * per + i)
                b.record()
                evs.append((a, b))
            cp.cuda.runtime.deviceSynchronize()
            times[name] += [cp.cuda.get_elapsed_time(a, b) * 1e3 for a, b in evs]
    out = {}
    for name, us in times.items():
        x = np.array(us)
        out[name] = {"median_us": float(np.median(x)), "p10_us": float(np.percentile(x, 10)),
                     "p90_us": float(np.percentile(x, 90)), "calls": len(us)}  # fmt: skip
    return out


def gpu_state() -> str:
    """SM clock, temperature, power and throttle reasons from nvidia-smi (context for the drift)."""
    q = "clocks.sm,temperature.gpu,power.draw,clocks_throttle_reasons.active"
    try:
        p = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True,
                           text=True, timeout=10, check=False)  # fmt: skip
        return p.stdout.strip()
    except Exception as e:  # noqa: BLE001
        return repr(e)


def rel_err(out: Any, ref: Any) -> float | None:
    o = out.astype(cp.float64)
    if not bool(cp.isfinite(o).all()):
        return None  # an element was left unwritten (NaN poison) or overflowed
    return float(cp.linalg.norm(o - ref) / cp.linalg.norm(ref))


def halves(*shape: int) -> Any:
    return cp.random.standard_normal(shape, dtype=cp.float32).astype(cp.float16)


def run_cfg(cfg: mma.Config, a: Any, b: Any, c: Any, res: Any = None, half: bool = False) -> None:
    m, k = a.shape
    n = b.shape[1]
    mma.launch(a=a.data.ptr, b=b.data.ptr, bias=0, res=0 if res is None else res.data.ptr, out=c.data.ptr,
               m=m, n=n, k=k, out_half=half, cfg=cfg)  # fmt: skip


def check(cfg: mma.Config, m: int, n: int, k: int) -> float | None:
    a, b = halves(m, k), halves(k, n)
    c = cp.full((m, n), cp.nan, dtype=cp.float32)
    run_cfg(cfg, a, b, c)
    return rel_err(c, a.astype(cp.float64) @ b.astype(cp.float64))


def resources(cfg: mma.Config, key: tuple[bool, bool]) -> dict[str, Any]:
    kern = mma._kernels(cfg)[key]
    cf = kern.dispatcher.compile(kern.sig)._codelibrary.get_cufunc()
    return {"regs": cf.attrs.regs, "local": cf.attrs.local}


Record = Callable[..., bool]


def bench_gemm(
    m: int, n: int, k: int, usable: list[str], record: Record, until: float
) -> list[dict[str, Any]]:
    """Check every usable variant's full output at (m, n, k) and time it; cuBLAS and the production path are
    checked and timed first, and again at the end (drift bound)."""
    shape = f"{m}x{n}x{k}"
    sets = [(halves(m, k), halves(k, n)) for _ in range(SETS)]
    outs = [cp.empty((m, n), dtype=cp.float32) for _ in range(SETS)]
    ref = sets[0][0].astype(cp.float64) @ sets[0][1].astype(cp.float64)
    flops = 2.0 * m * n * k
    rows: list[dict[str, Any]] = []

    def add(name: str, st: dict[str, float]) -> None:
        rows.append({"shape": shape, "impl": name, **st, "tflops": flops / st["median_us"] / 1e6})

    def prod(i: int) -> None:
        a, b = sets[i % SETS]
        g.gemm(a, b, outs[i % SETS], path="mma")

    def cub(i: int) -> None:
        a, b = sets[i % SETS]
        g.cublas_gemm_f16_f32(a, b, outs[i % SETS])

    c = cp.full((m, n), cp.nan, dtype=cp.float32)
    cands: list[tuple[str, Callable[[int], None]]] = []
    g.gemm(sets[0][0], sets[0][1], c, path="mma")
    record("production", shape, rel_err(c, ref))
    c.fill(cp.nan)
    g.cublas_gemm_f16_f32(sets[0][0], sets[0][1], c)
    record("cublas", shape, rel_err(c, ref))
    cands += [("cublas", cub), ("production", prod)]
    for name in usable:
        if elapsed() > until:
            log(f"skip timing {name} {shape}: time")
            continue
        cfg = VARIANTS[name]
        c.fill(cp.nan)
        run_cfg(cfg, *sets[0], c)
        if not record(name, shape, rel_err(c, ref)):
            continue

        def f(i: int, cfg: mma.Config = cfg) -> None:
            run_cfg(cfg, *sets[i % SETS], outs[i % SETS])

        cands.append((name, f))
    if INTERLEAVE:
        st0 = gpu_state()
        for name, st in time_interleaved(cands, INTERLEAVE).items():
            add(name, st)
        log(f"{shape}: nvidia-smi before {st0} / after {gpu_state()}")
    else:
        for name, fn in cands:
            add(name, time_us(fn))
        add("cublas_again", time_us(cub))
        add("production_again", time_us(prod))
    return rows


def bench_oproj(usable: list[str], record: Record) -> list[dict[str, Any]]:
    bs, s, k, n = 16, 512, 2560, 2560
    shape = f"o_proj[{bs},{s},{k}]x[{k},{n}]"
    d = [{"attn": halves(bs, s, k), "w": (halves(k, n) * (1 / np.sqrt(k))).astype(cp.float16),
          "residual": halves(bs, s, n), "bias": None, "out": cp.empty((bs, s, n), dtype=cp.float16)}
         for _ in range(SETS)]  # fmt: skip
    ref = d[0]["attn"].reshape(-1, k).astype(cp.float64) @ d[0]["w"].astype(cp.float64)
    ref = ref.reshape(bs, s, n) + d[0]["residual"].astype(cp.float64)
    flops = 2.0 * bs * s * n * k + bs * s * n
    rows: list[dict[str, Any]] = []

    def oprod(i: int) -> None:
        x = d[i % SETS]
        op.o_proj(x["attn"], x["w"], x["residual"], None, x["out"], path="mma")

    def ocub(i: int) -> None:
        op._cupy(d[i % SETS])

    def ocfg(cfg: mma.Config) -> Callable[[int], None]:
        def f(i: int) -> None:
            x = d[i % SETS]
            run_cfg(cfg, x["attn"].reshape(-1, k), x["w"], x["out"].reshape(-1, n), x["residual"], True)

        return f

    cands: list[tuple[str, Callable[[int], None]]] = [("cublas+add", ocub), ("production", oprod)]
    cands += [(nm, ocfg(VARIANTS[nm])) for nm in usable if nm in OPROJ_VARIANTS]
    ok = []
    for name, fn in cands:
        d[0]["out"].fill(cp.nan)
        fn(0)
        if record(f"o_proj {name}", shape, rel_err(d[0]["out"], ref), op.SPEC.tolerance["float16"]):
            ok.append((name, fn))
    timed = time_interleaved(ok, INTERLEAVE) if INTERLEAVE else {name: time_us(fn) for name, fn in ok}
    for name, st in timed.items():
        rows.append({"shape": shape, "impl": name, **st, "tflops": flops / st["median_us"] / 1e6})
    return rows


def prod_checks(record: Record) -> None:
    """The production path through the public ops at the verify shapes and around them: gemm fp16 (aligned and
    unaligned kernels, multi-tile), o_proj fp16 with and without bias on both kernels, and in place (out is
    the residual) on the aligned one."""
    for m, n, k in [ODD, *CHECK]:
        a, b = halves(m, k), halves(k, n)
        c = cp.full((m, n), cp.nan, dtype=cp.float32)
        g.gemm(a, b, c, path="mma")
        record("prod gemm", f"{m}x{n}x{k}", rel_err(c, a.astype(cp.float64) @ b.astype(cp.float64)),
               g.SPEC.tolerance["float16"])  # fmt: skip
    tol = op.SPEC.tolerance["float16"]
    for bs, s, k, n, bias, inplace in [(2, 37, 67, 129, True, False), (3, 67, 136, 200, False, False),
                                       (3, 67, 136, 200, True, False), (2, 300, 256, 264, True, False),
                                       (2, 300, 256, 264, True, True)]:  # fmt: skip
        attn = halves(bs, s, k)
        w = (halves(k, n) * (1 / np.sqrt(k))).astype(cp.float16)
        resid = halves(bs, s, n)
        bv = halves(n) if bias else None
        ref = (attn.reshape(-1, k).astype(cp.float64) @ w.astype(cp.float64)).reshape(bs, s, n)
        ref += resid.astype(cp.float64) + (bv.astype(cp.float64) if bias else 0.0)
        out = resid if inplace else cp.full((bs, s, n), cp.nan, dtype=cp.float16)
        try:
            op.o_proj(attn, w, resid, bv, out, path="mma")
            e = rel_err(out, ref)
        except Exception as ex:  # noqa: BLE001
            e = None
            log(f"o_proj {bs}x{s}x{k}x{n} inplace={inplace}: {ex!r}"[:300])
        record(f"prod o_proj bias={bias} inplace={inplace}", f"[{bs},{s},{k}]x[{k},{n}]", e, tol)


def ncu_target() -> None:
    """Child process under ncu: the production kernel at 4096^3, three launches."""
    a, b = halves(4096, 4096), halves(4096, 4096)
    c = cp.empty((4096, 4096), dtype=cp.float32)
    for _ in range(3):
        g.gemm(a, b, c, path="mma")
    cp.cuda.runtime.deviceSynchronize()


NCU_METRICS = [
    r"regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "sm__cycles_elapsed.avg.per_second",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum",
    "smsp__warps_active.avg.per_cycle_active",
    "gpu__time_duration.sum",
    "lts__t_bytes.sum.per_second",
    "lts__t_sectors.avg.pct_of_peak_sustained_elapsed",
    "lts__t_sector_hit_rate.pct",
    "dram__bytes.sum.per_second",
]


def run_ncu(budget_s: float) -> str:
    cmd = ["ncu", "--clock-control", "none", "-k", "regex:mma_tile", "--launch-skip", "1",
           "--launch-count", "1", "--metrics", ",".join(NCU_METRICS),
           sys.executable, __file__, "--ncu-target"]  # fmt: skip
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=budget_s, check=False)
        return p.stdout[-12000:] + ("\nSTDERR:\n" + p.stderr[-2000:] if p.returncode else "")
    except Exception as e:  # noqa: BLE001
        return f"ncu failed: {e!r}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--no-ncu", action="store_true")
    ap.add_argument(
        "--prod-checks", action="store_true", help="check the production ops at verify shapes first"
    )
    ap.add_argument("--ncu-target", action="store_true")
    ap.add_argument("--interleave", type=int, default=0, help="rounds of round-robin timing (0: batches)")
    ap.add_argument("--budget", type=float, default=135.0, help="seconds; later variants are dropped past it")
    args = ap.parse_args()
    if args.ncu_target:
        ncu_target()
        return 0
    global INTERLEAVE
    INTERLEAVE = args.interleave
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = [v for v in args.variants.split(",") if v]
    dev = cp.cuda.runtime.getDeviceProperties(0)
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(["python3", *sys.argv]),
        "device": dev["name"].decode(),
        "versions": {
            "cupy": cp.__version__,
            "numpy": np.__version__,
            "numba_cuda": __import__("importlib.metadata").metadata.version("numba-cuda"),
            "driver": cp.cuda.runtime.driverGetVersion(),
        },  # fmt: skip
        "method": {"sets": SETS, "warmup": WARMUP, "iters": 20},
        "variants": {n: VARIANTS[n].tag for n in names},
    }
    checks: list[dict[str, Any]] = []
    res: dict[str, Any] = {}
    bad = 0

    def record(name: str, shape: str, e: float | None, tol: float = 1e-3) -> bool:
        nonlocal bad
        ok = e is not None and e <= tol
        bad += not ok
        checks.append({"variant": name, "shape": shape, "rel_err": e, "ok": ok})
        if not ok:
            log(f"CHECK FAIL {name} {shape}: {e}")
        return ok

    if args.prod_checks:
        prod_checks(record)
        log(f"production checks done at {elapsed():.0f} s")

    # every variant is checked, benched, and the results flushed to disk before the ncu pass; budget
    # fractions: last compile start, last timing start
    compile_until, timing_until = args.budget * 0.7, args.budget * 0.8
    bench: list[dict[str, Any]] = []
    usable = compile_check(names, record, res, compile_until)
    for m, n, k in BENCH:
        bench += bench_gemm(m, n, k, usable, record, timing_until)
        cp.get_default_memory_pool().free_all_blocks()
        log(f"bench {m}x{n}x{k} done at {elapsed():.0f} s")
    # o_proj fp16 at the bench shape: production, epilogue variants, cuBLAS matmul + CuPy add
    if elapsed() < timing_until + 10:
        bench += bench_oproj(usable, record)
        cp.get_default_memory_pool().free_all_blocks()
    report.update(resources=res, checks=checks, bench=bench)
    write_results(out, report, bench, res, checks, bad)

    # stall reasons of the production kernel (child process; only with the time left)
    left = 148 - elapsed()
    if not args.no_ncu and left > 25:
        txt = run_ncu(left - 8)
        report["ncu"] = txt
        LOG.append("== ncu (production kernel, 4096^3) ==\n" + txt)
    table = write_results(out, report, bench, res, checks, bad)
    if "ncu" in report:  # the stall lines worth seeing in the tail
        keep = []
        for ln in report["ncu"].splitlines():
            f = ln.split()
            if len(f) >= 3 and ("__" in f[0]) and f[-1].replace(".", "", 1).replace(",", "").isdigit():
                keep.append((float(f[-1].replace(",", "")) if "stalled" in f[0] else 1e9, ln.strip()[:110]))
        keep.sort(key=lambda t: -t[0])
        print("\n".join(ln for _, ln in keep[:6]))
    print("\n".join(table))
    return 0 if bad == 0 else 1


def compile_check(group: list[str], record: Record, res: dict[str, Any], until: float) -> list[str]:
    """Build each variant and check it at the small shapes; the names that passed."""
    usable = []
    for name in group:
        if elapsed() > until:
            log(f"skip {name}: time")
            continue
        cfg = VARIANTS[name]
        t = time.time()
        try:
            ok = all([record(name, f"{m}x{n}x{k}", check(cfg, m, n, k)) for m, n, k in CHECK])
            if name in ("old", "lc_epi"):  # the other switches leave the unaligned kernel unchanged
                ok &= record(name, "x".join(map(str, ODD)), check(cfg, *ODD))
            res[name] = {"compile_check_s": round(time.time() - t, 1), **resources(cfg, (False, True))}
            if ok:
                usable.append(name)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            record(name, "build", None)
            res[name] = {"error": repr(e)[:400]}
        log(f"{name:14s} {cfg.tag:36s} {json.dumps(res[name])}")
    return usable


def write_results(
    out: Path, report: dict[str, Any], bench: list[dict[str, Any]], res: dict[str, Any], checks: list[Any],
    bad: int,
) -> list[str]:  # fmt: skip
    """Write mma.json and mma.txt (the log, every row, the summary table); return the summary table."""
    (out / "mma.json").write_text(json.dumps(report, indent=1, default=str))
    base = {r["shape"]: r["median_us"] for r in bench if r["impl"] in ("cublas", "cublas+add")}
    shapes = list(dict.fromkeys(r["shape"] for r in bench))
    rows = []
    for r in bench:
        b0 = base.get(r["shape"])
        rows.append(f"{r['shape']:30s} {r['impl']:18s} {r['median_us']:8.1f} us "
                    f"({r['p10_us']:.1f}-{r['p90_us']:.1f}) {r['tflops']:6.1f} TF  "
                    f"ratio {(b0 / r['median_us']) if b0 else 0:.3f}")  # fmt: skip
    bad = sum(not c["ok"] for c in checks)
    table = [f"{len(checks) - bad}/{len(checks)} checks pass; {elapsed():.0f} s; us (ratio = cuBLAS / ours)",
             f"{'impl':18s}" + "".join(f" {sh[:22]:>22s}" for sh in shapes)]  # fmt: skip
    for impl in dict.fromkeys(r["impl"] for r in bench):
        cells = []
        for sh in shapes:
            r_ = next((r for r in bench if r["shape"] == sh and r["impl"] == impl), None)
            cells.append(
                f"{r_['median_us']:9.1f} ({base[sh] / r_['median_us']:.3f})" if r_ and sh in base else ""
            )
        table.append(f"{impl:18s}" + "".join(f" {c:>22s}" for c in cells))
    cells = [f"{nm}:{r_.get('regs', '?')}r/{r_.get('local', '?')}L/{r_.get('compile_check_s', 'ERR')}s"
             for nm, r_ in res.items()]  # fmt: skip
    table += ["  " + " ".join(cells[i : i + 5]) for i in range(0, len(cells), 5)]
    (out / "mma.txt").write_text("\n".join(LOG + rows + table) + "\n")
    return table


if __name__ == "__main__":
    sys.exit(main())

"""Device probe for clip_grad_norm (benchmarks/notes-clip.md): every path side by side on the same buffers
at the bench shape (8 arrays of ~8.4M elements, clipping), fp32 and fp16, with CuPy in the same process.

Two timings per variant, both with the in-place inputs restored from a pristine copy before every call
(numba `copy_to_device`, exactly as kernels/bench.py does) and 3 input sets in rotation:
  bench: events right around the call, as kernels/bench.py times it. When the restore has drained from the
         GPU before the call is issued, this includes the launcher's host time up to its first launch;
  gpu:   a ~400 us sleeping kernel is queued between the restore and the first event, so the GPU is still
         busy while the host issues the call: device time only.
Every variant's last call is checked against float64 (norm and every scaled element); the no-clip case
(max_norm = 2 x norm) is checked to leave the arrays bit-identical. Host overhead: median time of one call on
2 small device arrays (kernels.overhead method). Writes $OUT/clip.json (everything) and $OUT/clip.txt (log),
prints a short table last.

    timeout 150 python3 benchmarks/probe_clip.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from numba import cuda, uint32

T0 = time.time()
COUNT, ELEMS = 8, 8388608
SETS, WARM, ITERS = 3, 3, 20
SPIN_US = 400
FINAL = False  # --final: round 2 (kernels.bench's own run first, then the production path and the v4 kinds)
BUDGET_S = 128  # stop starting new variants past this (the command runs under `timeout 150`)
COPY_GBS = 4190.0  # PERF.md's copy ceiling; the probe also measures a CuPy copy in this run


@cuda.jit
def _spin(k):  # type: ignore[no-untyped-def]
    if cuda.grid(1) == 0:
        for _ in range(k):
            cuda.nanosleep(uint32(1000))


class Probe:
    def __init__(self, out: str) -> None:
        self.out = out
        self.rows: list[dict[str, Any]] = []
        self.meta: dict[str, Any] = {}
        self.logf = open(f"{out}/clip.txt", "w")  # noqa: SIM115

    def log(self, msg: str) -> None:
        line = f"[{time.time() - T0:6.1f}s] {msg}"
        print(line, flush=True)
        self.logf.write(line + "\n")
        self.logf.flush()

    def save(self) -> None:
        with open(f"{self.out}/clip.json", "w") as f:
            json.dump({"meta": self.meta, "rows": self.rows}, f, indent=1)


def _free_deferred() -> None:
    """numba frees device memory lazily; release it now (no such list under the simulator)."""
    d = getattr(cuda.current_context(), "deallocations", None)
    if d is not None:
        d.clear()


def _stats(us: list[float]) -> dict[str, float]:
    a = np.asarray(us)
    return {"median": round(float(np.median(a)), 2), "p10": round(float(np.percentile(a, 10)), 2),
            "p90": round(float(np.percentile(a, 90)), 2)}  # fmt: skip


def _probe_dtype(P: Probe, dt: np.dtype, copy_gbs: float) -> None:  # noqa: C901, PLR0915
    """Every variant for one dtype, on one set of buffers."""
    import cupy as cp

    from kernels.arrays import operand
    from kernels.ops import clip_grad_norm as op

    sizes = [ELEMS + 7 * k for k in range(COUNT)]
    rs = cp.random.RandomState(1234 + dt.itemsize)
    pristine = [(rs.standard_normal(n, dtype=cp.float32) * 0.1).astype(dt) for n in sizes]
    sets = [[p.copy() for p in pristine] for _ in range(SETS)]
    g64 = [p.astype(cp.float64) for p in pristine]
    norm = math.sqrt(float(sum(float(cp.sum(x * x)) for x in g64)))
    mx = 0.5 * norm
    coef = mx / (norm + op.CLIP_EPS)
    nbytes = 3 * sum(sizes) * dt.itemsize
    pr_nb = [cuda.as_cuda_array(p) for p in pristine]
    sets_nb = [[cuda.as_cuda_array(x) for x in s] for s in sets]
    ops_ = [[operand(f"g{k}", x).reshaped((x.size,)) for k, x in enumerate(s)] for s in sets_nb]
    norm_out = cuda.device_array(1, np.float32)
    no_op = operand("norm_out", norm_out)
    P.log(f"{dt.name}: norm {norm:.6f}, {nbytes / 1e6:.1f} MB counted")

    def check(s: int, scaled: bool = True) -> float:
        worst = 0.0
        for x, r in zip(sets[s], g64, strict=True):
            ref = r * coef if scaled else r
            worst = max(worst, float(cp.linalg.norm(x.astype(cp.float64) - ref) / cp.linalg.norm(ref)))
        return worst

    def timed(call: Callable[[int], None], mode: str) -> tuple[dict[str, float], dict[str, float], int]:
        evs, host = [], []
        for i in range(WARM + ITERS):
            s = i % SETS
            for d, p in zip(sets_nb[s], pr_nb, strict=True):
                d.copy_to_device(p)
            if mode == "gpu":
                _spin[1, 1](SPIN_US)
            a, b = cuda.event(), cuda.event()
            a.record()
            t = time.perf_counter()
            call(s)
            host.append((time.perf_counter() - t) * 1e6)
            b.record()
            if i >= WARM:
                evs.append((a, b))
        cuda.synchronize()
        return _stats([cuda.event_elapsed_time(a, b) * 1e3 for a, b in evs]), _stats(host[WARM:]), s

    def variant(name: str, call: Callable[[int], None], what: str = "clip",
                check_fn: Callable[[int], float] | None = None) -> None:  # fmt: skip
        if time.time() - T0 > BUDGET_S:
            P.log(f"SKIP {dt.name} {name}: past the {BUDGET_S} s budget")
            return
        row: dict[str, Any] = {"dtype": dt.name, "variant": name, "what": what}
        try:
            t = time.time()
            call(0)  # compile + load outside the timed loops
            cuda.synchronize()
            row["first_call_s"] = round(time.time() - t, 1)
            for mode in ("bench", "gpu"):
                st, host, last = timed(call, mode)
                row[mode] = st
                row[f"host_{mode}"] = host
            err = check_fn(last) if check_fn is not None else check(last)
            tol = 1e-5 if dt == np.float32 else 1e-3
            row["rel_err"] = err
            row["ok"] = bool(err <= tol)
            if what == "clip":
                got = float(norm_out.copy_to_host()[0])
                row["norm_err"] = abs(got - norm) / norm
                row["ok"] = row["ok"] and row["norm_err"] <= tol
            moved = nbytes * {"clip": 3, "norm": 1, "scale": 2}[what] / 3
            for mode in ("bench", "gpu"):
                row[f"sol_{mode}"] = round(moved / (row[mode]["median"] * 1e-6) / 1e9 / copy_gbs, 3)
        except Exception as e:  # noqa: BLE001  (report the variant, keep probing the rest)
            row["error"] = f"{type(e).__name__}: {e}"
        P.rows.append(row)
        P.save()
        brief = {
            k: row.get(k) for k in ("bench", "gpu", "host_bench", "rel_err", "ok", "first_call_s", "error")
        }
        P.log(f"{dt.name} {name}: " + json.dumps(brief))

    def public(path: str) -> Callable[[int], None]:
        return lambda s: op.clip_grad_norm(sets_nb[s], mx, norm_out=norm_out, path=path)

    def direct(kind: str, cfg: Any) -> Callable[[int], None]:
        return lambda s: op.launch_v4(kind, ops_[s], no_op, mx, 0, cfg)

    # CuPy (what torch's clip_grad_norm_ does, as the bench's provider)
    names = {f"g{k}": None for k in range(COUNT)}
    cps = [{**{n: sets[s][k] for k, n in enumerate(names)}, "max_norm": mx, "norm": cp.asarray(norm_out)}
           for s in range(SETS)]  # fmt: skip
    variant("cupy", lambda s: op._cupy(cps[s]))

    if FINAL:
        # round 2: the production path ("auto") as the bench times it, beside the other v4 kinds
        variant(f"auto (production: {op.AUTO_V4.get(dt, 'v3 rules')})", public("auto"))
        for kind in ("two", "one"):  # ("two_last" lost by 2-3x in round 1)
            if kind != op.AUTO_V4.get(dt):
                variant(f"v4 {kind}", public(kind))
        # the bench's exposed host time, at its floor: the auto kind's kernels launched straight from
        # precomputed parameter words (pack_into + cuLaunchKernel only, no extraction or checks)
        plan = op._fast_plans.get((dt, op.AUTO_V4.get(dt, "")))
        if plan is not None:
            words = []
            p_no = 0
            for s_ in range(SETS):
                fv = op.fast_values(sets_nb[s_], norm_out)
                assert fv is not None
                p_no = fv[2]
                words.append(fv[1] + plan.empty_words * (op.SLOTS - len(fv[1]) // 7))

            def raw(s: int) -> None:
                for i, k in enumerate(plan.kernels):
                    g = plan.pack(i, words[s], p_no, mx)
                    k._launch(k._func, g, 1, 1, op.BLOCK, 1, 1, 0, None, k._params, None)

            variant("auto kind, launch only (exposure floor)", raw)
    else:
        main_cfg = op.V4_DEFAULT[dt]
        variant("v4 two (auto cfg)", public("two"))
        variant("v4 two_last", public("two_last"))
        variant("v4 one", public("one"))
        variant("v3 fused_vector (prod fp16)", public("fused_vector"))
        if dt == np.float32:
            variant("v2 split (prod fp32)", public("split"))

        # the two halves of "two" apart: norm only (partials checked), then scale only (reuses those partials)
        gq = op.v4_grid(dt, main_cfg, "norm")
        part = op._v4_buf("part", gq, np.float32)
        kn = op._v4_kernel(dt, main_cfg, "norm")
        ks = op._v4_kernel(dt, main_cfg, "scale")
        gs = op.v4_grid(dt, main_cfg, "scale")

        def norm_only(s: int) -> None:
            kn.launch(gq, op.BLOCK, (*ops_[s], part), stream=0)

        def norm_check(s: int) -> float:
            return abs(math.sqrt(float(np.sum(part.dev.copy_to_host().astype(np.float64)))) - norm) / norm

        def scale_only(s: int) -> None:
            ks.launch(gs, op.BLOCK, (*ops_[s], part, no_op, mx), stream=0)

        variant("half: norm pass only", norm_only, "norm", norm_check)
        variant("half: scale pass only", scale_only, "scale")

        # the L2 reuse: the same two kernels' work with the scale pass walking forwards
        fwd = op.V4Config(main_cfg.u_sq, main_cfg.u_sc, main_cfg.bps_sq, main_cfg.bps_sc, rev=False)
        ks_fwd = op._v4_kernel(dt, fwd, "scale")

        def two_fwd(s: int) -> None:
            kn.launch(gq, op.BLOCK, (*ops_[s], part), stream=0)
            ks_fwd.launch(gs, op.BLOCK, (*ops_[s], part, no_op, mx), stream=0)

        variant("v4 two, scale walks forwards", two_fwd)
        # other unrolls / blocks per SM (ptxas: no spills at these)
        alts = {  # most promising first (the budget may cut the last)
            np.dtype(np.float32): ((4, 2, 4, 8), (2, 2, 8, 8), (8, 4, 2, 2)),
            np.dtype(np.float16): ((4, 2, 8, 8), (2, 2, 8, 8), (4, 2, 4, 4)),
        }[dt]
        for alt in (op.V4Config(*a) for a in alts):
            variant(f"v4 two {alt.key()[:4]}", direct("two", alt))

    # no-clip: every v4 path leaves the arrays bit-identical and reports the norm
    for path in ("auto", "two", "one") if FINAL else ("two", "two_last", "one"):
        for d, p in zip(sets_nb[0], pr_nb, strict=True):
            d.copy_to_device(p)
        try:
            got = op.clip_grad_norm(sets_nb[0], 2.0 * norm, path=path)
            same = all(bool(cp.array_equal(x, p)) for x, p in zip(sets[0], pristine, strict=True))
            r = {"dtype": dt.name, "variant": f"noclip {path}", "what": "noclip", "untouched": same,
                 "norm_err": abs(got - norm) / norm}  # fmt: skip
            r["ok"] = same and r["norm_err"] <= (1e-5 if dt == np.float32 else 1e-3)
        except Exception as e:  # noqa: BLE001
            r = {"dtype": dt.name, "variant": f"noclip {path}", "error": f"{type(e).__name__}: {e}"}
        P.rows.append(r)
        P.log(json.dumps(r))
    P.save()  # the buffers go with this frame
    cp.get_default_memory_pool().free_all_blocks()
    _free_deferred()
    P.save()


def main() -> None:  # noqa: C901, PLR0915
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--final", action="store_true", help="round 2: kernels.bench first, fewer variants")
    args = ap.parse_args()
    global FINAL
    FINAL = args.final
    import cupy as cp

    from kernels import overhead
    from kernels.ops import clip_grad_norm as op

    P = Probe(args.out)
    dev = cuda.get_current_device()
    name = getattr(dev, "name", "?")
    P.meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "device": name.decode()
              if isinstance(name, bytes) else str(name), "sms": getattr(dev, "MULTIPROCESSOR_COUNT", 0),
              "numpy": np.__version__, "cupy": cp.__version__,
              "method": {"sets": SETS, "warm": WARM, "iters": ITERS, "spin_us": SPIN_US}}  # fmt: skip

    # copy ceiling in this run: CuPy copy of 1 GiB, best of 10 (read + write counted)
    src, dst = cp.empty(1 << 28, cp.float32), cp.empty(1 << 28, cp.float32)
    src.fill(1.0)
    ts = []
    for _ in range(12):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        cp.copyto(dst, src)
        b.record()
        b.synchronize()
        ts.append(cp.cuda.get_elapsed_time(a, b))
    copy_gbs = 2 * src.nbytes / (min(ts[2:]) * 1e-3) / 1e9
    P.meta["copy_gbs"] = round(copy_gbs, 1)
    del src, dst
    cp.get_default_memory_pool().free_all_blocks()
    P.log(f"copy {copy_gbs:.0f} GB/s")
    _spin[1, 1](1)
    cuda.synchronize()

    if FINAL:  # what the coordinator's final `python -m kernels bench --compare cupy` will report for this op
        from kernels import bench

        try:
            rep = bench.run([op.SPEC], compare="cupy")
            P.meta["bench"] = rep
            for r in rep["results"]:
                c = r.get("cupy", {})
                P.log(f"bench {r['dtype']} {r.get('path')}: {r.get('median_us')} us (p10 {r.get('p10_us')}, "
                      f"p90 {r.get('p90_us')}), {r.get('gbs')} GB/s, SOL {r.get('sol')}, ok {r.get('ok')}, "
                      f"cupy {c.get('median_us')} us, ratio {r.get('ratio_vs_cupy')}")  # fmt: skip
        except Exception as e:  # noqa: BLE001
            P.meta["bench"] = {"error": f"{type(e).__name__}: {e}"}
            P.log(f"bench failed: {e}")
        P.save()

    # host overhead first (it compiles the fp32 kernels the bench shape reuses): 2 small fp32 device arrays,
    # max_norm large (no clip), kernels.overhead's timing (median of 1000 calls)
    rng = np.random.default_rng()
    g = [cuda.to_device(rng.standard_normal(1000).astype(np.float32)) for _ in range(2)]
    nrm = cuda.device_array(1, np.float32)
    ref = math.sqrt(float(sum(np.sum(x.copy_to_host().astype(np.float64) ** 2) for x in g)))
    for path in ("auto", "two", "one", "fused_vector", "split"):
        try:
            st = overhead._time(lambda path=path: op.clip_grad_norm(g, 1e9, norm_out=nrm, path=path), 1000)
            r = {"dtype": "float32", "variant": f"overhead {path}", "what": "overhead", **st}
            r["ok"] = abs(float(nrm.copy_to_host()[0]) - ref) / ref < 1e-5
        except Exception as e:  # noqa: BLE001
            r = {"dtype": "float32", "variant": f"overhead {path}", "error": f"{type(e).__name__}: {e}"}
        P.rows.append(r)
        P.log(json.dumps(r))
    P.save()

    for dt in (np.dtype(np.float32), np.dtype(np.float16)):
        _probe_dtype(P, dt, copy_gbs)
        cp.get_default_memory_pool().free_all_blocks()
        _free_deferred()

    # the short table
    print(f"\ncopy {copy_gbs:.0f} GB/s; SOL vs that copy; bytes: 3 passes (clip)")
    print(
        f"{'dtype':8} {'variant':34} {'bench us':>9} {'gpu us':>8} {'host us':>8} {'SOLb':>5} {'SOLg':>5} ok"
    )
    for r in P.rows:
        if "error" in r:
            print(f"{r['dtype']:8} {r['variant']:34} ERROR {r['error'][:60]}")
        elif r.get("what") == "overhead":
            print(
                f"{r['dtype']:8} {r['variant']:34} {'':>9} {'':>8} {r['median_us']:8.2f} {'':>11} {r['ok']}"
            )
        elif r.get("what") == "noclip":
            continue
        else:
            print(f"{r['dtype']:8} {r['variant']:34} {r['bench']['median']:9.1f} {r['gpu']['median']:8.1f} "
                  f"{r['host_bench']['median']:8.1f} {r.get('sol_bench', 0):5.2f} {r.get('sol_gpu', 0):5.2f} "
                  f"{r['ok']}")  # fmt: skip
    for r in P.meta.get("bench", {}).get("results", []):
        print(f"kernels.bench {r['dtype']:8} {str(r.get('path')):9} {r.get('median_us')} us  "
              f"SOL {r.get('sol')}  ratio vs cupy {r.get('ratio_vs_cupy')}  ok {r.get('ok')}")  # fmt: skip
    bad = [r["variant"] for r in P.rows if r.get("what") == "noclip" and not r.get("ok")]
    print("noclip checks:", "all ok" if not bad else f"FAILED {bad}")
    P.log(f"done in {time.time() - T0:.0f} s")


if __name__ == "__main__":
    main()

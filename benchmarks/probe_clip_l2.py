"""Device probe of clip_grad_norm v5 (benchmarks/notes-clip.md, "v5: L2 cache hints"): the v4 "two" path
(baseline) beside the L2 cache-policy variants, fp16 and fp32 at the bench case (8 arrays of 8388608 + 7k
elements, clipping), one process, the copy bandwidth measured in the same run.

    timeout 120 python3 benchmarks/probe_clip_l2.py --out $OUT
    NUMBA_ENABLE_CUDASIM=1 python benchmarks/probe_clip_l2.py --dry-run --out /tmp/x   (tiny shape)

Variants (per dtype; every one is the norm kernel then the scale kernel, launched directly, on the same
buffers; the hinted norm kernel takes the kept tile count as an argument, so one compile serves every keep):
  two                       v4 default, no hints (baseline)
  two, scale ef             scale pass loads/stores evict_first, norm pass plain
  keep K MB                 norm pass: last K MB (global tile order) evict_last, earlier tiles evict_first;
                            K = 0 (all evict_first), 24, 40, 56; scale pass plain
  keep K MB + scale ef      the same, scale pass evict_first
  [setaside] ...            two, keep 24 / 40 + scale ef, keep 40: with the context's persisting-L2 limit
                            (cudaLimitPersistingL2CacheSize) at the device maximum, reset to 0 afterwards
Timing: in-place inputs restored (numba copy_to_device, as kernels/bench.py) before every call, a ~400 us
sleeping kernel queued before the start event (device time only), CUDA events, 3 input sets in rotation; two
rounds over all variants (the second in reverse order), median over both. Between variants the persisting L2
lines are reset (cuCtxResetPersistingL2Cache) so a variant's leftover evict_last lines do not burden the next
one; inside a variant's loop they stay (as a training loop would see them). Every variant's last call of
round 1 is checked against float64 (the norm and every scaled element), the norm in round 2 too. Writes
$OUT/clip_l2.json and $OUT/clip_l2.txt; prints a short table last.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from numba import cuda, uint32

T0 = time.time()
COUNT, ELEMS = 8, 8388608
SETS, WARM, ITERS = 3, 2, 15
SPIN_US = 400
BUDGET_S = 100.0  # no new variant timing past this (the command runs under `timeout 120`)
KEEPS = (0, 24, 40, 56)  # MB (10^6 bytes) kept evict_last at the end of the norm pass
MB = 10**6
LOG: list[str] = []


@cuda.jit
def _spin(k):  # type: ignore[no-untyped-def]
    if cuda.grid(1) == 0:
        for _ in range(k):
            cuda.nanosleep(uint32(1000))


def log(msg: str) -> None:
    line = f"[{time.time() - T0:6.1f}s] {msg}"
    print(line, flush=True)
    LOG.append(line)


def _driver() -> Any:
    try:
        from cuda.bindings import driver

        return driver
    except Exception:  # noqa: BLE001
        return None


def _l2_info(dry: bool) -> dict[str, Any]:
    """L2 size and the most a context may set aside for persisting lines (bytes), from the driver."""
    drv = _driver()
    if dry or drv is None:
        return {"l2_bytes": None, "max_persisting_bytes": 0}
    a = drv.CUdevice_attribute
    dev = cuda.get_current_device().id
    out = {}
    attrs = {
        "l2_bytes": a.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE,
        "max_persisting_bytes": a.CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE,
    }
    for key, attr in attrs.items():
        err, v = drv.cuDeviceGetAttribute(attr, dev)
        out[key] = int(v) if int(err) == 0 else None
    return out


def _set_persisting(nbytes: int, dry: bool) -> str:
    drv = _driver()
    if dry or drv is None:
        return "skipped"
    cuda.synchronize()
    (err,) = drv.cuCtxSetLimit(drv.CUlimit.CU_LIMIT_PERSISTING_L2_CACHE_SIZE, nbytes)
    return "ok" if int(err) == 0 else f"CUresult {int(err)}"


def _reset_persisting(dry: bool) -> None:
    drv = _driver()
    if not dry and drv is not None:
        cuda.synchronize()
        drv.cuCtxResetPersistingL2Cache()


def _probe_dtype(dt: np.dtype, copy_gbs: float, dry: bool, l2: dict[str, Any], res: dict[str, Any]) -> None:  # noqa: C901, PLR0915
    from kernels.arrays import operand
    from kernels.ops import clip_grad_norm as op

    try:
        import cupy as cp

        xp: Any = cp
    except ImportError:
        cp, xp = None, np
    sizes = [ELEMS + 7 * k for k in range(COUNT)]
    if cp is not None:
        rs = cp.random.RandomState(1234 + dt.itemsize)
        pristine = [(rs.standard_normal(n, dtype=cp.float32) * 0.1).astype(dt) for n in sizes]
        pr_nb = [cuda.as_cuda_array(p) for p in pristine]
        sets_nb = [[cuda.as_cuda_array(p.copy()) for p in pristine] for _ in range(SETS)]
    else:
        rng = np.random.default_rng(1234 + dt.itemsize)
        pristine = [(rng.standard_normal(n, dtype=np.float32) * 0.1).astype(dt) for n in sizes]
        pr_nb = [cuda.to_device(p) for p in pristine]
        sets_nb = [[cuda.to_device(p) for p in pristine] for _ in range(SETS)]

    def as_xp(d: Any) -> Any:
        return cp.asarray(d) if cp is not None else d.copy_to_host()

    g64 = [p.astype(xp.float64) for p in pristine]
    norm = math.sqrt(float(sum(float(xp.sum(x * x)) for x in g64)))
    mx = 0.5 * norm
    coef = mx / (norm + op.CLIP_EPS)
    nbytes = 3 * sum(sizes) * dt.itemsize
    ops_ = [[operand(f"g{k}", x).reshaped((x.size,)) for k, x in enumerate(s)] for s in sets_nb]
    norm_out = cuda.device_array(1, np.float32)
    no_op = operand("norm_out", norm_out)
    empty = op._device_state(dt)[2]
    slots = [(*o, *([empty] * (op.SLOTS - len(o)))) for o in ops_]
    tol = 1e-5 if dt == np.float32 else 1e-3
    log(f"{dt.name}: norm {norm:.6f}, {nbytes / 1e6:.1f} MB counted (3 passes)")

    base = op.V4_DEFAULT[dt]
    hint = op.V4Config(base.u_sq, base.u_sc, base.bps_sq, base.bps_sc, keep_mb=0, sc_first=True)
    gq, gs = op.v4_grid(dt, base, "norm"), op.v4_grid(dt, base, "scale")
    part = op._v4_buf("part", gq, np.float32)
    tile_bytes = op.BLOCK * base.u_sq * 16
    mb = MB if not dry else 250  # dry run: "MB" of 250 bytes, so the tiny arrays split inside
    t = time.time()
    kn = op._v4_kernel(dt, base, "norm")
    ks = op._v4_kernel(dt, base, "scale")
    kk = op._v4_kernel(dt, hint, "norm_keep")
    kf = op._v4_kernel(dt, hint, "scale")
    for k in (kn, ks, kk, kf):
        if not k._ready:
            k._prepare()
    log(f"{dt.name}: 4 kernels ready in {time.time() - t:.1f} s")

    def call_for(knorm: Any, kt: int | None, kscale: Any) -> Callable[[int], None]:
        def call(s: int) -> None:
            if kt is None:
                knorm.launch(gq, op.BLOCK, (*slots[s], part), stream=0)
            else:
                knorm.launch(gq, op.BLOCK, (*slots[s], part, kt), stream=0)
            kscale.launch(gs, op.BLOCK, (*slots[s], part, no_op, mx), stream=0)

        return call

    # (name, call, kept MB, scale evict_first, persisting set-aside)
    variants: list[tuple[str, Callable[[int], None], int, bool, bool]] = [
        ("two", call_for(kn, None, ks), -1, False, False),
        ("two, scale ef", call_for(kn, None, kf), -1, True, False),
    ]
    for sf in (False, True):
        for keep in KEEPS:
            kt = keep * mb // tile_bytes
            name = f"keep {keep} MB" + (" + scale ef" if sf else "")
            variants.append((name, call_for(kk, kt, kf if sf else ks), keep, sf, False))
    if l2.get("max_persisting_bytes") or dry:
        for keep, sf in ((-1, False), (24, True), (40, True), (40, False)):
            if keep < 0:
                name, c = "[setaside] two", call_for(kn, None, ks)
            else:
                name = f"[setaside] keep {keep} MB" + (" + scale ef" if sf else "")
                c = call_for(kk, keep * mb // tile_bytes, kf if sf else ks)
            variants.append((name, c, keep, sf, True))

    def check(s: int) -> float:
        worst = 0.0
        for d, r in zip(sets_nb[s], g64, strict=True):
            ref = r * coef
            x = as_xp(d).astype(xp.float64)
            worst = max(worst, float(xp.linalg.norm(x - ref) / xp.linalg.norm(ref)))
        return worst

    def timed(call: Callable[[int], None]) -> tuple[list[float], int]:
        evs = []
        s = 0
        for i in range(WARM + ITERS):
            s = i % SETS
            for d, p in zip(sets_nb[s], pr_nb, strict=True):
                d.copy_to_device(p)
            if not dry:
                _spin[1, 1](SPIN_US)
            a, b = cuda.event(), cuda.event()
            a.record()
            call(s)
            b.record()
            if i >= WARM:
                evs.append((a, b))
        cuda.synchronize()
        return [a.elapsed_time(b) * 1e3 for a, b in evs], s

    rows: dict[str, dict[str, Any]] = {}
    setaside_bytes = int(l2.get("max_persisting_bytes") or 0)
    for rnd, order in enumerate((variants, variants[::-1])):
        for name, call, keep, sf, aside in order:
            if time.time() - T0 > BUDGET_S:
                log(f"SKIP {dt.name} {name} round {rnd + 1}: past the {BUDGET_S:.0f} s budget")
                continue
            row = rows.setdefault(name, {"dtype": dt.name, "variant": name, "keep_mb": keep, "scale_ef": sf,
                                         "setaside": aside, "us": [], "ok": True})  # fmt: skip
            try:
                _reset_persisting(dry)
                if aside:
                    row["setaside_status"] = _set_persisting(setaside_bytes, dry)
                us, last = timed(call)
                row["us"] += us
                row[f"median_r{rnd + 1}"] = round(float(np.median(us)), 2)
                got = float(norm_out.copy_to_host()[0])
                nerr = abs(got - norm) / norm
                row["norm_err"] = max(row.get("norm_err", 0.0), nerr)
                row["ok"] = row["ok"] and nerr <= tol
                if rnd == 0:
                    row["rel_err"] = check(last)
                    row["ok"] = row["ok"] and row["rel_err"] <= tol
            except Exception as e:  # noqa: BLE001  (report the variant, keep probing the rest)
                row["error"] = f"{type(e).__name__}: {e}"
                row["ok"] = False
            finally:
                if aside:
                    _set_persisting(0, dry)
            log(f"{dt.name} r{rnd + 1} {name}: {row.get(f'median_r{rnd + 1}')} us, ok {row['ok']}"
                + (f" ERROR {row['error']}" if "error" in row else ""))  # fmt: skip
    _reset_persisting(dry)
    base_us = None
    for row in rows.values():
        if row["us"]:
            row["median"] = round(float(np.median(row["us"])), 2)
            row["p10"] = round(float(np.percentile(row["us"], 10)), 2)
            row["p90"] = round(float(np.percentile(row["us"], 90)), 2)
            row["sol"] = round(nbytes / (row["median"] * 1e-6) / 1e9 / copy_gbs, 3)
            if row["variant"] == "two":
                base_us = row["median"]
        del row["us"]
    for row in rows.values():
        if base_us is not None and "median" in row:
            row["vs_two_us"] = round(row["median"] - base_us, 2)
        res["rows"].append(row)
    if cp is not None:
        del pristine, g64
        cp.get_default_memory_pool().free_all_blocks()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--dry-run", action="store_true", help="tiny shape, no copy measurement (simulator)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    global ELEMS, WARM, ITERS, BUDGET_S
    if a.dry_run:  # the simulator runs every thread in Python: one fp16 norm tile and a tail per array
        ELEMS, WARM, ITERS, BUDGET_S = 1100, 0, 1, 1e9
    from kernels.ops import clip_grad_norm as op

    dev = cuda.get_current_device()
    name = getattr(dev, "name", "?")
    res: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": name.decode() if isinstance(name, bytes) else str(name),
        "shape": [COUNT, ELEMS],
        "method": {"sets": SETS, "warm": WARM, "iters_per_round": ITERS, "rounds": 2, "spin_us": SPIN_US},
        "v4_default": {d.name: repr(c) for d, c in op.V4_DEFAULT.items()},
        "rows": [],
    }

    def save() -> None:
        res["wall_s"] = round(time.time() - T0, 1)
        with open(os.path.join(a.out, "clip_l2.json"), "w") as f:
            json.dump(res, f, indent=1, default=str)
        with open(os.path.join(a.out, "clip_l2.txt"), "w") as f:
            f.write("\n".join(LOG) + "\n")

    if a.dry_run:
        copy_gbs = 1.0
        res["copy_gbs"] = "dry-run"
    else:
        from kernels.device import measure_copy_bandwidth

        copy = measure_copy_bandwidth()
        res["copy_gbs"] = {k: round(v, 1) for k, v in copy.items()}
        copy_gbs = max(copy.values())
        log(f"copy GB/s: {res['copy_gbs']}")
    l2 = _l2_info(a.dry_run)
    res["l2"] = l2
    log(f"L2: {l2}")
    save()
    for dt in (np.dtype(np.float16), np.dtype(np.float32)):
        try:
            _probe_dtype(dt, copy_gbs, a.dry_run, l2, res)
        except Exception as e:  # noqa: BLE001
            res["rows"].append({"dtype": dt.name, "variant": "setup", "error": f"{type(e).__name__}: {e}"})
            log(f"{dt.name} setup failed: {e}")
        save()
        d = getattr(cuda.current_context(), "deallocations", None)
        if d is not None:
            d.clear()

    print(f"\ncopy {copy_gbs:.0f} GB/s; SOL = 3-pass bytes / device time / copy; L2 {l2}")
    print(
        f"{'dtype':8} {'variant':34} {'us':>8} {'r1':>8} {'r2':>8} {'vs two':>7} {'SOL':>6} {'rel err':>8} ok"
    )
    for r in res["rows"]:
        if "median" not in r:
            print(f"{r['dtype']:8} {r['variant']:34} ERROR {r.get('error', 'not timed')[:70]}")
            continue
        print(f"{r['dtype']:8} {r['variant']:34} {r['median']:8.1f} {r.get('median_r1', 0):8.1f} "
              f"{r.get('median_r2', 0):8.1f} {r.get('vs_two_us', 0):+7.1f} {r['sol']:6.3f} "
              f"{r.get('rel_err', float('nan')):8.1e} {r['ok']}")  # fmt: skip
    bad = [f"{r['dtype']} {r['variant']}" for r in res["rows"] if not r.get("ok")]
    print("checks vs float64:", "all ok" if not bad else f"FAILED {bad}")
    log(f"done in {time.time() - T0:.0f} s")
    save()
    return 0 if not bad else 1


if __name__ == "__main__":
    raise SystemExit(main())

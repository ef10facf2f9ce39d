# ruff: noqa: E501, B023  (a probe: each closure is called within its own loop iteration)
"""A/B probe (GPU timing; correctness in the simulator too; not shipped): fused_add_rmsnorm's rows past what
registers hold, kept on chip like rmsnorm's (kernels.ops.rmsnorm.make_onchip), against the op's 16-byte
streaming kernel that `auto` takes there today (benchmarks/PERF.md, "thirteenth session").

Why. In the thirteenth session's table (an H100) fused_add_rmsnorm bf16 runs at 0.84 of copy at 261 x 128256
and 256 x 131072 on its streaming kernel, where rmsnorm's on-chip kernel runs at 0.85-0.86 and took
1.04-1.12x over rmsnorm's own streaming kernel. The streaming kernel's pass 1 reads x and residual, stores
the rounded sum to residual and sums its squares; pass 2 reads that sum back (from L2) and writes out. Its
DRAM bytes are already the floor (4 n per row: x, residual read; residual, out written); what it loses is
what rmsnorm's streaming kernel lost: a second pass over every row, each row's reduction and passes in turn
with every SM in the same phase.

Variant ("chip"): rmsnorm's on-chip kernel with the add in front. The block's first row: its register part
(threads x per columns) loaded from x and residual, both in flight, summed, rounded to the dtype
(round_like: what storing and reloading gives), stored to residual; the rest of the row likewise, `vectors`
16-byte loads of each input in flight, each rounded sum stored to residual and kept in the thread's own
shared slots as packed pairs (exact: the values are the dtype's). Then row after row: the block reduction,
and one pass that writes out from registers and slots and, in the same step, loads the next row's x and
residual into the freed slots (their loads issued before this row's stores). One read of x and residual,
one write of residual and out, no second pass. `vectors` = 1: two inputs in flight per step, the bytes
rmsnorm's 2 hold. ptxas sm_90 (offline, `--ptxas`): the copy first timed took 61-64 registers and no spills
at 1, and spilled 244-296 bytes at 2; the product's kernel takes 63-64 and none at 1, and spills 284-444 at 2.

Outcome (fourteenth session, an H100, benchmarks/h100/2026-12-06/fourteenth/probes/): 1.09-1.11x at the
vocabulary widths, 1.00-1.02x at 40960-65536; shipped as one kernel text for both ops
(kernels.ops.rmsnorm.make_onchip's `add`), which this probe now times (its own copy is in the git history).

Shapes: ONCHIP_ROWS (one block of 1024 threads per SM) at 261 x 128256 and 256 x 131072, ONCHIP_MID_ROWS
(two blocks of 512) at 512 x 65536 and 1024 x 40960, where today's auto streams all four.

Prediction (from rmsnorm's on-chip against its streaming kernel, 1.04-1.12x): 1.03-1.08x at the vocabulary
widths (0.84 -> 0.87-0.90 of copy), 1.03-1.10x at 40960-65536.

Timing: kernels.harness.bench.time_interleaved (a device-side pause before each call, CUDA events, rotation
over SETS input sets). The residual drifts (each call adds x to it), the same for both arms; each arm's
output and residual are then checked once from fresh inputs against float64 (the op's reference). Prints one
JSON line per case and a table last; $OUT/fused_onchip_ab.json holds everything, registers and local memory
included.

    source benchmarks/h200_env.sh; OUT=$OUT $PY lab/fused_onchip_ab.py     (FO_SHAPES, FO_DTYPES narrow it)
    NUMBA_ENABLE_CUDASIM=1 python lab/fused_onchip_ab.py                    (simulator: correctness only)
    NUMBA_ENABLE_CUDASIM=0 python lab/fused_onchip_ab.py --ptxas            (offline: registers, spills; sm_90)
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from typing import Any

import numpy as np
from numba import cuda

from kernels.harness.bench import SETS, time_interleaved
from kernels.ops import fused_add_rmsnorm as fam
from kernels.ops.rmsnorm import make_onchip
from kernels.ops.rows import ONCHIP_MID_ROWS, ONCHIP_ROWS, OnChipRows, for_machine
from kernels.runtime import arrays
from kernels.runtime.arrays import BF16, SIMULATED, HostSync
from kernels.runtime.launch import dynamic_smem, kernel, sm_count

F16 = np.dtype(np.float16)
VECTORS = 1  # 16-byte loads in flight per input and step of the shared part


def make_fused_onchip(config: OnChipRows, width: int, word: bool):  # type: ignore[no-untyped-def]
    """fused_add_rmsnorm on chip with `config.vectors` 16-byte loads of each input in flight: the product's
    kernel (kernels.ops.rmsnorm.make_onchip's `add`, which takes half the config's vectors per input). The
    copy this probe first timed (at 4170a13, benchmarks/h100/2026-12-06/fourteenth/probes/) differed only in
    the first row's order of sums; it is in the git history."""
    return make_onchip(replace(config, vectors=2 * config.vectors), width, word, add=True)


def shapes() -> list[tuple[int, int, OnChipRows]]:
    """(rows, cols, config) per case; under the simulator rows of for_machine's shrunken shapes."""
    chip, mid = (replace(c, vectors=VECTORS) for c in (ONCHIP_ROWS, ONCHIP_MID_ROWS))
    if SIMULATED:  # 2 x grid + 1 rows (grid: min_blocks x the simulator's 4 SMs): every block loops, some twice
        c, m = for_machine(chip), for_machine(mid)
        return [(9, c.threads * c.per + 8 * 40 + 8, c), (17, m.threads * m.per + 8 * 24, m)]
    default = "261x128256,256x131072,512x65536,1024x40960"
    out = []
    for s in os.environ.get("FO_SHAPES", default).split(","):
        m, n = map(int, s.split("x"))
        c = chip if n > mid.cols else mid
        if not (c.takes(n) and n % 8 == 0):  # the register part is stored unchecked; the shared part holds cols
            raise SystemExit(
                f"FO_SHAPES: {m}x{n}: columns must be a multiple of 8 in {mid.from_cols}..{mid.cols} (two blocks "
                f"per SM) or {chip.from_cols}..{chip.cols} (one)"
            )
        out.append((m, n, c))
    return out


def main() -> int:
    from kernels.runtime.device import peaks

    out_dir = os.environ.get("OUT")
    gbs = 1.0 if SIMULATED else float(peaks()["mem_gbs"] or 1.0)
    print(f"copy {gbs:.0f} GB/s", flush=True)
    rng = np.random.default_rng(0)
    dts = [np.dtype(BF16 if d == "bfloat16" else d) for d in os.environ.get("FO_DTYPES", "bfloat16,float16").split(",")]
    rows_out: list[dict[str, Any]] = []
    resources: dict[str, Any] = {}
    ok = True
    for m, n, config in shapes():
        for dt in dts:
            sync = HostSync()
            width = 16 // dt.itemsize
            # each row at its own scale (2^-2 .. 2^2), so a row normed with another row's sum errs far past the
            # bound (rows drawn alike differ by well under 1 % in their RMS)
            rs_ = (2.0 ** (np.arange(m) % 5 - 2))[:, None]
            xh = [(rng.standard_normal((m, n)) * rs_).astype(dt) for _ in range(SETS)]
            rh = [(rng.standard_normal((m, n)) * 2 * rs_).astype(dt) for _ in range(SETS)]
            wh = (1 + 0.5 * rng.standard_normal(n)).astype(dt)
            xs = [arrays.to_device(a) for a in xh]
            w = arrays.to_device(wh)
            arms: dict[str, Any] = {}
            rs = {a: [arrays.to_device(b) for b in rh] for a in ("auto", "chip")}
            outs = {a: [cuda.device_array((m, n), dt) for _ in range(SETS)] for a in ("auto", "chip")}
            arms["auto"] = lambda s: fam.fused_add_rmsnorm(xs[s], rs["auto"][s], w, outs["auto"][s], eps=1e-6)
            fn = make_fused_onchip(config, width, dt == BF16)
            kk = kernel(fn, fam._K.sigs[dt], on_load=dynamic_smem(config.smem))
            kk._prepare()
            shared = (n - config.threads * config.per) * dt.itemsize
            grid = min(m, config.min_blocks * sm_count())
            if not SIMULATED:
                d = kk.dispatcher
                resources[f"{dt.name} {m}x{n}"] = {
                    "registers": next(iter(d.get_regs_per_thread().values())),
                    "local_bytes": next(iter(d.get_local_mem_per_thread().values())),
                }
                print(f"{dt.name} {m}x{n} chip: {resources[f'{dt.name} {m}x{n}']}", flush=True)

            def chip_args(s: int) -> tuple[Any, ...]:
                return (
                    arrays.as_rows(arrays.operand("x", xs[s], sync)),
                    arrays.as_rows(arrays.operand("residual", rs["chip"][s], sync)),
                    arrays.operand("weight", w, sync),
                    arrays.as_rows(arrays.operand("out", outs["chip"][s], sync)),
                    1e-6,
                )

            argsets = [chip_args(s) for s in range(SETS)]
            arms["chip"] = lambda s, a=argsets: kk.launch(grid, config.threads, a[s], shared=shared)
            labels = list(arms)
            if SIMULATED:
                ts = [[1.0] for _ in labels]
            else:
                ts = time_interleaved([(arms[a], list(range(SETS)), None) for a in labels], 30)
            # the check: set 0 from fresh inputs, one call of each arm
            o64 = fam.reference(xh[0], rh[0], wh, 1e-6)[1]
            # the op's rule: the sum taken in fp32 and rounded once to the dtype (numpy's fp32 add is IEEE's)
            r_ref = (xh[0].astype(np.float32) + rh[0].astype(np.float32)).astype(dt).astype(np.float64)
            for a in labels:
                cuda.synchronize()
                arrays.words(rs[a][0]).copy_to_device(arrays.host_words(rh[0]))
                arms[a](0)
                cuda.synchronize()
                got_o = arrays.to_host(outs[a][0]).astype(np.float64)
                got_r = arrays.to_host(rs[a][0]).astype(np.float64)
                err = float(np.abs(got_o - o64).max() / np.abs(o64).max())
                r_exact = bool(np.array_equal(got_r, r_ref))  # one rounding of the exact sum: bit for bit
                good = bool(np.isfinite(got_o).all()) and err < (8e-3 if dt == BF16 else 2e-3) and r_exact
                ok &= good
                us = float(np.median(ts[labels.index(a)]))
                rec = {
                    "dtype": dt.name, "rows": m, "cols": n, "kernel": a, "us": round(us, 2),
                    "of_copy": round(4 * m * n * dt.itemsize / us / 1e3 / gbs, 3),
                    "x_auto": round(float(np.median(ts[0])) / us, 3), "err": err, "residual_exact": r_exact,
                    "ok": good,
                }
                rows_out.append(rec)
                print(json.dumps(rec), flush=True)
    if out_dir:
        with open(os.path.join(out_dir, "fused_onchip_ab.json"), "w") as f:
            json.dump({"copy_gbs": gbs, "vectors": VECTORS, "rows": rows_out, "resources": resources}, f, indent=1)
    print(f"{'dtype':9s} {'shape':12s} {'kernel':6s} {'us':>8s} {'of copy':>7s} {'x auto':>6s} err")
    for r in rows_out:
        print(f"{r['dtype']:9s} {r['rows']}x{r['cols']:<7d} {r['kernel']:6s} {r['us']:8.2f} {r['of_copy']:7.3f} "
              f"{r['x_auto']:6.3f} {r['err']:.1e}{'' if r['ok'] else ' BAD'}")
    print("all outputs right:", "yes" if ok else "NO")
    return 0 if ok else 1


def ptxas_report() -> int:
    """Offline (no GPU): the probe's registers and spills (ptxas sm_90) at both shapes, with 1 and 2 vectors."""
    from kernels.runtime import ptx

    for dt in (BF16, F16):
        for base in (ONCHIP_ROWS, ONCHIP_MID_ROWS):
            for vectors in (1, 2):
                c = replace(base, vectors=vectors)
                fn = make_fused_onchip(c, 16 // dt.itemsize, dt == BF16)
                r = ptx._ptxas(ptx.compile_one(fn, fam._K.sigs[dt], (9, 0)), (9, 0), False)
                print(f"{dt.name:8s} {c.threads}x{c.per} vectors {vectors}: registers {r.get('registers')}, "
                      f"spills {r.get('spill_bytes')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(ptxas_report() if "--ptxas" in sys.argv else main())

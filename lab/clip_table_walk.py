"""clip_grad_norm's table kernels with each block walking its own tiles, against the shipped kernels, where
every block walks every row of the table (benchmarks/PERF.md, "eleventh session": the registry's Llama-3-8B /
64 case takes 650 us in bf16 and 712 in fp32, twice the bytes; ~400 us that do not scale with them).

Variant ("walk"): the host adds two columns to the table, each row's first norm tile and first scale tile (a
prefix sum of the tile counts, computed once); block b takes the global tiles b, b + G, ... as the shipped
kernels deal them, and finds each tile's row from the row of its previous tile (one load while it stays in
that row, else a galloping search then a binary one over the skipped rows) instead of running the dealing
arithmetic (a 64-bit remainder among it) for every row. (A plain binary search per tile, ~9 steps for 291
rows, was 2.05x the shipped kernels at div64 bf16 but 0.976x at div8, where most tiles stay in their
block's row: benchmarks/h100/2026-12-06/twelfth/.) The same tiles in
the same order per block, so the same partial sums: the norm and every scaled array must equal the shipped
kernels' bit for bit (checked first, every size and dtype).

    source benchmarks/h200_env.sh; OUT=$OUT $PY lab/clip_table_walk.py   (GPU: $OUT/clip_table_walk.json)
    NUMBA_ENABLE_CUDASIM=1 python lab/clip_table_walk.py --check       (simulator: bit-for-bit check only)

Timed by kernels.harness.bench.time_interleaved (a device-side pause before every call, events around it,
inputs restored from a pristine copy and L2 flushed outside the events), shipped and walk interleaved call
by call. Prediction (floors: bytes 3 x the gradients', Llama-3-8B / 64 in bf16 752 MB, 255 us at 2.95 TB/s):
walk 300-380 us at div64 bf16 (0.67-0.85 of copy; 650 shipped), fp32 520-600 (712), and 1.02-1.06x at div8.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from typing import Any

import numpy as np
from numba import cuda, float32, float64, int64

from kernels.harness.bench import time_interleaved
from kernels.ops import clip_grad_norm as op
from kernels.primitives.cache_hints import ldg_hint_into
from kernels.primitives.pointers import address_of, view_at
from kernels.primitives.reductions import BLOCK, block_sum
from kernels.primitives.vector import WIDTH, ldg_into, stg_from
from kernels.runtime import arrays
from kernels.runtime.arrays import BF16, SIMULATED


def walk_kernels(dt: np.dtype, cfg: op.TwoPassConfig) -> dict[str, Any]:
    u_sq, u_sc, width = cfg.norm_unroll, cfg.scale_unroll, WIDTH[dt]
    tq, tc = BLOCK * u_sq * width, BLOCK * u_sc * width
    hint = cfg.l2_keep_mb >= 0
    keep = op.kept_tiles(cfg.l2_keep_mb, u_sq)
    policies = op._norm_policies(hint)
    io = op.IO_OF[dt]
    load, store = io.load, io.store
    at = view_at(dt)
    nv = max(u_sq, u_sc) * width
    jit_sq: dict[str, object] = {} if SIMULATED else {"launch_bounds": (BLOCK, cfg.norm_blocks_per_sm)}
    jit_sc: dict[str, object] = {} if SIMULATED else {"launch_bounds": (BLOCK, cfg.scale_blocks_per_sm)}

    @cuda.jit(device=True, inline="always")
    def last_at_most(tab, col, g, lo, hi):  # type: ignore[no-untyped-def]
        """The last row r in [lo, hi] with tab[r, col] <= g, given tab[lo, col] <= g (the column ascends)."""
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            if tab[mid, col] <= g:
                lo = mid
            else:
                hi = mid - 1
        return lo

    @cuda.jit(device=True, inline="always")
    def row_up(tab, col, g, j):  # type: ignore[no-untyped-def]
        """The row holding global tile g, from row j that holds an earlier tile (a block's tiles ascend): one
        load while g stays in row j, else a galloping search forward (steps 1, 2, 4, ...), then a binary
        search inside the last step, so a block pays O(log) per row it skips, not per tile."""
        last = int64(tab.shape[0] - 1)
        if j == last or tab[j + 1, col] > g:
            return j
        lo = j + 1
        step = int64(1)
        while lo + step <= last and tab[lo + step, col] <= g:
            lo += step
            step *= 2
        return last_at_most(tab, col, g, lo, min(lo + step - 1, last))

    @cuda.jit(device=True, inline="always")
    def row_down(tab, col, g, j):  # type: ignore[no-untyped-def]
        """row_up for a block whose tiles descend (the scale kernel counts from the last tile): row j holds
        a later tile, so the row of g is j or before it."""
        if tab[j, col] <= g:
            return j
        hi = j - 1  # the row of g is at most hi (tab[hi + 1, col] > g)
        step = int64(1)
        p = hi
        while p > 0 and tab[p, col] > g:  # row 0's first tile is 0 <= g
            hi = p - 1
            step *= 2
            p = max(hi - step + 1, int64(0))
        return last_at_most(tab, col, g, p, hi)

    @cuda.jit(**jit_sq)  # compiled at the first call
    def norm(tab, part, tiles):  # type: ignore[no-untyped-def]
        smem = cuda.shared.array(BLOCK, float32)
        v = cuda.local.array(nv, float32)
        acc = cuda.local.array(u_sq, float32)
        for u in range(u_sq):
            acc[u] = float32(0.0)
        tid = cuda.threadIdx.x
        b = int64(cuda.blockIdx.x)
        G = int64(cuda.gridDim.x)
        lim, pl, pf = policies(tiles, keep)
        g = b
        j = int64(0)
        while g < tiles:
            j = row_up(tab, 2, g, j)
            n = tab[j, 1]
            arr = at(tab[j, 0], n)
            base = (g - tab[j, 2]) * tq
            if base + tq <= n:
                if hint:
                    pol = pl if g >= lim else pf
                    for u in range(u_sq):
                        ldg_hint_into(v, u * width, arr, base + (u * BLOCK + tid) * width, pol)
                else:
                    for u in range(u_sq):
                        ldg_into(v, u * width, arr, base + (u * BLOCK + tid) * width)
                for u in range(u_sq):
                    for w in range(width):
                        x = v[u * width + w]
                        acc[u] += x * x
            else:
                i = base + tid
                while i < n:
                    x = load(arr[i])
                    acc[0] += x * x
                    i += BLOCK
            g += G
        s = float32(0.0)
        for u in range(u_sq):
            s += acc[u]
        total = block_sum(s, smem)
        if tid == 0:
            part[cuda.blockIdx.x] = total

    @cuda.jit(**jit_sc)
    def scale(tab, part, norm_out, max_norm, tiles):  # type: ignore[no-untyped-def]
        smem = cuda.shared.array(BLOCK, float32)
        total = op.sum_parts(part, smem)
        nrm = math.sqrt(float64(total))
        if cuda.threadIdx.x == 0 and cuda.blockIdx.x == 0:
            norm_out[0] = float32(nrm)
        coef = max_norm / (nrm + op.CLIP_EPS)
        if not (coef < 1.0 and coef > 0.0):
            return
        c = float32(coef)
        v = cuda.local.array(nv, float32)
        tid = cuda.threadIdx.x
        b = int64(cuda.blockIdx.x)
        G = int64(cuda.gridDim.x)
        s = b
        j = int64(tab.shape[0] - 1)
        while s < tiles:  # counted from the last tile, as shipped (what the norm read last, first)
            g = tiles - 1 - s
            j = row_down(tab, 3, g, j)
            n = tab[j, 1]
            arr = at(tab[j, 0], n)
            base = (g - tab[j, 3]) * tc
            if base + tc <= n:
                for u in range(u_sc):
                    ldg_into(v, u * width, arr, base + (u * BLOCK + tid) * width)
                for e in range(u_sc * width):
                    v[e] *= c
                for u in range(u_sc):
                    stg_from(arr, base + (u * BLOCK + tid) * width, v, u * width)
            else:
                k = base + tid
                while k < n:
                    arr[k] = store(load(arr[k]) * c)
                    k += BLOCK
            s += G

    return {"norm": norm, "scale": scale, "tq": tq, "tc": tc}


def address(a: Any) -> int:
    return address_of(a) if SIMULATED else int(a.device_ctypes_pointer.value)


class Runner:
    """One set of gradients and both ways of clipping it: `shipped` (the product's table kernels on its
    table) and `walk` (the variant on the 4-column table), each a call clipping the set in place."""

    def __init__(self, grads: list[Any], dt: np.dtype, max_norm: float, grid: int = 0) -> None:
        self.grads, self.mx = grads, max_norm
        cfg = op.two_pass_config(dt)
        self.gq, self.gc = op.two_pass_grid(dt, cfg, "norm"), op.two_pass_grid(dt, cfg, "scale")
        if grid:  # another persistent grid for both kernels (the check's: blocks that skip many rows a tile)
            self.gq = self.gc = grid
        rows = tuple((address(g), g.size) for g in grads)
        self.tab, self.tiles_q, self.tiles_c = op._table_of(dt, cfg, rows)
        self.kn, self.ks = op._table_kernel(dt, cfg, "norm"), op._table_kernel(dt, cfg, "scale")
        w = self.w = walk_kernels(dt, cfg)
        nq = [(n + w["tq"] - 1) // w["tq"] for _, n in rows]
        nc = [(n + w["tc"] - 1) // w["tc"] for _, n in rows]
        tab4 = np.zeros((len(rows), 4), np.int64)
        tab4[:, :2] = rows
        tab4[1:, 2] = np.cumsum(nq)[:-1]
        tab4[1:, 3] = np.cumsum(nc)[:-1]
        assert sum(nq) == self.tiles_q and sum(nc) == self.tiles_c
        self.tab4 = cuda.to_device(tab4)
        self.part = cuda.to_device(np.zeros(self.gq, np.float32))
        self.part_w = cuda.to_device(np.zeros(self.gq, np.float32))
        self.norm = cuda.device_array(1, np.float32)
        self.norm_w = cuda.device_array(1, np.float32)
        sync = arrays.HostSync()
        self.ops = (arrays.operand("part", self.part, sync), arrays.operand("norm", self.norm, sync))

    def shipped(self, _args: Any = None) -> None:
        part, no = self.ops
        self.kn.launch(self.gq, BLOCK, (self.tab, part, self.tiles_q))
        self.ks.launch(self.gc, BLOCK, (self.tab, part, no, self.mx, self.tiles_c))

    def walk(self, _args: Any = None) -> None:
        self.w["norm"][self.gq, BLOCK](self.tab4, self.part_w, self.tiles_q)
        self.w["scale"][self.gc, BLOCK](self.tab4, self.part_w, self.norm_w, self.mx, self.tiles_c)


def make(sizes: list[int], dt: np.dtype, seed: int) -> tuple[list[np.ndarray], float]:
    rng = np.random.default_rng(seed)
    host = [(rng.standard_normal(n, dtype=np.float32) * 0.1).astype(dt) for n in sizes]
    norm = math.sqrt(sum(float(np.sum(h.astype(np.float64) ** 2)) for h in host))
    return host, norm * 0.37  # scales (op's registry cases: max_norm at 0.37 of the norm)


def bitwise(sizes: list[int], dt: np.dtype, grid: int = 0) -> dict[str, Any]:
    """Shipped and walk on two copies of the same gradients: the norm and every array, bit for bit."""
    host, mx = make(sizes, dt, 7)
    a = Runner([arrays.to_device(h) for h in host], dt, mx, grid)
    b = Runner([arrays.to_device(h) for h in host], dt, mx, grid)
    a.shipped()
    b.walk()
    cuda.synchronize()
    same_norm = a.norm.copy_to_host().view(np.uint32)[0] == b.norm_w.copy_to_host().view(np.uint32)[0]
    differ = sum(
        int(np.count_nonzero(arrays.to_host(x).view(np.uint8) != arrays.to_host(y).view(np.uint8)))
        for x, y in zip(a.grads, b.grads, strict=True)
    )
    return {"arrays": len(sizes), "norm_equal": bool(same_norm), "bytes_differing": differ}


def timed(sizes: list[int], dt: np.dtype, iters: int) -> dict[str, Any]:
    host, mx = make(sizes, dt, 11)
    pristine = [arrays.to_device(h) for h in host]
    r = Runner([arrays.to_device(h) for h in host], dt, mx)

    def restore(_args: Any) -> None:
        for g, p in zip(r.grads, pristine, strict=True):
            arrays.words(g).copy_to_device(arrays.words(p))

    shipped, walk = time_interleaved([(r.shipped, [{}], restore), (r.walk, [{}], restore)], iters)
    nbytes = 3 * sum(sizes) * dt.itemsize
    ms, mw = statistics.median(shipped), statistics.median(walk)
    return {"shipped_us": round(ms, 2), "walk_us": round(mw, 2), "walk_x": round(ms / mw, 3),
            "shipped_gbs": round(nbytes / ms / 1e3, 1), "walk_gbs": round(nbytes / mw / 1e3, 1),
            "bytes": nbytes}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true", help="the bit-for-bit check only (the simulator's mode)")
    ap.add_argument("--iters", type=int, default=20)
    a = ap.parse_args()
    dts = {"bfloat16": BF16, "float32": np.dtype(np.float32)}
    # the simulator (2 blocks of 256 Python threads): whole tiles and tails of both dtypes (tiles of 8192
    # bf16, 4096 fp32 values), one-element arrays; the GPU: Llama-3-8B's 291 tensors / 64 and / 8
    cases = (
        [("sim-mix", [8197, 3, 8192, 100, 1, 17, 4099, 4096], 0),
         ("sim-skips", [1, 2, 3] * 9 + [20000] + [5, 1] * 8 + [9000, 1], 11)]  # 11 blocks: 1-11 rows a step
        if SIMULATED
        else [(f"llama3-8b-div{d}", op.llama3_8b_sizes(d), 0) for d in (64, 8)]
    )
    rows = []
    for label, sizes, grid in cases:
        for name, dt in dts.items():
            row: dict[str, Any] = {"dtype": name, "case": label, **bitwise(sizes, dt, grid)}
            if not a.check and not SIMULATED:
                row.update(timed(sizes, dt, a.iters))
            rows.append(row)
            print(json.dumps(row), flush=True)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "clip_table_walk.json"), "w") as f:
            json.dump(rows, f, indent=1)
    ok = all(r["norm_equal"] and r["bytes_differing"] == 0 for r in rows)
    print("bit for bit:", "yes" if ok else "NO")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Variants of the memory-bound kernels, timed side by side on the H200 in one process (METHOD.md: one
script, several variants). Not part of the library: it answers "which launch shape / ILP should the ops
use" with numbers. Prints a table; writes JSON to $OUT/memvariants.json when OUT is set.

    python benchmarks/memvariants.py
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
from numba import cuda, float32

from kernels.arrays import operand
from kernels.launch import kernel

N_ROWS, N_COLS = 16384, 4096
SETS, WARM, ITERS = 3, 3, 15
SMS = cuda.get_current_device().MULTIPROCESSOR_COUNT


def _time(fn, sets) -> float:  # type: ignore[no-untyped-def]
    evs = []
    for i in range(WARM + ITERS):
        a, b = cuda.event(), cuda.event()
        a.record()
        fn(sets[i % len(sets)])
        b.record()
        if i >= WARM:
            evs.append((a, b))
    cuda.synchronize()
    return float(np.median([cuda.event_elapsed_time(a, b) for a, b in evs])) * 1e3


# --- elementwise add variants ---------------------------------------------------------------------------


@cuda.jit
def add_one(x, r, out):  # type: ignore[no-untyped-def]
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = float32(x[i]) + float32(r[i])


@cuda.jit
def add_tile4(x, r, out):  # type: ignore[no-untyped-def]
    # block-contiguous tile of 4 x blockDim elements, four loads of each input in flight
    base = cuda.blockIdx.x * cuda.blockDim.x * 4 + cuda.threadIdx.x
    bd = cuda.blockDim.x
    n = x.shape[0]
    if base + 3 * bd < n:
        a0 = x[base]
        a1 = x[base + bd]
        a2 = x[base + 2 * bd]
        a3 = x[base + 3 * bd]
        b0 = r[base]
        b1 = r[base + bd]
        b2 = r[base + 2 * bd]
        b3 = r[base + 3 * bd]
        out[base] = float32(a0) + float32(b0)
        out[base + bd] = float32(a1) + float32(b1)
        out[base + 2 * bd] = float32(a2) + float32(b2)
        out[base + 3 * bd] = float32(a3) + float32(b3)
    else:
        for k in range(4):
            i = base + k * bd
            if i < n:
                out[i] = float32(x[i]) + float32(r[i])


@cuda.jit
def add_stride8(x, r, out):  # type: ignore[no-untyped-def]
    n = x.shape[0]
    s = cuda.gridsize(1)
    i = cuda.grid(1)
    while i + 7 * s < n:
        a0 = x[i]
        a1 = x[i + s]
        a2 = x[i + 2 * s]
        a3 = x[i + 3 * s]
        a4 = x[i + 4 * s]
        a5 = x[i + 5 * s]
        a6 = x[i + 6 * s]
        a7 = x[i + 7 * s]
        b0 = r[i]
        b1 = r[i + s]
        b2 = r[i + 2 * s]
        b3 = r[i + 3 * s]
        b4 = r[i + 4 * s]
        b5 = r[i + 5 * s]
        b6 = r[i + 6 * s]
        b7 = r[i + 7 * s]
        out[i] = float32(a0) + float32(b0)
        out[i + s] = float32(a1) + float32(b1)
        out[i + 2 * s] = float32(a2) + float32(b2)
        out[i + 3 * s] = float32(a3) + float32(b3)
        out[i + 4 * s] = float32(a4) + float32(b4)
        out[i + 5 * s] = float32(a5) + float32(b5)
        out[i + 6 * s] = float32(a6) + float32(b6)
        out[i + 7 * s] = float32(a7) + float32(b7)
        i += 8 * s
    while i < n:
        out[i] = float32(x[i]) + float32(r[i])
        i += s


def elementwise(dt: np.dtype) -> list[dict]:  # type: ignore[type-arg]
    from kernels.ops import residual_add as ra

    n = N_ROWS * N_COLS
    rng = np.random.default_rng()
    host_x = rng.standard_normal(n, dtype=np.float32).astype(dt)
    host_r = rng.standard_normal(n, dtype=np.float32).astype(dt)
    sets = []
    for _ in range(SETS):
        x, r, o = cuda.to_device(host_x), cuda.to_device(host_r), cuda.device_array(n, dt)
        sets.append((x, r, o, operand("x", x), operand("r", r), operand("o", o)))
    ref = host_x.astype(np.float32) + host_r.astype(np.float32)
    sig = f"void({dt.name}[::1], {dt.name}[::1], {dt.name}[::1])"
    fns = {"one": add_one, "tile4": add_tile4, "stride8": add_stride8, "lib": ra._DISPATCHERS[dt]}
    ks = {name: kernel(fn, sig) for name, fn in fns.items()}
    variants = [
        ("one-per-thread", "one", lambda n: (n + 255) // 256, 256),
        ("tile4 256", "tile4", lambda n: (n + 1023) // 1024, 256),
        ("tile4 512", "tile4", lambda n: (n + 2047) // 2048, 512),
        ("lib (tiles, unroll 4/8)", "lib", lambda n: ra.grid_for(n, ra.UNROLL[dt]), 256),
        ("stride8 8blk/SM", "stride8", lambda n: SMS * 8, 256),
    ]
    rows = []
    for label, kname, grid, block in variants:
        k = ks[kname]
        g = grid(n)
        us = _time(lambda s, k=k, g=g, block=block: k.launch(g, block, s[3:]), sets)
        ok = np.array_equal(sets[(WARM + ITERS - 1) % SETS][2].copy_to_host(), ref.astype(dt))
        rows.append({"op": "add", "dtype": dt.name, "variant": label, "us": round(us, 1),
                     "gbs": round(3 * n * dt.itemsize / us / 1e3, 1), "ok": bool(ok)})  # fmt: skip
    import cupy as cp

    cs = [tuple(cp.asarray(a) for a in s[:3]) for s in sets]
    us = _time(lambda s: cp.add(s[0], s[1], out=s[2]), cs)
    rows.append({"op": "add", "dtype": dt.name, "variant": "cupy.add", "us": round(us, 1),
                 "gbs": round(3 * n * dt.itemsize / us / 1e3, 1), "ok": True})  # fmt: skip
    return rows


# --- row variants: rmsnorm with the row kept in shared memory vs re-read --------------------------------


def make_rms_smem(block: int, cols: int):  # type: ignore[no-untyped-def]
    """The row is loaded once into shared memory (fp32), reduced, then written from shared memory."""
    per = cols // block
    warps = block // 32

    @cuda.jit
    def k(x, w, out, eps):  # type: ignore[no-untyped-def]
        row_s = cuda.shared.array(cols, float32)
        red = cuda.shared.array(32, float32)
        tid = cuda.threadIdx.x
        row = cuda.blockIdx.x
        acc = float32(0.0)
        for j in range(per):
            v = float32(x[row, tid + j * block])
            row_s[tid + j * block] = v
            acc += v * v
        for off in (16, 8, 4, 2, 1):
            acc += cuda.shfl_down_sync(0xFFFFFFFF, acc, off)
        if tid % 32 == 0:
            red[tid // 32] = acc
        cuda.syncthreads()
        if tid < 32:
            t = red[tid] if tid < warps else float32(0.0)
            for off in (16, 8, 4, 2, 1):
                t += cuda.shfl_down_sync(0xFFFFFFFF, t, off)
            if tid == 0:
                red[0] = t
        cuda.syncthreads()
        inv = float32(1.0) / math.sqrt(red[0] / float32(cols) + eps)
        for j in range(per):
            c = tid + j * block
            out[row, c] = row_s[c] * inv * float32(w[c])

    return k


def rows_variants(dt: np.dtype) -> list[dict]:  # type: ignore[type-arg]
    from kernels.ops import rmsnorm as rm

    rng = np.random.default_rng()
    hx = rng.standard_normal((N_ROWS, N_COLS), dtype=np.float32).astype(dt)
    hw = rng.standard_normal(N_COLS, dtype=np.float32).astype(dt)
    sets = []
    for _ in range(SETS):
        x, w, o = cuda.to_device(hx), cuda.to_device(hw), cuda.device_array((N_ROWS, N_COLS), dt)
        sets.append((x, w, o))
    ref = rm.reference(hx, hw, 1e-6)
    rows = []
    sig = f"void({dt.name}[:, ::1], {dt.name}[::1], {dt.name}[:, ::1], float32)"
    variants = [("lib: 256 thr, re-read", lambda s: rm.rmsnorm(s[0], s[1], s[2]))]
    for block in (128, 256, 512):
        k = kernel(make_rms_smem(block, N_COLS), sig)
        variants.append(
            (
                f"smem row {block} thr",
                lambda s, k=k, block=block: k.launch(
                    N_ROWS, block, tuple(operand(n, a) for n, a in zip("xwo", s, strict=True)) + (1e-6,)
                ),
            )
        )
    bytes_ = 2 * N_ROWS * N_COLS * dt.itemsize
    for label, fn in variants:
        us = _time(fn, sets)
        got = sets[(WARM + ITERS - 1) % SETS][2].copy_to_host().astype(np.float64)
        err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
        tol = 1e-5 if dt == np.float32 else 2e-3
        rows.append({"op": "rmsnorm", "dtype": dt.name, "variant": label, "us": round(us, 1),
                     "gbs": round(bytes_ / us / 1e3, 1), "ok": err < tol})  # fmt: skip
    return rows


def main() -> None:
    rows = []
    for dt in (np.dtype(np.float32), np.dtype(np.float16)):
        rows += elementwise(dt)
        rows += rows_variants(dt)
        cuda.current_context().deallocations.clear()
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "memvariants.json"), "w") as f:
            json.dump(rows, f, indent=1)
    print(f"{'op':<9}{'dtype':<9}{'variant':<26}{'us':>9}{'GB/s':>9}  ok")
    for r in rows:
        print(f"{r['op']:<9}{r['dtype']:<9}{r['variant']:<26}{r['us']:>9.1f}{r['gbs']:>9.0f}  {r['ok']}")


if __name__ == "__main__":
    main()

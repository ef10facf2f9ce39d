"""Why clip_grad_norm's Llama-3-8B / 64 row moves 13-16 % between runs in fp16 and fp32 (timed interleaved
with CuPy's 1 + 2N = 583 launches) while bf16 (timed alone) holds within 2 % (benchmarks/PERF.md, twentieth
session). One process, the registry bench's own method (`kernels.harness.bench.time_interleaved`: rotating
input sets, restore + L2 flush before each call, a 150 us device pause before each timed call), fp16, four
arms in rounds, twice in opposite orders:

  alone       ours only (as bf16 is timed)
  cupy        ours interleaved with CuPy (as the bench's fp16 row is timed)
  cupy-nogc   the same with Python's garbage collector off during the timed loop (CuPy's 583 calls make
              garbage; a collection between our start event and our launch is charged to us)
  cupy-spin2  the same with a 2000 us device pause instead of 150 (covers any host stall up to 2 ms)

Predictions (written before the run): if `alone` and `cupy` differ by < 2 %, the spread is run to run, not
the interleave. If cupy-nogc or cupy-spin2 lands at `alone` while cupy stays above, the cause is host time
inside our timed window (GC, or host work longer than the pause), and the bench's fix is the one that won.

    source benchmarks/h200_env.sh; OUT=$OUT $PY lab/clip_bench_spread.py   (-> $OUT/clip_bench_spread.json)
"""

from __future__ import annotations

import gc
import json
import os
import time

import numpy as np
from numba import cuda

from kernels.harness import bench
from kernels.harness.verify import stage
from kernels.registry import all_ops
from kernels.runtime import arrays

ITERS = 30


def stats(us: list[float]) -> dict[str, float]:
    a = np.asarray(us)
    return {k: round(float(np.percentile(a, q)), 2) for k, q in (("p10", 10), ("median", 50), ("p90", 90))}


def main() -> None:
    import cupy as cp

    spec = all_ops()["clip_grad_norm"]
    dtype = os.environ.get("DTYPE", "float16")
    case = next(c for c in spec.bench_cases if c.dtype == dtype and "llama" in c.label)
    problem = spec.make_problem(case, np.random.default_rng(0))
    base = stage(problem)
    sets = [base] + [bench.clone_args(base) for _ in range(bench.SETS - 1)]
    pristine = {n: bench.clone_args({n: base[n]})[n] for n in problem.inplace}

    def restore(args):  # type: ignore[no-untyped-def]
        for name, src in pristine.items():
            arrays.words(args[name]).copy_to_device(arrays.words(src))

    wrap = [{k: cp.asarray(v) if cuda.is_cuda_array(v) else v for k, v in s.items()} for s in sets]

    def cp_restore(args):  # type: ignore[no-untyped-def]
        for name, src in pristine.items():
            cp.copyto(args[name], cp.asarray(src))

    ours = (spec.launch, sets, restore)
    theirs = (spec.cupy, wrap, cp_restore)

    def alone() -> list[float]:
        return bench.time_interleaved([ours], ITERS)[0]

    def with_cupy() -> list[float]:
        return bench.time_interleaved([ours, theirs], ITERS)[0]

    def with_cupy_nogc() -> list[float]:
        gc.collect()
        gc.disable()
        try:
            return with_cupy()
        finally:
            gc.enable()

    def with_cupy_spin2() -> list[float]:
        old = bench.SPIN_US
        bench.SPIN_US = 2000
        try:
            return with_cupy()
        finally:
            bench.SPIN_US = old

    arms = {"alone": alone, "cupy": with_cupy, "cupy-nogc": with_cupy_nogc, "cupy-spin2": with_cupy_spin2}
    for fn in arms.values():  # compile, load, warm
        fn()
    out: dict[str, list[dict[str, float]]] = {k: [] for k in arms}
    order = list(arms)
    t0 = time.time()
    for rnd in range(4):
        for name in order if rnd % 2 == 0 else order[::-1]:
            out[name].append(stats(arms[name]()))
    cuda.synchronize()
    report = {
        "case": f"clip_grad_norm {dtype} {case.label}",
        "device": cuda.get_current_device().name.decode()
        if isinstance(cuda.get_current_device().name, bytes)
        else str(cuda.get_current_device().name),
        "iters": ITERS,
        "seconds": round(time.time() - t0, 1),
        "arms": out,
    }
    path = os.path.join(os.environ.get("OUT", "."), "clip_bench_spread.json")
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=1)
    print(f"{report['case']} on {report['device']}, {ITERS} timed calls per arm per round (us)")
    print(f"{'arm':12} " + "  ".join(f"round {i} p10/median/p90" for i in range(4)))
    for name, rows in out.items():
        cells = "  ".join(f"{r['p10']:7.1f}/{r['median']:7.1f}/{r['p90']:7.1f}" for r in rows)
        print(f"{name:12} {cells}")


if __name__ == "__main__":
    main()

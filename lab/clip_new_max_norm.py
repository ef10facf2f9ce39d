"""Why the plain 291-array clip with a new max_norm each call took 12.7 us of host time on an H100's host when
the same call with a fixed max_norm took 6.2 and a prepared set with a new max_norm 5.0 (tenth session,
`kernels bench --overhead`). Times the four calls in one process, twice in opposite orders, each as the
overhead bench does (2000 calls, the queue drained every 200) and again with a sync after every call; also
each call's device time (events around 200 calls) and the graph update alone.

    source benchmarks/h200_env.sh; $PY lab/clip_new_max_norm.py   (writes $OUT/clip_new_max_norm.json)
"""

from __future__ import annotations

import itertools
import json
import os
import time

import numpy as np
from numba import cuda

from kernels.ops import clip_grad_norm as op
from kernels.runtime import arrays


def host_us(fn, calls=2000, sync_each=False):  # type: ignore[no-untyped-def]
    for _ in range(300):
        fn()
    cuda.synchronize()
    ns = []
    for i in range(calls):
        t0 = time.perf_counter_ns()
        fn()
        if sync_each:
            cuda.synchronize()
        ns.append(time.perf_counter_ns() - t0)
        if i % 200 == 199:
            cuda.synchronize()
    cuda.synchronize()
    return round(float(np.median(ns)) / 1e3, 2)


def device_us(fn, calls=200):  # type: ignore[no-untyped-def]
    a, b = cuda.event(), cuda.event()
    cuda.synchronize()
    a.record()
    for _ in range(calls):
        fn()
    b.record()
    b.synchronize()
    return round(cuda.event_elapsed_time(a, b) * 1e3 / calls, 2)


def main() -> None:
    g = [arrays.to_device(np.ones(k, dtype=arrays.BF16)) for k in op.llama3_8b_sizes(4096)]
    norm = cuda.device_array(1, np.float32)
    prepared = op.prepare(g, norm_out=norm)
    mx = itertools.count(1e9)
    calls = {
        "plain fixed": lambda: op.clip_grad_norm(g, 1e9, norm_out=norm),
        "plain new": lambda: op.clip_grad_norm(g, next(mx), norm_out=norm),
        "prepared fixed": lambda: prepared(1e9),
        "prepared new": lambda: prepared(next(mx)),
    }
    rows = []
    for order in (list(calls), list(reversed(calls))):
        for name in order:
            fn = calls[name]
            rows.append({"call": name, "host_us": host_us(fn), "host_sync_each_us": host_us(fn, 500, True),
                         "device_us": device_us(fn)})
            print(rows[-1], flush=True)
    # the graph update alone, on the plain set's table call
    key = next(k for k in op._table_calls if k[1] == op.item_ids(g))
    entry = op._table_calls[key][0]
    scale = entry.kernels[1]

    def update() -> None:
        entry._graph.set_kernel_params(1, scale, entry.grids[1], op.BLOCK)

    rows.append({"call": "set_kernel_params alone", "host_us": host_us(update)})
    print(rows[-1], flush=True)
    out = os.environ.get("OUT", ".")
    with open(os.path.join(out, "clip_new_max_norm.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

"""The measured error of the bf16 row ops (rmsnorm, layernorm, softmax) against float64, the figures their
bf16 tolerances are set from: every sim case (CUDA simulator) or verify case (GPU) over several seeds, through
the public harness (kernels.harness.verify.check_case), the largest norm and per-element error per op.

    NUMBA_ENABLE_CUDASIM=1 PYTHONPATH=$PWD python lab/bf16_rows_error.py [--seeds 8] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse

import numpy as np

from kernels.harness import verify
from kernels.registry import all_ops
from kernels.runtime.arrays import SIMULATED


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--dtype", default="bfloat16")
    a = ap.parse_args()
    ops = all_ops()
    for name in ("rmsnorm", "layernorm", "softmax"):
        spec = ops[name]
        cases = [c for c in (spec.sim_cases if SIMULATED else spec.verify_cases) if c.dtype == a.dtype]
        rel = elem = 0.0
        for seed in range(a.seeds):
            for case in cases:
                r = verify.check_case(spec, case, np.random.default_rng(seed))
                if r.rel_err is None:
                    print(f"{name} {case.label}: {r.error}")
                    continue
                rel, elem = max(rel, r.rel_err), max(elem, r.elem_err or 0.0)
        labels = ",".join(c.label for c in cases)
        print(f"{name:10} {a.dtype} [{labels}] x {a.seeds} seeds: max rel {rel:.3e}  max elem {elem:.3e}  "
              f"(tol {spec.tolerance[a.dtype]:g} / {spec.elem_tolerance_of(a.dtype):g})")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

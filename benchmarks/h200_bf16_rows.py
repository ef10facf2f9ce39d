"""bf16 rmsnorm / layernorm / softmax on the H200 beside torch, one process: ours and torch's calls
interleaved call by call with the shared harness (kernels.harness.bench.time_interleaved: CUDA events per
call, inputs rotated over SETS device copies so no call finds its inputs in L2), every output checked
against float64 with the op's own tolerances (kernels.harness.verify.errors), then a short table.

    python benchmarks/h200_bf16_rows.py --out DIR [--dtypes bfloat16,float16]
    (benchmarks/h200_bf16_rows.sh sets the stack up first)

The problems, byte floors (2 bytes per bf16 element) and shapes are the registry's bench cases, the same as
fp16's. Torch's side: torch.nn.functional.rms_norm / layer_norm / softmax on bf16 (or fp16) tensors holding
the same values. Under the CUDA simulator (NUMBA_ENABLE_CUDASIM=1, a dry run of the plumbing) the ops' tiny
sim cases run once, untimed, without torch.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from kernels.harness.verify import errors, stage
from kernels.registry import Case, OpSpec, all_ops
from kernels.runtime import arrays, device
from kernels.runtime.arrays import BF16, SIMULATED

OPS = ("rmsnorm", "layernorm", "softmax")
TORCH_NAME = {"rmsnorm": "rms_norm", "layernorm": "layer_norm", "softmax": "softmax"}
ITERS = 30
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", flush=True)


def torch_provider(op: str, case: Case, sets: list[dict[str, Any]]) -> tuple[Callable[..., None], list[Any]]:
    """(fn, per-set torch args): torch's call on tensors holding each set's inputs; fn(args) keeps its
    result in args["out"]."""
    import torch
    import torch.nn.functional as F  # noqa: N812

    tdt = torch.bfloat16 if case.dtype == "bfloat16" else torch.float16

    def tensor(dev: Any) -> Any:
        host = arrays.to_host(dev)
        return torch.from_numpy(np.ascontiguousarray(host).view(np.int16)).cuda().view(tdt)

    n = case.params["cols"]
    tsets = [{k: tensor(v) for k, v in s.items() if k in ("x", "weight", "bias")} | {"eps": s.get("eps")}
             for s in sets]  # fmt: skip
    if op == "rmsnorm":

        def fn(a: dict[str, Any]) -> None:
            a["out"] = F.rms_norm(a["x"], (n,), a["weight"], a["eps"])
    elif op == "layernorm":

        def fn(a: dict[str, Any]) -> None:
            a["out"] = F.layer_norm(a["x"], (n,), a["weight"], a["bias"], a["eps"])
    else:

        def fn(a: dict[str, Any]) -> None:
            a["out"] = F.softmax(a["x"], dim=-1)

    return fn, tsets


def host_of_torch(t: Any) -> np.ndarray:
    import torch

    h = t.contiguous().view(torch.int16).cpu().numpy()
    return h.view(BF16) if t.dtype == torch.bfloat16 else h.view(np.float16)


def bench_one(spec: OpSpec, case: Case, rng: np.random.Generator, peaks: dict[str, Any]) -> dict[str, Any]:
    from kernels.harness.bench import SETS, clone_args, time_interleaved

    problem = spec.make_problem(case, rng)
    base = stage(problem)
    ref = problem.reference["out"]
    tol, etol = float(spec.tolerance[case.dtype]), spec.elem_tolerance_of(case.dtype)
    path = spec.path(case) if spec.path else None
    row: dict[str, Any] = {"op": spec.name, "dtype": case.dtype, "case": case.label, "path": path,
                           "tol": tol, "elem_tol": etol}  # fmt: skip
    if SIMULATED:  # dry run: one untimed call, checked
        spec.launch(base)
        sets, ours_us, ref_us, theirs = [base], None, None, None
    else:
        sets = [base] + [clone_args(base) for _ in range(SETS - 1)]
        fn, tsets = torch_provider(spec.name, case, sets)
        times = time_interleaved([(spec.launch, sets, None), (fn, tsets, None)], ITERS)
        ours_us, ref_us = (float(np.median(t)) for t in times)
        theirs = errors(host_of_torch(tsets[0]["out"]), ref)
        row["ref"] = f"torch.nn.functional.{TORCH_NAME[spec.name]}"
    # (torch writes its own tensors: set 0's `out` holds our last result for it)
    e = errors(arrays.to_host(sets[0]["out"]), ref)
    row |= {"rel_err": e.rel, "elem_err": e.elem, "why": e.why,
            "ok": e.why is None and e.rel <= tol and e.elem <= etol}  # fmt: skip
    if ours_us is not None and ref_us is not None and theirs is not None:
        nbytes = spec.bytes(case)
        gbs = nbytes / ours_us / 1e3
        row |= {"ours_us": round(ours_us, 2), "ref_us": round(ref_us, 2), "ratio": round(ref_us / ours_us, 3),
                "gbs": round(gbs, 1), "ref_rel_err": theirs.rel, "ref_elem_err": theirs.elem}  # fmt: skip
        if peaks.get("mem_gbs"):
            row["sol"] = round(gbs / float(peaks["mem_gbs"]), 3)
    log(json.dumps(row, default=str))
    return row


def table(rows: list[dict[str, Any]]) -> str:
    def f(v: Any, fmt: str) -> str:
        return format(v, fmt) if isinstance(v, (int, float)) else "-"

    lines = [f"{'op':10} {'dtype':9} {'case':11} {'path':9} {'ours us':>8} {'torch us':>8} {'ratio':>6} "
             f"{'SOL':>6} {'GB/s':>6} {'rel err':>9} {'elem err':>9} {'torch rel':>9} ok"]  # fmt: skip
    for r in rows:
        lines.append(
            f"{r['op']:10} {r['dtype']:9} {r['case']:11} {str(r.get('path')):9} "
            f"{f(r.get('ours_us'), '8.1f'):>8} "
            f"{f(r.get('ref_us'), '8.1f'):>8} {f(r.get('ratio'), '6.3f'):>6} {f(r.get('sol'), '6.3f'):>6} "
            f"{f(r.get('gbs'), '6.0f'):>6} {f(r.get('rel_err'), '9.2e')} {f(r.get('elem_err'), '9.2e')} "
            f"{f(r.get('ref_rel_err'), '9.2e'):>9} {'ok' if r.get('ok') else 'FAIL'}"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument(
        "--dtypes", default="bfloat16,float16", help="comma-separated (default: bfloat16,float16)"
    )
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    dtypes = [d.strip() for d in a.dtypes.split(",") if d.strip()]
    rng = np.random.default_rng(13)
    peaks: dict[str, Any] = {} if SIMULATED else device.peaks()
    log(f"simulated={SIMULATED} peaks {peaks}")
    rows: list[dict[str, Any]] = []
    errs: list[str] = []
    specs = all_ops()
    for dt in dtypes:
        for op in OPS:
            spec = specs[op]
            for case in spec.sim_cases if SIMULATED else spec.bench_cases:
                if case.dtype != dt:
                    continue
                try:
                    rows.append(bench_one(spec, case, rng, peaks))
                except Exception as e:  # noqa: BLE001  (one failure must not hide the other figures)
                    errs.append(f"{op} {dt} {case.label}: {type(e).__name__}: {e}")
                    log(f"ERROR {errs[-1]}")
    (a.out / "h200_bf16_rows.json").write_text(
        json.dumps(
            {"simulated": SIMULATED, "peaks": peaks, "rows": rows, "errors": errs}, indent=1, default=str
        )
    )
    print(table(rows))
    print(f"checks: {sum(bool(r['ok']) for r in rows)}/{len(rows)} ok; errors: {errs}")
    return 0 if not errs and rows and all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())

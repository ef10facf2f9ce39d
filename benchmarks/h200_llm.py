"""The LLM ops on the H200 beside torch eager and Liger-Kernel, in one process: rmsnorm, layernorm, softmax,
fused_add_rmsnorm, swiglu, rope, cast_fp8 and residual_add, in bf16 and fp16 (fp32 too with --dtypes), at
the registry's bench shapes plus a bf16 width sweep of the row ops (1024 to 131072 columns, 128256 included).

    python benchmarks/h200_llm.py --out DIR [--dtypes bfloat16,float16] [--no-sweep] [--no-liger]
    (benchmarks/h200_llm.sh sets the stack up first)

Method (kernels.harness.bench.time_interleaved): the providers' calls interleaved call by call, each timed
call right after an untimed one of its own provider (so it starts from L2 as its own op leaves it, not as
another library's call did: in plain interleaving the order alone moved softmax's "x Liger" by 3-12 %), CUDA
events per call, inputs rotated over SETS device copies so that no call finds its inputs in L2, the median of
ITERS calls. SOL is GB/s over the measured device-to-device copy bandwidth (`device.peaks()["mem_gbs"]`), so
it is the op's "fraction of copy"; every provider's GB/s counts the same bytes (the op's byte model), so the
ratio columns are plain time ratios.

Checks: every out-of-place output (ours, torch's, Liger's) is compared with the float64 reference with our
tolerances (kernels.harness.verify.errors): ours must pass; theirs are recorded. In-place ops (rope's x,
fused_add_rmsnorm's residual) are timed back to back on drifting inputs (a rotation keeps norms, a running
residual stays finite over the few calls), then the inputs are restored and one more call is checked.

Providers:
- torch eager: torch.nn.functional (rms_norm, layer_norm, softmax, silu), `torch.add`, the rotate-half RoPE
  written out as HF transformers does (out of place), fp8 as `(x.float() / (x.abs().amax() / 448)).to(e4m3)`.
- Liger-Kernel (liger_kernel.transformers.functional): rms_norm, layer_norm, softmax, fused_add_rms_norm,
  swiglu, rope. Its RoPE rotates q and k together: k gets one head (1/heads more bytes than ours, not
  counted) and full-width fp32 cos / sin tables (ours are half width). No Liger op for cast_fp8 or
  residual_add.

Under the CUDA simulator (NUMBA_ENABLE_CUDASIM=1, a dry run of the plumbing) the ops' tiny sim cases run once,
untimed, without torch.
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
from kernels.runtime.arrays import BF16, FP8, SIMULATED

OPS = ("rmsnorm", "layernorm", "softmax", "fused_add_rmsnorm", "swiglu", "rope", "cast_fp8", "residual_add")
SWEEP_OPS = ("rmsnorm", "layernorm", "softmax", "fused_add_rmsnorm")
SWEEP_COLS = (1024, 5120, 8192, 16384, 32768, 128256, 131072)
SWEEP_ELEMS = 1 << 25  # 64 MiB of bf16 per operand: each sweep case is past L2 (60 MB) with SETS copies
ITERS = 30
INPLACE = {"rope": ("x",), "fused_add_rmsnorm": ("residual",)}
T0 = time.perf_counter()

Fn = Callable[[dict[str, Any]], None]


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", flush=True)


def torch_dtype(name: str) -> Any:
    import torch

    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


def tensor_of(dev: Any) -> Any:
    """A torch CUDA tensor with a device array's values, through the host (bf16 / fp8 words as they are)."""
    import torch

    host = arrays.to_host(dev)
    if host.dtype == BF16:
        return torch.from_numpy(np.ascontiguousarray(host).view(np.int16)).cuda().view(torch.bfloat16)
    if host.dtype == FP8:
        return torch.from_numpy(np.ascontiguousarray(host).view(np.uint8)).cuda().view(torch.float8_e4m3fn)
    return torch.from_numpy(np.ascontiguousarray(host)).cuda()


def host_of_torch(t: Any) -> np.ndarray:
    import torch

    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).cpu().numpy().view(BF16)
    if t.dtype == torch.float8_e4m3fn:
        return t.view(torch.uint8).cpu().numpy().view(FP8)
    out: np.ndarray = t.cpu().numpy()
    return out


def _rotate_half(x: Any) -> Any:
    import torch

    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def providers(op: str, case: Case, liger: bool) -> dict[str, Callable[[dict[str, Any]], dict[str, Any]]]:
    """name -> prepare(set): torch tensors for one staged set, with a "call" closure; call() leaves the
    output to check in ["out"] (rope: ["x"], fused_add_rmsnorm: ["residual"] too)."""
    import torch
    import torch.nn.functional as F  # noqa: N812

    out: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {}
    eps = 1e-6

    def torch_eager(s: dict[str, Any]) -> dict[str, Any]:
        t = {k: tensor_of(v) for k, v in s.items() if hasattr(v, "shape")}
        e = s.get("eps", eps)
        if op == "rmsnorm":
            n = t["x"].shape[-1]
            t["call"] = lambda: t.__setitem__("out", F.rms_norm(t["x"], (n,), t["weight"], e))
        elif op == "layernorm":
            n = t["x"].shape[-1]
            t["call"] = lambda: t.__setitem__("out", F.layer_norm(t["x"], (n,), t["weight"], t["bias"], e))
        elif op == "softmax":
            t["call"] = lambda: t.__setitem__("out", F.softmax(t["x"], dim=-1))
        elif op == "fused_add_rmsnorm":
            n = t["x"].shape[-1]

            def call() -> None:
                t["residual"].add_(t["x"])
                t["out"] = F.rms_norm(t["residual"], (n,), t["weight"], e)

            t["call"] = call
        elif op == "swiglu":
            t["call"] = lambda: torch.mul(F.silu(t["a"]), t["b"], out=t["out"])
        elif op == "residual_add":
            t["call"] = lambda: torch.add(t["x"], t["r"], out=t["out"])
        elif op == "rope":
            cos = torch.cat((t["cos"], t["cos"]), dim=-1)[:, None, :].to(t["x"].dtype)
            sin = torch.cat((t["sin"], t["sin"]), dim=-1)[:, None, :].to(t["x"].dtype)

            def call() -> None:
                t["x"] = t["x"] * cos + _rotate_half(t["x"]) * sin

            t["call"] = call
        elif op == "cast_fp8":

            def call() -> None:
                scale = t["x"].abs().amax().float() / 448.0
                t["out"] = (t["x"].float() / scale).to(torch.float8_e4m3fn)
                t["scale"] = scale.reshape(1)

            t["call"] = call
        else:
            raise KeyError(op)
        return t

    out["torch"] = torch_eager
    if not liger or op not in ("rmsnorm", "layernorm", "softmax", "fused_add_rmsnorm", "swiglu", "rope"):
        return out
    import liger_kernel.transformers.functional as LF  # noqa: N812

    def liger_(s: dict[str, Any]) -> dict[str, Any]:
        t = {k: tensor_of(v) for k, v in s.items() if hasattr(v, "shape")}
        e = s.get("eps", eps)
        if op == "rmsnorm":
            t["call"] = lambda: t.__setitem__(
                "out", LF.liger_rms_norm(t["x"], t["weight"], e, in_place=False)
            )
        elif op == "layernorm":
            t["call"] = lambda: t.__setitem__("out", LF.liger_layer_norm(t["x"], t["weight"], t["bias"], e))
        elif op == "softmax":
            t["call"] = lambda: t.__setitem__("out", LF.liger_softmax(t["x"]))
        elif op == "fused_add_rmsnorm":

            def call() -> None:
                y, s_ = LF.liger_fused_add_rms_norm(t["x"], t["residual"], t["weight"], e, in_place=False)
                t["out"], t["residual"] = y, s_

            t["call"] = call
        elif op == "swiglu":
            t["call"] = lambda: t.__setitem__("out", LF.liger_swiglu(t["a"], t["b"]))
        elif op == "rope":
            tokens, heads, d = t["x"].shape
            cos = torch.cat((t["cos"], t["cos"]), dim=-1)  # [tokens, d] fp32
            sin = torch.cat((t["sin"], t["sin"]), dim=-1)
            k = torch.zeros((1, tokens, 1, d), dtype=t["x"].dtype, device="cuda").transpose(1, 2)

            def call() -> None:
                q = t["x"].view(1, tokens, heads, d).transpose(1, 2)
                qo, _ = LF.liger_rope(q, k, cos, sin)
                t["x"] = qo.transpose(1, 2).reshape(tokens, heads, d)

            t["call"] = call
        return t

    out["liger"] = liger_
    return out


def restore(dst: dict[str, Any], src: dict[str, Any], names: tuple[str, ...]) -> None:
    for n in names:
        arrays.words(dst[n]).copy_to_device(arrays.words(src[n]))


def bench_one(
    spec: OpSpec, case: Case, rng: np.random.Generator, peaks: dict[str, Any], liger: bool
) -> dict[str, Any]:
    from kernels.harness.bench import SETS, clone_args, time_interleaved

    problem = spec.make_problem(case, rng)
    base = stage(problem)
    pristine = clone_args(base) if not SIMULATED else None
    inplace = INPLACE.get(spec.name, ())
    checked = (
        ("out",)
        if spec.name not in INPLACE
        else (*inplace, *(("out",) if "out" in problem.reference else ()))
    )
    tol, etol = float(spec.tolerance[case.dtype]), spec.elem_tolerance_of(case.dtype)
    choice = spec.choice(case)
    row: dict[str, Any] = {"op": spec.name, "dtype": case.dtype, "case": case.label, "path": choice.path,
                           "tier": choice.tier, "tol": tol, "elem_tol": etol, "flops": spec.flops(case),
                           "bytes": spec.bytes(case)}  # fmt: skip
    if SIMULATED:  # dry run: one untimed call, checked
        spec.launch(base)
        sets = [base]
    else:
        sets = [base] + [clone_args(base) for _ in range(SETS - 1)]
        provs = providers(spec.name, case, liger)
        theirs: dict[str, list[dict[str, Any]]] = {}
        for name, prep in provs.items():
            try:  # a provider that fails to build or run (a Triton compile, say) is named, not fatal
                ts = [prep(s) for s in sets]
                ts[0]["call"]()
                theirs[name] = ts
            except Exception as e:  # noqa: BLE001
                row[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
        plist: list[tuple[Fn, list[Any], None]] = [(spec.launch, sets, None)]
        plist += [(lambda t: t["call"](), ts, None) for ts in theirs.values()]
        times = time_interleaved(plist, ITERS)
        med = [float(np.median(t)) for t in times]
        nbytes = spec.bytes(case)
        mem = float(peaks["mem_gbs"]) if peaks.get("mem_gbs") else None
        row["ours_us"] = round(med[0], 2)
        row["gbs"] = round(nbytes / med[0] / 1e3, 1)
        if mem:
            row["sol"] = round(row["gbs"] / mem, 3)
        for (name, ts), us in zip(theirs.items(), med[1:], strict=True):
            if inplace:  # restore, one call, check
                for k in inplace:
                    ts[0][k] = tensor_of(pristine[k])  # type: ignore[index]
                ts[0]["call"]()
            es = [errors(host_of_torch(ts[0][k]), problem.reference[k]) for k in checked]
            e = max(es, key=lambda x: (x.why is not None, x.rel))
            row[f"{name}_us"] = round(us, 2)
            row[f"{name}_ratio"] = round(us / med[0], 3)
            row[f"{name}_rel_err"], row[f"{name}_elem_err"] = e.rel, e.elem
        if inplace:
            restore(sets[0], pristine, inplace)  # type: ignore[arg-type]
            spec.launch(sets[0])
    worst = None
    for name in checked:
        e = errors(arrays.to_host(sets[0][name]), problem.reference[name])
        if worst is None or e.why is not None or e.rel > worst.rel:
            worst = e
    assert worst is not None
    row |= {"rel_err": worst.rel, "elem_err": worst.elem, "why": worst.why,
            "ok": worst.why is None and worst.rel <= tol and worst.elem <= etol}  # fmt: skip
    if spec.name == "cast_fp8":  # the scale too: bit-exact amax / 448
        got = float(arrays.to_host(sets[0]["scale"])[0])
        want = float(problem.reference["scale"][0])
        row["scale_ok"] = abs(got - want) <= 1e-6 * abs(want)
        row["ok"] = row["ok"] and row["scale_ok"]
    log(json.dumps(row, default=str))
    return row


def sweep_cases(spec: OpSpec, dtypes: list[str]) -> list[Case]:
    return [
        Case(f"{max(1, SWEEP_ELEMS // n)}x{n}", {"rows": max(1, SWEEP_ELEMS // n), "cols": n}, dt)
        for dt in dtypes
        if dt == "bfloat16"
        for n in SWEEP_COLS
    ]


def table(rows: list[dict[str, Any]]) -> str:
    def f(v: Any, fmt: str) -> str:
        return format(v, fmt) if isinstance(v, (int, float)) else "-"

    lines = [f"{'op':17} {'dtype':8} {'case':13} {'path':9} {'tier':8} {'ours us':>8} {'SOL':>5} "
             f"{'torch us':>8} {'x torch':>7} {'liger us':>8} {'x liger':>7} {'rel err':>8} ok"]  # fmt: skip
    for r in rows:
        lines.append(
            f"{r['op']:17} {r['dtype']:8} {r['case']:13} {str(r.get('path')):9} {str(r.get('tier')):8} "
            f"{f(r.get('ours_us'), '8.1f'):>8} {f(r.get('sol'), '5.2f'):>5} "
            f"{f(r.get('torch_us'), '8.1f'):>8} {f(r.get('torch_ratio'), '7.2f'):>7} "
            f"{f(r.get('liger_us'), '8.1f'):>8} {f(r.get('liger_ratio'), '7.2f'):>7} "
            f"{f(r.get('rel_err'), '8.1e')} {'ok' if r.get('ok') else 'FAIL'}"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument(
        "--dtypes", default="bfloat16,float16", help="comma-separated (default: bfloat16,float16)"
    )
    ap.add_argument("--ops", default=",".join(OPS), help=f"comma-separated subset of {','.join(OPS)}")
    ap.add_argument("--no-sweep", action="store_true", help="the bench shapes only, no width sweep")
    ap.add_argument("--no-liger", action="store_true", help="torch only")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    dtypes = [d.strip() for d in a.dtypes.split(",") if d.strip()]
    ops = [o.strip() for o in a.ops.split(",") if o.strip()]
    rng = np.random.default_rng(13)
    peaks: dict[str, Any] = {} if SIMULATED else device.peaks()
    liger = not a.no_liger and not SIMULATED
    versions: dict[str, Any] = {"simulated": SIMULATED}
    if not SIMULATED:
        import torch

        versions |= {"torch": torch.__version__, "device": torch.cuda.get_device_name()}
        if liger:
            import importlib.metadata as md

            versions["liger_kernel"] = md.version("liger-kernel")
    log(f"{versions} peaks {peaks}")
    rows: list[dict[str, Any]] = []
    errs: list[str] = []
    specs = all_ops()
    for op in ops:
        spec = specs[op]
        cases = [c for c in (spec.sim_cases if SIMULATED else spec.bench_cases) if c.dtype in dtypes]
        if op in SWEEP_OPS and not a.no_sweep and not SIMULATED:
            cases += sweep_cases(spec, dtypes)
        for case in cases:
            try:
                rows.append(bench_one(spec, case, rng, peaks, liger))
            except Exception as e:  # noqa: BLE001  (one failure must not hide the other figures)
                errs.append(f"{op} {case.dtype} {case.label}: {type(e).__name__}: {e}")
                log(f"ERROR {errs[-1]}")
            # after every case: a run stopped at its deadline keeps what it measured
            doc = {"versions": versions, "peaks": peaks, "iters": ITERS, "rows": rows, "errors": errs}
            (a.out / "h200_llm.json").write_text(json.dumps(doc, indent=1, default=str))
    print(table(rows))
    print(f"checks: {sum(bool(r['ok']) for r in rows)}/{len(rows)} ok; errors: {errs}")
    return 0 if not errs and rows and all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())

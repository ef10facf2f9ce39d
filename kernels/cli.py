"""`python -m kernels info | verify | bench | health`: parse, call the library, print. Exit codes: 0 all
good, 1 a check or an op failed, 2 a usage error (one line on stderr, e.g. an unknown op name)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kernels", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    info = sub.add_parser("info", help="device, versions, peaks, and what auto runs per op and dtype")
    info.add_argument("--json", action="store_true")
    info.add_argument("--remeasure", action="store_true", help="measure the copy bandwidth again")
    ver = sub.add_parser("verify", help="every op against its float64 reference")
    ver.add_argument("--json", action="store_true")
    ver.add_argument("--ops", help="comma-separated op names (default: all)")
    ver.add_argument("--shapes", choices=("verify", "bench", "all"), default="all",
                     help="GPU only: verification shapes, benchmark shapes or both (default)")  # fmt: skip
    ver.add_argument("--seed", type=int, help="replay a reported seed")
    b = sub.add_parser("bench", help="time every op at its benchmark shapes (GPU only)")
    b.add_argument("--json", action="store_true")
    b.add_argument("--ops", help="comma-separated op names (default: all)")
    b.add_argument("--compare", choices=("cupy",), help="time the CuPy equivalent in the same run")
    b.add_argument("--iters", type=int, default=20, help="timed calls per case (default 20)")
    b.add_argument("--plot", metavar="PNG", help="draw a roofline of every op to this file")
    b.add_argument("--out", metavar="JSON", help="also write the JSON report to this file")
    b.add_argument("--overhead", action="store_true", help="measure host overhead per call instead")
    h = sub.add_parser("health", help="node check: GPU health, release integrity, current, a tiny op")
    h.add_argument("--json", action="store_true")
    h.add_argument("--root", help="node root (default: $SOLFLEET_ROOT); also refreshes <root>/metrics")
    h.add_argument("--gpu-count", type=int, help="expected GPUs (default: from $SOLFLEET_HEALTH_EXPECT)")
    h.add_argument("--gpu-model", help="expected GPU model, matched inside the name (H200)")
    h.add_argument("--gpu-cc", help="expected compute capability (9.0)")
    h.add_argument("--driver", help="expected driver version or branch (580)")
    h.add_argument("--cuda", help="CUDA runtime the driver must support (13.0)")
    return p


def _ops(names: str | None) -> list[Any]:
    from kernels.registry import select

    return select(names)


def _emit(obj: dict[str, Any], as_json: bool, table: str) -> None:
    print(json.dumps(obj, indent=1, default=str) if as_json else table)


def _verify_table(rep: dict[str, Any]) -> str:
    lines = [f"device: {rep.get('device', {}).get('name', '?')}  simulated: {rep['simulated']}  "
             f"seed: {rep['seed']}"]  # fmt: skip
    lines.append(f"{'op':<19}{'dtype':<9}{'case':<22}{'rel_err':>11}{'tol':>9}  result")
    for r in rep.get("results", []):
        err = "-" if r["rel_err"] is None else f"{r['rel_err']:.2e}"
        res = "ok" if r["ok"] else f"FAIL {r.get('error', '')}"
        lines.append(f"{r['op']:<19}{r['dtype']:<9}{r['case']:<22}{err:>11}{r['tol']:>9.0e}  {res}")
    if rep.get("error"):
        lines.append(f"error: {rep['error']}")
    n = len(rep.get("results", []))
    bad = rep.get("failed_ops", [])
    tail = f"; failed ops: {', '.join(bad)}" if bad else ""
    lines.append(f"{'PASS' if rep['ok'] else 'FAIL'}: {n} cases{tail}")
    return "\n".join(lines)


def _bench_table(rep: dict[str, Any]) -> str:
    pk = rep["peaks"]
    lines = [f"{rep['device']['name']}  copy {pk['mem_gbs']} GB/s  fp32 {pk['fp32_tflops']} TFLOP/s  "
             f"({rep['date']})"]  # fmt: skip
    lines.append(f"{'op':<19}{'dtype':<8}{'case':<20}{'median us':>10}{'p10':>9}{'p90':>9}{'GB/s':>8}"
                 f"{'TFLOP/s':>9}{'SOL':>6}{'cupy us':>10}{'ratio':>7}  ok")  # fmt: skip
    for r in rep["results"]:
        if "median_us" not in r:
            lines.append(f"{r['op']:<19}{r['dtype']:<8}{r['case']:<20}  ERROR {r.get('error')}")
            continue
        cp = r.get("cupy") or {}
        cpu = f"{cp['median_us']:.1f}" if cp.get("median_us") else "-"
        ratio = f"{r['ratio_vs_cupy']:.2f}" if r.get("ratio_vs_cupy") else "-"
        sol = f"{r['sol']:.2f}" if r.get("sol") is not None else "-"
        lines.append(f"{r['op']:<19}{r['dtype']:<8}{r['case']:<20}{r['median_us']:>10.1f}{r['p10_us']:>9.1f}"
                     f"{r['p90_us']:>9.1f}{r['gbs']:>8.0f}{r['tflops']:>9.2f}{sol:>6}{cpu:>10}{ratio:>7}"
                     f"  {'ok' if r['ok'] else 'WRONG'}")  # fmt: skip
    return "\n".join(lines)


def _info(args: argparse.Namespace) -> int:
    from kernels.harness import coverage
    from kernels.runtime import device
    from kernels.runtime.arrays import SIMULATED

    device.require_device()
    cov = coverage.report(_ops(None))  # what auto runs here per op, dtype and production shape
    rep = {"simulated": SIMULATED, "device": device.describe(), "versions": device.versions(),
           "peaks": device.peaks(remeasure=args.remeasure)}  # fmt: skip
    table = "\n".join(f"{k}: {json.dumps(v, default=str)}" for k, v in rep.items())
    table += "\n" + coverage.table(cov)
    rep["coverage"] = cov
    _emit(rep, args.json, table)
    return EXIT_OK


def _verify(args: argparse.Namespace) -> int:
    from kernels.harness import verify

    rep = verify.run(_ops(args.ops), shapes=args.shapes, seed=args.seed)
    _emit(rep, args.json, _verify_table(rep))
    return EXIT_OK if rep["ok"] else EXIT_FAILED


def _bench(args: argparse.Namespace) -> int:
    from kernels.harness import bench

    ops = _ops(args.ops)
    if args.overhead:
        from kernels.harness import overhead
        from kernels.runtime.arrays import SIMULATED

        if SIMULATED:
            raise bench.SimulatorRefused(bench.REFUSAL)
        rows = overhead.measure(ops=tuple(s.name for s in ops) if args.ops else None)  # --ops: theirs only
        table = "\n".join(f"{r['call']:<42}{r['median_us']:>8.2f} us  (p10 {r['p10_us']:.2f}, "
                          f"p90 {r['p90_us']:.2f})" for r in rows)  # fmt: skip
        _emit({"overhead": rows}, args.json, table)
        return EXIT_OK

    def progress(s: str) -> None:
        print(f"  bench {s}", file=sys.stderr, flush=True)

    rep = bench.run(ops, compare=args.compare, iters=args.iters, progress=None if args.json else progress)
    if args.out:
        Path(args.out).write_text(json.dumps(rep, indent=1, default=str))
    if args.plot:
        from kernels.harness.roofline import plot

        plot(rep, args.plot)
    _emit(rep, args.json, _bench_table(rep))
    return EXIT_OK if all(r.get("ok") for r in rep["results"]) else EXIT_FAILED


def _health(args: argparse.Namespace) -> int:
    from kernels.harness import health

    expect = {"count": args.gpu_count, "model": args.gpu_model, "cc": args.gpu_cc, "driver": args.driver,
              "cuda": args.cuda}  # fmt: skip
    rep = health.run(health.inputs_from(root=args.root, expect=expect))
    table = "\n".join(f"{c['status']:<8}{c['name']}: {c['detail']}" for c in rep["checks"])
    _emit(rep, args.json, table)
    return EXIT_OK if rep["ok"] else EXIT_FAILED


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from kernels.harness.bench import SimulatorRefused
    from kernels.runtime.device import NoDevice

    try:
        return {"info": _info, "verify": _verify, "bench": _bench, "health": _health}[args.cmd](args)
    except (ValueError, SimulatorRefused, NoDevice) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE if isinstance(e, ValueError | SimulatorRefused) else EXIT_FAILED

"""Merge one H200 run's benchmark reports into `benchmarks/h200/latest.json`: every op x dtype x shape once,
with our median, SOL and error, and each reference timed beside it in the same process (CuPy, torch eager or
cuBLAS through torch, Liger-Kernel) with its median and the ratio (reference median / ours: > 1, ours is
faster). A ratio is only ever computed inside one report, from calls interleaved with ours; figures of two
reports are never divided.

    python benchmarks/latest.py --registry R.json --llm L.json [--llm L2.json] --gemm G.json [--clip C.json]
                                --out latest.json [--plot roofline.png] [--command "..."]

Inputs (each optional, at least one): `python -m kernels bench --compare cupy --json` (every op's bench
cases, CuPy beside it; bf16 has no CuPy), benchmarks/h200_llm.py's h200_llm.json (LLM ops against torch and
Liger, with the bf16 width sweep), benchmarks/h200_bf16.py's h200_bf16.json (gemm / o_proj against cuBLAS),
benchmarks/clip_llama.py's JSON (clip_grad_norm over Llama-3-8B's gradients against torch's foreach). Where
two reports time the same op, dtype and shape, the row is kept from the first in that order (llm, gemm,
clip, registry) and the other report's references are added to it, with their own ratio. One report's
rows of the same case on two kernels (h200_bf16.py times gemm / o_proj / linear on auto's TMA tile and on
the explicit cp.async tile) stay two rows, told apart by their path.

--llm and --gemm may be given more than once (runs of the same script that covered different ops: a run
stopped at its deadline, then a second for the rest), and each may name the script's log instead of its
JSON: both scripts log every row as one JSON line the moment it is measured, so the rows of a run whose
JSON was lost (the device tool returns a few files only) are rebuilt from its log, and the report says so
(`inputs`).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

Row = dict[str, Any]


def _ref(us: float | None, ours_us: float | None, **extra: Any) -> dict[str, Any] | None:
    if not us or not ours_us:
        return None
    return {"median_us": round(float(us), 2), "ratio": round(float(us) / float(ours_us), 3), **extra}


def from_registry(doc: dict[str, Any]) -> list[Row]:
    out = []
    for r in doc.get("results", []):
        ours = r.get("median_us")
        row: Row = {
            "op": r["op"],
            "dtype": r["dtype"],
            "case": r["case"],
            "path": r.get("path"),
            "bound": r.get("bound"),
            "flops": r.get("flops"),
            "bytes": r.get("bytes"),
            "median_us": ours,
            "p10_us": r.get("p10_us"),
            "p90_us": r.get("p90_us"),
            "tflops": r.get("tflops"),
            "gbs": r.get("gbs"),
            "sol": r.get("sol"),
            "rel_err": r.get("rel_err"),
            "ok": r.get("ok"),
            "source": "kernels bench",
            "refs": {},
        }
        cp = r.get("cupy") or {}
        ref = _ref(cp.get("median_us"), ours, rel_err=cp.get("rel_err"), timed_in="kernels bench")
        if ref:
            row["refs"]["cupy"] = ref
        elif cp.get("error"):
            row["refs_missing"] = {"cupy": cp["error"]}
        out.append(row)
    return out


def from_llm(doc: dict[str, Any]) -> list[Row]:
    out = []
    for r in doc.get("rows", []):
        ours = r.get("ours_us")
        flops, nbytes = r.get("flops"), r.get("bytes")
        row: Row = {
            "op": r["op"],
            "dtype": r["dtype"],
            "case": r["case"],
            "path": r.get("path"),
            "tier": r.get("tier"),
            "bound": "memory",
            "flops": flops,
            "bytes": nbytes,
            "median_us": ours,
            "gbs": r.get("gbs"),
            "sol": r.get("sol"),
            "tflops": round(flops / ours / 1e6, 3) if flops and ours else None,
            "rel_err": r.get("rel_err"),
            "elem_err": r.get("elem_err"),
            "ok": r.get("ok"),
            "source": "benchmarks/h200_llm.py",
            "refs": {},
        }
        for name, label in (("torch", "torch eager"), ("liger", "Liger-Kernel")):
            ref = _ref(
                r.get(f"{name}_us"),
                ours,
                what=label,
                rel_err=r.get(f"{name}_rel_err"),
                timed_in="benchmarks/h200_llm.py",
            )
            if ref:
                row["refs"][name] = ref
            elif r.get(f"{name}_error"):
                row.setdefault("refs_missing", {})[name] = r[f"{name}_error"]
        out.append(row)
    return out


def from_gemm(doc: dict[str, Any]) -> list[Row]:
    out = []
    for r in doc.get("rows", []):
        ours = r.get("ours_us")
        compute = r["op"] in ("gemm", "o_proj", "linear")
        row: Row = {
            "op": r["op"],
            "dtype": r["dtype"],
            "case": r["shape"],
            "path": r.get("path"),
            "bound": "compute" if compute else "memory",
            "flops": r.get("flops"),
            "bytes": r.get("bytes"),
            "median_us": ours,
            "tflops": r.get("ours_tflops"),
            "gbs": r.get("ours_gbs"),
            "sol": r.get("sol"),
            "rel_err": r.get("rel_err"),
            "ok": r.get("ok"),
            "source": "benchmarks/h200_bf16.py",
            "refs": {},
        }
        name = "cublas" if compute else "torch"
        ref = _ref(
            r.get("ref_us"),
            ours,
            what=r.get("ref"),
            rel_err=r.get("ref_rel_err"),
            timed_in="benchmarks/h200_bf16.py",
        )
        if ref:
            row["refs"][name] = ref
        for extra in ("plain_us", "epilogue_cost"):  # linear: ours without the activation, same run
            if extra in r:
                row[extra] = r[extra]
        out.append(row)
    return out


def from_clip(doc: dict[str, Any]) -> list[Row]:
    out = []
    for r in doc.get("rows", []):
        ours = r.get("ours_us")
        row: Row = {
            "op": "clip_grad_norm",
            "dtype": r["dtype"],
            "case": r["case"],
            "path": "table",
            "bound": "memory",
            "tensors": r.get("tensors"),
            "elements": r.get("elements"),
            "median_us": ours,
            "gbs": r.get("ours_gbs"),
            "sol": r.get("ours_sol"),
            "rel_err": (r.get("ours_check") or {}).get("norm_rel_err"),
            "ok": r.get("ok"),
            "host_us": r.get("ours_host_us"),
            "source": "benchmarks/clip_llama.py",
            "refs": {},
        }
        for name, key, label in (
            ("torch", "torch_us", "torch clip_grad_norm_ (foreach)"),
            ("per_array", "ours_per_array_us", "ours, one launch pair per array"),
        ):
            ref = _ref(r.get(key), ours, what=label, timed_in="benchmarks/clip_llama.py")
            if ref:
                row["refs"][name] = ref
        out.append(row)
    return out


_LOGGED_ROW = re.compile(r"^\[\s*[\d.]+s\] (\{\"op\": .*?)\s*$")  # (a line cut short too: said, not read)
_LOGGED_ERROR = re.compile(r"^\[\s*[\d.]+s\] ERROR (.*)$")
_LOGGED_PEAKS = re.compile(r"^\[\s*[\d.]+s\] (?:device (.+?)|(\{.*\})) peaks (\{.*\})\s*$")


def _device(d: Any) -> dict[str, Any] | None:
    """The report's device as a dict (kernels.runtime.device.describe's form): h200_llm.py and a rebuilt
    log name it by a string only."""
    return {"name": d} if isinstance(d, str) else d


def load_report(path: Path) -> dict[str, Any]:
    """A report: the script's JSON, or its log (see the module docstring), parsed into the same form with
    `from_log` set. A log without one row line is refused by name."""
    text = path.read_text(errors="replace")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        doc = None
    if isinstance(doc, dict):
        return doc
    rows: list[dict[str, Any]] = []
    head: dict[str, Any] = {}
    errors: list[str] = []
    for line in text.splitlines():
        if m := _LOGGED_ROW.match(line):
            try:
                rows.append(json.loads(m.group(1)))
            except json.JSONDecodeError:  # a line cut off (the run killed while writing it): said, not read
                errors.append(f"{path.name}: a row line that is not JSON: {line[:80]}")
        elif m := _LOGGED_ERROR.match(line):
            errors.append(m.group(1))
        elif not head and (m := _LOGGED_PEAKS.match(line)):
            versions = _literal(m.group(2)) if m.group(2) else {}
            head = {"peaks": _literal(m.group(3)), "versions": versions,
                    "device": m.group(1) or versions.get("device")}  # fmt: skip
    if not rows:
        raise SystemExit(f"{path}: neither a JSON report nor a log with row lines ('[ t s] {{\"op\": ...}}')")
    return {**head, "rows": rows, "errors": errors, "from_log": str(path)}


def _literal(text: str) -> dict[str, Any]:
    """A dict the scripts printed with repr: Python literals, where a non-finite float reads `nan` / `inf` /
    `-inf` (then None: only when the text does not read as it is, so a name with "nan" in it is kept)."""
    try:
        value: dict[str, Any] = ast.literal_eval(text)
    except ValueError:
        value = ast.literal_eval(re.sub(r"-?\b(nan|inf)\b", "None", text))
    return value


UNNAMED = {None, "auto"}  # a path that names no kernel: whatever `auto` ran


def merge(groups: list[list[Row]]) -> list[Row]:
    """Rows keyed by (op, dtype, case, path): a later report's row joins the row of the same case and path,
    or, where there is none, the case's only row when that row is another report's and one of the two does
    not name its kernel (UNNAMED: h200_bf16.py's memory-bound rows say "auto"). Joined, it is kept whole
    under `also[source]` (its own ours, SOL, check), its check counts in `ok`, and its references join the
    row's, renamed `name@source` where the name is taken, each with the `ours_us` it was timed against.
    Otherwise it is a row of its own: one report's rows of a case on two kernels stay two rows, as do two
    kernels of two reports. Sources must differ between reports (`main` numbers repeated runs of one
    script), so nothing a report measured is dropped."""
    rows: dict[tuple[str, ...], Row] = {}
    by_case: dict[tuple[str, ...], list[Row]] = {}
    for group in groups:
        in_group = Counter((r["op"], r["dtype"], r["case"]) for r in group)
        for r in group:
            case = (r["op"], r["dtype"], r["case"])
            key = (*case, str(r.get("path")))
            have = rows.get(key)
            if have is None and in_group[case] == 1:  # (a report's two kernels of a case never share a row)
                same_case = by_case.get(case, [])
                unnamed = {r.get("path"), same_case[0].get("path")} & UNNAMED if same_case else set()
                if len(same_case) == 1 and same_case[0]["source"] != r["source"] and unnamed:
                    have = same_case[0]
            if have is not None and (have["source"] == r["source"] or r["source"] in have.get("also", {})):
                have, key = None, (*key, r["source"])  # one report's second row here: a row of its own
            if have is None:
                rows[key] = r
                by_case.setdefault(case, []).append(r)
                continue
            have["ok"] = bool(have.get("ok")) and bool(r.get("ok"))
            have.setdefault("also", {})[r["source"]] = {
                k: r.get(k) for k in ("path", "median_us", "sol", "rel_err", "ok")
            }
            for name, ref in r["refs"].items():
                label = name if name not in have["refs"] else f"{name}@{r['source']}"
                have["refs"][label] = {**ref, "ours_us_in_that_run": r.get("median_us")}
    return sorted(rows.values(), key=lambda r: (r["op"], r["dtype"], r["case"], str(r.get("path"))))


def table(rows: list[Row]) -> str:
    def f(v: Any, fmt: str) -> str:
        return format(v, fmt) if isinstance(v, (int, float)) else "-"

    head = f"{'op':17} {'dtype':18} {'case':16} {'path':14} {'ours us':>9} {'SOL':>5}"
    lines = [head + "  references (x = their us / ours)"]
    for r in rows:
        refs = ", ".join(
            f"{n} {f(v['ratio'], '.2f')}x" + ("*" if "ours_us_in_that_run" in v else "")
            for n, v in r["refs"].items()
        )
        lines.append(
            f"{r['op']:17} {r['dtype']:18} {r['case']:16} {str(r.get('path')):14} "
            f"{f(r.get('median_us'), '9.1f')} {f(r.get('sol'), '5.2f')}  {refs}"
            f"{'' if r.get('ok') else '  CHECK FAILED'}"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name in ("registry", "clip"):
        ap.add_argument(f"--{name}", type=Path)
    for name in ("llm", "gemm"):
        ap.add_argument(f"--{name}", type=Path, action="append", default=[], help="JSON or log; repeatable")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--plot", type=Path)
    ap.add_argument("--command", default="", help="the command line(s) that made the inputs, recorded")
    a = ap.parse_args()
    given = {
        n: v if isinstance(v, list) else [v]
        for n in ("llm", "gemm", "clip", "registry")
        if (v := getattr(a, n))
    }
    if not given:
        ap.error("give at least one of --registry, --llm, --gemm, --clip")
    runs = {n: [load_report(p) for p in paths] for n, paths in given.items()}
    makers = {"llm": from_llm, "gemm": from_gemm, "clip": from_clip, "registry": from_registry}
    groups = []
    for n, ds in runs.items():
        for i, d in enumerate(ds):
            group = makers[n](d)
            if len(ds) > 1:  # runs of one script: each its own source, so a second never replaces a first
                for r in group:
                    r["source"] = f"{r['source']} run {i + 1}"
            groups.append(group)
    rows = merge(groups)
    docs = {n: ds[0] for n, ds in runs.items()}  # the report-level fields: each kind's first run
    reg = docs.get("registry", {})
    llm = docs.get("llm", {})
    report = {
        "simulated": bool(reg.get("simulated", False)),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": a.command,
        "device": _device(
            reg.get("device")
            or docs.get("gemm", {}).get("device")
            or (llm.get("versions") or {}).get("device")
        ),
        "versions": {**(reg.get("versions") or {}), **(llm.get("versions") or {})},
        "peaks": reg.get("peaks") or llm.get("peaks") or docs.get("gemm", {}).get("peaks"),
        "method": {
            "ratio": "reference median / our median, both timed interleaved in one process (source)",
            "sol": "memory-bound: GB/s over the measured copy (peaks.mem_gbs); compute-bound: TFLOP/s"
            " over the tensor-core or fp32 FMA peak",
            **(reg.get("method") or {}),
        },
        "errors": {  # by kind, "<kind> run N" where a kind had several runs (as their rows' sources)
            n if len(ds) == 1 else f"{n} run {i + 1}": d["errors"]
            for n, ds in runs.items()
            for i, d in enumerate(ds)
            if d.get("errors")
        },
        "inputs": {
            n: [
                {"file": str(p), "from_log": "from_log" in d, "peaks": d.get("peaks")}
                for p, d in zip(given[n], runs[n], strict=True)
            ]
            for n in runs
        },
        "results": rows,
    }
    a.out.write_text(json.dumps(report, indent=1, default=str))
    if a.plot:
        from kernels.harness.roofline import plot

        # the bench shapes only (the registry's cases; the width sweep would crowd the legend)
        keys = {(r["op"], r["dtype"], r["case"]) for r in reg.get("results", [])}
        pts = [
            r
            for r in rows
            if r.get("flops")
            and r.get("bytes")
            and r.get("tflops")
            and (not keys or (r["op"], r["dtype"], r["case"]) in keys)
        ]
        if isinstance((report["peaks"] or {}).get("mem_gbs"), (int, float)):
            plot({**report, "device": report["device"] or {}, "results": pts}, a.plot)
        else:  # the memory roof is the measured copy: without it there is no picture to draw
            print(
                f"no roofline: the report has no measured copy bandwidth (peaks.mem_gbs); {a.plot} not made"
            )
    print(table(rows))
    bad = [r for r in rows if not r.get("ok")]
    print(
        f"{len(rows)} rows, {len(rows) - len(bad)} checked ok against float64 (* a ratio from another"
        " report's run of the same case, against that run's own median)"
    )
    return 0 if not bad else 1


if __name__ == "__main__":
    raise SystemExit(main())

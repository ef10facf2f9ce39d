"""The report of one rollout: report.json, report.md and report.html in its run dir
(`<work>/fleets/<fleet>/runs/<id>/`), built from the ledger alone (the operation row and its plan, every
host outcome with its phase timings, the gate verdicts of fleet/gating.py), so `solfleet report ID` can
write it again for any recorded rollout. Health checks of the hosts are included when the caller has them.

report.html is one self-contained file: inline CSS, no script, no network, no font or CDN: a per-host
timeline of the phases, step by step (canary, batches, undo), and, when gates ran, a node x op table of SOL
coloured by verdict.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fleet import gating
from fleet.errors import UsageError
from fleet.ledger import HostRecord, Ledger, Operation

REPORT_FILES = ("report.json", "report.md", "report.html")
PHASE_ORDER = ("lock_wait", "push", "unpack_check", "verify", "bench", "activate", "health", "prune")
PHASE_COLOURS = {
    "lock_wait": "#bbbbbb",
    "push": "#4e79a7",
    "unpack_check": "#76b7b2",
    "verify": "#59a14f",
    "bench": "#edc948",
    "activate": "#f28e2b",
    "health": "#b07aa1",
    "prune": "#9c755f",
}
VERDICT_COLOURS = {
    "passed": "#c8e6c9",
    "failed": "#ffcdd2",
    "throttled": "#ffe0b2",
    "no_baseline": "#e0e0e0",
    "not_evaluated": "#eeeeee",
}
OPERATIONS_SEARCHED = 100000  # `report ID` looks the id up among this many recorded operations


def _host(r: HostRecord) -> dict[str, Any]:
    return {
        "step": r.step,
        "host": r.host,
        "outcome": r.outcome,
        "changed": r.changed,
        "version_before": r.version_before,
        "version_after": r.version_after,
        "failed_phase": r.failed_phase,
        "message": r.message,
        "phases": dict(r.phases),
        "simulated": r.simulated,
    }


def build_report(
    *,
    op: Operation,
    hosts: Sequence[HostRecord],
    gates: Sequence[Mapping[str, Any]] = (),
    health: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
) -> dict[str, Any]:
    """The report as a dict (what report.json holds). `gates`: rows of gating.recorded; `health`: host ->
    its checks ({"name", "status", "detail"})."""
    steps: list[str] = []
    for r in hosts:
        if r.step not in steps:
            steps.append(r.step)
    undo = [_host(r) for r in hosts if r.step.startswith(("undo", "rollback_fleet", "rollback_batch"))]
    return {
        "id": op.id,
        "kind": op.kind,
        "version": op.version,
        "fleet": op.fleet,
        "status": op.status,
        "message": op.message,
        "started": op.started,
        "finished": op.finished,
        "plan": op.plan,
        "steps": [{"step": s, "hosts": [_host(r) for r in hosts if r.step == s]} for s in steps],
        "gates": [dict(g) for g in gates],
        "health": {k: [dict(c) for c in v] for k, v in (health or {}).items()},
        "undo": undo,
    }


def find_operation(ledger: Ledger, op_id: str | None) -> Operation:
    """The operation `op_id`, or the newest deploy/rollback/reconcile when None."""
    ops = ledger.operations(limit=OPERATIONS_SEARCHED)
    if not ops:
        raise UsageError("no recorded operation: the ledger is empty")
    if op_id is None:
        return ops[0]
    for op in ops:
        if op.id == op_id:
            return op
    recent = ", ".join(o.id for o in ops[:5])
    raise UsageError(f"no operation {op_id!r} in the ledger; recent: {recent}")


def report_from_ledger(ledger_path: Path, op_id: str | None) -> dict[str, Any]:
    with Ledger(ledger_path) as ledger:
        op = find_operation(ledger, op_id)
        hosts = ledger.host_outcomes(op.id)
    return build_report(op=op, hosts=hosts, gates=gating.recorded(ledger_path, op.id))


def write_reports(run_dir: Path, report: Mapping[str, Any]) -> list[Path]:
    """report.json, report.md and report.html under `run_dir` (each written to a temp name, then renamed)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    texts = {
        "report.json": json.dumps(report, indent=1, sort_keys=True, default=str),
        "report.md": render_md(report),
        "report.html": render_html(report),
    }
    out = []
    for name, text in texts.items():
        tmp = run_dir / f".{name}.tmp"
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(run_dir / name)
        out.append(run_dir / name)
    return out


def _phases_text(phases: Mapping[str, float]) -> str:
    return ", ".join(f"{k} {v:.2f}s" for k, v in _ordered(phases)) or "-"


def _ordered(phases: Mapping[str, float]) -> list[tuple[str, float]]:
    known = [(k, float(phases[k])) for k in PHASE_ORDER if k in phases]
    return known + [(k, float(v)) for k, v in sorted(phases.items()) if k not in PHASE_ORDER]


def _md_cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_md(rep: Mapping[str, Any]) -> str:
    lines = [
        f"# {rep['kind']} {rep.get('version') or ''} on {rep['fleet']}: {rep['status']}".replace("  ", " "),
        "",
        f"- id: `{rep['id']}`",
        f"- started {rep['started']}, finished {rep.get('finished') or '-'}",
        f"- message: {rep.get('message') or '-'}",
        "",
        "## Plan",
        "",
        "```json",
        json.dumps(rep.get("plan") or {}, indent=1, sort_keys=True),
        "```",
    ]
    for step in rep["steps"]:
        lines += [
            "",
            f"## {step['step']}",
            "",
            "| host | outcome | before -> after | failed phase | phases | message |",
            "|---|---|---|---|---|---|",
        ]
        for h in step["hosts"]:
            sim = " (simulated)" if h.get("simulated") else ""
            lines.append(
                f"| {_md_cell(h['host'] + sim)} | {_md_cell(h['outcome'])} | "
                f"{_md_cell(h.get('version_before') or '-')} -> {_md_cell(h.get('version_after') or '-')} | "
                f"{_md_cell(h.get('failed_phase') or '-')} | "
                f"{_md_cell(_phases_text(h.get('phases') or {}))} | "
                f"{_md_cell(h.get('message') or '')} |"
            )
    if rep.get("gates"):
        lines += [
            "",
            "## Gates",
            "",
            "| host | gate | op | dtype | case | verdict | detail |",
            "|---|---|---|---|---|---|---|",
        ]
        for g in rep["gates"]:
            lines.append(
                "| "
                + " | ".join(
                    _md_cell(g.get(k, ""))
                    for k in ("host", "gate", "op", "dtype", "case", "verdict", "detail")
                )
                + " |"
            )
    if rep.get("health"):
        lines += ["", "## Health", ""]
        for host, checks in sorted(rep["health"].items()):
            bad = [c for c in checks if c.get("status") == "failed"]
            lines.append(f"- {host}: {'healthy' if not bad else 'UNHEALTHY'} ({len(checks)} checks)")
            lines += [f"  - {c['name']}: {c['status']}: {c.get('detail', '')}" for c in bad]
    lines += ["", "## Undo", ""]
    if rep.get("undo"):
        lines += [f"- {u['host']}: {u['outcome']} -> {u.get('version_after') or '-'}" for u in rep["undo"]]
    else:
        lines.append("none")
    return "\n".join(lines) + "\n"


CSS = """
body{font-family:sans-serif;margin:24px;color:#222;background:#fff}
h1{font-size:20px} h2{font-size:16px;margin-top:28px}
table{border-collapse:collapse;font-size:13px} td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}
.tl{display:flex;height:18px;min-width:2px;border:1px solid #888;background:#f4f4f4}
.seg{height:100%} .legend span{display:inline-block;padding:2px 6px;margin-right:6px;font-size:12px}
.bad{color:#b71c1c;font-weight:bold} .ok{color:#1b5e20}
"""


def _e(x: object) -> str:
    return html.escape(str(x), quote=True)


def render_html(rep: Mapping[str, Any]) -> str:
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>solfleet {_e(rep['kind'])} {_e(rep.get('version') or '')} {_e(rep['id'])}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>{_e(rep['kind'])} {_e(rep.get('version') or '')} on {_e(rep['fleet'])}: "
        f"<span class='{'ok' if rep['status'] == 'succeeded' else 'bad'}'>{_e(rep['status'])}</span></h1>",
        f"<p>id {_e(rep['id'])}; started {_e(rep['started'])}, finished {_e(rep.get('finished') or '-')}</p>",
        f"<p>{_e(rep.get('message') or '')}</p>",
        "<h2>Timeline</h2><div class='legend'>"
        + "".join(f"<span style='background:{c}'>{_e(p)}</span>" for p, c in PHASE_COLOURS.items())
        + "</div>",
    ]
    longest = max(
        (sum(float(v) for v in (h.get("phases") or {}).values()) for s in rep["steps"] for h in s["hosts"]),
        default=0.0,
    )
    scale = 600.0 / longest if longest > 0 else 0.0  # px per second: the slowest host fills 600 px
    for step in rep["steps"]:
        parts.append(
            f"<h3>{_e(step['step'])}</h3><table><tr><th>host</th><th>outcome</th><th>phases</th></tr>"
        )
        for h in step["hosts"]:
            segs = "".join(
                f"<div class='seg' title='{_e(p)} {v:.2f} s' "
                f"style='width:{max(v * scale, 1):.1f}px;background:{PHASE_COLOURS.get(p, '#666')}'></div>"
                for p, v in _ordered(h.get("phases") or {})
            )
            cls = "bad" if h.get("failed_phase") else "ok"
            why = (
                f": {_e(h.get('failed_phase'))}: {_e(h.get('message') or '')}"
                if h.get("failed_phase")
                else ""
            )
            parts.append(
                f"<tr><td>{_e(h['host'])}{' (simulated)' if h.get('simulated') else ''}</td>"
                f"<td class='{cls}'>{_e(h['outcome'])}{why}</td>"
                f"<td><div class='tl'>{segs}</div>{_e(_phases_text(h.get('phases') or {}))}</td></tr>"
            )
        parts.append("</table>")
    sol = [g for g in rep.get("gates") or [] if g.get("gate") == "min_sol"]
    if rep.get("gates"):
        parts.append("<h2>SOL by node and op</h2>")
        hosts = sorted({g["host"] for g in rep["gates"]})
        # one column per op and dtype benched; a gate over every dtype ("*": a simulated node's) fills all
        # of its op's columns
        ops = sorted({f"{g['op']} {g['dtype']}" for g in sol if g["dtype"] != "*"})
        ops += sorted({f"{g['op']} *" for g in sol if g["dtype"] == "*"} - {o.split()[0] + " *" for o in ops})
        ops = sorted(set(ops)) or ["(no min_sol gate)"]
        cell: dict[tuple[str, str], Mapping[str, Any]] = {}
        rank = ("failed", "throttled", "no_baseline", "not_evaluated", "passed")
        for g in sol:
            cols = (
                [o for o in ops if o.split()[0] == g["op"]]
                if g["dtype"] == "*"
                else [f"{g['op']} {g['dtype']}"]
            )
            for col in cols:
                prev = cell.get((g["host"], col))
                # the worst case of the op/dtype for the node: failed over throttled over the rest
                if prev is None or rank.index(g["verdict"]) < rank.index(prev["verdict"]):
                    cell[(g["host"], col)] = g
        parts.append("<table><tr><th>node</th>" + "".join(f"<th>{_e(o)}</th>" for o in ops) + "</tr>")
        for host in hosts:
            row = [f"<td>{_e(host)}</td>"]
            for o in ops:
                g = cell.get((host, o))
                if g is None:
                    row.append("<td>-</td>")
                    continue
                value = (g.get("figures") or {}).get("sol")
                text = f"{value:.3f}" if isinstance(value, int | float) else g["verdict"]
                colour = VERDICT_COLOURS.get(str(g["verdict"]).split()[0], "#fff")
                row.append(
                    f"<td style='background:{colour}' title='{_e(g.get('detail', ''))}'>{_e(text)} "
                    f"({_e(g['verdict'])})</td>"
                )
            parts.append("<tr>" + "".join(row) + "</tr>")
        parts.append(
            "</table><h3>Every gate</h3><table><tr><th>node</th><th>gate</th><th>op</th><th>dtype</th>"
            "<th>case</th><th>verdict</th><th>detail</th></tr>"
        )
        for g in rep["gates"]:
            colour = VERDICT_COLOURS.get(str(g["verdict"]), "#fff")
            parts.append(
                "<tr>"
                + "".join(f"<td>{_e(g.get(k, ''))}</td>" for k in ("host", "gate", "op", "dtype", "case"))
                + f"<td style='background:{colour}'>{_e(g['verdict'])}</td>"
                f"<td>{_e(g.get('detail', ''))}</td></tr>"
            )
        parts.append("</table>")
    if rep.get("health"):
        parts.append(
            "<h2>Health</h2><table><tr><th>node</th><th>check</th><th>status</th><th>detail</th></tr>"
        )
        for host, checks in sorted(rep["health"].items()):
            for c in checks:
                cls = "bad" if c.get("status") == "failed" else ""
                parts.append(
                    f"<tr><td>{_e(host)}</td><td>{_e(c['name'])}</td><td class='{cls}'>"
                    f"{_e(c['status'])}</td><td>{_e(c.get('detail', ''))}</td></tr>"
                )
        parts.append("</table>")
    parts.append("<h2>Undo</h2>")
    if rep.get("undo"):
        parts.append(
            "<ul>"
            + "".join(
                f"<li>{_e(u['host'])}: {_e(u['outcome'])} -> {_e(u.get('version_after') or '-')}</li>"
                for u in rep["undo"]
            )
            + "</ul>"
        )
    else:
        parts.append("<p>none</p>")
    parts.append("</body></html>\n")
    return "\n".join(parts)

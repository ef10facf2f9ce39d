"""`solfleet`: parse, call the library, print. No behaviour lives here (see fleet/rollout.py and friends).

Exit codes (docs/cli.md): 0 ok, 1 operation failed on a host, 2 usage/spec error (nothing touched),
3 hosts unreachable, 4 ansible-runner could not run, 5 another rollout holds the nodes, 10 paused after
the canary (deploy, and `status` while a rollout is paused), 130 interrupted; `status` also 6 drift,
7 suspect, 8 split; `health` 9 unhealthy. SIGTERM and SIGHUP are handled like
Ctrl-C."""

from __future__ import annotations

import argparse
import json
import signal
import sqlite3
import sys
from dataclasses import replace
from pathlib import Path
from typing import NoReturn

from rich.console import Console
from rich.markup import escape

from fleet import artifact, gating, report, reports
from fleet import provision as prov
from fleet import wheelhouse as wh
from fleet.errors import ExitCode, FleetError, Interrupted, UsageError
from fleet.health import fleet_health
from fleet.inventory import write_private_data_dir
from fleet.ledger import Ledger
from fleet.operation import OperationReport
from fleet.plan import Batch, Plan, plan_rollback, plan_rollout, select_nodes
from fleet.progressive import abort, find_paused, promote
from fleet.recovery import LeaseHeld
from fleet.rollout import (
    ArtifactInfo,
    deploy,
    reconcile,
    refuse_if_paused,
    rollback,
    undo_targets,
    unfinished_operations,
)
from fleet.spec import (
    FleetSpec,
    Node,
    check_controller_files,
    check_version,
    embedded_fleet,
    load_spec,
    resolve_work_dir,
)
from fleet.status import fleet_status
from fleet.validate import TEMPLATE_MARKERS
from fleet.workdir import ledger_path, run_dir


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # one line, exit 2, like every other usage error
        self.exit(ExitCode.USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _at_least_one(text: str) -> int:
    """argparse type of `-n`: a count of rows; 0 or a negative count is a mistake, not "all"."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer; expected N >= 1") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} is not allowed; expected N >= 1")
    return n


def _parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument(
        "--fleet",
        default=argparse.SUPPRESS,
        metavar="PATH",
        help="fleet spec YAML (default: the embedded local fleet inventory/fleets/local.yml)",
    )
    common.add_argument(
        "--work-dir",
        default=argparse.SUPPRESS,
        metavar="DIR",
        help="controller work dir: ledger, runs, local node roots "
        "(default: $SOLFLEET_WORK, else <repo>/.work)",
    )
    p = _Parser(
        prog="solfleet",
        parents=[common],
        description="Build, deploy, verify and roll back the solfleet operator library on a fleet.",
    )
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    b = sub.add_parser("build", parents=[common], help="build dist/solfleet-ops-V.tar.gz")
    b.add_argument("--version", required=True)
    b.add_argument("--out", default="dist", metavar="DIR")
    b.add_argument(
        "--ptx-python",
        metavar="PATH",
        help="interpreter that compiles PTX; must hold the spec's numba-cuda, numba, llvmlite and numpy "
        "(default: this one)",
    )

    r = sub.add_parser("render", parents=[common], help="write the ansible-runner private_data_dir")
    r.add_argument("--out", metavar="DIR", help="default: <work>/fleets/<fleet>/rendered")

    d = sub.add_parser("deploy", parents=[common], help="push, check, verify and activate a version")
    d.add_argument("--version", required=True)
    d.add_argument("--artifact", metavar="PATH", help="default: dist/solfleet-ops-V.tar.gz")
    d.add_argument("--limit", metavar="HOSTS", help="node names, globs or label:NAME, comma-separated")
    d.add_argument("--dry-run", action="store_true", help="print the plan and exit; touches nothing")
    d.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    d.add_argument("--stage", action="store_true", help="push, unpack, check and verify; do not activate")
    d.add_argument(
        "--verify-ops", default="", metavar="OPS", help="verify only these ops (a,b); default every op"
    )

    rb = sub.add_parser("rollback", parents=[common], help="switch nodes back to a verified release")
    rb.add_argument("--to", metavar="VERSION", help="default: each node's previous release")
    rb.add_argument("--limit", metavar="HOSTS")
    rb.add_argument("--dry-run", action="store_true")
    rb.add_argument("--yes", action="store_true")

    s = sub.add_parser("status", parents=[common], help="what every node runs, and drift from the ledger")
    s.add_argument("--json", action="store_true")
    s.add_argument("--limit", metavar="HOSTS")
    s.add_argument(
        "--deep",
        action="store_true",
        help="also re-hash every file of each node's current release against its MANIFEST (reads it all)",
    )

    rp = sub.add_parser(
        "report", parents=[common], help="print the report of a rollout (default: the newest)"
    )
    rp.add_argument("id", nargs="?", help="operation id (solfleet history lists them)")
    rp.add_argument("--format", choices=("md", "json", "html"), default="md")
    rp.add_argument("--write", action="store_true", help="also (re)write report.* in the run dir")

    hl = sub.add_parser("health", parents=[common], help="GPU and release health of every node")
    hl.add_argument("--json", action="store_true")
    hl.add_argument("--limit", metavar="HOSTS")

    rc = sub.add_parser(
        "reconcile",
        parents=[common],
        help="return the hosts of an unfinished (killed, interrupted) rollout to its baseline",
    )
    rc.add_argument("--dry-run", action="store_true", help="say which rollouts are unfinished; touch nothing")
    rc.add_argument("--yes", action="store_true")

    for name, what in (
        ("promote", "continue a paused rollout with its remaining batches"),
        ("abort", "end a paused rollout with its failure policy (on_failure)"),
    ):
        pa = sub.add_parser(name, parents=[common], help=what)
        pa.add_argument("id", nargs="?", help="the paused rollout (default: the only one)")
        pa.add_argument("--dry-run", action="store_true", help="print what it would do; touch nothing")
        pa.add_argument("--yes", action="store_true", help="do not ask for confirmation")

    w = sub.add_parser(
        "wheelhouse", parents=[common], help="download + lock the stack's wheels for the nodes"
    )
    w.add_argument("--out", default="dist", metavar="DIR")
    w.add_argument("--find-links", action="append", default=[], metavar="DIR|URL", help="pip --find-links")
    w.add_argument("--index-url", metavar="URL", help="pip --index-url (default: pip's own configuration)")
    w.add_argument("--no-index", action="store_true", help="only --find-links: no registry at all")

    pv = sub.add_parser("provision", parents=[common], help="preflight, driver, runtime and config on nodes")
    pv.add_argument(
        "--wheelhouse", metavar="PATH", help="default: dist/solfleet-wheelhouse-<stack-id>.tar.gz"
    )
    pv.add_argument("--limit", metavar="HOSTS", help="node names, globs or label:NAME, comma-separated")
    pv.add_argument("--only", metavar="ROLES", help=f"comma-separated subset of {','.join(prov.ROLES)}")
    pv.add_argument(
        "--dry-run", action="store_true", help="print the plan, run in check mode; change nothing"
    )
    pv.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    pv.add_argument("--json", action="store_true", help='print {"hosts": [{"name","ok","changed","failed"}]}')

    h = sub.add_parser("history", parents=[common], help="recorded deploys and rollbacks")
    h.add_argument("--json", action="store_true")
    h.add_argument(
        "-n", type=_at_least_one, default=20, metavar="N", help="most recent N operations (default 20)"
    )
    return p


def _spec(args: argparse.Namespace) -> FleetSpec:
    fleet = getattr(args, "fleet", None) or str(embedded_fleet())
    return load_spec(fleet, work_dir=resolve_work_dir(getattr(args, "work_dir", None)))


def _confirm(args: argparse.Namespace, what: str) -> None:
    if args.yes:
        return
    if not sys.stdin.isatty():
        raise UsageError(f"refusing to {what} without --yes: stdin is not a terminal to ask on")
    answer = input(f"{what}? [y/N] ").strip().lower()
    if answer not in ("y", "yes"):
        raise UsageError(f"{what}: not confirmed; nothing was changed")


def _preflight(spec: FleetSpec, nodes: list[Node], *, dry_run: bool) -> list[str]:
    """Controller-side files must exist before a real run (exit 2 otherwise); a dry run only notes it, so
    a plan can be previewed on a machine without the fleet's keys."""
    try:
        check_controller_files(spec, nodes)
    except UsageError as exc:
        if not dry_run:
            raise
        return [f"a real run would stop here: {exc}"]
    return []


def _recover_first(spec: FleetSpec, out: Console, *, dry_run: bool) -> int:
    """Before a deploy or rollback: an unfinished rollout is returned to its baseline first (its default
    policy), so the new one starts from a known fleet. Returns a non-zero exit code when that failed."""
    pending = unfinished_operations(spec)
    for op_id in pending:
        if dry_run:
            out.print(f"note: unfinished rollout {op_id}: a real run returns its hosts to its baseline first")
            continue
        result = _reconcile_one(spec, op_id)
        report.print_operation(out, result)
        _write_report(spec, result.op_id, out)
        if result.exit_code:
            return int(result.exit_code)
    return 0


def _first_returning(spec: FleetSpec) -> str:
    """What the confirmation must also say when an unfinished rollout will be returned first."""
    pending = unfinished_operations(spec)
    whose = "its" if len(pending) == 1 else "their"
    return f", after returning unfinished {', '.join(pending)} to {whose} baseline" if pending else ""


def _reconcile_one(spec: FleetSpec, op_id: str) -> OperationReport:
    in_spec = {n.name for n in spec.nodes}
    with Ledger(ledger_path(spec)) as ledger:
        hosts = tuple(h for h in ledger.baseline(op_id) if h in in_spec)  # recover() names the others
    plan = Plan(
        kind="reconcile",
        version=None,
        batches=(Batch("baseline", hosts, 0),),
        on_failure="halt",
        unreachable=spec.rollout.unreachable.value,
        keep_releases=spec.rollout.keep_releases,
    )
    return reconcile(spec, plan, op_id, progress=report.live_factory(sys.stderr.isatty()))


def _reconcile(args: argparse.Namespace) -> int:
    spec = _spec(args)
    out = report.console()
    pending = unfinished_operations(spec)
    if not pending:
        out.print(f"fleet {spec.name}: no unfinished rollout; nothing to reconcile")
        return 0
    for op_id in pending:
        out.print(f"unfinished rollout {op_id}: its hosts go back to its baseline (ledger `baselines`)")
    if args.dry_run:
        out.print("dry run: nothing was changed")
        return 0
    _confirm(args, f"return the hosts of {len(pending)} unfinished rollout(s) to their baseline")
    return _recover_first(spec, out, dry_run=False)


def _build(args: argparse.Namespace) -> int:
    spec = _spec(args)
    result = artifact.build(
        spec=spec,
        version=check_version(args.version),
        out_dir=Path(args.out),
        ptx_python=args.ptx_python,
        progress=lambda line: print(line, file=sys.stderr, flush=True),  # a cold compile takes minutes
    )
    out = report.console()
    out.print(f"built {result.path} ({result.size} bytes) sha256 {result.sha256}")
    m = result.manifest
    out.print(
        f"  commit {m['git']['commit']}{' (kernels/ dirty)' if m['git']['dirty'] else ''}; "
        f"build_time {m['build_time']}; stack {m['stack_id']} {m['stack']}"
    )
    for t in m["targets"]:
        where = " (from the PTX cache)" if t["cc"] in result.ptx_cached else ""
        out.print(f"  cc {t['cc']}: {len(t['kernels'])} kernel(s) PTX, {t['ptx_status']}{where}")
    out.print(f"  {len(m['files'])} files checked by sha256 on every node")
    return 0


def _render(args: argparse.Namespace) -> int:
    spec = _spec(args)
    out_dir = Path(args.out) if args.out else spec.fleet_dir / "rendered"
    rendered = write_private_data_dir(spec, out_dir)
    for rel in rendered.files:
        print(rendered.path / rel)
    print(rendered.path / "project", "->", (rendered.path / "project").resolve())
    return 0


def _check_verify_ops(text: str) -> str:
    """--verify-ops reaches the nodes as an extra var, which Ansible templates: only registered op names."""
    if not text:
        return text
    from kernels.registry import all_ops  # the registry imports numba: only when the flag is given

    known = sorted(all_ops())
    # the node reads the list as `kernels verify --ops` does: items stripped, empty ones ignored
    names = [name for name in (n.strip() for n in text.split(",")) if name]
    if not names:
        raise UsageError(f"--verify-ops: {text!r} names no op; allowed: {', '.join(known)}")
    unknown = [name for name in names if name not in known]
    if unknown:
        bad = ", ".join(map(repr, unknown))
        raise UsageError(f"--verify-ops: {bad} is not an op; allowed: {', '.join(known)}")
    return text


def _deploy(args: argparse.Namespace) -> int:
    spec = _spec(args)
    _refuse_if_paused(spec)
    version = check_version(args.version)
    args.verify_ops = _check_verify_ops(args.verify_ops)
    path = Path(args.artifact) if args.artifact else artifact.artifact_path(Path("dist"), version)
    if any(m in f"{path} {path.resolve()}" for m in TEMPLATE_MARKERS):
        # the resolved path reaches the nodes' playbook as an extra var, which Ansible would template
        raise UsageError(
            f"--artifact: {str(path)!r} holds a Jinja2 opener; paths are data: `{{{{`, `{{%` and `{{#`"
            " are not allowed"
        )
    manifest = artifact.read_manifest(path)
    if manifest.get("version") != version:
        raise UsageError(f"--artifact: {path} holds version {manifest.get('version')!r}, not {version!r}")
    sha = artifact.sha256_file(path)
    git = manifest["git"] if isinstance(manifest.get("git"), dict) else {}
    info = ArtifactInfo(path=path, sha256=sha, git_commit=git.get("commit"), dirty=bool(git.get("dirty")))
    nodes = select_nodes(spec.nodes, args.limit)
    preflight = _preflight(spec, nodes, dry_run=args.dry_run)
    kind = "stage" if args.stage else "deploy"
    plan = plan_rollout(nodes, spec.rollout, version=version, kind=kind)
    notes = preflight
    if manifest.get("stack_id") != spec.stack_id:
        notes.append(
            f"artifact stack {manifest.get('stack')} differs from the spec's {dict(spec.stack)}; "
            "nodes check their own versions against the artifact's pins"
        )
    if info.dirty:
        notes.append(f"built from a dirty tree (commit {info.git_commit}, uncommitted changes in kernels/)")
    for row in gating.planned(spec.gates, nodes):
        notes.append(f"gates {'; '.join(row['gates'])} on {row['host']}: {row['verdict']} ({row['detail']})")
    out = report.console()
    report.print_plan(
        out, plan, fleet=spec.name, notes=notes, header=f"{kind} {version} from {path} (sha256 {sha[:16]}..)"
    )
    if args.dry_run:
        _recover_first(spec, out, dry_run=True)
        out.print("dry run: nothing was changed")
        return 0
    # asked before anything moves, the return of an unfinished rollout included
    _confirm(args, f"{kind} {version} to {len(plan.hosts)} node(s)" + _first_returning(spec))
    recovered = _recover_first(spec, out, dry_run=False)
    if recovered:
        return recovered
    result = deploy(
        spec,
        plan,
        artifact=info,
        verify_ops=args.verify_ops,
        progress=report.live_factory(sys.stderr.isatty()),
    )
    report.print_operation(out, result)
    _write_report(spec, result.op_id, out)
    return int(result.exit_code)


def _refuse_if_paused(spec: FleetSpec) -> None:
    path = ledger_path(spec)
    if path.exists():
        with Ledger(path) as ledger:
            refuse_if_paused(ledger)


def _paused_step(args: argparse.Namespace) -> int:
    """`promote` and `abort`: find the paused rollout, say what will happen, then do it."""
    spec = _spec(args)
    paused = find_paused(spec, args.id, command=args.command)
    plan = paused.plan
    nodes = [n for n in spec.nodes if n.name in plan.hosts]
    notes = _preflight(spec, nodes, dry_run=args.dry_run)
    out = report.console()
    canary = ", ".join(paused.canary)
    if args.command == "promote":
        rest = list(plan.batches[1:])
        header = f"promote {paused.id}: deploy {plan.version}; the canary ({canary}) passed and is done"
        shown = replace(plan, batches=tuple(rest))
        report.print_plan(out, shown, fleet=spec.name, header=header, notes=notes)
        what = f"promote {paused.id} to {sum(len(b.hosts) for b in rest)} more node(s)"
    else:
        targets = undo_targets(plan.on_failure, list(plan.hosts), plan.batches[0])
        out.print(f"plan: abort {paused.id}: deploy {escape(plan.version or '')}; canary {escape(canary)}")
        out.print(
            f"  on_failure={plan.on_failure}: "
            + (
                f"return {escape(', '.join(targets))} to the baseline"
                if targets
                else "hosts stay where they are"
            )
        )
        for note in notes:
            out.print(f"  [yellow]note:[/] {escape(note)}")
        what = f"abort {paused.id}"
    if args.dry_run:
        out.print("dry run: nothing was changed")
        return 0
    _confirm(args, what)
    step = promote if args.command == "promote" else abort
    result = step(spec, paused, progress=report.live_factory(sys.stderr.isatty()))
    report.print_operation(out, result)
    _write_report(spec, result.op_id, out)
    return int(result.exit_code)


def _rollback(args: argparse.Namespace) -> int:
    spec = _spec(args)
    _refuse_if_paused(spec)
    to = check_version(args.to, field="--to") if args.to else None
    nodes = select_nodes(spec.nodes, args.limit)
    notes = _preflight(spec, nodes, dry_run=args.dry_run)
    plan = plan_rollback(nodes, spec.rollout, to=to)
    out = report.console()
    report.print_plan(
        out, plan, fleet=spec.name, header=f"rollback to {to or 'each node`s previous'}", notes=notes
    )
    if args.dry_run:
        _recover_first(spec, out, dry_run=True)
        out.print("dry run: nothing was changed")
        return 0
    _confirm(args, f"roll back {len(plan.hosts)} node(s)" + _first_returning(spec))
    try:
        failed = _recover_first(spec, out, dry_run=False)
    except (LeaseHeld, Interrupted):
        raise  # another controller's nodes, or the operator's Ctrl-C: stop here, as ever
    except FleetError as exc:  # a step that could not finish (a hung node's read): said, then as below
        out.print(f"return of an unfinished rollout stopped: {escape(str(exc))}")
        failed = int(exc.exit_code)
    if failed:
        # the escape hatch is never held back by a rollout it could not finish (a node that stays dark):
        # roll back what answers; that rollout stays unfinished, and status says so
        out.print("note: an unfinished rollout could not be returned everywhere (above); rolling back anyway")
    result = rollback(spec, plan, progress=report.live_factory(sys.stderr.isatty()))
    report.print_operation(out, result)
    _write_report(spec, result.op_id, out)
    return int(result.exit_code)


def _write_report(spec: FleetSpec, op_id: str, out: Console) -> None:
    """report.json/.md/.html in the operation's run dir, from the ledger. A report that cannot be written
    does not change the operation's outcome or exit code: it is said, once."""
    try:
        paths = reports.write_reports(
            run_dir(spec, op_id), reports.report_from_ledger(ledger_path(spec), op_id)
        )
    except (OSError, FleetError, sqlite3.Error) as exc:
        out.print(f"report not written: {escape(str(exc))}")
        return
    out.print(f"report: {escape(str(paths[-1]))}")


def _report(args: argparse.Namespace) -> int:
    spec = _spec(args)
    rep = reports.report_from_ledger(ledger_path(spec), args.id)
    if args.write:
        reports.write_reports(run_dir(spec, rep["id"]), rep)
    if args.format == "json":
        print(json.dumps(rep, indent=1, sort_keys=True, default=str))
    elif args.format == "html":
        print(reports.render_html(rep), end="")
    else:
        print(reports.render_md(rep), end="")
    return 0


def _status(args: argparse.Namespace) -> int:
    spec = _spec(args)
    selected = select_nodes(spec.nodes, args.limit)
    check_controller_files(spec, selected)
    live = report.live_factory(sys.stderr.isatty() and not args.json)
    state = fleet_status(spec, selected, deep=args.deep, progress=live("status", [n.name for n in selected]))
    if args.json:
        print(report.status_json(state))
    else:
        report.print_status(report.console(), state)
    return int(state.exit_code)


def _health(args: argparse.Namespace) -> int:
    spec = _spec(args)
    selected = select_nodes(spec.nodes, args.limit)
    check_controller_files(spec, selected)
    live = report.live_factory(sys.stderr.isatty() and not args.json)
    state = fleet_health(spec, selected, progress=live("health", [n.name for n in selected]))
    if args.json:
        print(report.health_json(state))
    else:
        report.print_health(report.console(), state)
    return int(state.exit_code)


def _history(args: argparse.Namespace) -> int:
    spec = _spec(args)
    with Ledger(ledger_path(spec)) as ledger:
        ops = [(op, ledger.host_outcomes(op.id)) for op in ledger.operations(limit=args.n)]
    if args.json:
        print(report.history_json(ops))
    else:
        report.print_history(report.console(), ops)
    return 0


def _wheelhouse(args: argparse.Namespace) -> int:
    spec = _spec(args)
    result = wh.build_wheelhouse(
        spec=spec,
        out_dir=Path(args.out),
        find_links=args.find_links,
        index_url=args.index_url,
        no_index=args.no_index,
    )
    out = report.console()
    m = result.manifest
    out.print(f"built {result.archive} sha256 {result.sha256} for stack {result.stack_id} ({m['mode']})")
    for name, version in m["locked"].items():
        out.print(f"  {name}=={version}")
    out.print(f"  installer {m['installer']}; lock {result.directory / m['lock']}")
    return 0


def _provision(args: argparse.Namespace) -> int:
    spec = _spec(args)
    prov.require_provision(spec)
    roles = prov.ROLES
    if args.only:
        roles = tuple(r.strip() for r in args.only.split(",") if r.strip())
        bad = [r for r in roles if r not in prov.ROLES]
        if bad or not roles:
            raise UsageError(
                f"--only: {','.join(bad) or '(empty)'} is not allowed; expected {','.join(prov.ROLES)}"
            )
    nodes = select_nodes(spec.nodes, args.limit)
    wheelhouse = Path(args.wheelhouse) if args.wheelhouse else prov.default_wheelhouse(spec, Path("dist"))
    out = report.console(sys.stderr if args.json else None)
    for line in prov.provision_plan(spec, nodes, wheelhouse=wheelhouse, check=args.dry_run, roles=roles):
        out.print(line)
    if not args.dry_run:
        _confirm(args, f"provision {len(nodes)} node(s)")
    live = report.live_factory(sys.stderr.isatty() and not args.json)
    result = prov.provision(
        spec,
        nodes,
        wheelhouse=wheelhouse,
        check=args.dry_run,
        roles=roles,
        progress=live("provision", [n.name for n in nodes]),
    )
    if args.json:
        print(json.dumps(result.as_json(), indent=1))
    for h in result.hosts:
        out.print(
            f"  {h.name}: ok={h.ok} changed={h.changed} failed={h.failed} driver={h.driver_action}"
            + (" reboot" if h.reboot else "")
            + (f": {h.message}" if h.failed and h.message else "")
        )
    if result.reboot_waves:
        verb = "would reboot" if result.check_mode else "reboot waves"
        out.print(f"  {verb}: " + " | ".join(",".join(w) for w in result.reboot_waves))
    if result.check_mode:
        out.print("dry run: nothing was changed")
    return int(result.exit_code)


COMMANDS = {
    "build": _build,
    "render": _render,
    "deploy": _deploy,
    "rollback": _rollback,
    "status": _status,
    "health": _health,
    "report": _report,
    "history": _history,
    "reconcile": _reconcile,
    "promote": _paused_step,
    "abort": _paused_step,
    "wheelhouse": _wheelhouse,
    "provision": _provision,
}


def _as_interrupt(signum: int, _frame: object) -> None:
    """SIGTERM and SIGHUP (a closed terminal, a stopping service) mean what Ctrl-C means: stop the running
    step, apply the failure policy, record the run as interrupted. A second signal during the policy ends
    that too; the run then stays unfinished and the next deploy, rollback or reconcile returns it."""
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _as_interrupt)
    try:
        return COMMANDS[args.command](args)
    except FleetError as exc:
        print(f"solfleet: error: {exc}", file=sys.stderr)
        return int(exc.exit_code)
    except KeyboardInterrupt:
        print("solfleet: interrupted", file=sys.stderr)
        return int(ExitCode.INTERRUPTED)
    except sqlite3.Error as exc:
        # the ledger could not be opened, read or written (a full or locked disk), possibly after an
        # operation had moved hosts: one line, and no claim that nothing changed
        print(
            f"solfleet: error: ledger: {exc}; `solfleet status` reads where the nodes are from the nodes",
            file=sys.stderr,
        )
        return int(ExitCode.OPERATION_FAILED)
    except OSError as exc:
        # A controller-side path that cannot be made or written (--out, --work-dir, a full disk) is the
        # user's to fix: one line naming the path, not a traceback.
        where = f"{exc.filename}: " if exc.filename is not None else ""
        print(f"solfleet: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return int(ExitCode.USAGE)


if __name__ == "__main__":
    sys.exit(main())

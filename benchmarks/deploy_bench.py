"""Deploy benchmark: N real sshd nodes on 127.0.0.1, driven through the `solfleet` CLI, per-phase timings.

    .venv/bin/python benchmarks/deploy_bench.py --nodes 4 16 64 [--ansistrano DIR] [--json OUT.jsonl]

For each N it starts N sshd nodes (tests/e2e/sshd_fleet.py), builds two artifacts with `solfleet build`, and
times three deploys: the first version onto empty nodes, a second version (push + activate, `previous` set),
and a re-deploy of that version (idempotent no-op), then a rollback of the whole fleet (back to the first).
Per phase it prints the median and max over hosts: push, unpack+check, verify, activate, health (the node
module's `phases`). `runner` is the wall time ansible-runner spent (first to last event); `no-verify` is that
minus the slowest host's verify+health, i.e. the push + unpack + check + activate path that ansistrano's
50-task role covers; `path` is the same within the batch runs alone (deploy_path_s: the lease, preflight
health and lease-end runs left out). `cpu/node` is the controller's CPU (user + sys of the CLI process and
everything it ran: ansible-playbook, its forks, the ssh clients) divided by N; the sshd nodes' own work is
not in it.

`--ansistrano DIR` (a checkout of github.com/ansistrano/deploy; not part of this repository) also deploys the
same artifact to the same nodes with ansistrano's deploy role (`copy_unarchive`, anonymous stats off: no
traffic leaves loopback), with the same inventory and SSH settings (pipelining, ControlPersist), in the same
run, and prints the ratio of solfleet's no-verify time to ansistrano's wall time. Beside it, the floor of one
Ansible task on the same fleet: a one-`ping` play's wall minus that of the same play matching no host (the
`ping` row), which the deploy path, one task per host, cannot go below.
Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e"))
sys.path.insert(0, str(REPO / "tests"))  # loopback.py, which sshd_fleet imports

from sshd_fleet import SshdFleet  # noqa: E402  (the fixture code, reused as a library)

PHASES = ("push", "unpack_check", "verify", "activate", "health")


def children_cpu_s() -> float:
    """user + sys CPU of every finished child process of this one (and their reaped descendants)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def cli(work: Path, spec: Path, *args: str) -> float:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["SOLFLEET_WORK"] = str(work)
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "fleet.cli", "--fleet", str(spec), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    elapsed = time.monotonic() - start
    if proc.returncode != 0:
        sys.exit(
            f"solfleet {' '.join(args)} failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}"
        )
    return elapsed


def latest_events(work: Path, seen: set[Path]) -> list[dict[str, object]]:
    """job_events of the runs that appeared since the last call (one operation = one or more runner runs),
    each with the key "_run": the job_events directory it came from (one runner run)."""
    events = []
    for path in work.glob("fleets/*/runs/*/**/job_events/*.json"):
        if path in seen:
            continue
        seen.add(path)
        events.append(json.loads(path.read_text()) | {"_run": str(path.parent)})
    return events


def deploy_path_runs_s(events: list[dict[str, object]]) -> list[float]:
    """push + unpack + check + activate, the path ansistrano's role covers, per runner run that pushed (the
    canary, then each batch, in order): its wall time minus its slowest verify + health; the lease,
    preflight-health and lease-end runs of the operation are left out. Their sum is the metric of the
    2026-11-29 table (one run per deploy). Empty when no run pushed (a rollback, a re-deploy that found
    every host current)."""
    by_run: dict[str, list[dict[str, object]]] = {}
    for event in events:
        by_run.setdefault(str(event["_run"]), []).append(event)
    walls = []
    for run in sorted(by_run.values(), key=lambda evs: min(str(e["created"]) for e in evs)):
        per_phase, wall, verify_health = phase_table(run)
        if per_phase["push"]:
            walls.append(wall - max(verify_health.values(), default=0.0))
    return walls


def phase_table(events: list[dict[str, object]]) -> tuple[dict[str, list[float]], float, dict[str, float]]:
    per_phase: dict[str, list[float]] = {p: [] for p in PHASES}
    verify_health: dict[str, float] = {}
    stamps = []
    for event in events:
        stamps.append(datetime.fromisoformat(str(event["created"])))
        data = event.get("event_data") or {}
        assert isinstance(data, dict)
        if event.get("event") not in ("runner_on_ok", "runner_on_failed"):
            continue
        host = str(data.get("host"))
        if str(data.get("task", "")).endswith("Push artifact"):  # before the node module took the push
            per_phase["push"].append(float(data.get("duration") or 0.0))
        solfleet = (data.get("res") or {}).get("solfleet")
        if isinstance(solfleet, dict) and "phases" in solfleet:
            phases = solfleet["phases"]
            for name in PHASES:
                if name in phases:
                    per_phase[name].append(float(phases[name]))
            verify_health[host] = float(phases.get("verify", 0.0)) + float(phases.get("health", 0.0))
    runner_wall = (max(stamps) - min(stamps)).total_seconds() if stamps else 0.0
    return per_phase, runner_wall, verify_health


def fmt(values: list[float]) -> str:
    if not values:
        return "      -      "
    return f"{statistics.median(values):5.2f}/{max(values):5.2f}"


ANSISTRANO_PLAY = """\
- name: ansistrano deploy of the solfleet artifact (benchmark only)
  hosts: all
  gather_facts: false
  roles:
    - role: {role}
      vars:
        ansistrano_deploy_via: copy_unarchive
        ansistrano_deploy_from: {artifact}
        ansistrano_deploy_to: "{{{{ solfleet_root }}}}/ansistrano"
        ansistrano_keep_releases: 3
        ansistrano_allow_anonymous_stats: false
"""


PING_PLAY = """\
- name: "one ansible.builtin.ping per host (benchmark only: the floor of one Ansible task)"
  hosts: all
  gather_facts: false
  tasks:
    - name: ping
      ansible.builtin.ping:
"""


def playbook(rendered: Path, play: Path) -> tuple[float, float]:
    """Wall time and controller CPU of one ansible-playbook run of `play`, through the inventory and SSH
    settings that `solfleet render` wrote to `rendered`."""
    import yaml

    env = dict(os.environ) | {
        k: str(v) for k, v in yaml.safe_load((rendered / "env" / "envvars").read_text()).items()
    }
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    cpu0, start = children_cpu_s(), time.monotonic()
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            str(rendered / "inventory" / "hosts.yml"),
            str(play),
        ],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    wall, cpu = time.monotonic() - start, children_cpu_s() - cpu0
    if proc.returncode != 0:
        sys.exit(f"{play.name} failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    return wall, cpu


def ansistrano(role: Path, work: Path, spec: Path, artifact: Path, base: Path) -> dict[str, float]:
    """One ansistrano deploy of `artifact` (wall time, controller CPU) and, in the same fleet and run, the
    floor of one Ansible task: a one-`ping` play's wall minus the wall of the same play on a group with no
    host (ansible-playbook's own start-up, which the deploy path, timed from a run's first event, leaves
    out). Medians of three."""
    rendered = base / "ansistrano-pdd"
    cli(work, spec, "render", "--out", str(rendered))
    play = base / "ansistrano-deploy.yml"
    play.write_text(ANSISTRANO_PLAY.format(role=role.resolve(), artifact=artifact.resolve()))
    wall, cpu = playbook(rendered, play)
    ping, nobody = base / "ping.yml", base / "ping-no-host.yml"
    ping.write_text(PING_PLAY)
    nobody.write_text(PING_PLAY.replace("hosts: all", "hosts: solfleet_bench_no_such_group"))
    ping_wall = statistics.median(playbook(rendered, ping)[0] for _ in range(3))
    startup = statistics.median(playbook(rendered, nobody)[0] for _ in range(3))
    return {"wall": wall, "cpu": cpu, "ping_wall": ping_wall, "startup_wall": startup}


RUNS = (("first", "1.0.0"), ("second", "1.1.0"), ("re-deploy", "1.1.0"), ("rollback", None))


def bench(
    n: int,
    verify_ops: str,
    base: Path,
    role: Path | None,
    records: list[dict[str, object]],
    wanted: tuple[str, ...] = tuple(r[0] for r in RUNS),
) -> list[str]:
    fleet = SshdFleet(base / f"n{n}", count=n).start()
    rows = []
    try:
        spec = fleet.write_spec(base / f"fleet-{n}.yml")
        work, dist = base / f"work-{n}", base / "dist"
        for version in ("1.0.0", "1.1.0"):
            if not (dist / f"solfleet-ops-{version}.tar.gz").exists():
                cli(work, spec, "build", "--version", version, "--out", str(dist))
        seen: set[Path] = set()
        runs = [r for r in RUNS if r[0] in wanted]
        no_verify_of: dict[str, float] = {}
        path_of: dict[str, float] = {}
        for label, version in runs:
            if version is None:
                args = ("rollback", "--yes")
            else:
                artifact = dist / f"solfleet-ops-{version}.tar.gz"
                args = (
                    "deploy",
                    "--version",
                    version,
                    "--artifact",
                    str(artifact),
                    "--yes",
                    "--verify-ops",
                    verify_ops,
                )
            cpu0 = children_cpu_s()
            wall = cli(work, spec, *args)
            cpu = children_cpu_s() - cpu0
            events = latest_events(work, seen)
            per_phase, runner_wall, verify_health = phase_table(events)
            no_verify = runner_wall - max(verify_health.values(), default=0.0)
            no_verify_of[label] = no_verify
            path_runs = deploy_path_runs_s(events)
            deploy_path = sum(path_runs) if path_runs else None
            if deploy_path is not None:
                path_of[label] = deploy_path
            cells = "  ".join(fmt(per_phase[p]) for p in PHASES)
            rows.append(
                f"{n:>3} {label:<10} {wall:6.1f} {runner_wall:6.1f} {no_verify:9.1f} "
                f"{'-' if deploy_path is None else f'{deploy_path:.1f}':>7} "
                f"{cpu / n:8.2f}  {cells}"
            )
            records.append(
                {
                    "nodes": n,
                    "run": label,
                    "cli_s": round(wall, 2),
                    "runner_s": round(runner_wall, 2),
                    "no_verify_s": round(no_verify, 2),
                    "deploy_path_s": None if deploy_path is None else round(deploy_path, 2),
                    "deploy_path_runs_s": [round(w, 2) for w in path_runs],
                    "cpu_per_node_s": round(cpu / n, 3),
                    "phases": {p: per_phase[p] for p in PHASES},
                }
            )
        if role is not None:
            timed = ansistrano(role, work, spec, dist / "solfleet-ops-1.1.0.tar.gz", base / f"a{n}")
            wall, cpu = timed["wall"], timed["cpu"]
            ratio = no_verify_of.get("second", float("nan")) / wall
            path_ratio = path_of.get("second", float("nan")) / wall
            ping_floor = timed["ping_wall"] - timed["startup_wall"]
            rows.append(
                f"{n:>3} {'ansistrano':<10} {wall:6.1f} {'-':>6} {'-':>9} {'-':>7} {cpu / n:8.2f}  "
                f"solfleet second / ansistrano: no-verify {ratio:.3f}x, deploy path {path_ratio:.3f}x"
            )
            rows.append(
                f"{n:>3} {'ping':<10} {timed['ping_wall']:6.1f} {'-':>6} {'-':>9} {ping_floor:7.1f} "
                f"{'-':>8}  one ping {timed['ping_wall']:.2f} s, start-up {timed['startup_wall']:.2f} s; "
                f"the floor of one task / ansistrano {ping_floor / wall:.3f}x"
            )
            records.append(
                {
                    "nodes": n,
                    "run": "ansistrano",
                    "cli_s": round(wall, 2),
                    "cpu_per_node_s": round(cpu / n, 3),
                    "ratio_solfleet_no_verify": round(ratio, 4),
                    "ratio_solfleet_deploy_path": round(path_ratio, 4),
                    "ping_wall_s": round(timed["ping_wall"], 2),
                    "startup_wall_s": round(timed["startup_wall"], 2),
                    "ratio_ping_floor": round(ping_floor / wall, 4),
                }
            )
    finally:
        fleet.stop()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, nargs="+", default=[4, 16], help="fleet sizes (default 4 16)")
    parser.add_argument("--verify-ops", default="residual_add", help="ops verify runs on every node")
    parser.add_argument("--ansistrano", type=Path, metavar="DIR", help="a checkout of ansistrano/deploy")
    parser.add_argument("--json", type=Path, metavar="FILE", help="append one JSON line per row to FILE")
    parser.add_argument(
        "--runs",
        default=",".join(r[0] for r in RUNS),
        help="which of first,second,re-deploy,rollback to time (first and second build the fleet up)",
    )
    args = parser.parse_args()
    if args.ansistrano is not None and not (args.ansistrano / "tasks" / "main.yml").is_file():
        parser.error(f"--ansistrano {args.ansistrano}: not an ansistrano/deploy checkout (no tasks/main.yml)")
    if any(n < 1 or n > 64 for n in args.nodes):
        parser.error(f"--nodes {args.nodes}: each size must be 1..64")
    print(
        f"deploy benchmark: {os.cpu_count()} CPUs, verify ops: {args.verify_ops};"
        " phases in s as median/max over hosts"
    )
    header = "  N run         cli  runner no-verify   path cpu/node  " + "  ".join(f"{p:>11}" for p in PHASES)
    print(header)
    records: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="solfleet-bench-") as tmp:
        for n in args.nodes:
            for row in bench(
                n, args.verify_ops, Path(tmp), args.ansistrano, records, tuple(args.runs.split(","))
            ):
                print(row, flush=True)
    if args.json:
        stamp = {"date": datetime.now().isoformat(timespec="seconds"), "cpus": os.cpu_count()}
        with args.json.open("a") as fh:
            for rec in records:
                fh.write(json.dumps(stamp | rec) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where a deploy's controller CPU goes: the cost of one Ansible task per host, on N real sshd nodes.

    PYTHONPATH=$PWD .venv/bin/python lab/ansible_task_floor.py --nodes 16 64 [--repeat 2]

For each N it starts N sshd nodes (tests/e2e/sshd_fleet.py), renders the fleet's inventory and SSH settings
with `solfleet render` (pipelining, ControlPersist, forks = N), and times one-task playbooks with
ansible-playbook straight (no ansible-runner, no solfleet CLI):

- `ping`: ansible.builtin.ping, the smallest module: Ansible's own floor per host-task;
- `state`: solfleet_state mode=status, what `solfleet status` and a lease run send each host;
- `state x4`: the same task four times in one play, so the per-run start-up cost separates from the
  per-host-task cost;
- `ping run`: `ansible-playbook` for a play with no hosts matched (`--limit` of a host not there): start-up.

CPU is user + sys of ansible-playbook and everything it ran and waited for (its forks, the ssh clients),
from RUSAGE_CHILDREN; the sshd nodes' work is not in it, nor the ControlPersist ssh masters (started by the
warm-up run, detached, never waited for). Per host-task CPU has the start-up run's CPU taken off.
A deploy is four host-tasks per node (lease, preflight, deploy, lease end): cpu/node of a deploy ~=
4 x the `state` host-task cost + 6 run start-ups / N.
A probe, not part of the suite or the product.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e"))
sys.path.insert(0, str(REPO / "tests"))  # loopback.py, which sshd_fleet imports

from sshd_fleet import SshdFleet  # noqa: E402  (the fixture code, reused as a library)

PLAYS = {
    "ping": [{"name": "ping", "ansible.builtin.ping": {}}],
    "state": [{"name": "state", "solfleet_state": {"mode": "status", "root": "{{ solfleet_root }}",
                                                    "node": "{{ inventory_hostname }}"}}],
}  # fmt: skip
PLAYS["state x4"] = PLAYS["state"] * 4


def cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run(
    pdd: Path, env: dict[str, str], tasks: list[dict[str, object]], limit: str | None, base: Path
) -> tuple[float, float]:  # noqa: E501
    play = base / "play.yml"
    play.write_text(
        yaml.safe_dump([{"name": "probe", "hosts": "all", "gather_facts": False, "tasks": tasks}])
    )
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(pdd / "inventory"), str(play)]
    if limit:
        argv += ["--limit", limit]
    c0, t0 = cpu_s(), time.monotonic()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    wall, cpu = time.monotonic() - t0, cpu_s() - c0
    if proc.returncode not in (0,) and not limit:
        sys.exit(f"ansible-playbook failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-2000:]}")
    return wall, cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--repeat", type=int, default=2, help="runs of each playbook; the median is printed")
    args = ap.parse_args()
    print(f"{os.cpu_count()} CPUs; seconds; cpu/host-task = (cpu - start-up cpu) / (N x tasks)")
    print(f"{'N':>3} {'playbook':<9} {'wall':>6} {'cpu':>6} {'cpu/host-task':>14}")
    with tempfile.TemporaryDirectory(prefix="floor-") as tmp:
        base = Path(tmp)
        for n in args.nodes:
            fleet = SshdFleet(base / f"n{n}", count=n).start()
            try:
                spec = fleet.write_spec(base / f"fleet-{n}.yml")
                pdd = base / f"pdd-{n}"
                env = dict(os.environ) | {"SOLFLEET_WORK": str(base / f"work-{n}")}
                env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
                subprocess.run([sys.executable, "-m", "fleet.cli", "--fleet", str(spec), "render", "--out",
                                str(pdd)], cwd=REPO, env=env, check=True, capture_output=True)  # fmt: skip
                env |= {k: str(v) for k, v in yaml.safe_load((pdd / "env" / "envvars").read_text()).items()}
                run(pdd, env, PLAYS["ping"], None, base)  # ControlPersist masters up, caches warm
                cases = [
                    ("ping run", PLAYS["ping"], "no-such-host"),
                    *((k, v, None) for k, v in PLAYS.items()),
                ]
                startup = 0.0
                for label, tasks, limit in cases:
                    walls, cpus = zip(
                        *(run(pdd, env, tasks, limit, base) for _ in range(args.repeat)), strict=True
                    )
                    wall, cpu = statistics.median(walls), statistics.median(cpus)
                    if limit:
                        startup = cpu  # the first case: what every run costs before any host
                    per = "-" if limit else f"{(cpu - startup) / (n * len(tasks)):.3f}"
                    print(f"{n:>3} {label:<9} {wall:6.2f} {cpu:6.2f} {per:>14}", flush=True)
            finally:
                fleet.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

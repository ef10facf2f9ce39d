# ruff: noqa: E501  (a probe; lab/ is not linted by CI)
"""Probe (not shipped): where one host's time goes in a 16-node deploy, against the runner's events.

    PYTHONPATH=$PWD .venv/bin/python lab/deploy_host_timeline.py [--nodes 16]

Copies the committed tree (`git archive HEAD`) to a temporary directory and instruments that copy only:
- the node module (playbooks/library/solfleet_release.py) records the epoch time of its process's start (from
  /proc/self/stat and CLOCK_BOOTTIME, 10 ms resolution), of its own first line (after AnsiballZ's wrapper
  and the import of ansible.module_utils.basic, which the wrapper does before any module code), and of its
  end, and its process's CPU time (self, and its children: the stack probe, verify, health);
- its action plugin records when it starts on the controller.
Then it runs benchmarks/deploy_bench.py's `bench` (first and second deploys) from the copy, and prints per
host, in seconds from the run's first event: the task's start (runner_on_start), the action plugin's start, the
node process's start, the module's first line, its end, the result event (runner_on_ok), CPU self / children,
and the unpack_check and verify + health phases.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

MODULE_HEAD = "from __future__ import annotations\n"
MODULE_EXIT = "    module.exit_json(\n"
ACTION_START = "        result = super().run(tmp, task_vars)\n"
ACTION_END = "        return result\n"


def instrument(copy: Path) -> None:
    mod = copy / "playbooks" / "library" / "solfleet_release.py"
    text = mod.read_text()
    assert MODULE_HEAD in text and MODULE_EXIT in text
    text = text.replace(MODULE_HEAD, MODULE_HEAD + "import time as _t\n_MOD0 = _t.time()\n", 1)
    text = text.replace(
        MODULE_EXIT,
        "    import os as _o\n"
        '    _st = open("/proc/self/stat").read().rsplit(")", 1)[1].split()\n'
        '    _age = _t.clock_gettime(_t.CLOCK_BOOTTIME) - int(_st[19]) / _o.sysconf("SC_CLK_TCK")\n'
        "    _tm = _o.times()\n"
        '    module.exit_json(_dbg={"proc": _t.time() - _age, "mod": _MOD0, "end": _t.time(),'
        ' "cpu": _tm.user + _tm.system, "ccpu": _tm.children_user + _tm.children_system},\n',
        1,
    )
    mod.write_text(text)
    act = copy / "playbooks" / "action_plugins" / "solfleet_release.py"
    text = act.read_text()
    assert ACTION_START in text and ACTION_END in text
    text = text.replace(ACTION_START, "        import time as _t\n        _a0 = _t.time()\n" + ACTION_START, 1)
    text = text.replace(ACTION_END, '        result["_dbg_action"] = {"a0": _a0}\n' + ACTION_END, 1)
    act.write_text(text)


def report(work: Path) -> None:
    runs: dict[str, list[dict]] = {}
    for p in work.glob("fleets/*/runs/*/**/job_events/*.json"):
        runs.setdefault(str(p.parent), []).append(json.loads(p.read_text()))

    def ts(e: dict) -> float:
        return datetime.fromisoformat(e["created"]).timestamp()

    for evs in sorted(runs.values(), key=lambda evs: min(e["created"] for e in evs)):
        oks = [
            e
            for e in evs
            if e["event"] in ("runner_on_ok", "runner_on_failed") and "_dbg" in (e["event_data"].get("res") or {})
        ]
        if not oks:
            continue
        t0 = min(ts(e) for e in evs)
        starts = {e["event_data"]["host"]: ts(e) for e in evs if e["event"] == "runner_on_start"}
        print(f"pushing run: wall {max(ts(e) for e in evs) - t0:.2f} s")
        print(" host     start action   proc    mod    end     ok    cpu   ccpu unpack    v+h")
        rows = []
        for e in oks:
            h, r = e["event_data"]["host"], e["event_data"]["res"]
            d, a, ph = r["_dbg"], r.get("_dbg_action", {}), r["solfleet"]["phases"]
            rows.append(
                (h, starts.get(h, t0) - t0, a.get("a0", t0) - t0, d["proc"] - t0, d["mod"] - t0, d["end"] - t0,
                 ts(e) - t0, d["cpu"], d["ccpu"], ph.get("unpack_check", 0.0),
                 ph.get("verify", 0.0) + ph.get("health", 0.0))
            )  # fmt: skip
        for row in sorted(rows, key=lambda x: x[1]):
            print(f" {row[0]:<8}" + " ".join(f"{v:6.2f}" for v in row[1:]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=16)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="timeline-") as tmp:
        copy, base = Path(tmp) / "repo", Path(tmp) / "bench"
        copy.mkdir()
        base.mkdir()
        archive = subprocess.run(["git", "-C", str(REPO), "archive", "HEAD"], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(copy)], input=archive.stdout, check=True)
        instrument(copy)
        # the copy is no git checkout: its build time is the commit's, as `solfleet build` takes it from git
        stamp = subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%ct"], capture_output=True, text=True)
        os.environ["SOURCE_DATE_EPOCH"] = stamp.stdout.strip()
        sys.path.insert(0, str(copy / "benchmarks"))
        import deploy_bench  # the copy's: its REPO is the instrumented tree

        assert Path(deploy_bench.__file__).resolve().is_relative_to(copy)
        for row in deploy_bench.bench(args.nodes, "residual_add", base, None, [], ("first", "second")):
            print(row)
        report(base / f"work-{args.nodes}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""fleet.ptx_export on the real kernels: each op compiles in its own process, so the PTX bytes do not
depend on how many run at once (numba numbers functions in compile order within a process), bad
arguments get exit 2 with the allowed values, and a compile process killed mid-compile fails the export
naming its op. Three small ops keep it to ~30 s."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OPS = "cast,cast_bf16,residual_add"


def export(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"} | {
        "PYTHONDONTWRITEBYTECODE": "1"
    }
    return subprocess.run(
        [sys.executable, "-m", "fleet.ptx_export", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_the_ptx_bytes_do_not_depend_on_the_number_of_processes() -> None:
    one, two = export("9.0", "--jobs", "1", "--ops", OPS), export("9.0", "--jobs", "2", "--ops", OPS)
    assert one.returncode == 0 and two.returncode == 0, one.stderr[-2000:] + two.stderr[-2000:]
    assert one.stdout == two.stdout
    records = json.loads(one.stdout)
    assert {r["op"] for r in records} == set(OPS.split(","))
    assert [r["kernel"] for r in records] == sorted(r["kernel"] for r in records)
    assert all(".entry" in r["ptx"] for r in records)
    # an op compiled alone is the same bytes as inside the set: no number leaks from one op to the next
    # (cast: scheduled after residual_add's 6 kernels, so in the same process it would carry their numbers)
    alone = {r["kernel"]: r["ptx"] for r in json.loads(export("9.0", "--ops", "cast").stdout)}
    assert alone and all(r["ptx"] == alone[r["kernel"]] for r in records if r["op"] == "cast")


def test_bad_arguments_exit_2_naming_what_is_allowed() -> None:
    for args, says in (
        (("9",), "cc: '9' is not MAJOR.MINOR (e.g. 9.0)"),
        (("9.0", "--jobs", "0"), "--jobs: 0 is not allowed; give 1 or more"),
        (("9.0", "--ops", "sgemm"), "--ops: sgemm not registered; ops: cast, cast_bf16, cast_fp8,"),
    ):
        proc = export(*args)
        assert proc.returncode == 2 and says in proc.stderr, (args, proc.returncode, proc.stderr)
        assert proc.stdout == ""


def _spawned_workers(pid: int) -> list[int]:
    """The multiprocessing workers among `pid`'s children (not its resource tracker), from /proc."""
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    out = []
    for kid in kids:
        try:
            cmd = Path(f"/proc/{kid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if b"multiprocessing" in cmd and b"resource_tracker" not in cmd:
            out.append(int(kid))
    return out


def test_a_compile_process_killed_fails_the_export_naming_its_op() -> None:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleet.ptx_export", "9.0", "--jobs", "1", "--ops", "residual_add"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (workers := _spawned_workers(proc.pid)) and proc.poll() is None:
            assert time.monotonic() < deadline, "no compile process appeared"
            time.sleep(0.05)
        assert workers, "the export ended before its compile process could be killed"
        os.kill(workers[0], signal.SIGKILL)  # a real kill of the real worker, mid-compile
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, (proc.returncode, err[-2000:])
    assert out == ""  # no partial PTX records for the build to take
    assert "op residual_add: its compile process died" in err, err[-2000:]

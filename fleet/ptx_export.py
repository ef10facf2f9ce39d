"""Child process of `solfleet build`: `python -m fleet.ptx_export 9.0 [--jobs N] [--ops a,b]` prints a JSON
list of {op, kernel, signature, ptx, registers, shared_bytes, spill_bytes, ptxas, link, arch} for every
kernel that kernels.runtime.ptx.compile_all compiles offline for that compute capability.

Run with cwd = the tree being packaged. Exit 3 (reason on stdout) when that tree has no
kernels/runtime/ptx.py, so a build can still package the kernels and record that PTX was unavailable; any
other failure (a kernel that does not compile) is a build error: exit 1, one line on stderr naming every
kernel that failed.

Each op compiles in a fresh process, N at a time (default: the CPUs this process may use), the ops with
the most kernels first; the output is the same bytes whatever N is (compile_parallel says why)."""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any


def _records(result: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for name, info in sorted(result.items()):
        regs = info.get("registers")
        out.append(
            {
                "op": str(info["op"]),
                "kernel": str(name),
                "signature": str(info.get("signature", "")),
                "ptx": str(info["ptx"]),
                "registers": None if regs is None else int(regs),
                "shared_bytes": info.get("shared_bytes"),
                "spill_bytes": info.get("spill_bytes"),
                "ptxas": info.get("ptxas"),
                "link": [Path(p).name for p in info.get("link") or []],
                # "sm_90a" for a kernel that runs on that architecture alone (wgmma); None: any of its cc
                "arch": info.get("arch"),
            }
        )
    return out


class OpsUnknown(ValueError):
    """--ops names an op the tree does not register (exit 2)."""


def _compile_ops(cc: tuple[int, int], ops: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """One worker's task: compile_all for these ops (imported in the worker, from the same sys.path)."""
    ptx = importlib.import_module("kernels.runtime.ptx")
    result: dict[str, dict[str, Any]] = ptx.compile_all(cc, ops=ops)
    return result


def _default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def compile_parallel(
    ptx: Any, cc: tuple[int, int], jobs: int, only: tuple[str, ...] | None = None
) -> dict[str, dict[str, Any]]:
    """compile_all(cc), each op in a fresh spawned process, `jobs` at a time (`only`: these ops). Fresh per
    op because numba numbers every function it compiles (the `v1197` in a mangled name) in compile order
    within a process: an op compiled alone gets the same numbers, so the same PTX bytes, whatever `jobs` is
    and however the ops were scheduled. A tree whose compile_all cannot take a list of ops compiles all of
    them in this process."""
    ops = ptx.all_ops() if hasattr(ptx, "all_ops") else {}
    if not ops or "ops" not in inspect.signature(ptx.compile_all).parameters:
        result: dict[str, dict[str, Any]] = ptx.compile_all(cc)
        return result
    unknown = sorted(set(only or ()) - set(ops))
    if unknown:
        raise OpsUnknown(f"--ops: {', '.join(unknown)} not registered; ops: {', '.join(sorted(ops))}")
    chosen = [name for name in ops if only is None or name in only]
    order = sorted(chosen, key=lambda name: (-len(ops[name].ptx_kernels), name))  # the longest tasks first
    merged: dict[str, dict[str, Any]] = {}
    context = multiprocessing.get_context("spawn")  # a forked numba / CUDA state is unsafe
    with ProcessPoolExecutor(min(jobs, len(order)), mp_context=context, max_tasks_per_child=1) as pool:
        futures = {name: pool.submit(_compile_ops, cc, (name,)) for name in order}
        for name, future in futures.items():  # in `order`: the merge is the same whatever finishes first
            try:
                part = future.result()
            except BrokenProcessPool as exc:  # the worker died (a signal, out of memory): no traceback
                raise RuntimeError(f"op {name}: its compile process died ({exc})") from None
            except Exception as exc:  # an import or compile error outside compile_all's own records
                raise RuntimeError(f"op {name}: {type(exc).__name__}: {exc}") from exc
            clash = merged.keys() & part.keys()
            if clash:
                raise RuntimeError(f"kernel name(s) {sorted(clash)} registered by more than one op")
            merged.update(part)
    return merged


def _args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m fleet.ptx_export", description=__doc__.split("\n\n")[0])
    parser.add_argument("cc", help="the compute capability, MAJOR.MINOR (e.g. 9.0)")
    parser.add_argument(
        "--jobs", type=int, default=_default_jobs(), help="processes at once (default: the CPUs)"
    )
    parser.add_argument("--ops", default="", help="comma-separated op names (default: every op)")
    args = parser.parse_args(argv)
    major, dot, minor = args.cc.partition(".")
    if not (dot and major.isdigit() and minor.isdigit()):
        parser.error(f"cc: {args.cc!r} is not MAJOR.MINOR (e.g. 9.0)")  # exit 2
    if args.jobs < 1:
        parser.error(f"--jobs: {args.jobs} is not allowed; give 1 or more")
    return args


def main(argv: list[str]) -> int:
    args = _args(argv)
    major, _, minor = args.cc.partition(".")
    cc = (int(major), int(minor))
    only = tuple(filter(None, args.ops.split(","))) or None
    try:
        ptx = importlib.import_module("kernels.runtime.ptx")
    except ModuleNotFoundError as exc:
        if exc.name in ("kernels.runtime", "kernels.runtime.ptx"):  # a tree without kernels/runtime/ too
            print("kernels/runtime/ptx.py not present in this tree")
            return 3
        raise
    # an editable install can resolve kernels.runtime.ptx from another checkout: PTX must match this tree
    if not Path(ptx.__file__ or "").resolve().is_relative_to(Path.cwd().resolve()):
        print(f"kernels/runtime/ptx.py not present in this tree (found only {ptx.__file__})")
        return 3
    try:
        result = compile_parallel(ptx, cc, args.jobs, only)
    except OpsUnknown as exc:
        print(exc, file=sys.stderr)
        return 2
    except Exception as exc:  # a kernel that does not compile: one line for the build error, then the detail
        first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")
        print(
            f"{type(exc).__name__}: {first} (run `python -m fleet.ptx_export {args.cc}` for the traceback)",
            file=sys.stderr,
        )
        if sys.stderr.isatty():
            raise
        return 1
    # compile_all records a kernel that does not compile and goes on (one failure never hides another's):
    # here every failure stops the build, all of them named on one line
    failed = [f"{info['op']}.{name}: {info.get('error')}" for name, info in sorted(result.items())
              if info.get("ptx") is None or info.get("error")]  # fmt: skip
    if failed:
        print(
            f"{len(failed)} kernel(s) failed to compile for {args.cc}: " + "; ".join(failed), file=sys.stderr
        )
        return 1
    print(json.dumps(_records(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

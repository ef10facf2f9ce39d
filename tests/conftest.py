"""Test-wide set-up. Kernel tests run under numba's CUDA simulator on machines without a GPU: the switch
must be set before numba.cuda is first imported, so it lives here, in the first conftest pytest loads.
A machine with a GPU runs the same tests on the GPU, plus the `gpu`-marked ones."""

from __future__ import annotations

import glob
import os
import signal
import sys
from collections.abc import Iterator

import pytest


def _gpu_present() -> bool:
    # no numba.cuda import here (it would freeze the simulator switch): the driver's device nodes tell
    return bool(glob.glob("/dev/nvidia[0-9]*")) or os.environ.get("SOLFLEET_ASSUME_GPU") == "1"


if "NUMBA_ENABLE_CUDASIM" not in os.environ and not _gpu_present():
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    # if something imported numba.core.config already, numba.cuda would read the old settings from it
    if "numba.core.config" in sys.modules:
        sys.modules["numba.core.config"].reload_config()


# A suite started from a shell without job control in the background (`cmd &` in a script) inherits SIGINT
# ignored: Python then installs no KeyboardInterrupt handler, and every CLI the tests start inherits the
# ignore too, so the Ctrl-C tests see nothing happen (seen: test_runner_streaming's Ctrl-C test and
# test_faults' SIGINT case, when the suite ran under `(./scripts/test.sh &)`). The tests are about what a
# terminal's Ctrl-C does: give this process (and so its children) the terminal's disposition back.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_sessionstart(session):  # type: ignore[no-untyped-def]
    # Builds in this run share one PTX cache (fleet/artifact.py: keyed by the kernels' bytes and the
    # compiler), under this run's temp dir: the xdist workers' common parent, so each distinct tree compiles
    # once per run, and nothing from an earlier run or the user's ~/.cache is reused.
    if "SOLFLEET_PTX_CACHE" not in os.environ:
        base = session.config._tmp_path_factory.getbasetemp()
        run_dir = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
        os.environ["SOLFLEET_PTX_CACHE"] = str(run_dir / "ptx-cache")
    # A machine that shows a GPU but cannot use it must not pass by skipping every device test.
    if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1" and _gpu_present():
        from numba import cuda

        if not cuda.is_available():
            raise pytest.UsageError(
                "a GPU device node exists but CUDA is not usable here (driver/runtime?); "
                "fix it, or run the simulator explicitly with NUMBA_ENABLE_CUDASIM=1"
            )


_GUARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@pytest.fixture(autouse=True)
def _signal_handlers_restored() -> Iterator[None]:
    """A test file shares its xdist worker with others: a handler one test leaves behind (ansible-runner's
    run() without cancel_callback turns SIGINT into a flag; fleet.cli.main() maps SIGTERM/SIGHUP to Ctrl-C)
    would change what a signal does in every later test. Each test starts from, and ends with, the
    handlers this process began with."""
    before = {sig: signal.getsignal(sig) for sig in _GUARDED_SIGNALS}
    yield
    for sig, handler in before.items():
        if signal.getsignal(sig) is not handler:
            signal.signal(sig, handler)

"""Test-wide set-up. Kernel tests run under numba's CUDA simulator on machines without a GPU: the switch
must be set before numba.cuda is first imported, so it lives here, in the first conftest pytest loads.
A machine with a GPU runs the same tests on the GPU, plus the `gpu`-marked ones."""

from __future__ import annotations

import glob
import os
import sys


def _gpu_present() -> bool:
    # no numba.cuda import here (it would freeze the simulator switch): the driver's device nodes tell
    return bool(glob.glob("/dev/nvidia[0-9]*")) or os.environ.get("SOLFLEET_ASSUME_GPU") == "1"


if "NUMBA_ENABLE_CUDASIM" not in os.environ and not _gpu_present():
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    # pytest imported numba.core.config already (pyproject's filterwarnings names a numba warning class),
    # and numba.cuda reads its settings from there: re-read the environment before numba.cuda loads
    if "numba.core.config" in sys.modules:
        sys.modules["numba.core.config"].reload_config()


def pytest_configure(config):  # type: ignore[no-untyped-def]
    # numba-cuda 0.30 raises its own NumbaPerformanceWarning class (numba.cuda.core.errors), not the
    # numba.core one pyproject.toml ignores: tiny verification grids warn on a real GPU by design
    config.addinivalue_line("filterwarnings", "ignore:.*will likely result in GPU under-utilization")

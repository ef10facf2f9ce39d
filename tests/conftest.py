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
    # if something imported numba.core.config already, numba.cuda would read the old settings from it
    if "numba.core.config" in sys.modules:
        sys.modules["numba.core.config"].reload_config()

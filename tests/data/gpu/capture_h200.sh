#!/usr/bin/env bash
# On a real GPU node (the H200 device machine), from the repo root: read the GPU through this project's own
# NVML reader and through the nvidia-smi fallback, run every GPU check and write the metrics file. Needs only
# nvidia-ml-py and prometheus-client (both in the H200 image); no numba. Takes a few seconds.
# Results under $OUT (default ./out-gpu-health): nvml-dump.json (same shape as h200-healthy/nvml.json),
# nvidia-smi-q.xml, checks.json, facts-nvml.json, facts-smi.json, solfleet.prom; a table is printed last.
set -euo pipefail
OUT=${OUT:-$PWD/out-gpu-health}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
nvidia-smi -q -x > "$OUT/nvidia-smi-q.xml" || true
dmesg > "$OUT/dmesg.txt" 2>&1 || true
PYTHONPATH=$PWD OUT=$OUT "$PY" - <<'PY'
import dataclasses, json, os, time
from pathlib import Path
from kernels.harness import gpu_health as gh, metrics

out = Path(os.environ["OUT"])
dump = gh.nvml_dump()
(out / "nvml-dump.json").write_text(json.dumps(dump, indent=1))
a = gh.facts_from_nvml_dump(dump)
b = gh.read_smi()
(out / "facts-nvml.json").write_text(json.dumps(dataclasses.asdict(a), indent=1))
(out / "facts-smi.json").write_text(json.dumps(dataclasses.asdict(b), indent=1))
diff = [(f.name, getattr(x, f.name), getattr(y, f.name)) for x, y in zip(a.gpus, b.gpus)
        for f in dataclasses.fields(x) if getattr(x, f.name) != getattr(y, f.name)]
expect = gh.GpuExpectations(count=len(a.gpus), model="H200", cc="9.0", driver="580", cuda="13.0")
t0 = time.perf_counter()
checks = gh.run_gpu_checks(expect=expect, state_dir=out / "state", simulated=False)
dt = time.perf_counter() - t0
(out / "checks.json").write_text(gh.checks_as_json(checks))
metrics.write_metrics(root=out, metrics=metrics.NodeMetrics(checks=checks))
(out / "solfleet.prom").write_text((out / "metrics" / "solfleet.prom").read_text())
print(f"NVML vs nvidia-smi differences (clocks/power/temperature move between reads): {diff}")
print(f"run_gpu_checks took {dt:.2f} s")
for c in checks:
    print(f"{c.name:26} {c.status.value:8} {c.detail}")
PY

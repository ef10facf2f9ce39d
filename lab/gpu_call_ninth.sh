#!/usr/bin/env bash
# The ninth session's first device call (PERF.md "The next GPU session"). On an H200: latest.json
# (benchmarks/h200_latest.sh), nothing else. Elsewhere: the GPU tests of the on-chip kernels as shipped
# since the eighth session (the next row's loads in the write pass), rope and cast_fp8; verify of the row
# ops; then Nsight Compute on the on-chip kernels (vocabulary and mid widths, bf16) for where their time goes.
#   OUT=dir bash lab/gpu_call_ninth.sh      (carry .whl)
set -uo pipefail
OUT=${OUT:-/tmp/gpu-ninth}; mkdir -p "$OUT"; t0=$(date +%s)
source benchmarks/h200_env.sh || exit 2
left() { local s=$(( $1 - ($(date +%s) - t0) )); echo $(( s > 1 ? s : 1 )); }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader | tee "$OUT/nvidia-smi.csv"
if grep -q H200 "$OUT/nvidia-smi.csv"; then OUT=$OUT bash benchmarks/h200_latest.sh; exit $?; fi
timeout "$(left ${T_TESTS:-300})" $PY -m pytest -q -m "not slow" -p no:cacheprovider -rf \
  tests/kernels/test_softmax.py tests/kernels/test_layernorm.py tests/kernels/test_rmsnorm.py \
  "tests/kernels/test_bf16.py::test_onchip_rows_round_the_float64_result" tests/kernels/test_special_values.py \
  tests/kernels/test_rope.py tests/kernels/test_cast_fp8.py > "$OUT/pytest.txt" 2>&1
echo "== pytest rc=$? after $(( $(date +%s) - t0 )) s"
timeout "$(left ${T_VERIFY:-370})" $PY -m kernels verify --json --ops rmsnorm,layernorm,softmax --shapes verify \
  > "$OUT/verify.json" 2> "$OUT/verify.err"
echo "== verify rc=$? after $(( $(date +%s) - t0 )) s"
NCU="ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --csv --page details"
for shape in 261x128256 512x65536; do
  RN_ROWS=${shape%x*} RN_COLS=${shape#*x} RN_OPS=rmsnorm,layernorm,softmax timeout "$(left ${T_NCU:-560})" \
    $NCU $PY lab/rows_ncu.py > "$OUT/ncu-$shape.csv" 2> "$OUT/ncu-$shape.err"
  echo "== ncu $shape rc=$? after $(( $(date +%s) - t0 )) s"
done
tail -4 "$OUT/pytest.txt"; tail -2 "$OUT/verify.err"
for f in "$OUT"/ncu-*.csv; do echo "$f"; grep -E '"(Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per Thread)"' "$f" | awk -F'","' '{print $5" | "$(NF-2)" "$(NF-1)" "$NF}' | head -36; done

#!/usr/bin/env bash
# The fourteenth session's first device call (carry .whl), packed into $OUT/fourteenth.tgz; ~6 min on an H100:
#   1. lab/gpu_call_thirteenth_probes.sh (layernorm held; fused_add_rmsnorm on chip), ~4 min;
#   2. lab/rows_liger_ncu.py under Nsight Compute: softmax and rmsnorm bf16, ours and Liger's, at 1024, 4096
#      and 8192 columns (the widths where softmax is 0.95-0.97x Liger), ~1-2 min.
#   OUT=dir bash lab/gpu_call_fourteenth.sh
# On an H200 it runs the table instead (issue 13's must-show: benchmarks/h200/latest.json), split as
# benchmarks/h200_latest.sh's header says; the second part is the next call (H200_PART=B).
set -uo pipefail
OUT=${OUT:-/tmp/gpu-fourteenth}; mkdir -p "$OUT/n"; t0=$(date +%s)
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  echo "== an H200: the table, part ${H200_PART:-A}"
  if [ "${H200_PART:-A}" = A ]; then
    LLM_OPS=rmsnorm,layernorm,softmax OUT="$OUT/A" bash benchmarks/h200_latest.sh
  else
    LLM_OPS=fused_add_rmsnorm,swiglu,rope,cast_fp8,residual_add GEMM=0 REG_OPS= LLM_DEADLINE=400 \
      OUT="$OUT/B" bash benchmarks/h200_latest.sh
  fi
  P=${H200_PART:-A}; tar czf "$OUT/table-$P.tgz" -C "$OUT" "$P" && rm -rf "$OUT/$P" "$OUT/n"; exit 0
fi
OUT="$OUT" bash lab/gpu_call_thirteenth_probes.sh
source benchmarks/h200_env.sh || exit 2
NCU="ncu --profile-from-start off --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section InstructionStats --section SchedulerStats --csv --page details"
timeout "$(( 560 - ($(date +%s) - t0) ))" $NCU $PY lab/rows_liger_ncu.py > "$OUT/n/ncu.csv" 2> "$OUT/n/ncu.err"
echo "== ncu rc=$? after $(( $(date +%s) - t0 )) s"; grep -E "launch:|rel err" "$OUT/n/ncu.csv" | tail -30
grep -E '"(Duration|DRAM Throughput|Registers Per Thread|Achieved Occupancy|Executed Instructions|Block Size|Grid Size)"' "$OUT/n/ncu.csv" \
  | awk -F'","' '{print $1"\" "$5" | "$(NF-2)" "$NF}' | sed 's/"//g' | head -120
tar czf "$OUT/fourteenth.tgz" -C "$OUT" n probes.tgz && rm -rf "$OUT/n"

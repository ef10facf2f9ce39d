#!/usr/bin/env bash
# The twenty-second session's device calls (carry .whl), on whichever GPU comes:
#   on an H200 (STEP=table): "The next GPU session" item 1, the table's missing rows (benchmarks/h200_latest.sh
#               with the second half of the LLM ops; its registry step times clip, cast, gemm and o_proj);
#   otherwise (STEP=wb): lab/layernorm_wb_smem_ab.py (layernorm's weight and bias copied to shared memory by
#               cp.async during the row's loads and reductions; one reduction a row), until TOTAL s.
#   OUT=dir [STEP=auto|wb|table] [TOTAL=300] bash lab/gpu_call_twentysecond.sh
set -uo pipefail
OUT=${OUT:-/tmp/gpu-twentysecond}; TOTAL=${TOTAL:-300}; STEP=${STEP:-auto}
t0=$(date +%s)
left() { local s=$(( $1 - ($(date +%s) - t0) )); echo $(( s > 1 ? s : 1 )); }
mkdir -p "$OUT"
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "== device: $name"
source benchmarks/h200_env.sh || exit 2
[[ $STEP == auto ]] && STEP=$([[ $name == *H200* ]] && echo table || echo wb)
if [[ $STEP == table ]]; then
  LLM_OPS=fused_add_rmsnorm,swiglu,rope,cast_fp8,residual_add GEMM=0 LLM_DEADLINE=330 REG_DEADLINE=470 \
    OUT=$OUT/table bash benchmarks/h200_latest.sh > "$OUT/table.txt" 2>&1
  echo "== table rc=$? after $(( $(date +%s) - t0 )) s"; tail -30 "$OUT/table.txt"
else
  mkdir -p "$OUT/ln-wb"; OUT=$OUT/ln-wb timeout -k 5 "$(left "$TOTAL")" $PY lab/layernorm_wb_smem_ab.py > "$OUT/ln-wb.txt" 2>&1
  echo "== layernorm wb A/B rc=$? after $(( $(date +%s) - t0 )) s"; tail -14 "$OUT/ln-wb.txt"
fi

#!/usr/bin/env bash
# The eleventh session's fourth device call (carry .whl): the LLM ops that h200_latest.sh's first step did not
# reach before its deadline (swiglu, rope, cast_fp8, residual_add; every dtype), then the host time per call
# of the ops whose replays the tenth session guarded (OverlapGuard.over) and of clip. Outputs in one tar (the
# device tool returns a few files only).
#   OUT=dir bash lab/gpu_call_eleventh_llm.sh
set -uo pipefail
OUT=${OUT:-/tmp/gpu-eleventh-llm}; mkdir -p "$OUT/w"; t0=$(date +%s)
source benchmarks/h200_env.sh || exit 2
left() { local s=$(( $1 - ($(date +%s) - t0) )); echo $(( s > 1 ? s : 1 )); }
W=$OUT/w
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader > "$W/nvidia-smi.csv"
timeout "$(left ${T_LLM:-300})" $PY benchmarks/h200_llm.py --out "$W/llm" --ops swiglu,rope,cast_fp8,residual_add \
  --dtypes bfloat16,float16,float32 > "$W/llm.txt" 2>&1
echo "== llm rc=$? after $(( $(date +%s) - t0 )) s"
timeout "$(left ${T_OVERHEAD:-500})" $PY -m kernels bench --overhead --json \
  --ops gemm,o_proj,linear,rope,swiglu,fused_add_rmsnorm,clip_grad_norm > "$W/overhead.json" 2> "$W/overhead.err"
echo "== overhead rc=$? after $(( $(date +%s) - t0 )) s"
tar -C "$OUT" -czf "$OUT/eleventh-llm.tgz" w && rm -rf "$W"
tail -n 25 <(tar -xzOf "$OUT/eleventh-llm.tgz" w/llm.txt) | cut -c1-160

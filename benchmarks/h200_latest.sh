#!/usr/bin/env bash
# One device call on the H200 that makes benchmarks/h200/latest.json: every op x dtype x shape, ours beside
# CuPy, torch eager, Liger-Kernel and cuBLAS (each reference timed interleaved with ours in one process), SOL,
# errors against float64, and the roofline. Run from the repository root, carrying .whl (numpy 2.4, and
# .whl/bench/liger_kernel-*.whl):
#   OUT=/some/dir bash benchmarks/h200_latest.sh
# Steps, each on its own deadline from the start (seconds; the whole call stays under the device tool's 600);
# LLM_OPS, LLM_DTYPES, GEMM (0: step 2 skipped) and REG_OPS (empty: step 3 skipped) narrow a shorter call:
#   1. benchmarks/h200_llm.py, every LLM op in bf16, fp16 and fp32 at the bench shapes, and the bf16 width
#      sweep of the row ops (1024-131072 columns): ours / torch eager / Liger-Kernel          (LLM_DEADLINE 330)
#   2. benchmarks/h200_bf16.py: gemm, o_proj and linear in bf16 / fp16 against cuBLAS (torch), bf16 residual_add and
#      cast against torch                                                                       (GEMM_DEADLINE 420)
#   3. python -m kernels bench --compare cupy for the ops step 1 does not cover (cast, clip_grad_norm, gemm,
#      o_proj; fp32 and fp16 against CuPy, bf16 alone: CuPy has no bfloat16)                  (REG_DEADLINE 520)
#   4. benchmarks/latest.py merges the three into $OUT/latest.json and $OUT/roofline.png, table last; the
#      inputs go into $OUT/inputs.tgz.
# A step that hits its deadline leaves its JSON unwritten and the merge goes on without it (it says so). On an
# H100 all eight LLM ops need ~450 s; rmsnorm, layernorm and softmax take ~250 s of step 1's 330 (thirteenth
# session): there, run LLM_OPS=rmsnorm,layernorm,softmax first (~500 s in all), then LLM_OPS=fused_add_rmsnorm,
# swiglu,rope,cast_fp8,residual_add GEMM=0 REG_OPS= LLM_DEADLINE=400 in a second call (~300 s), unpack both
# calls' inputs.tgz (into A and B) and merge them with `benchmarks/latest.py --llm A/llm/h200_llm.json --llm
# B/llm/h200_llm.json --gemm A/gemm/h200_bf16.json --registry A/registry.json` (each --llm may also be the
# run's log, llm.txt).
set -uo pipefail
OUT=${OUT:-/tmp/h200-latest}
mkdir -p "$OUT"
t0=$(date +%s)
source benchmarks/h200_env.sh || exit 2
left() { local s=$(( $1 - ($(date +%s) - t0) )); echo $(( s > 1 ? s : 1 )); }
smi() { timeout 15 nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw \
  --format=csv,noheader >>"$OUT/nvidia-smi.csv" 2>&1; }
smi
LLM_OPS=${LLM_OPS:-rmsnorm,layernorm,softmax,fused_add_rmsnorm,swiglu,rope,cast_fp8,residual_add}
LLM_DTYPES=${LLM_DTYPES:-bfloat16,float16,float32}
REG_OPS=${REG_OPS-cast,clip_grad_norm,gemm,o_proj}  # empty: no registry bench
timeout "$(left ${LLM_DEADLINE:-330})" $PY benchmarks/h200_llm.py --out "$OUT/llm" --ops $LLM_OPS \
  --dtypes $LLM_DTYPES >"$OUT/llm.txt" 2>&1
echo "== llm rc=$? after $(( $(date +%s) - t0 )) s"; smi
if [ "${GEMM:-1}" != 0 ]; then
  timeout "$(left ${GEMM_DEADLINE:-420})" $PY benchmarks/h200_bf16.py --out "$OUT/gemm" >"$OUT/gemm.txt" 2>&1
  echo "== gemm rc=$? after $(( $(date +%s) - t0 )) s"; smi
fi
if [ -n "$REG_OPS" ]; then
  timeout "$(left ${REG_DEADLINE:-520})" $PY -m kernels bench --ops "$REG_OPS" --compare cupy \
    --json --out "$OUT/registry.json" >"$OUT/registry.txt" 2>&1
  echo "== registry bench rc=$? after $(( $(date +%s) - t0 )) s"; smi
fi
args=()
[ -s "$OUT/llm/h200_llm.json" ] && args+=(--llm "$OUT/llm/h200_llm.json")
[ -s "$OUT/gemm/h200_bf16.json" ] && args+=(--gemm "$OUT/gemm/h200_bf16.json")
[ -s "$OUT/registry.json" ] && args+=(--registry "$OUT/registry.json")
timeout "$(left 590)" $PY benchmarks/latest.py ${args[@]+"${args[@]}"} --out "$OUT/latest.json" --plot "$OUT/roofline.png" \
  --command "OUT=\$OUT bash benchmarks/h200_latest.sh (h200_llm.py --ops $LLM_OPS --dtypes $LLM_DTYPES; h200_bf16.py${GEMM:+ GEMM=$GEMM}; kernels bench --ops ${REG_OPS:-(none)} --compare cupy)" \
  >"$OUT/latest.txt" 2>&1
echo "== merge rc=$? (inputs: ${args[*]}) after $(( $(date +%s) - t0 )) s"
grep -hE "ERROR|Traceback|Error:" "$OUT/llm.txt" "$OUT/gemm.txt" "$OUT"/registry.txt 2>/dev/null | head -10
# the device tool brings back a few files per call (2026-12-06: 8; llm/ and gemm/'s JSONs were left out): every
# input of the merge in one archive beside latest.json, latest.txt, roofline.png and nvidia-smi.csv, so a
# second call's run (LLM_OPS for the ops the first did not reach) can be merged with it by latest.py
inputs=$(cd "$OUT" && ls -d llm gemm llm.txt gemm.txt registry.json registry.txt 2>/dev/null)
if [ -n "$inputs" ] && tar -C "$OUT" -czf "$OUT/inputs.tgz" $inputs && tar -tzf "$OUT/inputs.tgz" >/dev/null; then
  (cd "$OUT" && rm -rf $inputs) && echo "the merge's inputs (the paths above, under \$OUT) are in $OUT/inputs.tgz"
fi
echo "---- nvidia-smi"; cat "$OUT/nvidia-smi.csv"
echo "---- table"; cat "$OUT/latest.txt"
exit 0

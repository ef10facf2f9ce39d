#!/usr/bin/env bash
# The twelfth session's first device call (carry .whl), under one deadline, everything packed into
# $OUT/twelfth_a.tgz: the packed register rows A/B (lab/packed_rows_ab.py, bf16 at 8192-32768 and fp16 at
# 32768), clip's table walk A/B (lab/clip_table_walk.py), then cast_fp8 fp32 on auto's vector kernels and
# the eleventh session's new GPU tests (lab/gpu_call_eleventh_fp8.sh, test_cast_fp8.py whole cut short).
#   OUT=dir bash lab/gpu_call_twelfth_a.sh
set -uo pipefail
OUT=${OUT:-/tmp/gpu-twelfth-a}; mkdir -p "$OUT/w"; t0=$(date +%s)
source benchmarks/h200_env.sh || exit 2
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader | tee "$OUT/w/gpu.txt"
OUT="$OUT/w" timeout 170 $PY lab/packed_rows_ab.py > "$OUT/w/packed.txt" 2>&1
echo "== packed bf16 rc=$? after $(( $(date +%s) - t0 )) s"
mkdir -p "$OUT/w/f16"; OUT="$OUT/w/f16" PR_DTYPES=float16 PR_COLS=32768 timeout 60 $PY lab/packed_rows_ab.py > "$OUT/w/packed-f16.txt" 2>&1
echo "== packed fp16 rc=$? after $(( $(date +%s) - t0 )) s"
OUT="$OUT/w" timeout 130 $PY lab/clip_table_walk.py > "$OUT/w/walk.txt" 2>&1
echo "== walk rc=$? after $(( $(date +%s) - t0 )) s"; tail -6 "$OUT/w/walk.txt"
OUT="$OUT/w/fp8" T_BENCH=60 T_NEW=150 T_ALL=${T_ALL:-175} bash lab/gpu_call_eleventh_fp8.sh
echo "== all after $(( $(date +%s) - t0 )) s"
grep -A40 "^op " "$OUT/w/packed.txt" | tail -40; grep -E "^(rmsnorm|layernorm|softmax) " "$OUT/w/packed-f16.txt"
tar czf "$OUT/twelfth_a.tgz" -C "$OUT" w && rm -rf "$OUT/w"

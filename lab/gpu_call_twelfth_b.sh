#!/usr/bin/env bash
# The twelfth session's second device call (carry .whl), packed into $OUT/twelfth_b.tgz: clip's table walk
# with the galloping row search (lab/clip_table_walk.py: bit for bit, then timed at Llama-3-8B / 64 and / 8),
# cast_fp8's bench rows (every dtype; fp32 on auto's vector kernels), and the fixed
# test_auto_launches_the_vector_kernels.
#   OUT=dir bash lab/gpu_call_twelfth_b.sh
set -uo pipefail
OUT=${OUT:-/tmp/gpu-twelfth-b}; mkdir -p "$OUT/w"; t0=$(date +%s)
source benchmarks/h200_env.sh || exit 2
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader | tee "$OUT/w/gpu.txt"
OUT="$OUT/w" timeout 230 $PY lab/clip_table_walk.py --iters 15 > "$OUT/w/walk.txt" 2>&1
echo "== walk rc=$? after $(( $(date +%s) - t0 )) s"
timeout 100 $PY benchmarks/h200_llm.py --out "$OUT/w/llm" --ops cast_fp8 --dtypes float32,float16,bfloat16 > "$OUT/w/llm.txt" 2>&1
echo "== bench rc=$? after $(( $(date +%s) - t0 )) s"
timeout 60 $PY -m pytest -q -p no:cacheprovider -rf tests/kernels/test_cast_fp8.py -k "auto" > "$OUT/w/pytest.txt" 2>&1
echo "== tests rc=$? after $(( $(date +%s) - t0 )) s"; tail -2 "$OUT/w/pytest.txt"
grep '^{' "$OUT/w/walk.txt"; grep -E '"op": "cast_fp8"' "$OUT/w/llm.txt" | sed 's/.*"dtype": "\([a-z0-9]*\)".*"path": "\([a-z]*\)".*"ours_us": \([0-9.]*\).*"sol": \([0-9.]*\).*"torch_ratio": \([0-9.]*\).*/cast_fp8 \1 \2 \3 us sol \4 torch \5x/'
tar czf "$OUT/twelfth_b.tgz" -C "$OUT" w && rm -rf "$OUT/w"

#!/usr/bin/env bash
# The twelfth session's clip call (carry .whl), packed into $OUT/twelfth_d.tgz: clip_grad_norm's table
# kernels with the row search as shipped: the registry bench (8 x 8388608 and Llama-3-8B / 64, every dtype,
# against CuPy), then the op's GPU tests and the replay tests of clip; then, in the time left, the packed
# layernorm probe (lab/packed_rows_ab.py: two-pass and shifted packed builds against auto's kernel).
#   OUT=dir bash lab/gpu_call_twelfth_d.sh
set -uo pipefail
OUT=${OUT:-/tmp/gpu-twelfth-d}; mkdir -p "$OUT/w"; t0=$(date +%s)
source benchmarks/h200_env.sh || exit 2
left() { local s=$(( $1 - ($(date +%s) - t0) )); echo $(( s > 1 ? s : 1 )); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/w/gpu.txt"
timeout "$(left 100)" $PY -m kernels bench --ops clip_grad_norm --compare cupy --json --out "$OUT/w/clip-bench.json" \
  > "$OUT/w/clip-bench.txt" 2>&1
echo "== bench rc=$? after $(( $(date +%s) - t0 )) s"
timeout "$(left ${T_TESTS:-290})" $PY -m pytest -q -p no:cacheprovider -rf tests/kernels/test_clip_grad_norm.py \
  tests/kernels/test_replay_gpu.py -k "clip or table or two_pass or llama or case" > "$OUT/w/pytest.txt" 2>&1
echo "== tests rc=$? after $(( $(date +%s) - t0 )) s"; tail -3 "$OUT/w/pytest.txt"
OUT="$OUT/w" PR_OPS=layernorm PR_DTYPES=bfloat16,float16 timeout "$(left ${T_PROBE:-560})" $PY lab/packed_rows_ab.py \
  > "$OUT/w/packed-layernorm.txt" 2>&1
echo "== layernorm probe rc=$? after $(( $(date +%s) - t0 )) s"; grep -A40 "^op " "$OUT/w/packed-layernorm.txt"
$PY -c "
import json; r = json.load(open('$OUT/w/clip-bench.json'))
for c in r.get('results', r if isinstance(r, list) else []):
    print(c.get('dtype'), c.get('case'), c.get('path'), c.get('ours_us') or c.get('us'), c.get('sol'), c.get('ok'), c.get('cupy_ratio') or c.get('compare'))
" 2>&1 | tail -8
tar czf "$OUT/twelfth_d.tgz" -C "$OUT" w && rm -rf "$OUT/w"

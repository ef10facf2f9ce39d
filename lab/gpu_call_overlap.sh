#!/usr/bin/env bash
# One device call (eighth session, second machine): the GPU tests of what changed since the first call
# (rmsnorm's on-chip kernels with the next row's loads in the write pass; rope's and cast_fp8's FastCache
# replay; cast_fp8's lock across its two launches, and the same test with the lock taken out, which should
# fail), the overlap variants of all three row ops (lab/onchip_prefetch.py), the host time of rope and
# cast_fp8 through their registry launch, and verify of the ops that changed. Deadlines from the start (s).
#   OUT=dir bash lab/gpu_call_overlap.sh      (carry .whl)
set -uo pipefail
OUT=${OUT:-/tmp/gpu-overlap}; mkdir -p "$OUT"; t0=$(date +%s)
source benchmarks/h200_env.sh || exit 2
left() { local s=$(( $1 - ($(date +%s) - t0) )); echo $(( s > 1 ? s : 1 )); }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader > "$OUT/nvidia-smi.csv"
timeout "$(left ${T_TESTS:-190})" $PY -m pytest -q -m "not slow" -p no:cacheprovider -rf \
  tests/kernels/test_replay_gpu.py tests/kernels/test_concurrency_gpu.py tests/kernels/test_rope.py \
  tests/kernels/test_cast_fp8.py tests/kernels/test_rmsnorm.py > "$OUT/pytest.txt" 2>&1
echo "== pytest rc=$? after $(( $(date +%s) - t0 )) s"
# the lock taken out (this copy of the tree only): the test should catch a cast reading another call's amax
cp kernels/ops/cast_fp8.py "$OUT/.cast_fp8.py.bak"
sed -i 's/    with _PAIR:  # no other/    with contextlib.nullcontext():  # no other/; s/        with _PAIR:$/        with contextlib.nullcontext():/; s/^import threading$/import contextlib\nimport threading/' kernels/ops/cast_fp8.py
grep -c "nullcontext" kernels/ops/cast_fp8.py > "$OUT/mutation.txt"
timeout "$(left ${T_MUT:-230})" $PY -m pytest -q -p no:cacheprovider tests/kernels/test_concurrency_gpu.py \
  -k fp8 >> "$OUT/mutation.txt" 2>&1
echo "== mutation (expected to fail) rc=$? after $(( $(date +%s) - t0 )) s"
mv "$OUT/.cast_fp8.py.bak" kernels/ops/cast_fp8.py; grep -c "with _PAIR" kernels/ops/cast_fp8.py >> "$OUT/mutation.txt"
OUT=$OUT OP_SHAPES=${OP_SHAPES:-261x128256,1024x128256,512x65536} OP_DTYPES=${OP_DTYPES:-bfloat16} \
  timeout "$(left ${T_PREFETCH:-420})" $PY lab/onchip_prefetch.py > "$OUT/prefetch.txt" 2>&1
echo "== prefetch rc=$? after $(( $(date +%s) - t0 )) s"
timeout "$(left ${T_OVERHEAD:-470})" $PY -c "
import json, sys
from kernels.harness import overhead
rows = overhead.registry_rows(ops=('rope', 'cast_fp8', 'rmsnorm', 'residual_add'))
json.dump(rows, open(sys.argv[1], 'w'), indent=1)
for r in rows: print(f\"{r['call']:<80}{r['median_us']:>8.2f} us (p10 {r['p10_us']:.2f}, p90 {r['p90_us']:.2f})\")
" "$OUT/overhead.json" > "$OUT/overhead.txt" 2>&1
echo "== overhead rc=$? after $(( $(date +%s) - t0 )) s"
timeout "$(left ${T_VERIFY:-530})" $PY -m kernels verify --json --ops rmsnorm,rope,cast_fp8 --shapes verify \
  > "$OUT/verify.json" 2> "$OUT/verify.err"
echo "== verify rc=$? after $(( $(date +%s) - t0 )) s"
tail -3 "$OUT/pytest.txt"; tail -3 "$OUT/mutation.txt"; grep -v "registers" "$OUT/prefetch.txt" | tail -12
cat "$OUT/overhead.txt" | tail -12

# Sourced by a device call on the H200 (bash): the Python stack the kernels need there, and nothing else.
#   source benchmarks/h200_env.sh   ->  $PY (the image's python3 with torch), PYTHONPATH with this repo and a
#   private site holding the carried numpy 2.4 (the image's numpy 2.5 breaks numba-cuda 0.30.4) and, when
#   carried, Liger-Kernel (.whl/bench/liger_kernel-*.whl, pure Python over the image's Triton).
# Carry `.whl` in the device call. Fails (return 2) when numpy 2.5+ is there and no 2.4 wheel was carried.
export PYTHONUNBUFFERED=1 XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/solfleet-h200-cache} PYTHONPATH=$PWD
export PATH=$PATH:/usr/local/cuda/bin
export PY=${PY:-python3}
_site=/tmp/solfleet-h200-site
if $PY -c "import sys, numpy; sys.exit(0 if tuple(map(int, numpy.__version__.split('.')[:2])) >= (2, 5) else 1)"; then
  _whl=$(ls .whl/numpy-2.4*cp312*manylinux*x86_64*.whl 2>/dev/null | head -1)
  if [ -z "$_whl" ]; then echo "the image's numpy breaks numba-cuda 0.30.4 and no .whl/numpy-2.4*cp312*.whl was carried"; return 2; fi
  mkdir -p "$_site" && $PY -m zipfile -e "$_whl" "$_site" || return 2
fi
for _w in .whl/bench/liger_kernel-*.whl; do [ -f "$_w" ] && mkdir -p "$_site" && $PY -m zipfile -e "$_w" "$_site"; done
[ -d "$_site" ] && export PYTHONPATH="$_site:$PYTHONPATH"
$PY -c "import numpy, numba, ml_dtypes; print('numpy', numpy.__version__, 'numba', numba.__version__, 'ml_dtypes', ml_dtypes.__version__)" 2>&1 | tail -1

#!/usr/bin/env bash
# Run ON the device machine, from the repository root, after benchmarks/gpu/wheels.sh here:
#   device tool: run(command="bash benchmarks/gpu/device-check.sh", carry=[".whl"], timeout_s=480)
# Installs the carried wheels beside the image's numba/numba-cuda/numpy/xarray, then runs
# check.py; its JSON and log land in $OUT.
set -euo pipefail
out="${OUT:-.}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv || true
python3 -c "import numba, numba_cuda, numpy; print('numba', numba.__version__, 'numba-cuda', numba_cuda.__version__, 'numpy', numpy.__version__)" || true
# The image's numba-cuda still registers np.row_stack, which its NumPy (>= 2.4) removed: alias
# it (to what NumPy deprecated it in favour of) in every process, Dask's spawned workers too.
cat > /tmp/site/sitecustomize.py <<'PY'
import numpy
if not hasattr(numpy, "row_stack"):
    numpy.row_stack = numpy.vstack
PY
python3 benchmarks/gpu/check.py --json "$out/gpu-check.json" 2>&1 | tee "$out/gpu-check.log"

#!/usr/bin/env bash
# Run HERE (a machine with the package index), before a GPU check on the device machine.
# Downloads into .whl/ the Python 3.12 wheels that the device image (PyTorch image: numba,
# numba-cuda, numpy, xarray, pandas, ... already there) lacks to import nbody_dask, at the
# versions of this environment. .whl/ is git-ignored; name it in the device call's `carry`.
set -euo pipefail
cd "$(dirname "$0")/../.."
version() { python -c "import importlib.metadata as m; print(m.version('$1'))"; }
pkgs=()
for p in dask distributed zarr numcodecs donfig google-crc32c tornado zict tblib locket partd; do
    pkgs+=("$p==$(version "$p")")
done
rm -rf .whl && mkdir .whl
python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl "${pkgs[@]}"
du -sh .whl && ls .whl

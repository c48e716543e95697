#!/usr/bin/env bash
# Build SWIFT (gravity-only runs: FFTW for the mesh, GSL, HDF5) in its source tree.
set -euo pipefail
src=${1:?usage: build.sh SWIFT_SOURCE_DIR}
cd "$src"
./autogen.sh
./configure --disable-mpi --disable-doxygen-doc --disable-vec
make -j"$(nproc)"
ls -l "$src/swift"

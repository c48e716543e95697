"""Cost of the CRC-32C that every chunk of a store carries (issue 16): write and read one
snapshot chunk of 65,536 bodies (float32, 768 KiB), zstd alone against zstd + CRC-32C.

    python benchmarks/checksum_cost.py

Prints the median time per chunk (best of three rounds of 60 writes and 60 reads). Compare
the difference with a step's time at the same N (``nbody-dask bench``): a snapshot writes
two such chunks per tile.
"""

from __future__ import annotations

import statistics
import tempfile
import time

import numpy as np
import zarr
from zarr.codecs import Crc32cCodec, ZstdCodec


def chunk_times(compressors, n: int = 65_536, rounds: int = 3, chunks: int = 60):
    tile = np.random.default_rng(0).standard_normal((n, 3)).astype(np.float32)
    best = [float("inf"), float("inf")]
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as tmp:
            array = zarr.create_array(f"{tmp}/a.zarr", shape=(chunks, n, 3),
                                      chunks=(1, n, 3), dtype="f4", compressors=compressors)
            writes, reads = [], []
            for i in range(chunks):
                start = time.perf_counter()
                array[i] = tile
                writes.append(time.perf_counter() - start)
            for i in range(chunks):
                start = time.perf_counter()
                array[i]
                reads.append(time.perf_counter() - start)
            best = [min(best[0], statistics.median(writes)),
                    min(best[1], statistics.median(reads))]
    return best


if __name__ == "__main__":
    for label, compressors in (("zstd", (ZstdCodec(),)),
                               ("zstd + crc32c", (ZstdCodec(), Crc32cCodec()))):
        write, read = chunk_times(compressors)
        print(f"{label:14s} write {write * 1e3:.3f} ms   read {read * 1e3:.3f} ms per chunk")

"""The mesh's distributed FFT (a Dask graph of slabs or pencils) against one scipy.fft call."""

from __future__ import annotations

import dask
import numpy as np
import pytest
import scipy.fft

from nbody_dask import meshfft
from nbody_dask.kernels import pm

#: Round-off of a 3-D FFT relative to its largest coefficient, by dtype.
ROUND_OFF = {"float32": 2e-6, "float64": 1e-14}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(("n", "parts", "second"), [
    (64, 1, 1), (64, 2, 1), (64, 4, 1), (64, 2, 2), (64, 4, 4), (48, 4, 2), (30, 4, 1),
    pytest.param(128, 4, 4, marks=pytest.mark.slow),
    pytest.param(256, 2, 1, marks=pytest.mark.slow),
])  # 512^3 with 1, 2 and 4 chunks an axis: benchmarks/meshfft.py
def test_the_distributed_fft_equals_scipy_fft(n, parts, second, dtype):
    mesh = np.random.default_rng(n).random((n, n, n)).astype(dtype)
    chunked = meshfft.pencils(mesh, parts, second)
    with dask.config.set(scheduler="threads"):
        spectrum = meshfft.rfftn(chunked)
        back = meshfft.irfftn(spectrum, n, chunked.chunks)
        got, back = dask.compute(spectrum, back)
    want = scipy.fft.rfftn(mesh)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.abs(got - want).max() <= ROUND_OFF[dtype] * np.abs(want).max()
    assert back.dtype == mesh.dtype and back.shape == mesh.shape
    assert np.abs(back - mesh).max() <= 10 * ROUND_OFF[dtype]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(("parts", "second"), [(1, 1), (3, 1), (2, 2)])
def test_the_distributed_long_range_force_equals_the_one_task_solve(parts, second, dtype):
    n = 32
    rng = np.random.default_rng(3)
    x, m = rng.random((3, 3000)).astype(dtype), np.full(3000, 1 / 3000, dtype=dtype)
    mesh = pm.mesh_sum(n, dtype, pm.deposit(x, m, 1.0, n, "tsc"))
    one = pm.long_range(mesh, 1.0, 2.5 / n, True, "tsc").fields
    with dask.config.set(scheduler="threads"):
        fields = np.stack(dask.compute(*meshfft.long_range(
            meshfft.pencils(mesh, parts, second), 1.0, 2.5 / n, True, "tsc")))
    assert fields.dtype == one.dtype
    assert np.abs(fields - one).max() <= 10 * ROUND_OFF[dtype] * np.abs(one).max()


@pytest.mark.parametrize("bounds", [[(0, 16), (16, 32)], [(0, 8), (8, 16), (16, 24), (24, 32)],
                                    [(0, 11), (11, 32)], [(0, 32)]])
def test_an_interpolation_reads_only_its_planes_of_the_slabs(bounds):
    """:func:`~nbody_dask.kernels.pm.span_pieces` cuts a tile's planes (every start and
    count, around the mesh) from the slabs that hold them, in the planes' order, and
    nothing more: joined, they are the planes asked for."""
    n = 32
    field = np.arange(n)
    for first in range(n):
        for count in range(1, n + 1):
            pieces = pm.span_pieces(bounds, first, count)
            joined = np.concatenate([field[bounds[j][0]:bounds[j][1]][lo:hi]
                                     for j, lo, hi in pieces])
            np.testing.assert_array_equal(joined, (first + np.arange(count)) % n)
            assert all(hi > lo for _, lo, hi in pieces)


@pytest.mark.parametrize("bounds", [[(0, 16), (16, 32)], [(0, 11), (11, 23), (23, 32)],
                                    [(0, 32)]])
@pytest.mark.parametrize("near", [(0.0, 0.1), (0.93, 1.0), (0.3, 0.55), (0.0, 1.0)])
def test_tiles_whose_planes_are_not_planned_read_the_slabs_they_need(bounds, near):
    """Where the graph is built before a tile's planes are known (individual time steps'
    ticks): each slab sums the rows of every deposit there
    (:func:`~nbody_dask.tasks.region_planes`), and each tile reads its planes of every
    slab (:func:`~nbody_dask.tasks.span_planes`): the mesh and the forces of the planned
    path, tiles across the box's face included."""
    from nbody_dask import tasks
    from nbody_dask.bodies import Tile

    n, dtype = 32, "float64"
    rng = np.random.default_rng(7)
    x = rng.random((3, 400))
    x[0] = near[0] + (near[1] - near[0]) * x[0]
    m = np.full(400, 1 / 400)
    region = pm.deposit(x, m, 1.0, n, "tsc")
    for lo, hi in bounds:
        trimmed = tasks.region_planes(region, n, lo, hi)
        assert trimmed.values.shape[0] <= region.values.shape[0]
        np.testing.assert_array_equal(pm.slab_sum(n, dtype, lo, hi, trimmed),
                                      pm.slab_sum(n, dtype, lo, hi, region))
    solved = pm.long_range(pm.mesh_sum(n, dtype, region), 1.0, 2.5 / n, True, "tsc")
    tile = Tile(0, x, np.zeros_like(x), m)
    periodic = tasks.Periodic(1.0, n, 2.5 / n, 12.5 / n, 0.5, 1, "cpu")
    span = tasks.tile_span(tile, periodic)
    pieces = [tasks.span_planes(span, field[lo:hi], bounds, j)
              for field in solved.fields for j, (lo, hi) in enumerate(bounds)]
    got = tasks.mesh_forces_from_span(tile, periodic, solved.total_mass, span, 4, bounds,
                                      *pieces)
    np.testing.assert_array_equal(got, pm.interpolate(x, m, solved, 1.0, 2.5 / n, "tsc"))

"""Bit-identical results whatever the number of workers or threads, at a fixed tile size."""

from __future__ import annotations

import numpy as np
import pytest
from distributed import Client, LocalCluster

import nbody_dask


def _final_state(tmp_path, n_workers, threads, name, **kw):
    ds = nbody_dask.plummer(700, seed=11)
    with LocalCluster(n_workers=n_workers, threads_per_worker=threads, processes=True,
                      host="127.0.0.1", dashboard_address="127.0.0.1:0") as cluster, \
            Client(cluster) as c:
        traj = nbody_dask.simulate(ds, steps=12, dt=1 / 64, softening=0.02, tile_size=128,
                                   split_every=3, store=tmp_path / name, snapshot_every=4,
                                   client=c, progress=False, **kw)
        return traj.isel(time=-1).load()


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_bit_identical_across_workers_and_threads(tmp_path, dtype):
    """700 bodies in 6 tiles (the last one short), split_every=3: two reduction levels."""
    runs = [_final_state(tmp_path, w, t, f"{w}x{t}.zarr", dtype=dtype)
            for w, t in ((1, 1), (2, 1), (1, 2))]
    for other in runs[1:]:
        for name in ("position", "velocity", "total_energy", "momentum"):
            np.testing.assert_array_equal(runs[0][name].values, other[name].values)
    assert runs[0].position.dtype == np.dtype(dtype)


def test_tiling_changes_only_round_off(client):
    """Other tile sizes change the summation order, never more than round-off."""
    ds = nbody_dask.plummer(64, seed=4)
    kw = dict(steps=30, dt=1 / 64, softening=0.05, snapshot_every=7, client=client,
              progress=False)
    one_tile = nbody_dask.simulate(ds, tile_size=64, **kw)  # runs fused
    tiled = nbody_dask.simulate(ds, tile_size=16, **kw)
    np.testing.assert_allclose(tiled.position.values, one_tile.position.values, rtol=0,
                               atol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32"])
def test_rows_layout_equals_pairs_layout_on_any_workers_and_kernel_threads(tmp_path, dtype):
    """The HPC layout (parallel kernel, a task per tile) is bit-identical to the pairs layout
    with the plain kernel, with 1 or 2 workers and 1 or 2 kernel threads (float32, whose
    SIMD lanes are twice float64's: the layout the parallel blocks are likelier to cut
    differently; float64 rows against pairs in one process: tests/test_same_bits.py)."""
    import dask

    with dask.config.set({"nbody.symmetric": False}):
        pairs = _final_state(tmp_path, 1, 2, "pairs.zarr", dtype=dtype)
    runs = []
    for workers, kernel_threads in ((1, 1), (2, 2), (2, None)):
        with dask.config.set({"nbody.kernel-threads": kernel_threads}):
            runs.append(_final_state(tmp_path, workers, 1, f"rows-{workers}-{kernel_threads}",
                                     dtype=dtype, layout="rows"))
    for rows in runs:
        assert rows.attrs["layout"] == "rows"
        for name in ("position", "velocity", "total_energy", "momentum"):
            np.testing.assert_array_equal(rows[name].values, pairs[name].values)


def test_resume_keeps_the_stored_layout(tmp_path, client):
    ds = nbody_dask.plummer(300, seed=2)
    kw = dict(dt=1 / 64, softening=0.05, tile_size=100, snapshot_every=3, client=client,
              progress=False)
    whole = nbody_dask.simulate(ds, steps=9, layout="rows", **kw).isel(time=-1)
    store = tmp_path / "part.zarr"
    with pytest.raises(_Crash):
        nbody_dask.simulate(ds, steps=9, layout="rows", store=store, **kw,
                            callback=_stop_after(3))
    with pytest.raises(ValueError, match="layout='pairs' differs from the store's"):
        nbody_dask.simulate(store=store, resume=True, layout="pairs", client=client)
    resumed = nbody_dask.simulate(store=store, resume=True, client=client, progress=False)
    assert resumed.attrs["layout"] == "rows"
    np.testing.assert_array_equal(resumed.position[-1].values, whole.position.values)


class _Crash(Exception):
    pass


def _stop_after(step):
    """A callback that stops the run (as a crash would) once ``step`` is reached."""
    def callback(at, record):
        if at >= step:
            raise _Crash
    return callback

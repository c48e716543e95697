"""The trajectory store: schema, contents, commit marker, overwrite protection."""

from __future__ import annotations

import json

import numpy as np
import pytest
import xarray as xr

import nbody_dask
from nbody_dask.storage import committed_snapshots


@pytest.fixture(scope="module")
def run(client, tmp_path_factory):
    path = tmp_path_factory.mktemp("store") / "run.zarr"
    ds0 = nbody_dask.plummer(300, seed=7)
    ds0.attrs.update(length_unit="1 pc", mass_unit="1e4 solar_mass")
    traj = nbody_dask.simulate(ds0, steps=23, dt=1 / 128, softening=0.01, store=path,
                               snapshot_every=5, tile_size=128, dtype="float32",
                               client=client, progress=False)
    return path, ds0, traj


def test_open_zarr_shows_the_schema(run):
    path, ds0, _ = run
    ds = xr.open_zarr(path)
    assert dict(ds.sizes) == {"time": 6, "body": 300, "axis": 3}
    assert ds.position.dims == ("time", "body", "axis") and ds.position.dtype == np.float32
    assert ds.velocity.dims == ("time", "body", "axis")
    assert ds.mass.dims == ("body",)
    for name in ("kinetic_energy", "potential_energy", "total_energy"):
        assert ds[name].dims == ("time",) and ds[name].dtype == np.float64
    for name in ("momentum", "angular_momentum"):
        assert ds[name].dims == ("time", "axis")
    assert list(ds.axis.values) == ["x", "y", "z"]
    np.testing.assert_array_equal(ds.step.values, [0, 5, 10, 15, 20, 23])
    np.testing.assert_allclose(ds.time.values, ds.step.values / 128)
    assert ds.time.dtype == np.float64  # not decoded as dates
    np.testing.assert_array_equal(ds.body.values, ds0.body.values)
    assert ds.position.encoding["chunks"] == (1, 128, 3)
    assert ds.position.encoding["compressors"]  # compressed
    attrs = ds.attrs
    assert attrs["G"] == 1.0 and attrs["softening"] == 0.01 and attrs["dt"] == 1 / 128
    assert attrs["integrator"] == "leapfrog-kdk" and attrs["dtype"] == "float32"
    assert attrs["nbody_dask_version"] == nbody_dask.__version__
    assert attrs["units"] == ds0.attrs["units"]
    assert attrs["length_unit"] == "1 pc" and attrs["mass_unit"] == "1e4 solar_mass"
    assert "time_unit" not in attrs  # copied only when declared
    assert json.loads(attrs["config"])["steps"] == 23


def test_every_snapshot_committed_and_complete(run):
    path, ds0, traj = run
    assert committed_snapshots(path) == 6
    assert bool(np.isfinite(traj.position).all()) and bool(np.isfinite(traj.velocity).all())
    np.testing.assert_array_equal(traj.position.isel(time=0).values,
                                  ds0.position.values.astype(np.float32))
    np.testing.assert_array_equal(traj.total_energy.values,
                                  traj.kinetic_energy.values + traj.potential_energy.values)


def test_last_snapshot_is_the_final_state(client, run, tmp_path):
    """Restarting from snapshot k and running on reproduces the continuous run exactly."""
    path, _, traj = run
    restart = nbody_dask.simulate(traj.isel(time=2), steps=13, dt=1 / 128, softening=0.01,
                                  snapshot_every=5, tile_size=128, dtype="float32",
                                  client=client, progress=False)
    assert restart.time.values[0] == traj.time.values[2]
    for name in ("position", "velocity"):
        np.testing.assert_array_equal(restart[name].isel(time=-1).values,
                                      traj[name].isel(time=-1).values)


def test_simulate_returns_what_open_trajectory_reads(run):
    path, _, traj = run
    again = nbody_dask.open_trajectory(path)
    xr.testing.assert_identical(traj.load(), again.load())


def test_existing_store_is_not_overwritten(client, run):
    path, ds0, _ = run
    before = xr.open_zarr(path).position.values
    with pytest.raises(FileExistsError, match="overwrite=True"):
        nbody_dask.simulate(ds0, steps=1, dt=0.1, store=path, client=client, progress=False)
    np.testing.assert_array_equal(xr.open_zarr(path).position.values, before)


def test_overwrite_replaces_store(client, tmp_path):
    path = tmp_path / "x.zarr"
    ds = nbody_dask.uniform_cube(10, seed=1)
    nbody_dask.simulate(ds, steps=4, dt=0.01, store=path, snapshot_every=1, client=client,
                        progress=False)
    traj = nbody_dask.simulate(ds, steps=2, dt=0.01, store=path, overwrite=True, client=client,
                               progress=False)
    assert traj.sizes["time"] == 2 and committed_snapshots(path) == 2


def test_overwrite_with_another_shape_and_chunking(client, tmp_path):
    """Workers cache array handles; a store recreated at the same path must not reuse them
    (a regression: 3 snapshots into a store that had 2 failed, other tiles mis-chunked)."""
    path = tmp_path / "again.zarr"
    ds = nbody_dask.plummer(300, seed=4)
    kw = dict(dt=0.01, softening=0.05, client=client, progress=False)
    nbody_dask.simulate(ds, steps=2, snapshot_every=2, tile_size=100, store=path, **kw)
    again = nbody_dask.simulate(ds, steps=6, snapshot_every=2, tile_size=64, store=path,
                                overwrite=True, **kw)
    fresh = nbody_dask.simulate(ds, steps=6, snapshot_every=2, tile_size=64,
                                store=tmp_path / "fresh.zarr", **kw)
    assert again.sizes["time"] == 4
    np.testing.assert_array_equal(xr.open_zarr(path).position.values, fresh.position.values)


def test_overwrite_refuses_a_non_store(client, tmp_path):
    precious = tmp_path / "thesis"
    precious.mkdir()
    (precious / "chapter1.tex").write_text("irreplaceable")
    with pytest.raises(ValueError, match="not a Zarr store"):
        nbody_dask.simulate(nbody_dask.uniform_cube(4), steps=1, dt=0.1, store=precious,
                            overwrite=True, client=client, progress=False)
    assert (precious / "chapter1.tex").read_text() == "irreplaceable"


def test_open_trajectory_shows_only_committed_snapshots(run, tmp_path):
    import shutil

    import zarr

    path, _, _ = run
    copy = tmp_path / "copy.zarr"
    shutil.copytree(path, copy)
    zarr.open_group(copy, mode="r+", use_consolidated=False)["nbody"].attrs["committed"] = 3
    assert nbody_dask.open_trajectory(copy).sizes["time"] == 3


def test_open_trajectory_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no trajectory store"):
        nbody_dask.open_trajectory(tmp_path / "missing.zarr")
    xr.Dataset({"a": ("x", [1, 2])}).to_zarr(tmp_path / "other.zarr", zarr_format=3,
                                             consolidated=False)
    with pytest.raises(ValueError, match="not an nbody_dask trajectory store"):
        nbody_dask.open_trajectory(tmp_path / "other.zarr")


def test_without_store_returns_trajectory_in_memory(client):
    traj = nbody_dask.simulate(nbody_dask.kepler(0.3), steps=10, dt=0.01, snapshot_every=5,
                               client=client, progress=False)
    assert traj.sizes["time"] == 3
    assert not traj.position.chunks  # loaded: the temporary store is gone


@pytest.mark.parametrize("kind", ["isolated", "box", "comoving"])
def test_one_body_of_id_0_runs_and_reads_back(client, kind):
    """A chunk equal to the fill value (the body id 0 of a single body) is still written, so
    the store is not taken for damaged."""
    if kind == "comoving":
        bodies = nbody_dask.cosmological_ics(2, 100.0, z_start=20).compute().isel(body=[0])
        kw = {"steps": 2, "softening": 1.0}
    else:
        bodies = nbody_dask.make_bodies([[0.5, 0.5, 0.5]], [[0.1, 0.0, 0.0]], [1.0])
        kw = {"steps": 2, "dt": 0.1, **({"box_size": 1.0} if kind == "box" else {})}
    traj = nbody_dask.simulate(bodies, client=client, progress=False, **kw)
    assert traj.sizes["body"] == 1 and int(traj.body[0]) == 0
    assert np.isfinite(traj.position.values).all()


def test_a_run_of_no_steps_at_time_0_stores_its_one_snapshot(client, store):
    traj = nbody_dask.simulate(nbody_dask.plummer(10), steps=0, dt=0.1, client=client,
                               progress=False, store=store)
    assert traj.sizes["time"] == 1 and float(traj.time[0]) == 0 and int(traj.step[0]) == 0
    assert nbody_dask.verify_trajectory(store) == 1

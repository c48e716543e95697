"""Body sets from and to files: .npz, netCDF, Zarr, and trajectory snapshots."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import nbody_dask
from nbody_dask.bodyfiles import load_bodies, save_bodies


@pytest.mark.parametrize("name", ["ic.npz", "ic.nc", "ic.zarr"])
def test_round_trip(tmp_path, name):
    ds = nbody_dask.plummer(37, seed=1)
    path = save_bodies(ds, tmp_path / name)
    back = load_bodies(path)
    for var in ("position", "velocity", "mass"):
        np.testing.assert_array_equal(back[var].values, ds[var].values)
    with pytest.raises(FileExistsError, match="overwrite"):
        save_bodies(ds, tmp_path / name)
    save_bodies(nbody_dask.plummer(5, seed=2), tmp_path / name, overwrite=True)
    assert load_bodies(tmp_path / name).sizes["body"] == 5


def test_npz_with_positions_only(tmp_path):
    np.savez(tmp_path / "p.npz", position=np.eye(3))
    ds = load_bodies(tmp_path / "p.npz")
    assert ds.mass.values.sum() == pytest.approx(1.0)
    assert np.all(ds.velocity.values == 0)


def test_plain_xarray_zarr_dataset(tmp_path):
    ds = nbody_dask.uniform_cube(11, seed=3)
    ds = ds.assign_coords(axis=np.array(["x", "y", "z"], dtype=object))
    ds.to_zarr(tmp_path / "plain", zarr_format=3, consolidated=False)  # no .zarr suffix
    np.testing.assert_array_equal(load_bodies(tmp_path / "plain").position, ds.position)


def test_snapshot_of_a_trajectory_continues_the_run(tmp_path):
    ds = nbody_dask.plummer(64, seed=4)
    store = tmp_path / "run.zarr"
    nbody_dask.simulate(ds, steps=8, dt=0.01, softening=0.05, store=store, snapshot_every=4,
                        progress=False)
    traj = nbody_dask.open_trajectory(store)
    last = load_bodies(store)
    assert float(last.time) == pytest.approx(0.08)
    np.testing.assert_array_equal(last.position.values, traj.position.isel(time=-1).values)
    middle = load_bodies(store, snapshot=1)
    np.testing.assert_array_equal(middle.position.values, traj.position.isel(time=1).values)
    with pytest.raises(ValueError, match=r"snapshot must be in \[-3, 2\].*got 3"):
        load_bodies(store, snapshot=3)
    # bit-identical continuation: 4 steps from the middle snapshot equal steps 4..8
    cont = nbody_dask.simulate(middle, steps=4, dt=0.01, softening=0.05, progress=False)
    np.testing.assert_array_equal(cont.position.isel(time=-1).values,
                                  traj.position.isel(time=-1).values)
    assert float(cont.time[-1]) == pytest.approx(0.08)


def test_netcdf_trajectory_like_dataset(tmp_path):
    traj = xr.concat([nbody_dask.plummer(9, seed=s).expand_dims(time=[float(s)])
                      for s in range(3)], dim="time")
    traj["mass"] = traj.mass.isel(time=0)
    traj.attrs = {}
    traj.to_netcdf(tmp_path / "t.nc")
    ds = load_bodies(tmp_path / "t.nc", snapshot=0)
    np.testing.assert_array_equal(ds.position.values, nbody_dask.plummer(9, seed=0).position)


@pytest.mark.parametrize("name, error, match", [
    ("missing.npz", FileNotFoundError, "no body file at"),
    ("bodies.txt", ValueError, "cannot tell the format"),
])
def test_load_errors(tmp_path, name, error, match):
    (tmp_path / "bodies.txt").write_text("1 2 3")
    with pytest.raises(error, match=match):
        load_bodies(tmp_path / name)


def test_npz_without_positions(tmp_path):
    np.savez(tmp_path / "bad.npz", pos=np.eye(3))
    with pytest.raises(ValueError, match=r"no 'position' array; it has \['pos'\]"):
        load_bodies(tmp_path / "bad.npz")


def test_save_never_replaces_a_foreign_directory(tmp_path):
    (tmp_path / "data.zarr").mkdir()
    (tmp_path / "data.zarr" / "precious.txt").write_text("keep")
    with pytest.raises(ValueError, match="not a Zarr store"):
        save_bodies(nbody_dask.plummer(3), tmp_path / "data.zarr", overwrite=True)
    assert (tmp_path / "data.zarr" / "precious.txt").read_text() == "keep"


@pytest.mark.parametrize("url", ["s3://bucket/ic.zarr", "S3://bucket/ic.npz",
                                 "gs://bucket/out.hdf5"])
def test_body_files_are_never_written_to_a_local_folder_named_like_a_url(tmp_path, url,
                                                                          monkeypatch):
    """save_bodies refuses object-store URLs in one line instead of writing ./s3:/bucket/...
    (issue 33, item 2)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"body files are written to local paths"):
        save_bodies(nbody_dask.plummer(8, seed=0), url)
    assert list(tmp_path.iterdir()) == []


def test_a_body_set_never_replaces_a_trajectory(client, tmp_path):
    store = tmp_path / "run.zarr"
    nbody_dask.simulate(nbody_dask.plummer(16, seed=0), steps=2, dt=0.01, store=store,
                        client=client, progress=False)
    with pytest.raises(ValueError, match="is a trajectory store"):
        save_bodies(nbody_dask.plummer(16, seed=0), store, overwrite=True)
    assert nbody_dask.open_trajectory(store).sizes["time"] == 2


def test_a_lazy_ic_set_is_written_to_zarr_without_gathering_and_reads_back(tmp_path):
    import dask

    import nbody_dask

    ics = nbody_dask.cosmological_ics(8, 50.0, z_start=20, seed=3)
    path = tmp_path / "ics.zarr"
    with dask.config.set(scheduler="threads"):
        save_bodies(ics, path)
    back = load_bodies(path)
    want = ics.compute()
    for name in ("position", "velocity", "mass"):
        np.testing.assert_array_equal(back[name].values, want[name].values)
    assert float(back.time) == float(want.time) and back.attrs["cosmology"]
    broken = ics.assign(mass=ics.mass * np.nan)
    with pytest.raises(ValueError, match="bodies.mass has non-finite values"):
        save_bodies(broken.chunk({"body": 128}), tmp_path / "broken.zarr")

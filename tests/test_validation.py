"""Bad input gets a clear error naming the parameter and value, before any work starts."""

from __future__ import annotations

import numpy as np
import pytest

import nbody_dask


def _good():
    return nbody_dask.uniform_cube(8, seed=0)


def _with(var, index, value):
    ds = _good().copy(deep=True)
    ds[var].values[index] = value
    return ds


def _mapping(**overrides):
    ds = _good()
    base = {"position": ds.position.values, "velocity": ds.velocity.values,
            "mass": ds.mass.values}
    base.update(overrides)
    return base


BAD_BODIES = [
    (_with("position", (3, 1), np.nan), ValueError, r"position has 1 non-finite.*\(3, 1\).*nan"),
    (_with("position", (0, 0), np.inf), ValueError, r"position has 1 non-finite.*inf"),
    (_with("velocity", (2, 2), -np.inf), ValueError, r"velocity has 1 non-finite"),
    (_with("mass", 4, -1.0), ValueError, r"mass must be >= 0; body 4 has mass -1\.0"),
    (_with("mass", slice(None), 0.0), ValueError, r"total mass must be > 0, got 0\.0"),
    (_mapping(velocity=np.zeros((7, 3))), ValueError,
     r"velocity has shape \(7, 3\) but position has shape \(8, 3\)"),
    (_mapping(mass=np.ones(9)), ValueError, r"mass must have shape \(8,\).*got \(9,\)"),
    (_mapping(position=np.zeros((8, 2))), ValueError, r"position must have shape \(n, 3\)"),
    (_mapping(position=np.zeros((0, 3)), velocity=np.zeros((0, 3)), mass=np.zeros(0)),
     ValueError, "at least one body"),
    (_mapping(mass=np.array(["a"] * 8)), TypeError, "mass must hold real numbers"),
    ({"position": np.zeros((2, 3))}, ValueError, r"missing key\(s\) \['velocity', 'mass'\]"),
    (np.zeros((8, 3)), TypeError, "bodies must be an xarray.Dataset"),
]


@pytest.mark.parametrize(("bodies", "error", "match"), BAD_BODIES)
def test_bad_bodies(no_cluster, store, bodies, error, match):
    with pytest.raises(error, match=match):
        nbody_dask.simulate(bodies, steps=1, dt=0.1, store=store, progress=False)
    assert not store.exists()


BAD_PARAMETERS = [
    (dict(steps=-1), ValueError, r"steps must be >= 0, got -1"),
    (dict(steps=2.5), TypeError, r"steps must be an integer, got 2\.5"),
    (dict(steps=True), TypeError, r"steps must be an integer, got True"),
    (dict(dt=0.0), ValueError, r"dt must be > 0, got 0\.0"),
    (dict(dt=-0.1), ValueError, r"dt must be > 0, got -0\.1"),
    (dict(dt=float("nan")), ValueError, r"dt must be finite, got nan"),
    (dict(dt=float("inf")), ValueError, r"dt must be finite, got inf"),
    (dict(dt="0.1"), TypeError, r"dt must be a real number, got '0\.1'"),
    (dict(softening=-0.01), ValueError, r"softening must be >= 0, got -0\.01"),
    (dict(softening=float("nan")), ValueError, r"softening must be finite"),
    (dict(dtype="float16"), ValueError, r"dtype must be 'float32' or 'float64', got 'float16'"),
    (dict(dtype="banana"), ValueError, r"dtype must be .*got 'banana'"),
    (dict(dtype=np.int32), ValueError, r"dtype must be 'float32' or 'float64'"),
    (dict(tile_size=0), ValueError, r"tile_size must be >= 1, got 0"),
    (dict(tile_size=-5), ValueError, r"tile_size must be >= 1, got -5"),
    (dict(tile_size=1.5), TypeError, r"tile_size must be an integer"),
    (dict(snapshot_every=0), ValueError, r"snapshot_every must be >= 1, got 0"),
    (dict(split_every=1), ValueError, r"split_every must be >= 2, got 1"),
    (dict(G=0.0), ValueError, r"G must be > 0, got 0\.0"),
    (dict(layout="grid"), ValueError, r"layout must be one of \('pairs', 'rows'\), got 'grid'"),
    (dict(layout="rows", backend="cuda"), ValueError, r"layout='rows' runs the parallel CPU"),
    (dict(overwrite="yes"), TypeError, r"overwrite must be True or False"),
    (dict(store=42), TypeError, r"store must be a path"),
    (dict(client="tcp://nowhere:1"), TypeError, r"client must be a distributed.Client"),
]


@pytest.mark.parametrize(("kwargs", "error", "match"), BAD_PARAMETERS)
def test_bad_parameters(no_cluster, store, kwargs, error, match):
    args = dict(steps=1, dt=0.1, store=store, progress=False)
    args.update(kwargs)
    with pytest.raises(error, match=match):
        nbody_dask.simulate(_good(), **args)
    assert not store.exists()


def test_bad_input_to_one_shot_apis(no_cluster):
    with pytest.raises(ValueError, match="softening must be >= 0"):
        nbody_dask.accelerations(_good(), -1.0)
    with pytest.raises(ValueError, match="non-finite"):
        nbody_dask.potential_energy(_with("position", (0, 0), np.nan))


@pytest.mark.parametrize(("call", "match"), [
    (lambda: nbody_dask.plummer(0), r"n must be >= 1, got 0"),
    (lambda: nbody_dask.uniform_cube(-3), r"n must be >= 1, got -3"),
    (lambda: nbody_dask.kepler(1.0), r"eccentricity must be < 1"),
    (lambda: nbody_dask.kepler(-0.1), r"eccentricity must be >= 0"),
    (lambda: nbody_dask.kepler(0.1, masses=(1.0, 0.0)), r"masses\[1\] must be > 0"),
])
def test_bad_initial_condition_parameters(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_store_inside_a_file_is_refused(no_cluster, tmp_path):
    blocker = tmp_path / "results"
    blocker.write_text("not a folder")
    with pytest.raises(ValueError, match="is a file"):
        nbody_dask.simulate(_good(), steps=1, dt=0.1, store=blocker / "run.zarr")
    assert blocker.read_text() == "not a folder"


@pytest.fixture
def finished_store(client, tmp_path):
    store = tmp_path / "done.zarr"
    nbody_dask.simulate(_good(), steps=4, dt=0.01, store=store, snapshot_every=2,
                        client=client, progress=False)
    return store


def _corrupt_marker(store):
    import zarr
    zarr.open_group(store, mode="r+", use_consolidated=False)["nbody"].attrs["committed"] = 99


def _delete_array(store):
    import shutil
    shutil.rmtree(store / "velocity")


def _garble_root_metadata(store):
    (store / "zarr.json").write_text("{ not json")


@pytest.mark.parametrize(("damage", "match"), [
    (_corrupt_marker, r"damaged: commit marker says committed=99 of snapshots=3"),
    (_delete_array, r"damaged"),
    (_garble_root_metadata, r"not an nbody_dask trajectory store|damaged"),
])
def test_damaged_store_is_reported(client, finished_store, damage, match):
    damage(finished_store)
    with pytest.raises(ValueError, match=match):
        nbody_dask.open_trajectory(finished_store)
    with pytest.raises(ValueError, match=match):
        nbody_dask.simulate(store=finished_store, resume=True, client=client)


def test_resume_of_another_dtype_or_size_is_refused(client, finished_store):
    with pytest.raises(ValueError, match=r"resume: dtype='float32' differs .*'float64'"):
        nbody_dask.simulate(store=finished_store, resume=True, dtype="float32", client=client)
    with pytest.raises(ValueError, match=r"resume: tile_size=3 differs"):
        nbody_dask.simulate(store=finished_store, resume=True, tile_size=3, client=client)
    with pytest.raises(ValueError, match=r"resume: steps=10 differs from the store's steps=4"):
        nbody_dask.simulate(store=finished_store, resume=True, steps=10, client=client)


def test_conflicting_options(no_cluster, store):
    with pytest.raises(ValueError, match="resume=True needs store="):
        nbody_dask.simulate(resume=True)
    with pytest.raises(TypeError, match=r"simulate\(\) needs bodies, steps, dt"):
        nbody_dask.simulate()
    with pytest.raises(TypeError, match="callback must be callable"):
        nbody_dask.simulate(_good(), steps=1, dt=0.1, callback=3)


@pytest.fixture
def tiny_mount(tmp_path):
    """A small tmpfs (root only; skipped where mounting is not allowed)."""
    import subprocess

    mounts = []

    def mount(options):
        target = tmp_path / f"mnt{len(mounts)}"
        target.mkdir()
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)],
                              capture_output=True)
        if proc.returncode != 0:
            pytest.skip("cannot mount a tmpfs here (needs root)")
        mounts.append(target)
        return target

    yield mount
    for target in mounts:
        subprocess.run(["umount", str(target)], check=False)


def test_read_only_location_is_refused_before_work(no_cluster, tiny_mount):
    target = tiny_mount("ro,size=256k")
    with pytest.raises(PermissionError, match="is not writable"):
        nbody_dask.simulate(_good(), steps=1, dt=0.1, store=target / "run.zarr")


def test_full_disk_keeps_committed_snapshots(client, tiny_mount):
    """The disk fills mid-run: a clear error, committed snapshots intact and readable."""
    target = tiny_mount("size=1m")
    store = target / "run.zarr"
    ds = nbody_dask.uniform_cube(2000, seed=1)  # ~100 KB per snapshot: full after ~8 of 41
    with pytest.raises(OSError, match=r"writing to the store .* failed .*No space left.* "
                                      r"committed and intact: fix the cause, then resume"):
        nbody_dask.simulate(ds, steps=40, dt=1e-3, store=store, snapshot_every=1,
                            client=client, progress=False)
    traj = nbody_dask.open_trajectory(store).load()
    assert 1 <= traj.sizes["time"] < 41
    assert np.isfinite(traj.position.values).all()
    np.testing.assert_array_equal(traj.position.values[0], ds.position.values)


@pytest.mark.parametrize("command", [["run", "--no-progress"], ["ic", "plummer", "ic.npz"],
                                     ["accuracy", "plummer"]])
def test_too_many_bodies_for_this_machine_is_one_line_before_allocating(tmp_path, command,
                                                                        monkeypatch):
    """`--n 1000000000000` ended in a 30-line MemoryError traceback (issue 33, item 8)."""
    from click.testing import CliRunner

    from nbody_dask.cli import main

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, [*command, "--n", "1000000000000"])
    assert result.exit_code == 1, result.output
    line = result.output.strip().splitlines()[-1]
    assert line.startswith("Error: n=1000000000000 needs about ") and "TiB of memory for the " \
        "initial conditions, more than the " in line, result.output
    with pytest.raises(MemoryError, match=r"n=10000000000000 needs about 2.27 PiB"):
        nbody_dask.plummer(10**13)

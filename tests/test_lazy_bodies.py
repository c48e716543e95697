"""Lazy body sets (Dask arrays: cosmological ICs, ``xr.open_zarr`` of a body set): checked
and cut into tiles on the cluster, never gathered by the driver, the same bits as in
memory."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import nbody_dask
from nbody_dask.bodies import is_lazy, lazy_bodies

_RUN = dict(steps=4, dt=1 / 64, softening=0.02, snapshot_every=2, tile_size=100,
            progress=False)


@pytest.fixture
def never_gathered(monkeypatch):
    """Any Dask-backed DataArray or Variable of more than 64 values read into the driver
    (``.values``, ``np.asarray``) fails the test."""
    for kind in (xr.DataArray, xr.Variable):
        values = kind.values

        def guarded(self, values=values):
            if self.chunks is not None and self.size > 64:
                raise AssertionError(f"{getattr(self, 'name', 'a variable')} ({self.size} "
                                     "values) gathered by the driver")
            return values.fget(self)

        monkeypatch.setattr(kind, "values", property(guarded, values.fset))
    yield
    monkeypatch.undo()


def test_a_lazy_body_set_runs_as_the_same_set_in_memory(client, tmp_path, never_gathered):
    bodies = nbody_dask.plummer(300, seed=1)
    lazy = bodies.chunk({"body": 70})  # chunks that are not the tiles
    assert is_lazy(lazy) and not is_lazy(bodies)
    got = nbody_dask.simulate(lazy, store=tmp_path / "lazy.zarr", client=client, **_RUN)
    want = nbody_dask.simulate(bodies, store=tmp_path / "memory.zarr", client=client, **_RUN)
    for name in ("position", "velocity", "mass", "total_energy", "momentum"):
        np.testing.assert_array_equal(got[name].load().data, want[name].load().data)


def test_cosmological_ics_run_from_the_cluster_as_from_memory(client, tmp_path,
                                                                never_gathered):
    """A comoving TreePM run from the ICs' graph (canonical momenta made by the workers)
    equals the run from the same ICs computed first."""
    ics = nbody_dask.cosmological_ics(8, 100.0, "Planck18", z_start=20, seed=2)
    kw = dict(steps=3, softening=0.5, snapshot_every=3, client=client, progress=False,
              dtype="float32", method="treepm")
    assert ics.body.chunks is not None and "body" not in ics.xindexes  # ids never held here
    got = nbody_dask.simulate(ics, store=tmp_path / "lazy.zarr", **kw)
    want = nbody_dask.simulate(ics.compute(), store=tmp_path / "memory.zarr", **kw)
    for name in ("position", "velocity", "mass", "time"):
        np.testing.assert_array_equal(got[name].load().data, want[name].load().data)
    # the ids written by the workers; the trajectory of lazy bodies keeps them unindexed
    assert "body" not in got.xindexes and "body" in want.xindexes
    np.testing.assert_array_equal(got.body.load().data, np.arange(8**3))


@pytest.mark.parametrize("variable, index, value, match", [
    ("mass", (5,), -1.0, "mass must be >= 0; body 5 has mass -1.0"),
    ("position", (7, 1), np.nan, r"position has 1 non-finite value\(s\); first at index "
                                 r"\(7, 1\): nan"),
    ("velocity", (2, 0), np.inf, r"velocity has 1 non-finite value\(s\); first at index "
                                 r"\(2, 0\): inf"),
])
def test_bad_values_of_a_lazy_set_are_named_before_anything_is_written(
        client, tmp_path, variable, index, value, match):
    bodies = nbody_dask.plummer(300, seed=1)
    bodies[variable][index] = value
    with pytest.raises(ValueError, match=match):
        nbody_dask.simulate(bodies.chunk({"body": 70}), store=tmp_path / "bad.zarr",
                            client=client, **_RUN)
    assert not (tmp_path / "bad.zarr").exists()


def test_a_lazy_set_is_checked_for_what_the_dtype_holds(client):
    bodies = nbody_dask.plummer(100, seed=1)
    bodies["velocity"][3, 2] = 1e39
    with pytest.raises(ValueError, match=r"velocity reaches 1e\+39, beyond what float32"):
        nbody_dask.simulate(bodies.chunk({"body": 30}), dtype="float32", client=client,
                            **_RUN)


def test_the_structure_of_a_lazy_set_is_checked_without_computing_it():
    bodies = nbody_dask.plummer(50, seed=1).chunk({"body": 20})
    with pytest.raises(ValueError, match="bodies.mass must have dims"):
        lazy_bodies(bodies.assign(mass=(("body", "extra"), bodies.mass.data[:, None])))
    with pytest.raises(TypeError, match="mass must hold real numbers, got dtype bool"):
        lazy_bodies(bodies.assign(mass=bodies.mass > 0))
    flat = xr.Dataset({"position": (("body", "axis"), bodies.position.data[:, :2]),
                       "velocity": (("body", "axis"), bodies.velocity.data[:, :2]),
                       "mass": ("body", bodies.mass.data)})
    with pytest.raises(ValueError, match=r"position must have shape \(n, 3\), got \(50, 2\)"):
        lazy_bodies(flat)
    checked = lazy_bodies(bodies)
    assert is_lazy(checked) and checked.position.dtype == np.float64


def _with_ids(bodies, ids, chunk):
    """``bodies`` in chunks of ``chunk``, with the lazy unindexed ids ``ids``."""
    import dask.array as da

    return bodies.chunk({"body": chunk}).drop_vars("body").assign_coords(
        xr.Coordinates({"body": ("body", da.from_array(ids, chunks=chunk))}, indexes={}))


def test_lazy_ids_are_checked_on_the_cluster_and_written_by_it(client, tmp_path,
                                                                never_gathered):
    """Lazy ids that ascend are checked from three numbers a chunk; others are gathered to
    find repeats; either way the store holds them as given."""
    bodies = nbody_dask.plummer(300, seed=1)
    ascending = _with_ids(bodies, np.arange(300) * 3 + 7, 70)
    assert lazy_bodies(ascending).body.chunks is not None
    traj = nbody_dask.simulate(ascending, store=tmp_path / "ascending.zarr", client=client,
                               **_RUN)
    np.testing.assert_array_equal(traj.body.load().data, np.arange(300) * 3 + 7)
    np.testing.assert_array_equal(traj.position.load().data, nbody_dask.simulate(
        bodies, store=tmp_path / "memory.zarr", client=client, **_RUN).position.load().data)


@pytest.mark.parametrize("ids, ascending", [
    (np.arange(300)[::-1], False),  # unique, descending: gathered and checked
    (np.r_[np.arange(0, 140), np.arange(100, 260)], False),  # each chunk ascends, not all
    (np.r_[np.arange(0, 140), np.arange(140, 300)], True),
])
def test_the_summary_says_whether_lazy_ids_ascend(client, ids, ascending):
    import dask

    from nbody_dask.bodies import check_values, summarize

    ds = lazy_bodies(_with_ids(nbody_dask.plummer(300, seed=1), ids, 70))
    with dask.config.set(scheduler=client):
        summary = summarize(ds)
        assert summary.ids_ascending is ascending
        if len(np.unique(ids)) == len(ids):
            check_values(ds, summary)
        else:
            with pytest.raises(ValueError, match=r"body ids must be unique; repeated: "
                                                 r"\[100, 101, 102, 103, 104\]"):
                check_values(ds, summary)


def test_lazy_ids_that_repeat_are_refused_before_anything_is_written(client, tmp_path):
    bodies = nbody_dask.plummer(300, seed=1)
    ids = np.r_[np.arange(0, 140), np.arange(100, 260)]
    with pytest.raises(ValueError, match=r"body ids must be unique; repeated: \[100,"):
        nbody_dask.simulate(_with_ids(bodies, ids, 70), store=tmp_path / "bad.zarr",
                            client=client, **_RUN)
    assert not (tmp_path / "bad.zarr").exists()
    with pytest.raises(TypeError, match="body ids must be integers, got dtype float64"):
        lazy_bodies(_with_ids(bodies, np.arange(300.0), 70))


def test_the_checks_read_a_lazy_set_once(client, tmp_path):
    """The value checks before a run (finite values, masses, what the dtype holds) compute
    each chunk of a lazy set once: a Zarr set is read once, an IC graph run once."""
    import dask
    import dask.array as da

    from nbody_dask.arguments import check_on_cluster
    from nbody_dask.plan import Plan

    bodies = nbody_dask.plummer(300, seed=1)
    log = tmp_path / "reads"  # written where the chunks are computed
    log.touch()

    def chunk(name, lo, hi):
        with open(log, "a") as f:
            f.write(f"{name} {lo}\n")
        return bodies[name].values[lo:hi]

    def lazy(name):
        shape = bodies[name].shape
        parts = [da.from_delayed(dask.delayed(chunk)(name, lo, min(lo + 100, shape[0])),
                                 (min(lo + 100, shape[0]) - lo, *shape[1:]), np.float64)
                 for lo in range(0, shape[0], 100)]
        return (bodies[name].dims, da.concatenate(parts))

    ds = lazy_bodies(xr.Dataset({name: lazy(name) for name in ("position", "velocity",
                                                                 "mass")}))
    with dask.config.set(scheduler=client):
        check_on_cluster(ds, Plan(n=300, steps=1, dt=0.01, dtype="float32"))
    assert sorted(log.read_text().split("\n")[:-1]) == sorted(
        f"{name} {lo}" for name in ("position", "velocity", "mass") for lo in (0, 100, 200))


def test_forces_of_a_lazy_set_are_those_of_the_set_in_memory(client, never_gathered):
    """accelerations and potential_energy read a lazy set on the cluster, as simulate does:
    the same bits as from memory; its bad values named."""
    bodies = nbody_dask.plummer(300, seed=2)
    lazy = bodies.chunk({"body": 70})
    kw = dict(softening=0.02, tile_size=100, client=client)
    np.testing.assert_array_equal(nbody_dask.accelerations(lazy, **kw),
                                  nbody_dask.accelerations(bodies, **kw))
    assert nbody_dask.potential_energy(lazy, **kw) == nbody_dask.potential_energy(bodies,
                                                                                  **kw)
    bodies["mass"][4] = -1.0
    with pytest.raises(ValueError, match="mass must be >= 0; body 4 has mass -1.0"):
        nbody_dask.accelerations(bodies.chunk({"body": 70}), **kw)

"""Friends-of-friends halos (nbody_dask.halos) against a brute-force search of the whole box."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
import xarray as xr
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from scipy.spatial import cKDTree

import nbody_dask as nb
from nbody_dask.halos import mass_function


def _brute_force(ds, b, min_members, box):
    x = ds.position.values
    n = len(x)
    pairs = cKDTree(x, boxsize=box).query_pairs(b * box / n ** (1 / 3), output_type="ndarray")
    graph = coo_matrix((np.ones(len(pairs)), (pairs[:, 0], pairs[:, 1])), shape=(n, n))
    _, label = connected_components(graph, directed=False)
    counts = np.bincount(label)
    ids = ds.body.values
    lowest = np.full(counts.size, np.iinfo(np.int64).max)
    np.minimum.at(lowest, label, ids)
    big = np.flatnonzero(counts >= min_members)
    order = np.lexsort((lowest[big], -counts[big]))
    return counts[big][order], lowest[big][order]


@pytest.fixture(scope="module")
def clumps():
    return nb.plummer_clumps(20_000, seed=3)


@pytest.mark.parametrize("slabs", [1, 2, 3, 7])
def test_halos_equal_a_brute_force_search_on_any_number_of_slabs(clumps, slabs):
    halos = nb.friends_of_friends(clumps, 0.2, 20, box_size=1.0, slabs=slabs)
    members, ids = _brute_force(clumps, 0.2, 20, 1.0)
    assert len(members) > 10
    np.testing.assert_array_equal(halos.members.values, members)
    np.testing.assert_array_equal(halos.id.values, ids)
    one = nb.friends_of_friends(clumps, 0.2, 20, box_size=1.0, slabs=1)
    np.testing.assert_allclose(halos.position.values, one.position.values, rtol=0, atol=1e-12)
    np.testing.assert_allclose(halos.mass.values, one.mass.values, rtol=1e-12)
    assert halos.attrs["linking_length"] == pytest.approx(0.2 / 20_000 ** (1 / 3))


def test_a_halo_across_the_box_faces_has_its_centre_in_the_box():
    """One Plummer clump centred on a corner of the box: its bodies are wrapped to all eight
    corners, and it is one halo whose centre is the corner, whatever the slabs."""
    rng = np.random.default_rng(0)
    clump = nb.plummer(3000, seed=1)
    x = np.mod(clump.position.values * 0.01, 1.0)  # centred on (0, 0, 0)
    background = rng.uniform(0, 1, (2000, 3))
    position = np.concatenate([x, background])
    velocity = np.concatenate([clump.velocity.values + [1.0, 2.0, 3.0],
                               np.zeros((2000, 3))])
    ds = nb.make_bodies(position, velocity, np.full(5000, 1 / 5000))
    for slabs in (1, 2, 4):
        halos = nb.friends_of_friends(ds, 0.2, 100, box_size=1.0, slabs=slabs)
        assert halos.sizes["halo"] == 1
        centre = halos.position.values[0]
        assert ((centre >= 0) & (centre < 1)).all()
        distance = centre - np.round(centre)  # from the nearest corner
        assert np.abs(distance).max() < 2e-3
        np.testing.assert_allclose(halos.velocity.values[0], [1, 2, 3], atol=0.05)
        assert halos.members.values[0] >= 2900


def test_halos_are_bit_identical_on_any_scheduler(clumps):
    import dask

    with dask.config.set(scheduler="synchronous"):
        one = nb.friends_of_friends(clumps, box_size=1.0, slabs=3)
    with dask.config.set(scheduler="threads", num_workers=4):
        four = nb.friends_of_friends(clumps, box_size=1.0, slabs=3)
    for name in ("members", "mass", "position", "velocity"):
        np.testing.assert_array_equal(one[name].values, four[name].values)


def test_the_mass_function_counts_every_halo(clumps):
    halos = nb.friends_of_friends(clumps, box_size=1.0)
    hmf = mass_function(halos, 4)
    assert int(hmf["count"].sum()) == halos.sizes["halo"]
    widths = np.diff(np.log10(hmf.mass_edges.values))
    assert float((hmf.dn_dlog10m * widths).sum()) == pytest.approx(halos.sizes["halo"])


@pytest.mark.parametrize("kwargs, match", [({"linking_length": 0.0}, "linking_length"),
                                           ({"min_members": 0}, "min_members"),
                                           ({"slabs": 100}, "slabs must be <="),
                                           ({"box_size": None}, "box_size is needed"),
                                           ({"linking_length": 30.0}, "quarter of the box")])
def test_bad_halo_arguments_are_refused_by_name(kwargs, match):
    ds = nb.uniform_cube(1000, seed=1)
    args = {"box_size": 1.0, **kwargs}
    with pytest.raises((TypeError, ValueError), match=match):
        nb.friends_of_friends(ds, **args)


def test_a_box_without_halos_gives_an_empty_catalogue():
    ds = xr.Dataset({"position": (("body", "axis"), np.random.default_rng(1).random((500, 3))),
                     "velocity": (("body", "axis"), np.zeros((500, 3))),
                     "mass": ("body", np.ones(500))}, coords={"body": np.arange(500)})
    halos = nb.friends_of_friends(ds, 0.05, 5, box_size=1.0)
    assert halos.sizes["halo"] == 0
    with pytest.raises(ValueError, match="no halos"):
        mass_function(halos)


@pytest.fixture(scope="module")
def cosmological_run(tmp_path_factory):
    store = tmp_path_factory.mktemp("halos") / "box.zarr"
    ics = nb.cosmological_ics(16, 32.0, z_start=30, seed=5)
    nb.simulate(ics, steps=12, softening=0.06, snapshot_every=6, store=store, progress=False,
                dtype="float32")
    return store


def test_cli_halos_writes_a_catalogue_and_a_mass_function_plot(cosmological_run, tmp_path):
    from click.testing import CliRunner

    from nbody_dask.cli import main

    table, figure = tmp_path / "halos.csv", tmp_path / "hmf.png"
    result = CliRunner().invoke(main, ["halos", str(cosmological_run), "--min-members", "8",
                                       "--out", str(table), "--plot", str(figure)])
    assert result.exit_code == 0, result.output
    found = nb.friends_of_friends(nb.open_trajectory(cosmological_run).isel(time=-1),
                                  min_members=8)
    assert found.sizes["halo"] >= 3
    assert result.output.startswith(f"{found.sizes['halo']} halos of >= 8 bodies at z = 0")
    assert "Msun/h" in result.output and figure.stat().st_size > 0
    import pandas as pd

    saved = pd.read_csv(table)
    np.testing.assert_array_equal(saved["members"].values, found.members.values)
    bad = CliRunner().invoke(main, ["halos", str(cosmological_run), "--out", "x.txt"])
    assert bad.exit_code == 1 and "must end in .nc or .csv" in bad.output


def test_a_store_opened_without_its_body_index_gives_the_same_analyses(cosmological_run):
    """What the CLI's ``power`` and ``halos`` open (no body index, read 8 bytes a body into
    the driver): the same halos, ids included, and the same spectrum."""
    indexed = nb.open_trajectory(cosmological_run).isel(time=-1)
    lazy = nb.open_trajectory(cosmological_run, index=False).isel(time=-1)
    assert "body" not in lazy.indexes and isinstance(lazy.body.data, da.Array)
    found, again = (nb.friends_of_friends(ds, min_members=8) for ds in (indexed, lazy))
    assert found.sizes["halo"] >= 3
    xr.testing.assert_identical(again, found)
    xr.testing.assert_identical(nb.power_spectrum(lazy, 32), nb.power_spectrum(indexed, 32))


def test_power_spectrum_plot_has_a_measured_and_a_linear_line_a_snapshot(cosmological_run):
    from nbody_dask import plot

    traj = nb.open_trajectory(cosmological_run)
    fig = plot.power_spectra(traj)
    lines = fig.axes[0].get_lines()
    assert len(lines) == 2 * traj.sizes["time"] + 1  # measured, linear; the shot noise
    with pytest.raises(ValueError, match="cosmological runs"):
        plot.power_spectra(traj.assign_attrs(cosmology=None).drop_attrs())

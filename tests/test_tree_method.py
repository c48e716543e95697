"""method="tree" through the public API: spatial tiles, body order, determinism, resume."""

from __future__ import annotations

import math
import re
import signal
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
import xarray as xr
from distributed import Client, LocalCluster

import nbody_dask
from nbody_dask.accuracy import force_errors
from nbody_dask.bodies import Tile, split_tiles
from nbody_dask.plan import TREE_CROSSOVER, Plan
from nbody_dask.spatial import (bounding_cube, cut_by_splitters, key_sample, merge_parts,
                                sample_stride, splitters, tile_extent)
from nbody_dask.testing import direct_sum_reference

ALL_OPENED = 1e-9  # an opening angle that opens every cell: the tree is direct summation


def _oracle(ds, softening):
    acc, phi = direct_sum_reference(ds.position.values, ds.mass.values, softening)
    return acc, 0.5 * float(np.sum(ds.mass.values * phi))


@pytest.mark.parametrize(("n", "tile_size"), [(1, None), (2, None), (3, 1), (97, 20),
                                              (1000, 1000), (1003, 250)])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_every_cell_opened_is_direct_summation_on_any_tiling(client, n, tile_size, dtype):
    """Spatial tiles, routing back to body order and the reduction lose nothing: with every
    cell opened the tree equals the float64 oracle to the dtype's round-off."""
    ds = nbody_dask.plummer(n, seed=n) if n > 2 else nbody_dask.uniform_cube(n, seed=1)
    kw = dict(method="tree", theta=ALL_OPENED, tile_size=tile_size, dtype=dtype,
              client=client)
    acc = nbody_dask.accelerations(ds, 0.05, **kw)
    ref, energy = _oracle(ds, 0.05)
    assert acc.dtype == np.dtype(dtype) and acc.shape == (n, 3)
    tol = 1e-12 if dtype == "float64" else 1e-5
    np.testing.assert_allclose(acc, ref, rtol=0, atol=tol * max(np.abs(ref).max(), 1e-300))
    w = nbody_dask.potential_energy(ds, 0.05, **kw)
    # the self terms are removed as in the direct kernel: m / eps, rounded (M = 1)
    assert w == pytest.approx(energy, rel=tol, abs=tol / 0.05)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_default_accuracy_on_spatial_tiles(client, dtype):
    """At the default theta, forces on 6 spatial tiles (walks across tiles) meet the
    accuracy the single-tree kernel meets, and the potential energy is close."""
    ds = nbody_dask.plummer(6000, seed=3)
    acc = nbody_dask.accelerations(ds, 0.0, method="tree", tile_size=1000, dtype=dtype,
                                   client=client)
    errors = force_errors(ds, acc, sample=500)
    assert errors.median <= 3e-4 and errors.p99 <= 3e-3, errors
    w_tree = nbody_dask.potential_energy(ds, 0.01, method="tree", tile_size=1000,
                                         dtype=dtype, client=client)
    w_direct = nbody_dask.potential_energy(ds, 0.01, method="direct", client=client)
    assert w_tree == pytest.approx(w_direct, rel=1e-4)


def test_coincident_bodies_without_softening_stay_finite(client):
    ds = nbody_dask.make_bodies(np.zeros((50, 3)) + [1.0, 2.0, 3.0])
    acc = nbody_dask.accelerations(ds, method="tree", tile_size=10, client=client)
    assert np.array_equal(acc, np.zeros((50, 3)))
    assert nbody_dask.potential_energy(ds, method="tree", tile_size=10, client=client) == 0.0


# -- spatial tiles ---------------------------------------------------------------------------

def _retile(tiles: list[Tile], n: int) -> list[Tile]:
    """The re-tiling graph's functions, called in order."""
    cube = bounding_cube(*map(tile_extent, tiles))
    stride = sample_stride(n, len(tiles))
    split = splitters(len(tiles), *(key_sample(t, cube, stride) for t in tiles))
    cuts = [cut_by_splitters(t, cube, split) for t in tiles]
    return [merge_parts(*(c[new] for c in cuts)) for new in range(len(tiles))]


def test_retiling_does_not_depend_on_the_tiles_before():
    """Re-tiling a body set gives the same tiles however it was tiled before: what makes a
    resume (from tiles in body order) bit-identical to the run it continues."""
    ds = nbody_dask.plummer(5000, seed=9)
    by_order = _retile(split_tiles(ds, 1250, np.float64), 5000)
    shuffled = ds.isel(body=np.random.default_rng(0).permutation(5000))
    tiles = [t.evolve(ids=shuffled.body.values[t.start:t.start + t.size])
             for t in split_tiles(shuffled, 1250, np.float64)]
    again = _retile(_retile(tiles, 5000), 5000)  # from shuffled tiles, then from spatial ones
    for a, b in zip(by_order, again, strict=True):
        np.testing.assert_array_equal(a.ids, b.ids)
        np.testing.assert_array_equal(a.position, b.position)
        np.testing.assert_array_equal(a.velocity, b.velocity)
    sizes = [t.size for t in by_order]
    assert sum(sizes) == 5000 and min(sizes) > 0.8 * 1250 and max(sizes) < 1.2 * 1250
    # spatial: in a uniform cube, 4 tiles along the Morton curve are compact (about its
    # quarters), their bodies much nearer their centre than the cube's are to its centre
    cube = nbody_dask.uniform_cube(4000, seed=1)

    def spread(position):  # (3, n)
        return np.median(np.linalg.norm(position - position.mean(axis=1)[:, None], axis=0))

    quarters = _retile(split_tiles(cube, 1000, np.float64), 4000)
    whole = spread(cube.position.values.T)
    assert all(spread(t.position) < 0.75 * whole for t in quarters)


def test_retiling_coincident_bodies_leaves_no_tile_empty():
    tiles = split_tiles(nbody_dask.make_bodies(np.ones((40, 3))), 10, np.float64)
    new = _retile(tiles, 40)
    assert [t.size for t in new] == [10, 10, 10, 10]
    assert sorted(np.concatenate([t.ids for t in new]).tolist()) == list(range(40))


# -- simulate() ------------------------------------------------------------------------------

def _run(client, ds, **kw):
    kw = {**dict(steps=12, dt=1 / 64, softening=0.02, snapshot_every=4, tile_size=200,
                 method="tree", progress=False, client=client), **kw}
    return nbody_dask.simulate(ds, **kw)


def test_store_keeps_body_order_and_the_method(client, tmp_path):
    """The tree's state is tiled in space, the store in the user's order: each body id is
    the same body at every time, close to the direct run's."""
    ds = nbody_dask.plummer(700, seed=11)
    ds = ds.assign_coords(body=np.arange(700)[::-1] * 3)  # ids that are not 0..n-1
    tree = _run(client, ds, store=tmp_path / "t.zarr")
    direct = _run(client, ds, method="direct")
    assert tree.attrs["method"] == "tree" and tree.attrs["theta"] == 0.4
    assert tree.attrs["leaf_size"] == 64 and direct.attrs["method"] == "direct"
    np.testing.assert_array_equal(tree.body.values, ds.body.values)
    np.testing.assert_array_equal(tree.position[0].values, ds.position.values)
    assert float(np.abs(tree.position - direct.position).max()) < 1e-4
    # the energies and momenta are those of body order and close to direct summation's
    np.testing.assert_allclose(tree.total_energy, direct.total_energy, rtol=1e-4)
    assert nbody_dask.verify_trajectory(tmp_path / "t.zarr") == 4
    reopened = xr.open_zarr(tmp_path / "t.zarr")
    assert reopened.attrs["method"] == "tree"


def _final(n_workers, threads, processes, tmp_path, name, dtype):
    where = {"host": "127.0.0.1"} if processes else {}
    with LocalCluster(n_workers=n_workers, threads_per_worker=threads, processes=processes,
                      dashboard_address="127.0.0.1:0", **where) as cluster, \
            Client(cluster) as c:
        traj = _run(c, nbody_dask.plummer(700, seed=11), store=tmp_path / name, dtype=dtype,
                    split_every=3)
        return traj.isel(time=-1).load()


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_tree_bit_identical_across_workers_and_threads(tmp_path, dtype):
    """4 spatial tiles re-cut 5 times: one worker with 1 or 2 threads, two worker processes."""
    runs = [_final(w, t, p, tmp_path, f"{w}-{t}-{p}.zarr", dtype)
            for w, t, p in ((1, 1, False), (1, 2, False), (2, 1, True))]
    for other in runs[1:]:
        for name in ("position", "velocity", "total_energy", "momentum"):
            np.testing.assert_array_equal(runs[0][name].values, other[name].values)


class _Crash(Exception):
    pass


def test_resume_after_a_crash_is_bit_identical(client, tmp_path):
    ds = nbody_dask.plummer(700, seed=5)
    whole = _run(client, ds, store=tmp_path / "whole.zarr").load()
    store = tmp_path / "part.zarr"

    def crash(step, record):
        if step >= 5:
            raise _Crash

    with pytest.raises(_Crash):
        _run(client, ds, store=store, callback=crash)
    with pytest.raises(ValueError, match="method='direct' differs from the store's"):
        nbody_dask.simulate(store=store, resume=True, method="direct", client=client)
    resumed = nbody_dask.simulate(store=store, resume=True, client=client, progress=False)
    assert resumed.attrs["method"] == "tree"
    for name in ("position", "velocity", "total_energy", "momentum", "angular_momentum"):
        np.testing.assert_array_equal(resumed[name].values, whole[name].values)


CLI_RUN = ["--ic", "plummer", "--n", "800", "--seed", "4", "--steps", "150", "--dt",
           "0.0078125", "--softening", "0.05", "--snapshot-every", "5", "--tile-size", "200",
           "--method", "tree", "--no-progress"]


@pytest.fixture(scope="module")
def cli_reference(tmp_path_factory):
    """An uninterrupted CLI run of the tree on 4 spatial tiles."""
    store = tmp_path_factory.mktemp("tree-reference") / "ref.zarr"
    subprocess.run([sys.executable, "-m", "nbody_dask.cli", "run", *CLI_RUN, "--store",
                    str(store)], check=True, timeout=300)
    return nbody_dask.open_trajectory(store).load()


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "code"), [(signal.SIGKILL, -9), (signal.SIGTERM, 143)])
@pytest.mark.xdist_group("cli-reference")  # one process runs the reference
def test_interrupted_driver_resumed_is_bit_identical(tmp_path, cli_reference, signum, code,
                                                     interrupt_cli_run):
    """A CLI driver running the tree is SIGKILLed (no chance to clean up) or SIGTERMed
    (commits and exits) after 3 snapshots, then resumed: the store equals an uninterrupted
    run's, re-tiles included."""
    from nbody_dask.storage import committed_snapshots

    store = tmp_path / "interrupted.zarr"
    returncode, err = interrupt_cli_run(["run", *CLI_RUN, "--store", str(store)], store, 3,
                                        signum)
    assert returncode == code, err
    if signum == signal.SIGTERM:
        assert "interrupted by SIGTERM" in err and "Traceback" not in err
    assert 3 <= committed_snapshots(store) < cli_reference.sizes["time"]
    subprocess.run([sys.executable, "-m", "nbody_dask.cli", "resume", str(store),
                    "--no-progress"], check=True, timeout=300)
    got = nbody_dask.open_trajectory(store).load()
    for name in ("position", "velocity", "total_energy", "momentum"):
        np.testing.assert_array_equal(got[name].values, cli_reference[name].values,
                                      err_msg=name)


@pytest.mark.slow
def test_body_trajectories_stay_continuous_over_many_retilings(client):
    """Re-cut every step for 60 steps: no body swaps ids (each body's move between snapshots
    is bounded by the fastest speed times the time between them)."""
    import dask

    ds = nbody_dask.plummer(1500, seed=8)
    with dask.config.set({"nbody.retile-every": 1}):
        traj = _run(client, ds, steps=60, snapshot_every=2, tile_size=300).load()
    step = traj.position.diff("time")
    jump = np.sqrt((step**2).sum("axis")).max("body")
    speed = np.sqrt((traj.velocity**2).sum("axis")).max("body")
    dt = np.diff(traj.time.values)
    assert (jump.values <= 1.5 * speed.values[1:] * dt).all()


def test_auto_picks_by_the_measured_crossover(capsys, client):
    below = nbody_dask.plummer(TREE_CROSSOVER - 1, seed=1)
    small = nbody_dask.simulate(below, steps=1, dt=1 / 64, client=client, progress=False)
    assert small.attrs["method"] == "direct"
    above = nbody_dask.plummer(TREE_CROSSOVER, seed=1)
    big = nbody_dask.simulate(above, steps=1, dt=1 / 64, client=client, progress=True)
    assert big.attrs["method"] == "tree"
    err = capsys.readouterr().err
    assert "forces by the tree" in err and f"method='auto': {TREE_CROSSOVER} bodies >=" in err


@pytest.mark.parametrize(("kw", "match"), [
    (dict(method="barnes-hut"), "method must be one of"),
    (dict(method="tree", theta=0.0), "theta must be > 0"),
    (dict(method="tree", theta=1.5), r"theta must be in \(0, 1\], got 1.5"),
    (dict(method="tree", leaf_size=0), "leaf_size must be >= 1"),
    (dict(method="tree", backend="cuda"), "method='tree' runs on CPUs"),
])
def test_bad_tree_parameters_are_refused_before_any_work(no_cluster, kw, match):
    with pytest.raises((ValueError, TypeError), match=match):
        nbody_dask.simulate(nbody_dask.plummer(10, seed=0), steps=1, dt=0.1, **kw)


def test_plan_re_tiles_at_snapshots_and_every_interval():
    plan = Plan(n=1000, steps=25, dt=0.1, snapshot_every=7, tile_size=250, method="tree",
                retile_every=10)
    assert plan.spatial and plan.retile_steps() == {0, 7, 10, 14, 20, 21, 25}
    assert not Plan(n=1000, steps=25, dt=0.1, tile_size=1000, method="tree").spatial
    assert Plan(n=1000, steps=25, dt=0.1, tile_size=250).retile_steps() == frozenset()
    assert [plan.window_end(s) for s in (0, 6, 7, 20, 21, 25)] == [6, 6, 9, 20, 24, 25]
    assert not plan.near_far and plan.n_tiles < plan.near_far_tiles == 32
    assert Plan(n=1000, steps=25, dt=0.1, tile_size=250, method="tree",
                near_far_tiles=4).near_far


def test_spatial_plans_are_built_in_pieces():
    from nbody_dask.graph import initial_graph, steps_graph

    plan = Plan(n=1000, steps=25, dt=0.1, tile_size=250, method="tree")
    with pytest.raises(ValueError, match="initial_pieces"):
        initial_graph(plan, "tok", ["a"] * 4)
    with pytest.raises(ValueError, match="steps_pieces"):
        steps_graph(plan, "tok", ["a"] * 4, 1, 2, frozenset())


def test_cli_runs_the_tree_and_reports_its_accuracy(tmp_path):
    from click.testing import CliRunner

    from nbody_dask.cli import main

    store = tmp_path / "cli.zarr"
    runner = CliRunner()
    result = runner.invoke(main, ["run", "--n", "900", "--steps", "4", "--snapshot-every", "2",
                                  "--tile-size", "300", "--method", "tree", "--theta", "0.5",
                                  "--store", str(store), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "forces       tree (theta = 0.5, leaf_size = 64)" in result.output
    result = runner.invoke(main, ["accuracy", str(store), "--sample", "200"])
    assert result.exit_code == 0, result.output
    line = result.output.strip()
    assert line.startswith("tree: relative force error over 200 targets: median")
    median = float(line.split("median ")[1].split(",")[0])
    assert 0 < median < 1e-3
    # every cell opened: direct summation's accuracy, on initial conditions given by kind
    result = runner.invoke(main, ["accuracy", "plummer", "-n", "500", "--method", "tree",
                                  "--theta", "1e-9", "--sample", "100"])
    assert result.exit_code == 0, result.output
    assert float(result.output.split("max ")[1]) < 1e-12
    result = runner.invoke(main, ["accuracy", "plummer", "-n", "500", "--theta", "2"])
    assert result.exit_code == 1 and "theta must be in (0, 1], got 2.0" in result.output


def test_tree_tile_sizes():
    from nbody_dask.plan import auto_tile_size

    assert auto_tile_size(16_384, 2, method="tree", workers=2) == 16_384  # one fused tile
    # one worker: one tile (its walk on all threads) up to TREE_ONE_TILE_MAX
    assert auto_tile_size(4_194_304, 2, method="tree") == 4_194_304
    assert auto_tile_size(16_777_216, 64, method="tree") == 1_048_576  # at most 1M a tile
    assert auto_tile_size(1_048_576, 2, method="tree", workers=2) == 349_526  # 9 walks
    assert auto_tile_size(4_194_304, 2, method="tree", workers=2) == 1_048_576
    assert auto_tile_size(1_048_576, 64, method="tree", workers=8) == 65_536  # 16 tiles
    # rows: a tile per worker, at most TREE_ONE_TILE_MAX a tile
    rows = dict(method="tree", layout="rows")
    assert auto_tile_size(1_048_576, 16, workers=16, **rows) == 65_536
    assert auto_tile_size(16_384, 4, workers=4, **rows) == 16_384
    assert auto_tile_size(10**8, 4, workers=4, **rows) == 8_333_334  # 12 tiles


@pytest.mark.slow
def test_bodies_move_between_tiles_in_blocks_with_the_same_bits(client, monkeypatch):
    """16 spatial tiles: re-tiling and routing to body order take an old tile's parts for 2
    new tiles in one task (T x 8 tasks, not T**2); the run is bit-identical to taking every
    part alone."""
    kw = dict(steps=4, snapshot_every=2, tile_size=50, dtype="float32")
    plan = Plan(n=800, steps=4, dt=1.0, method="tree", tile_size=50)
    assert plan.shuffle_blocks() == [(lo, lo + 2) for lo in range(0, 16, 2)]
    assert [len(Plan(n=t, steps=1, dt=1.0, tile_size=1).shuffle_blocks())
            for t in (1, 7, 8, 64, 256, 1000)] == [1, 7, 8, 16, 32, 67]
    blocked = _run(client, _clumps(800), **kw).load()
    monkeypatch.setattr(Plan, "shuffle_blocks",
                        lambda self: [(i, i + 1) for i in range(self.n_tiles)])
    single = _run(client, _clumps(800), **kw).load()
    np.testing.assert_array_equal(blocked.body.values, np.arange(800))
    for name in ("position", "velocity", "potential_energy"):
        np.testing.assert_array_equal(blocked[name].values, single[name].values)


def test_rows_layout_runs_a_task_per_tile_a_step():
    """With "rows", a step of a near/far window is a drift, a refit tree, a summary and a row
    task per tile and the forest: no task per tile pair, whatever the near sets."""
    from nbody_dask import graph
    from nbody_dask.methods.tree import TreeWindow

    t = 8
    plan = Plan(n=4000, steps=20, dt=0.1, method="tree", layout="rows", tile_size=500,
                near_far_tiles=2)
    window = TreeWindow([f"tree-{i}" for i in range(t)], [list(range(i + 1))
                                                          for i in range(t)])
    piece = next(graph.steps_pieces(plan, "tok", [f"tile-{i}" for i in range(t)],
                                    window, 2, 3, frozenset()))
    assert piece.fetch is None and len(piece.graph) == 2 * (4 * t + 1)
    assert plan.tasks_per_step() == 4 * t + 1 + math.ceil((4 * t + t * t + 2) / 10)
    pairs = replace(plan, layout="pairs")  # a walk per near pair, a far task, a kick
    piece = next(graph.steps_pieces(pairs, "tok", [f"tile-{i}" for i in range(t)],
                                    window, 2, 3, frozenset()))
    assert len(piece.graph) == 2 * (4 * t + 1 + sum(range(1, t + 1)) + (t - 1))


@pytest.mark.slow
def test_snapshots_record_the_sampled_force_errors(client, tmp_path):
    """force_error_sample: each snapshot stores the median, p99 and max force error of the
    same sampled bodies, equal to force_errors() on that snapshot's state; resumed runs go
    on recording; the CLI shows the worst."""
    from click.testing import CliRunner

    from nbody_dask.accuracy import force_errors
    from nbody_dask.cli import main

    ds = nbody_dask.plummer(900, seed=3)
    store = tmp_path / "errors.zarr"

    def crash(step, record):
        assert record is None or record["force_error"].shape == (3,)
        if step >= 4:
            raise _Crash

    with pytest.raises(_Crash):
        _run(client, ds, store=store, force_error_sample=150, callback=crash)
    with pytest.raises(ValueError, match="force_error_sample=7 differs from the store's"):
        nbody_dask.simulate(store=store, resume=True, force_error_sample=7, client=client)
    traj = nbody_dask.simulate(store=store, resume=True, client=client, progress=False).load()
    assert list(traj.statistic.values) == ["median", "p99", "max"]
    assert traj.attrs["force_error_sample"] == 150
    for t in (0, traj.sizes["time"] - 1):
        snap = nbody_dask.accelerations(traj.isel(time=t), 0.02, method="tree",
                                        tile_size=200, client=client)
        want = force_errors(traj.isel(time=t), snap, softening=0.02, sample=150)
        np.testing.assert_allclose(traj.force_error[t].values, [want.median, want.p99,
                                                                want.max], rtol=1e-6)
        assert 1e-6 < want.median < 3e-4
    direct = _run(client, ds, method="direct", dtype="float64", force_error_sample=150)
    assert float(direct.force_error.max()) < 1e-13
    assert "force_error" not in _run(client, ds)  # only when asked
    result = CliRunner().invoke(main, ["info", str(store)])
    assert result.exit_code == 0 and "(150 sampled bodies)" in result.output, result.output
    with pytest.raises(ValueError, match="force_error_sample must be >= 0, got -1"):
        _run(client, ds, force_error_sample=-1)


def test_progress_shows_force_errors_also_when_the_energy_is_zero(client):
    """A massless body beside one at rest: E0 = 0, so the bar has no energy error to show,
    only the recorded force error (this once raised KeyError)."""
    ds = nbody_dask.make_bodies(position=[[0.0, 0, 0], [1, 0, 0]],
                                velocity=[[0.0, 0, 0], [0, 0, 0]], mass=[1.0, 0.0])
    traj = nbody_dask.simulate(ds, steps=2, dt=0.01, progress=True, force_error_sample=2,
                               method="direct", client=client)
    assert float(traj.total_energy[0]) == 0 and float(traj.force_error.max()) < 1e-15


# -- near and far tile pairs ------------------------------------------------------------------

NEAR_FAR = {"nbody.near-far-tiles": 2}  # classify even 8 tiles (default: from 32)


def _clumps(n=1600, seed=2, fast=1.0):
    """Two Plummer spheres 16 apart (a merger's start): their tiles are far from each
    other's. ``fast`` scales the velocities."""
    ds = nbody_dask.merger(n, seed=seed, separation=16.0)
    return ds.assign(velocity=ds.velocity * fast)


def _counting_far_walks(monkeypatch):
    """Count the far walks (the kernel is looked up when a far task runs, in this process:
    the cluster's workers are threads)."""
    from nbody_dask.kernels import tree

    calls = []
    original = tree.far_walk

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(tree, "far_walk", counted)
    return calls


@pytest.mark.slow
def test_near_far_equals_walking_every_pair(client, monkeypatch):
    """8 spatial tiles re-cut 3 times, far pairs from tree summaries: the trajectory of
    walking every pair, to round-off (the same cells are accepted, summed in another
    order); the "rows" layout gives the "pairs" layout's bits."""
    import dask

    far_tasks = _counting_far_walks(monkeypatch)
    with dask.config.set(NEAR_FAR):
        near_far = _run(client, _clumps(), dtype="float64").load()
        rows = _run(client, _clumps(), dtype="float64", layout="rows").load()
    assert far_tasks  # the far pairs were evaluated from summaries, after every re-tiling
    every = _run(client, _clumps(), dtype="float64").load()  # 8 < 32 tiles: every pair
    for name in ("position", "velocity", "potential_energy"):
        np.testing.assert_allclose(near_far[name], every[name], rtol=1e-12, atol=1e-13)
        # "rows": a task per target tile, summed in the same groups: the same bits
        np.testing.assert_array_equal(rows[name].values, near_far[name].values)


def _near_far_final(n_workers, processes, path):
    import dask

    where = {"host": "127.0.0.1"} if processes else {}
    with dask.config.set(NEAR_FAR), \
            LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=processes,
                         dashboard_address="127.0.0.1:0", **where) as cluster, \
            Client(cluster) as c:
        return _run(c, _clumps(), store=path, dtype="float32").load()


@pytest.mark.slow
def test_near_far_bit_identical_across_workers_and_after_a_crash(tmp_path):
    """Near/far classifications fetched by the driver repeat exactly: one worker, two
    worker processes, and a run crashed after its second snapshot then resumed."""
    import dask

    one = _near_far_final(1, False, tmp_path / "one.zarr")
    two = _near_far_final(2, True, tmp_path / "two.zarr")
    store = tmp_path / "crashed.zarr"

    def crash(step, record):
        if step >= 5:
            raise _Crash

    with dask.config.set(NEAR_FAR), LocalCluster(n_workers=1, threads_per_worker=2,
                                                 processes=False) as cluster, \
            Client(cluster) as c:
        with pytest.raises(_Crash):
            _run(c, _clumps(), store=store, dtype="float32", callback=crash)
        resumed = nbody_dask.simulate(store=store, resume=True, client=c,
                                      progress=False).load()
    for other in (two, resumed):
        for name in ("position", "velocity", "total_energy", "momentum"):
            np.testing.assert_array_equal(one[name].values, other[name].values,
                                          f"{name} {'two' if other is two else 'resumed'}")


@pytest.mark.slow
def test_a_window_whose_far_tiles_bodies_outrun_walks_every_pair(client, monkeypatch):
    """Classified as if the bodies were at rest, fast bodies make a far walk need bodies it
    does not have: the driver restarts from the last snapshot, walks every pair in that
    window (saying so) and the trajectory is that of walking every pair. With the motion
    margin the same run needs no restart."""
    import dask
    import warnings

    from nbody_dask import tasks

    fast = _clumps(fast=40.0)
    kw = dict(steps=8, snapshot_every=4, dtype="float64")
    every = _run(client, fast, **kw).load()
    with dask.config.set(NEAR_FAR):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no restart
            margin = _run(client, fast, **kw).load()
        monkeypatch.setattr(tasks, "near_in_window",
                            lambda forest, theta, duration, *motions:
                            tasks.near_now(forest, theta))
        with pytest.warns(RuntimeWarning, match=r"outran|margin") as caught:
            outrun = _run(client, fast, **kw).load()
    assert any(re.search(r"walking every tile pair in steps [15]-[37]", str(w.message))
               for w in caught)
    for got in (margin, outrun):
        np.testing.assert_allclose(got.position, every.position, rtol=1e-12, atol=1e-12)


def test_the_reason_auto_gives_names_the_crossover_it_used():
    """In a periodic box ``auto`` chooses by the periodic crossover, and says so."""
    from nbody_dask.plan import PERIODIC_CROSSOVER, Plan
    from nbody_dask.session import describe_method

    box = Plan(n=4096, steps=1, dt=0.1, method="treepm", box_size=1.0).settle(2, 1, "cpu")
    assert describe_method(box, "auto").endswith(
        f"(method='auto': 4096 bodies >= {PERIODIC_CROSSOVER})")
    sphere = Plan(n=4096, steps=1, dt=0.1, softening=0.01, method="direct").settle(2, 1, "cpu")
    assert describe_method(sphere, "auto").endswith(
        f"(method='auto': 4096 bodies < {TREE_CROSSOVER})")

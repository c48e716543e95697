"""The task graphs built from a plan: shape, keys, and the layouts' equal arithmetic."""

from __future__ import annotations

import numpy as np
import pytest
from dask.core import get_dependencies

import nbody_dask
from nbody_dask.bodies import split_tiles
from nbody_dask.graph import execute, fused_steps, initial_graph, snapshot_graph, steps_graph
from nbody_dask.plan import Plan


def _tiles(n, tile_size, dtype=np.float64):
    return split_tiles(nbody_dask.plummer(n, seed=1), tile_size, dtype)


def _plan(n, tile_size, **kw):
    return Plan(n=n, steps=10, dt=0.01, softening=kw.pop("softening", 0.0),
                tile_size=tile_size, **kw)


def _forced(plan, tiles, with_potential=True):
    """Initial tiles with forces, computed in place."""
    inputs = {f"in-{i}": t for i, t in enumerate(tiles)}
    dsk, keys = initial_graph(plan, "tok", list(inputs), with_potential)
    return [execute(dsk, k, inputs) for k in keys]


def _stages(dsk):
    return [k.split("-")[1] for k in dsk]


@pytest.mark.parametrize(("n_tiles", "split_every", "combines"),
                         [(2, 8, 0), (5, 8, 0), (9, 8, 9 * 2), (9, 3, 9 * 3)])
@pytest.mark.parametrize("symmetric", [False, True])
def test_step_graph_shape(n_tiles, split_every, combines, symmetric):
    plan = _plan(10 * n_tiles, 10, split_every=split_every, symmetric=symmetric)
    state = [f"state-{i}" for i in range(n_tiles)]
    dsk, out = steps_graph(plan, "tok", state, 1, 1, frozenset())
    stages = _stages(dsk)
    assert len(dsk) == plan.tasks_per_step()
    assert stages.count("drift") == stages.count("kick") == n_tiles
    pairs = n_tiles * (n_tiles + 1) // 2 if symmetric else n_tiles**2
    assert stages.count("pair") == pairs
    assert sum(s.startswith("combine") for s in stages) == combines
    assert out == [f"nbody-kick-tok-1-{i}" for i in range(n_tiles)]
    for name in dsk:  # no task gathers more than split_every partials, plus its own tile
        assert len(get_dependencies({**dsk, **dict.fromkeys(state)}, name)) <= split_every + 1


def test_rows_step_graph_is_two_tasks_per_tile_and_a_few_blocks():
    plan = _plan(50, 10, layout="rows")
    dsk, out = steps_graph(plan, "tok", [f"s-{i}" for i in range(5)], 1, 3, frozenset({3}))
    assert plan.source_blocks() == [(0, 3), (3, 5)]
    assert len(dsk) == 3 * plan.tasks_per_step() == 3 * (2 * 5 + 2)
    assert out == [f"nbody-row-tok-3-{i}" for i in range(5)]
    row = dsk["nbody-row-tok-3-4"]  # its own drifted tile and the two blocks
    assert row[-3:] == ("nbody-drift-tok-3-4", "nbody-sources-tok-3-0", "nbody-sources-tok-3-1")


def test_keys_are_deterministic():
    plan = _plan(40, 10)
    a, b = (steps_graph(plan, "tok", ["a", "b", "c", "d"], 3, 3, frozenset({3}))
            for _ in range(2))
    assert a == b


@pytest.mark.parametrize("split_every", [2, 8])
def test_symmetric_and_plain_graphs_agree(split_every):
    """Same forces to round-off, through the reduction tree too (9 tiles, fan-in 2)."""
    tiles = _tiles(95, 11)
    out = {sym: _forced(_plan(95, 11, softening=0.01, split_every=split_every,
                              symmetric=sym), tiles) for sym in (False, True)}
    for plain, sym in zip(out[False], out[True], strict=True):
        np.testing.assert_allclose(sym.acceleration, plain.acceleration, rtol=1e-12,
                                   atol=1e-12 * np.abs(plain.acceleration).max())
        np.testing.assert_allclose(sym.potential, plain.potential, rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("n", "tile_size", "split_every"),
                         [(1, 1, 8), (2, 1, 8), (97, 10, 3), (300, 77, 2), (1000, 130, 8)])
def test_rows_layout_is_bit_identical_to_pairs(n, tile_size, split_every, dtype):
    """The parallel row kernel and its in-task reduction equal the pair tasks, bit for bit."""
    tiles = _tiles(n, tile_size, dtype)
    pairs = _forced(_plan(n, tile_size, softening=0.05, split_every=split_every), tiles)
    rows = _forced(_plan(n, tile_size, softening=0.05, split_every=split_every,
                         layout="rows"), tiles)
    for a, b in zip(pairs, rows, strict=True):
        np.testing.assert_array_equal(a.acceleration, b.acceleration)
        np.testing.assert_array_equal(a.potential, b.potential)


def test_fused_steps_equal_the_task_graph(client):
    """The fused one-tile path performs exactly the operations of the task graph."""
    (tile,) = _tiles(50, 50)
    plan = _plan(50, 50, softening=0.05)
    (start,) = _forced(plan, [tile])
    potential_steps = frozenset({5, 12})
    fused = fused_steps(start, plan, "fused", 1, 12, potential_steps)
    [future] = client.scatter([start])
    dsk, (out,) = steps_graph(plan, "tasks", [future], 1, 12, potential_steps)
    as_tasks = client.get(dsk, out)
    for name in ("position", "velocity", "acceleration", "potential"):
        np.testing.assert_array_equal(getattr(fused, name), getattr(as_tasks, name))


def test_snapshot_graph_reduces_diagnostics(client):
    tiles = _tiles(30, 7)
    plan = _plan(30, 7, softening=0.1, split_every=2)
    forced = client.scatter(_forced(plan, tiles))
    dsk, total = snapshot_graph(plan, "diag", forced, 0, None, 0)
    vector = client.get(dsk, total)
    assert vector.shape == (8,)
    mass = np.concatenate([t.mass for t in tiles])
    vel = np.concatenate([t.velocity for t in tiles], axis=1)
    assert vector[0] == pytest.approx(0.5 * np.sum(mass * (vel**2).sum(0)), rel=1e-14)
    np.testing.assert_allclose(vector[2:5], vel @ mass, atol=1e-16)


def test_dask_weighs_the_tiles_and_trees_the_tasks_return(client):
    """Dask's memory accounting and transfer costs see the arrays inside a task's records
    (:mod:`nbody_dask.sizes`): before, a tile of bodies or its tree weighed a few dozen
    bytes to the scheduler."""
    from dask.sizeof import sizeof

    from nbody_dask import tasks
    from nbody_dask.kernels.pm import LongRange, Region

    bodies = nbody_dask.plummer(4096, seed=0)
    tile = split_tiles(bodies, 4096, "float32")[0]
    arrays = tile.position.nbytes + tile.velocity.nbytes + tile.mass.nbytes
    assert arrays <= sizeof(tile) < arrays + 1024
    tree = tasks.short_tree(tile, 64)
    assert sizeof(tree) > tree.tree.x.nbytes * 4 + tree.tree.order.nbytes
    field = np.zeros((3, 8, 8, 8), np.float32)
    assert sizeof(LongRange(field, 1.0)) >= field.nbytes
    assert sizeof(Region((0, 0, 0), field[0])) >= field[0].nbytes
    future = client.submit(tasks.short_tree, tile, 64, pure=False)
    future.result()
    assert client.nbytes(keys=[future.key], summary=False)[future.key] == sizeof(tree)

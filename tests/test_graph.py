"""Shape and determinism of the step graph, and the fused path's equivalence to it."""

from __future__ import annotations

import numpy as np
import pytest
from dask.core import get_dependencies

import nbody_dask
from nbody_dask.bodies import auto_tile_size, split_tiles, tile_bounds
from nbody_dask.graph import (StepPlan, eager, fused_steps, initial_graph, snapshot_graph,
                              step_graph)


def _tiles(n, tile_size):
    return split_tiles(nbody_dask.plummer(n, seed=1), tile_size, np.float64)


def _graph_of(delayed_list):
    return {k: v for d in delayed_list for k, v in dict(d.__dask_graph__()).items()}


@pytest.mark.parametrize(("n_tiles", "split_every", "combines"),
                         [(1, 8, 0), (5, 8, 0), (9, 8, 9 * 2), (9, 3, 9 * 3)])
def test_step_graph_shape(n_tiles, split_every, combines):
    tiles = _tiles(10 * n_tiles, 10)
    plan = StepPlan("tok", 0.01, 0.0, split_every=split_every)
    start = initial_graph(tiles, plan, call=eager)
    graph = _graph_of(step_graph(start, plan, 1, with_potential=False))
    names = [k.split("-")[1] for k in graph if isinstance(k, str) and k.startswith("nbody-")]
    assert names.count("drift") == n_tiles
    assert names.count("pair") == n_tiles**2
    assert names.count("kick") == n_tiles
    assert sum(n.startswith("combine") for n in names) == combines
    # no task gathers more than split_every partials, plus its own tile
    for key in graph:
        if isinstance(key, str) and key.startswith("nbody-"):
            assert len(get_dependencies(graph, key)) <= split_every + 1


@pytest.mark.parametrize("n_tiles", [1, 2, 5])
def test_symmetric_step_graph_shape(n_tiles):
    """One task per unordered pair of distinct tiles, plus the self pairs."""
    tiles = _tiles(10 * n_tiles, 10)
    plan = StepPlan("tok", 0.01, 0.0, symmetric=True)
    start = initial_graph(tiles, plan, call=eager)
    graph = _graph_of(step_graph(start, plan, 1, with_potential=False))
    names = [k.split("-")[1] for k in graph if isinstance(k, str) and k.startswith("nbody-")]
    assert names.count("sympair") == n_tiles * (n_tiles - 1) // 2
    assert names.count("selfpair") == n_tiles
    assert names.count("pair") == 0


@pytest.mark.parametrize("split_every", [2, 8])
def test_symmetric_and_plain_graphs_agree(split_every):
    """Same forces to round-off, through the reduction tree too (9 tiles, fan-in 2)."""
    tiles = _tiles(95, 11)
    out = {}
    for symmetric in (False, True):
        plan = StepPlan("tok", 0.01, 0.01, split_every=split_every, symmetric=symmetric)
        out[symmetric] = initial_graph(tiles, plan, with_potential=True, call=eager)
    for plain, sym in zip(out[False], out[True], strict=True):
        np.testing.assert_allclose(sym.acceleration, plain.acceleration, rtol=1e-12,
                                   atol=1e-12 * np.abs(plain.acceleration).max())
        np.testing.assert_allclose(sym.potential, plain.potential, rtol=1e-12)


def test_keys_are_deterministic():
    tiles = _tiles(40, 10)
    plan = StepPlan("tok", 0.01, 0.0)
    a = [d.key for d in step_graph(tiles, plan, 3, True)]
    b = [d.key for d in step_graph(tiles, plan, 3, True)]
    assert a == b == [f"nbody-kick-tok-3-{i}" for i in range(4)]


def test_tiles_cover_every_body_once():
    for n, size in [(1, 1), (17, 4), (4099, 1024), (1000, 1000), (5, 7)]:
        bounds = tile_bounds(n, size)
        covered = np.concatenate([np.arange(lo, hi) for lo, hi in bounds])
        np.testing.assert_array_equal(covered, np.arange(n))
        assert all(hi - lo == size for lo, hi in bounds[:-1])


@pytest.mark.parametrize("threads", [1, 2, 3, 4, 8, 16, 24, 64, 256, 1024])
@pytest.mark.parametrize("n", [4097, 16_384, 65_536, 100_003, 262_144, 1_048_576, 4_194_304])
def test_auto_tile_size_keeps_every_thread_busy(n, threads):
    size = auto_tile_size(n, threads)
    tiles = len(tile_bounds(n, size))
    assert size >= 2048 or tiles == 1
    if tiles < n // 2048:  # not held back by the smallest tile: even work for every thread
        pairs = tiles * tiles
        assert pairs >= 2 * threads
        assert pairs / (threads * -(-pairs // threads)) >= 0.9
        assert size <= 16_384 or tiles >= 16


def test_auto_tile_size_known_layouts():
    # measured on 2 cores (benchmarks/README.md): 2 tiles at N = 16,384, 4 at 65,536
    assert auto_tile_size(4096, 2) == 4096  # one fused tile
    assert auto_tile_size(16_384, 2) == 8192
    assert auto_tile_size(65_536, 2) == 16_384
    assert auto_tile_size(1_048_576, 2) == 65_536  # at most 16 tiles when threads are few
    assert auto_tile_size(65_536, 64) == 4096  # 16 tiles: 256 pairs, 4 per thread
    assert auto_tile_size(65_536, 12) == 10_923  # 36 pairs, 3 per thread
    assert auto_tile_size(300_000, 8, backend="cuda") == 75_000


def test_fused_steps_equal_the_task_graph(client):
    """The fused one-tile path performs exactly the operations of the task graph."""
    (tile,) = _tiles(50, 50)
    plan = StepPlan("fused", 1 / 64, 0.05)
    (start,) = initial_graph([tile], plan, call=eager)
    potential_steps = frozenset({5, 12})
    fused = fused_steps(start, plan, 1, 12, potential_steps)
    graph = [start]
    for step in range(1, 13):
        graph = step_graph(graph, plan, step, step in potential_steps)
    (as_tasks,) = client.compute(graph, optimize_graph=False)
    as_tasks = as_tasks.result()
    for name in ("position", "velocity", "acceleration", "potential"):
        np.testing.assert_array_equal(getattr(fused, name), getattr(as_tasks, name))


def test_snapshot_graph_reduces_diagnostics(client):
    tiles = _tiles(30, 7)
    plan = StepPlan("diag", 0.01, 0.1, split_every=2)
    forced = initial_graph(tiles, plan, call=eager)
    vector = client.compute(snapshot_graph(forced, plan, 0, None, 0)).result()
    assert vector.shape == (8,)
    mass = np.concatenate([t.mass for t in tiles])
    vel = np.concatenate([t.velocity for t in tiles], axis=1)
    assert vector[0] == pytest.approx(0.5 * np.sum(mass * (vel**2).sum(0)), rel=1e-14)
    np.testing.assert_allclose(vector[2:5], vel @ mass, atol=1e-16)

"""Properties of the plan (nbody_dask.plan): pure arithmetic, checked with Hypothesis."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nbody_dask.plan import (Plan, auto_tile_size, reduction_groups, submission_ends,
                             tile_bounds)

sizes = st.integers(1, 300)
plans = st.builds(
    lambda n, tile, split, symmetric, layout: Plan(
        n=n, steps=10, dt=0.01, tile_size=tile, split_every=split,
        symmetric=symmetric and layout == "pairs", layout=layout),
    sizes, st.integers(1, 64), st.integers(2, 9), st.booleans(), st.sampled_from(["pairs", "rows"]))


@settings(max_examples=200, deadline=None)
@given(plans)
def test_every_ordered_pair_of_bodies_is_counted_once(plan):
    bounds = plan.tile_bounds()
    counts = np.zeros((plan.n, plan.n), dtype=int)
    used = set()
    for target in range(plan.n_tiles):
        parts = plan.parts(target)
        assert len(parts) == plan.n_tiles
        for (a, b), side in parts:
            used.add((a, b))
            assert target == (b if side == 1 else a)
            source = a if side == 1 else b
            (t0, t1), (s0, s1) = bounds[target], bounds[source]
            counts[t0:t1, s0:s1] += 1
    assert (counts == 1).all()
    assert used == set(plan.pair_tasks())  # every task is used, no task is missing


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2000), st.integers(2, 16))
def test_reduction_fan_in_and_coverage(count, split_every):
    n = count
    for level in reduction_groups(count, split_every):
        assert [lo for lo, _ in level][0] == 0 and level[-1][1] == n
        for (lo, hi), (nxt, _) in zip(level, level[1:] + [(n, n)], strict=True):
            assert 1 <= hi - lo <= split_every and hi == nxt  # contiguous, in order
        n = len(level)
    assert n <= split_every  # what the consumer adds itself


@settings(max_examples=100, deadline=None)
@given(plans, st.integers(1, 1024), st.integers(1, 64))
def test_fixed_tiles_make_the_same_arithmetic_on_any_cluster(plan, threads, workers):
    settled = plan.settle(threads, workers, "cpu")
    other = plan.settle(1, 1, "cpu")
    for method in ("tile_bounds", "pair_tasks", "groups", "snapshot_steps"):
        assert getattr(settled, method)() == getattr(other, method)()


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 500), st.integers(1, 60), st.integers(1, 50))
def test_submissions_end_on_every_snapshot_and_are_bounded(steps, every, max_steps):
    snaps = Plan(n=1, steps=steps, dt=1.0, snapshot_every=every).snapshot_steps()
    ends = list(submission_ends(snaps, max_steps))
    assert set(snaps[1:]) <= set(ends)
    assert ends == sorted(set(ends))
    assert all(0 < gap <= max_steps for gap in np.diff([0] + ends))
    assert ends[-1:] == ([steps] if steps else [])


@given(st.integers(1, 10**7), st.integers(1, 256))
def test_rows_layout_has_a_few_tasks_per_worker(n, workers):
    plan = Plan(n=n, steps=1, dt=1.0, layout="rows").settle(64 * workers, workers, "cpu")
    assert plan.n_tiles <= workers
    assert plan.tasks_per_step() <= 4 * workers
    blocks = plan.source_blocks()  # cover the tiles in order, about sqrt(T) of them
    assert [lo for lo, _ in blocks] + [plan.n_tiles] == [0] + [hi for _, hi in blocks]
    assert len(blocks) <= 2 * plan.n_tiles**0.5


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
    assert auto_tile_size(1_048_576, 1024, layout="rows", workers=16) == 65_536


def test_plan_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match="layout must be one of"):
        Plan(n=1, steps=1, dt=1.0, layout="grid")
    with pytest.raises(ValueError, match="backend='cuda' needs layout='pairs'"):
        Plan(n=1, steps=1, dt=1.0, layout="rows", backend="cuda")
    with pytest.raises(ValueError, match="no tile size yet"):
        Plan(n=1, steps=1, dt=1.0).tile_bounds()


def test_stored_plan_round_trips():
    plan = Plan(n=10, steps=3, dt=0.5, softening=0.1, tile_size=4, layout="rows")
    assert Plan.from_stored(plan.stored(), 10) == plan
    old = {"steps": 3, "dt": 0.5, "softening": 0.1, "G": 1.0, "snapshot_every": None,
           "dtype": "float64", "tile_size": 4, "split_every": 8}  # before the plan was stored
    assert Plan.from_stored(old, 10).layout == "pairs"


# -- the tree's planning half (nbody_dask.methods.tree) ----------------------------------------

tree_plans = st.builds(
    lambda n, tiles, steps, every, retile, layout: Plan(
        n=n, steps=steps, dt=0.01, snapshot_every=every, tile_size=-(-n // tiles),
        method="tree", retile_every=retile, layout=layout),
    st.integers(1, 5000), st.integers(1, 40), st.integers(0, 60),
    st.one_of(st.none(), st.integers(1, 30)), st.integers(1, 15),
    st.sampled_from(["pairs", "rows"]))


@settings(max_examples=300, deadline=None)
@given(tree_plans)
def test_tree_windows_cover_the_run_and_restart_at_every_snapshot(plan):
    """Re-tilings: every snapshot step (so a resume re-tiles where the run did) and every
    ``retile_every`` steps; each step's forces use the window that starts at the last
    re-tiling at or before it; the last window ends at the last step."""
    retile = plan.retile_steps()
    if not plan.spatial:
        assert retile == frozenset()
        return
    assert set(plan.snapshot_steps()) <= retile
    assert set(range(0, plan.steps + 1, plan.retile_every)) <= retile
    for step in range(plan.steps + 1):
        start = max(r for r in retile if r <= step)
        end = plan.window_end(start)
        assert start <= step <= end <= plan.steps
        assert not any(start < r <= end for r in retile)
    assert plan.window_end(max(retile)) == plan.steps
    assert plan.tasks_per_step() >= (1 if plan.fused else 3 * plan.n_tiles)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 10**9), st.integers(1, 4096), st.integers(1, 512),
       st.sampled_from(["pairs", "rows"]))
def test_tree_tiles_are_few_bounded_and_cover_the_bodies(n, threads, workers, layout):
    from nbody_dask.methods.tree import TREE_ONE_TILE_MAX, tree_tile_size

    size = tree_tile_size(n, threads, workers, layout)
    tiles = -(-n // size)
    assert 1 <= size and tiles * size >= n
    if n <= 16_384 or (workers == 1 and n <= TREE_ONE_TILE_MAX):
        assert tiles == 1  # one tile: no re-tiling, the walk on all threads
    else:
        assert size >= 4_096 or tiles == 1
        if layout == "rows":
            assert size <= TREE_ONE_TILE_MAX + 1 and tiles >= min(workers, n // 4_096)
        else:  # at most 1,048,576 bodies a tile (one task's memory), T**2 >= 4 threads
            assert size <= 1_048_577
            assert tiles**2 >= min(4 * threads, (n // 4_096) ** 2)

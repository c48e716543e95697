"""The tree far-field kernel and the force-accuracy API, against a NumPy float64 direct sum."""

from __future__ import annotations

import os

import numba
import numpy as np
import pytest

import nbody_dask
from nbody_dask.accuracy import direct_reference, force_errors
from nbody_dask.kernels import tree
from nbody_dask import config
from nbody_dask.kernels.tree import build_tree, morton_keys, tree_accelerations
from nbody_dask import spatial
from nbody_dask.spatial import bounding_cube
from nbody_dask.testing import direct_sum_reference


def _direct(position, mass, softening=0.0, targets=None):
    return direct_sum_reference(position, mass, softening, targets=targets)[0]


#: The default opening angle (nbody.yaml: the one source of defaults).
THETA = config.get("theta")
LEAF = config.get("leaf-size")


def _tree(bodies, dtype, softening=0.0, theta=None, leaf_size=None):
    """The tree's accelerations (n, 3), at the configured defaults unless given."""
    pos = bodies.position.values.T.astype(dtype)
    return tree_accelerations(pos, bodies.mass.values.astype(dtype), softening,
                              config.get("theta", theta), config.get("leaf-size", leaf_size)).T


@pytest.mark.parametrize("n", [1, 2, 3, 97, 1000])
def test_with_every_cell_opened_the_tree_is_the_direct_sum(n):
    bodies = nbody_dask.plummer(max(n, 2), seed=5).isel(body=slice(0, n))
    ref = _direct(bodies.position.values, bodies.mass.values, 0.01)
    got = _tree(bodies, np.float64, softening=0.01, theta=1e-9, leaf_size=8)
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12 * np.abs(ref).max())
    got32 = _tree(bodies, np.float32, softening=0.01, theta=1e-9, leaf_size=8)
    assert got32.dtype == np.float32
    np.testing.assert_allclose(got32, ref, rtol=2e-4, atol=2e-5 * np.abs(ref).max())


def test_error_falls_steadily_as_theta_falls():
    bodies = nbody_dask.plummer(4096, seed=2)
    ref = _direct(bodies.position.values, bodies.mass.values)
    medians = []
    for theta in (0.9, 0.7, 0.5, 0.35, 0.2):
        got = _tree(bodies, np.float64, theta=theta)
        err = np.linalg.norm(got - ref, axis=1) / np.linalg.norm(ref, axis=1)
        medians.append(np.median(err))
    assert all(b < 0.8 * a for a, b in zip(medians[:-1], medians[1:], strict=True)), medians
    assert medians[-1] < 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind", ["plummer", "disk", "merger"])
def test_default_accuracy_at_65536_bodies(kind, dtype):
    """Median <= 3e-4 and p99 <= 3e-3 at the defaults (pytreegrav's default: 1.1e-3 and
    6.8e-3 on this Plummer sphere, measured in benchmarks/tree.py)."""
    bodies = {"plummer": lambda: nbody_dask.plummer(65536, seed=1),
              "disk": lambda: nbody_dask.exponential_disk(65536, seed=1),
              "merger": lambda: nbody_dask.merger(65536, seed=1)}[kind]()
    acc = _tree(bodies, dtype, softening=0.0)
    targets = np.sort(np.random.default_rng(3).choice(65536, 400, replace=False))
    ref = _direct(bodies.position.values, bodies.mass.values, 0.0, targets)
    err = np.linalg.norm(acc[targets] - ref, axis=1) / np.linalg.norm(ref, axis=1)
    assert np.median(err) <= 3e-4 and np.quantile(err, 0.99) <= 3e-3, \
        (np.median(err), np.quantile(err, 0.99))


def test_coincident_bodies_without_softening_stay_finite():
    pos = np.zeros((3, 50))
    pos[:, 25:] = 1.0  # two clumps of 25 coincident bodies
    acc = tree_accelerations(pos, np.ones(50), softening=0.0, theta=0.5, leaf_size=4)
    assert np.isfinite(acc).all()
    np.testing.assert_allclose(acc[:, 0], 25 / np.sqrt(3) ** 3 * np.ones(3),
                               rtol=1e-12)


def test_the_result_does_not_depend_on_the_threads():
    bodies = nbody_dask.plummer(20000, seed=9)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = _tree(bodies, np.float32)
        numba.set_num_threads(before)
        many = _tree(bodies, np.float32)
    finally:
        numba.set_num_threads(before)
    np.testing.assert_array_equal(one, many)


def test_tree_cells_cover_the_bodies_in_pre_order():
    rng = np.random.default_rng(0)
    x, y, z = rng.random((3, 5000))
    keys = np.sort(morton_keys(x, y, z, np.zeros(3), 1.0))
    start, end, skip, leaf = build_tree(keys, 16)
    assert start[0] == 0 and end[0] == 5000 and skip[0] == len(start)
    assert ((end - start)[leaf] <= 16).all()
    assert (end[leaf] - start[leaf]).sum() == 5000  # leaves partition the bodies
    for cell in np.nonzero(~leaf)[0]:  # children tile their parent's run, in order
        child, covered = cell + 1, start[cell]
        while child < skip[cell]:
            assert start[child] == covered
            covered = end[child]
            child = skip[child]
        assert covered == end[cell]


@pytest.mark.parametrize("bad, match", [(dict(theta=0.0), "theta must be in"),
                                        (dict(theta=1.5), "theta must be in"),
                                        (dict(leaf_size=0), "leaf_size must be >= 1")])
def test_bad_parameters_are_named(bad, match):
    with pytest.raises(ValueError, match=match):
        tree_accelerations(np.zeros((3, 4)), np.ones(4), **{"softening": 0.0, "theta": 0.5,
                                                            "leaf_size": 8, **bad})


def test_the_defaults_come_from_the_configuration_alone():
    """theta and leaf_size: nbody.yaml's values in a plan, none in the kernels."""
    import inspect

    from nbody_dask.kernels import farfield, octree, walk
    from nbody_dask.plan import Plan

    assert 0 < THETA <= 1
    plan = Plan(n=10, steps=1, dt=0.1, method="tree")
    assert (plan.theta, plan.leaf_size) == (THETA, config.get("leaf-size"))
    for function in (walk.walk, walk.tree_accelerations, farfield.far_walk, octree.build):
        for name in ("theta", "leaf_size"):
            parameter = inspect.signature(function).parameters.get(name)
            assert parameter is None or parameter.default is inspect.Parameter.empty


# -- the accuracy API ----------------------------------------------------------------------

def test_force_errors_of_a_float64_direct_sum_are_round_off():
    bodies = nbody_dask.plummer(600, seed=4)
    exact = _direct(bodies.position.values, bodies.mass.values, 0.02)
    ref = direct_reference(bodies, np.arange(600), softening=0.02, G=2.0)
    np.testing.assert_allclose(ref, 2.0 * exact, rtol=1e-12)
    stats = force_errors(bodies, exact, softening=0.02, sample=100, seed=1)
    assert stats.max < 1e-12 and len(stats.targets) == 100
    assert list(stats.targets) == sorted(set(stats.targets))
    assert "relative force error over 100 targets" in str(stats)


def test_force_errors_measure_float32_and_tree_errors():
    bodies = nbody_dask.plummer(2048, seed=4)
    acc32 = _direct(bodies.position.values, bodies.mass.values).astype(np.float32)
    assert 1e-9 < force_errors(bodies, acc32).median < 1e-6
    tree = _tree(bodies, np.float64, theta=0.7)
    stats = force_errors(bodies, tree, sample=5000)  # more than there are: all bodies
    assert len(stats.targets) == 2048 and 1e-4 < stats.median < 1e-2
    assert stats.median <= stats.p99 <= stats.max
    assert stats.as_dict()["targets"] == 2048


def test_force_errors_of_a_lone_body_and_bad_shapes():
    one = nbody_dask.make_bodies(position=[[0.0, 0.0, 0.0]], velocity=[[0.0, 0.0, 0.0]],
                                 mass=[1.0])
    assert force_errors(one, np.zeros((1, 3))).max == 0.0
    assert force_errors(one, np.ones((1, 3))).max == np.inf
    with pytest.raises(ValueError, match=r"accelerations must have shape \(1, 3\)"):
        force_errors(one, np.zeros((3, 1)))
    with pytest.raises(ValueError, match="sample must be >= 1"):
        force_errors(one, np.zeros((1, 3)), sample=0)


def test_a_deep_chain_of_one_child_cells_grows_the_tree():
    """Clumps of bodies closer than a key cell, each a little larger than a leaf, give chains
    of one-child cells down to the last key bit: more cells than build_tree first allots."""
    rng = np.random.default_rng(1)
    pos = np.repeat(rng.random((3, 40)), 21, axis=1)  # 40 clumps of 21 bodies
    pos += rng.random(pos.shape) * 1e-9  # apart by less than a key cell
    n, leaf_size = pos.shape[1], 20
    keys = np.sort(morton_keys(*pos, np.zeros(3), 1.0))
    start, _, _, _ = build_tree(keys, leaf_size)
    assert len(start) > 2 * (n // leaf_size + 1) * 8 + 1  # the first allotment was exceeded
    acc = tree_accelerations(pos, np.ones(n), softening=0.01, theta=1e-9, leaf_size=leaf_size)
    ref = _direct(pos.T, np.ones(n), 0.01)
    np.testing.assert_allclose(acc.T, ref, rtol=1e-9, atol=1e-9 * np.abs(ref).max())


# -- near and far tiles -----------------------------------------------------------------------

def _two_clumps(n, dtype, separation=16.0, seed=0):
    """Two Plummer spheres ``separation`` apart, in ``dtype``: (3, n) positions, masses."""
    a, b = nbody_dask.plummer(n // 2, seed=seed), nbody_dask.plummer(n - n // 2, seed=seed + 1)
    shift = np.array([separation / 2, 0.0, 0.0])
    position = np.concatenate([a.position.values - shift, b.position.values + shift])
    mass = np.concatenate([a.mass.values, b.mass.values]) / 2
    return position.T.astype(dtype).copy(), mass.astype(dtype)


def _cube(position):
    """The cube of all the bodies, as the re-tiling computes it."""
    return bounding_cube(np.stack([position.min(axis=1), position.max(axis=1)]).astype(float))


def _curve_tiles(position, n_tiles):
    """Body indices of ``n_tiles`` runs along the Morton curve (as spatial tiles are)."""
    cube = _cube(position)
    keys = morton_keys(position[0], position[1], position[2], cube[:3].copy(), cube[3])
    return np.array_split(np.argsort(keys, kind="stable"), n_tiles)


def _tile_trees(position, mass, tiles):
    """The tiles' trees in the cube of all bodies (as the re-tiling builds them)."""
    return [tree.build(position[:, t], mass[t], LEAF, cube=_cube(position)) for t in tiles]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_far_tiles_from_summaries_equal_walks_of_their_whole_trees(dtype):
    """A target's far tiles evaluated from their summaries give the sum of the walks of
    their whole trees: the same cells are accepted, only the order of the sum differs."""
    position, mass = _two_clumps(4000, dtype)
    trees = _tile_trees(position, mass, _curve_tiles(position, 8))
    forest = tree.forest(*map(tree.summarize, trees))
    near = tree.near_sources(forest, THETA)
    assert all(i in row for i, row in enumerate(near))
    far_pairs = 0
    eps2 = dtype(0.01) ** 2
    for i, target in enumerate(trees):
        far = [j for j in range(8) if j not in near[i]]
        far_pairs += len(far)
        got = tree.far_walk(target, forest, np.array(far, dtype=np.int64), eps2, THETA,
                            with_potential=True)
        want = sum(tree.walk(target, trees[j], eps2, THETA, with_potential=True)
                   for j in far) if far else np.zeros_like(got)
        tol = 1e-12 if dtype == np.float64 else 2e-6
        np.testing.assert_allclose(got, want, rtol=0, atol=tol * np.abs(want).max())
    assert far_pairs >= 16  # the clumps' tiles are far from each other


def test_summaries_hold_every_body_once():
    position, mass = _two_clumps(3001, np.float64)
    target = tree.build(position, mass, 16)
    summary = tree.summarize(target, 100)
    ends = np.flatnonzero(summary.leaf)
    assert summary.mass[ends].sum() == pytest.approx(mass.sum(), rel=1e-12)
    assert summary.skip[0] == summary.mass.shape[0]  # the root's subtree is the summary
    assert summary.groups.shape == (4, int(target.leaf.sum()))
    assert summary.mass.shape[0] < target.mass.shape[0]


def test_refit_keeps_the_cells_and_follows_the_bodies():
    """A refitted tree has the old cells (each holds the same bodies) and the moments of the
    new positions; its walks stay accurate after the bodies moved."""
    position, mass = _two_clumps(4000, np.float64)
    built = tree.build(position, mass, LEAF)
    again = tree.refit(built, position, mass)
    for name in ("mass", "com", "quad", "bmax", "x"):
        np.testing.assert_array_equal(getattr(again, name), getattr(built, name))
    moved = position + np.random.default_rng(1).normal(0, 0.05, position.shape)
    refit = tree.refit(built, moved, mass)
    assert refit.start is built.start and refit.skip is built.skip
    acc = tree.walk(refit, refit, 0.0, THETA, same=True)
    errors = force_errors({"position": moved.T, "velocity": 0 * moved.T, "mass": mass}, acc.T,
                          sample=400)
    assert errors.median <= 3e-4 and errors.p99 <= 3e-3, errors


def test_the_motion_margin_keeps_far_tiles_far():
    """Classified with a displacement d, far tiles stay far while every body moves by up to
    d (cells refitted): the far walk never needs a body. Classified for bodies at rest,
    moves of 3 d make it fail loudly instead of answering wrongly."""
    position, mass = _two_clumps(4000, np.float64, separation=12.0)
    tiles = _curve_tiles(position, 8)
    trees = _tile_trees(position, mass, tiles)
    forest = tree.forest(*map(tree.summarize, trees))
    d = 0.2
    step = np.random.default_rng(3).normal(size=position.shape)
    step /= np.linalg.norm(step, axis=0)
    # with the margin, moves of d (every body) are safe; at rest, moves of 3 d are not
    for nears, move, must_hold in ((tree.near_sources(forest, THETA, d), d, True),
                                   (tree.near_sources(forest, THETA), 3 * d, False)):
        moved = position + move * step
        refits = [tree.refit(t, moved[:, idx], mass[idx])
                  for t, idx in zip(trees, tiles, strict=True)]
        after = tree.forest(*map(tree.summarize, refits))
        failures = 0
        for i, target in enumerate(refits):
            far = np.array([j for j in range(8) if j not in nears[i]], dtype=np.int64)
            try:
                tree.far_walk(target, after, far, 0.0, THETA)
            except tree.FarFieldError as exc:
                assert "near/far margin" in str(exc)
                failures += 1
        assert (failures == 0) == must_hold
    wider = tree.near_sources(forest, THETA, d)
    assert sum(map(len, wider)) < 64  # some tiles are still far with the margin


_KERNEL_BITS = """
import sys
import numpy as np
import nbody_dask
from nbody_dask.kernels import shortrange, tree
position = nbody_dask.plummer(3000, seed=4).position.values.T.copy()
mass = np.full(3000, 1 / 3000)
near = tree.build(position[:, :1500], mass[:1500], 64)
far = tree.build(position[:, 1500:], mass[1500:], 64)
walks = [tree.walk(near, far, 1e-4, theta, True, False) for theta in (0.4, 1.0)]
box = nbody_dask.plummer_clumps(8000, seed=3).position.values.T.copy()
clumps = tree.build(box, np.full(8000, 1 / 8000), 16)
short = shortrange.short_walk(clumps, clumps, 1e-6, 0.4, 1.0, 0.02, 0.1, True)
np.save(sys.argv[1], np.concatenate([*walks, short], axis=1))
"""


@pytest.mark.slow
def test_kernels_give_the_same_bits_compiled_or_loaded_from_numbas_cache(tmp_path):
    """A tree walk and TreePM's short-range walk on a clustered box (their M2P and P2P are
    kernels called by another kernel) give the same bits in a process that compiles them and
    in one that loads them from Numba's on-disk cache: a resumed run or a new worker does not
    change the last bit (see ``law.FAST_MATH``; the short range's M2P differed in 5 of
    44,000 values with approximate reciprocals)."""
    import subprocess
    import sys

    script = tmp_path / "bits.py"
    script.write_text(_KERNEL_BITS)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    for run in ("compiled", "cached"):
        subprocess.run([sys.executable, str(script), str(tmp_path / run)], env=env,
                       check=True, timeout=240)
    compiled, cached = np.load(tmp_path / "compiled.npy"), np.load(tmp_path / "cached.npy")
    assert np.abs(compiled[:, :3000]).min() > 0  # real results (a few bodies of the box
    assert (compiled[:, 3000:] != 0).mean() > 0.99  # have no neighbour within the cutoff)
    np.testing.assert_array_equal(compiled, cached)


def test_spatial_tiles_are_as_accurate_as_one_tree():
    """Walks of every tile pair (Morton-curve tiles, their trees in one cube, as the
    simulation builds them) are no less accurate than one tree of all the bodies: the cells
    a tile's run cuts are never accepted (:func:`tree.acceptable_cells`). Accepting them,
    each tile's tree in its own cube, gave 1.17x and 1.3x one tree's median error here."""
    bodies = nbody_dask.plummer(32768, seed=4)
    position, mass = bodies.position.values.T.copy(), bodies.mass.values
    targets = np.sort(np.random.default_rng(3).choice(32768, 400, replace=False))
    ref = _direct(bodies.position.values, mass, 0.0, targets)

    def median_error(acc):
        got = acc.T[targets]
        return np.median(np.linalg.norm(got - ref, axis=1) / np.linalg.norm(ref, axis=1))

    one = tree.build(position, mass, LEAF)
    assert not one.acceptable[0] and one.acceptable[one.leaf].all()
    one_error = median_error(tree.walk(one, one, 0.0, 0.4, same=True))
    for n_tiles in (3, 64):
        tiles = _curve_tiles(position, n_tiles)
        trees = _tile_trees(position, mass, tiles)
        acc = np.zeros_like(position)
        for i, target in enumerate(trees):
            acc[:, tiles[i]] = sum(tree.walk(target, source, 0.0, 0.4, same=i == j)
                                   for j, source in enumerate(trees))
        assert median_error(acc) <= 1.05 * one_error, n_tiles


def test_massless_bodies_feel_the_field_and_leave_it_unchanged():
    """Test particles (mass 0, many alone in their cells, which the walks skip) get the
    forces of the massive bodies and add none: every force as accurate as usual."""
    bodies = nbody_dask.plummer(3000, seed=6)
    probes = np.random.default_rng(1).uniform(-30, 30, size=(500, 3))
    position = np.concatenate([bodies.position.values, probes])
    mass = np.concatenate([bodies.mass.values, np.zeros(500)])
    got = tree_accelerations(position.T.copy(), mass, 0.01, THETA, LEAF).T
    assert np.isfinite(got).all()
    ref = _direct(position, mass, 0.01)
    err = np.linalg.norm(got - ref, axis=1) / np.linalg.norm(ref, axis=1)
    assert np.median(err[:3000]) < 3e-4 and np.median(err[3000:]) < 3e-4


def test_a_far_outlier_leaves_the_rest_of_the_tree_deep():
    """One body at 1e9 beside a Plummer sphere: 21-bit keys in the bounding cube put the
    whole sphere in one leaf (the walk became a direct sum, 3.7x slower: issue 33, item 15);
    keys in a cube around the central bodies keep leaves of leaf_size, and the forces as
    accurate as without the outlier."""
    bodies = nbody_dask.plummer(20000, seed=1)
    position = np.concatenate([bodies.position.values.T, [[1e9], [0.0], [0.0]]], axis=1)
    mass = np.append(bodies.mass.values, bodies.mass.values[0])
    built = tree.build(position, mass, LEAF)
    sizes = (built.end - built.start)[built.leaf]
    assert sizes.max() <= 2 * LEAF and len(sizes) >= 20000 // LEAF
    acc = tree_accelerations(position, mass, 0.01, THETA, LEAF).T
    targets = np.arange(0, 20001, 97)
    ref = _direct(position.T, mass, 0.01, targets)
    err = np.linalg.norm(acc[targets] - ref, axis=1) / np.linalg.norm(ref, axis=1)
    assert np.median(err) < 3e-4


def test_a_far_outlier_leaves_the_shared_cube_of_several_tiles_around_the_rest():
    """With several spatial tiles the keys' cube comes from every tile's bounds
    (spatial.tile_boxes): their central boxes give a cube around the sphere, not one 1e9
    wide, so tile trees built in it keep leaves of leaf_size (issue 33, item 15)."""
    from nbody_dask.bodies import Tile

    bodies = nbody_dask.plummer(20000, seed=1)
    position = np.concatenate([bodies.position.values.T, [[1e9], [0.0], [0.0]]], axis=1)
    mass = np.append(bodies.mass.values, bodies.mass.values[0])
    bounds = [spatial.tile_boxes(Tile(start, position[:, start:start + 5001],
                                       np.zeros((3, min(5001, 20001 - start))),
                                       mass[start:start + 5001]))
              for start in range(0, 20001, 5001)]
    cube = spatial.bounding_cube(*bounds)
    assert cube[3] < 1e3  # the plain bounding cube is 1e9 wide
    assert spatial.bounding_cube(*(b[:2] for b in bounds))[3] > 1e9
    built = tree.build(position, mass, LEAF, cube)
    sizes = (built.end - built.start)[built.leaf]
    assert sizes.max() <= 2 * LEAF and len(sizes) >= 20000 // LEAF

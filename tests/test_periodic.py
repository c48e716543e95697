"""Periodic boxes: the Ewald reference against known values, TreePM against the Ewald sum,
conservation, determinism, and the periodic box through the API, the store and the CLI."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import xarray as xr
from distributed import Client, LocalCluster
from numba import njit
from scipy.special import erf, erfc, k0

import nbody_dask
from nbody_dask.kernels import ewald, octree, pm
from nbody_dask.kernels.ewald import ewald_forces
from nbody_dask.kernels.law import (FAST_SPLIT_ERROR, POLYNOMIAL_CUTOFF, POLYNOMIAL_SPLIT_ERROR,
                                    fast_short_range, long_range_polynomials,
                                    polynomial_long_range, short_range_constants)
from nbody_dask.kernels.shortrange import INSIDE, long_m2p, short_walk, walk_constants
from nbody_dask.plan import Plan, auto_mesh_size, auto_mesh_slabs, resolve_method

#: The potential of a lone unit mass in a periodic unit cube with the mean density
#: subtracted (G = 1): minus the simple cubic lattice's Wigner-Madelung constant.
LATTICE_POTENTIAL = 2.8372974794806


def _one(point):
    return np.asarray(point, dtype=np.float64).reshape(3, 1)


# -- the Ewald reference ---------------------------------------------------------------------

@pytest.mark.parametrize("box", [1.0, 3.5])
def test_a_lone_body_feels_no_force_and_the_lattice_potential(box):
    """A lone body is a simple cubic lattice: no force, and the lattice's potential."""
    x = _one([0.3, 0.7, 0.1]) * box
    out = ewald_forces(x, x, np.array([1.5]), box, same=True)
    assert np.abs(out[:3]).max() < 1e-12 / box**2
    assert out[3, 0] == pytest.approx(LATTICE_POTENTIAL * 1.5 / box, rel=1e-10)


def test_a_simple_cubic_lattice_feels_no_force():
    grid = (np.arange(4) + 0.25) / 4
    x = np.array(np.meshgrid(grid, grid, grid, indexing="ij")).reshape(3, -1)
    out = ewald_forces(x, x, np.ones(64), 1.0, same=True)
    assert np.abs(out[:3]).max() < 1e-10
    # every body of the lattice has the lattice's potential (64 bodies, spacing 1/4)
    np.testing.assert_allclose(out[3], LATTICE_POTENTIAL * 4, rtol=1e-10)


def test_the_ewald_sum_does_not_depend_on_alpha():
    rng = np.random.default_rng(1)
    x, m = rng.random((3, 40)) * 2.0, rng.random(40)
    sums = [ewald_forces(x, x, m, 2.0, alpha=a / 2.0, same=True) for a in (4.0, 6.0, 8.0)]
    scale = np.abs(sums[0]).max(axis=1, keepdims=True)
    for other in sums[1:]:
        assert (np.abs(other - sums[0]) / scale).max() < 1e-10


def _lekner_force_x(d, box):
    """The x force of one unit mass and all its images at separation ``d``, summed line by
    line of images with Lekner's Bessel series (an independent, exponentially convergent
    image sum): ``8 pi sum_l l sin(2 pi l x) sum_{m, n} K0(2 pi l rho_mn)``."""
    d = np.asarray(d) / box
    shifts = np.arange(-12, 13)
    my, mz = np.meshgrid(shifts, shifts, indexing="ij")
    rho = np.sqrt((d[1] + my) ** 2 + (d[2] + mz) ** 2).ravel()
    lines = np.arange(1, 80)[:, None]
    series = 8 * np.pi * lines * np.sin(2 * np.pi * lines * d[0]) * k0(2 * np.pi * lines * rho)
    return series.sum() / box**2


@pytest.mark.parametrize("source", [[1.4, 0.9, 0.3], [0.5, 2.1, 1.2], [2.9, 0.05, 1.5]])
def test_the_force_of_one_body_equals_its_image_sum(source):
    box, target = 3.0, np.array([0.2, 0.5, 2.9])
    out = ewald_forces(target[:, None], np.array(source)[:, None], np.array([1.0]), box)
    d = np.array(source) - target
    for axis in range(3):
        order = [axis, (axis + 1) % 3, (axis + 2) % 3]
        assert out[axis, 0] == pytest.approx(_lekner_force_x(d[order], box), rel=1e-10)


def test_softening_applies_to_the_nearest_image_only():
    box, eps = 1.0, 0.05
    a, b = _one([0.5, 0.5, 0.5]), _one([0.52, 0.51, 0.5])
    plain = ewald_forces(a, b, np.array([1.0]), box)
    soft = ewald_forces(a, b, np.array([1.0]), box, softening=eps)
    d = (b - a)[:, 0]
    r = np.linalg.norm(d)
    newton = d / r**3
    plummer = d / (r * r + eps * eps) ** 1.5
    np.testing.assert_allclose(soft[:3, 0] - plain[:3, 0], plummer - newton, rtol=1e-10)


# -- TreePM's parts against the Ewald sum's -----------------------------------------------------

def _uniform(n, seed=2):
    rng = np.random.default_rng(seed)
    return rng.random((3, n)), np.full(n, 1.0 / n)


def _relative(forces, reference):
    return (np.linalg.norm(forces[:3] - reference[:3], axis=0)
            / np.linalg.norm(reference[:3], axis=0))


def test_the_mesh_force_converges_to_the_reciprocal_sum_as_the_mesh_grows():
    """At a fixed split scale, the mesh's long-range force approaches the Ewald sum's
    reciprocal part (the same Gaussian split, alpha = 1 / 2 r_s) as h^2."""
    x, m = _uniform(2000)
    split = 2.5 / 16
    alpha = 1 / (2 * split)
    vectors = ewald.wave_vectors(1.0, alpha)
    factors = ewald.structure_factors(x[0], x[1], x[2], m, 1.0, vectors)
    t = x[:, :200]
    reference = ewald.reciprocal_space(t[0], t[1], t[2], 1.0, alpha, vectors, factors, 1.0)
    errors = []
    for mesh in (16, 32, 64):
        solved = pm.long_range(pm.mesh_sum(mesh, "float64", pm.deposit(x, m, 1.0, mesh, "tsc")),
                               1.0, split, False, "tsc")
        errors.append(np.median(_relative(pm.interpolate(t, m[:200], solved, 1.0, split,
                                                         "tsc"), reference)))
    assert errors[0] > 3 * errors[1] > 9 * errors[2]
    # TSC is the more accurate assignment at the same mesh
    solved = pm.long_range(pm.mesh_sum(16, "float64", pm.deposit(x, m, 1.0, 16)), 1.0,
                           split, False)
    assert np.median(_relative(pm.interpolate(t, m[:200], solved, 1.0, split), reference)) \
        > 3 * errors[0]


def test_the_mesh_conserves_momentum_to_round_off():
    x, m = _uniform(3000)
    solved = pm.long_range(pm.mesh_sum(20, "float64", pm.deposit(x, m, 1.0, 20, "tsc")),
                           1.0, 0.1, False, "tsc")
    forces = pm.interpolate(x, m, solved, 1.0, 0.1, "tsc")
    assert np.abs((m * forces).sum(axis=1)).max() < 1e-13 * (m * np.abs(forces)).sum()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_interpolation_gives_each_body_the_same_bits_in_any_order(dtype):
    """The interpolation takes the bodies by mesh plane (for the cache); a body's forces
    and potential do not depend on the order or company it is given in."""
    x, m = _uniform(3000, seed=5)
    x, m = x.astype(dtype), m.astype(dtype)
    solved = pm.long_range(pm.mesh_sum(24, dtype, pm.deposit(x, m, 1.0, 24, "tsc")), 1.0,
                           0.1, True, "tsc")
    whole = pm.interpolate(x, m, solved, 1.0, 0.1, "tsc")
    shuffled = np.random.default_rng(1).permutation(3000)
    np.testing.assert_array_equal(pm.interpolate(x[:, shuffled], m[shuffled], solved, 1.0,
                                                 0.1, "tsc"), whole[:, shuffled])
    np.testing.assert_array_equal(pm.interpolate(x[:, :7], m[:7], solved, 1.0, 0.1, "tsc"),
                                  whole[:, :7])


def test_the_short_range_walk_equals_the_real_space_sum_when_it_opens_every_cell():
    x, m = _uniform(1500)
    split = 0.04  # the cutoff (0.499) leaves out terms below exp(-38)
    tree = octree.build(x, m, 16)
    walked = short_walk(tree, tree, 0.0, 1e-3, 1.0, split, 0.499, True)
    t = x[:, :300]
    reference = ewald.real_space(t[0], t[1], t[2], x[0], x[1], x[2], m, 1.0, 1 / (2 * split),
                                 0.0, True)
    # the walk's split factors are within FAST_SPLIT_ERROR of the exact ones: each pair's
    # term within that much of Newton's (sum m / r^2 and m / r bound the sums' errors)
    d = x[:, None, :] - t[:, :, None]
    d -= np.floor(d + 0.5)
    r = np.sqrt((d * d).sum(axis=0))
    with np.errstate(divide="ignore"):
        newton = np.where(r > 0, m / r**2, 0).sum(axis=1), np.where(r > 0, m / r, 0).sum(axis=1)
    bound = 2 * FAST_SPLIT_ERROR["float64"]
    assert (np.linalg.norm(walked[:3, :300] - reference[:3], axis=0) <= bound * newton[0]).all()
    # the Ewald real part has each body's own smooth part removed: m / (r_s sqrt(pi)) more
    own = m[:300] / (split * math.sqrt(math.pi))
    assert (np.abs(walked[3, :300] + own - reference[3]) <= bound * newton[1]).all()


def _short_range_sum(x, m, n_targets, split, cutoff):
    """The short-range forces (3, n_targets) and potentials on the first ``n_targets`` bodies
    of ``x`` (3, n) in the unit box by the pairs within the cutoff, in float64 with scipy's
    erfc, and the sums of Newton's force and potential magnitudes over those pairs."""
    t = x[:, :n_targets]
    d = x[:, None, :] - t[:, :, None]
    d -= np.floor(d + 0.5)
    r = np.sqrt((d * d).sum(axis=0))
    inside = (r > 0) & (r <= cutoff)
    u = np.where(inside, r, 1.0) / (2 * split)
    e = erfc(u)
    g = e + 2 / math.sqrt(math.pi) * u * np.exp(-u * u)
    with np.errstate(divide="ignore"):
        force = np.where(inside, m * g / r**3, 0)
        newton = np.where(inside, m / r**2, 0).sum(axis=1), np.where(inside, m / r, 0).sum(axis=1)
        potential = -np.where(inside, m * e / r, 0).sum(axis=1)
    return (force[None] * d).sum(axis=2), potential, newton


def test_the_short_range_walk_with_the_pairs_polynomials_equals_a_direct_sum():
    """At the default cutoff (5 r_s, where the pairs take the polynomial factors) and
    every cell opened, the walk is a sum over the pairs within the cutoff: against that
    sum in float64 with scipy's erfc."""
    x, m = _uniform(1500)
    split, cutoff = 0.04, 0.2
    tree = octree.build(x, m, 16)
    walked = short_walk(tree, tree, 0.0, 1e-3, 1.0, split, cutoff, True)
    reference, potential, newton = _short_range_sum(x, m, 300, split, cutoff)
    bound = 2 * POLYNOMIAL_SPLIT_ERROR["float64"]
    assert (np.linalg.norm(walked[:3, :300] - reference, axis=0) <= bound * newton[0]).all()
    assert (np.abs(walked[3, :300] - potential) <= bound * newton[1]).all()


def _long_range_sum(target, x, m, split):
    """The long-range acceleration and potential of sources ``x`` (3, n) on one target,
    directly in float64: ``-sum m (1 - g) / r^3 (t - x)`` and ``sum m erf(r / 2r_s) / r``."""
    d = target[:, None] - x
    r = np.sqrt((d * d).sum(axis=0))
    u = r / (2 * split)
    lf = (erf(u) - 2 / math.sqrt(math.pi) * u * np.exp(-u * u)) / r**3
    return -(m * lf * d).sum(axis=1), (m * erf(u) / r).sum()


def test_a_cells_long_range_expansion_converges_as_its_size_cubed():
    """long_m2p subtracts a cell's long range as one expansion about its centre of mass,
    for targets anywhere within the cutoff (inside the cell too): its error falls as
    (b_max / r_s)^3."""
    split, cutoff = 1.0, 5.0
    law = walk_constants(100.0, split, cutoff, np.float64)
    rng = np.random.default_rng(0)
    unit = rng.random((3, 40)) - 0.5
    m = rng.random(40)
    errors = []
    for size in (0.4, 0.2):
        x = unit * size * 2 / math.sqrt(3) + 3.0
        moments = np.zeros((11, 1))
        com = (x * m).sum(axis=1) / m.sum()
        d = x - com[:, None]
        r2 = (d * d).sum(axis=0)
        moments[:4, 0] = m.sum(), *com
        moments[4:7, 0] = [(m * (3 * d[i] * d[i] - r2)).sum() for i in range(3)]
        moments[7:10, 0] = [(3 * m * d[i] * d[j]).sum() for i, j in ((0, 1), (0, 2), (1, 2))]
        moments[10, 0] = (m * r2).sum()
        worst = [0.0, 0.0]
        for offset in ([0.1, 0.0, 0.0], [1.5, 1.0, 0.3], [3.0, 2.0, 1.0]):
            target = com + np.array(offset)
            out = np.zeros((4, 1))
            long_m2p(target[:1], target[1:2], target[2:], moments, 1, law, out)
            acc, potential = _long_range_sum(target, x, m, split)
            newton = m.sum() / np.sum(np.square(offset))  # the cell's Newton force
            worst[0] = max(worst[0], np.linalg.norm(out[:3, 0] + acc) / newton)
            worst[1] = max(worst[1], abs(out[3, 0] - potential) / potential)
        errors.append(worst)
    assert errors[1][0] < 3e-4 and errors[1][1] < 2e-5
    assert errors[0][0] > 6 * errors[1][0] and errors[0][1] > 6 * errors[1][1]


def test_the_short_range_of_a_dense_clump_equals_a_direct_sum():
    """In a clump much smaller than r_s, the walk takes cells as Newton's less one
    expansion of their long range (b_max <= INSIDE r_s): against the float64 sum of the
    exact law over the pairs within the cutoff."""
    rng = np.random.default_rng(5)
    n = 3000
    clump = 0.5 + 0.01 * rng.standard_normal((3, n)) / np.sqrt(1 + rng.random(n) * 4)
    x = np.concatenate([clump, rng.random((3, 1000))], axis=1)
    m = np.full(x.shape[1], 1.0 / x.shape[1])
    split, cutoff = 0.04, 0.2
    tree = octree.build(x, m, 16)
    assert (tree.bmax[~tree.leaf] <= INSIDE * split).sum() > 10  # cells that take the path
    walked = short_walk(tree, tree, 0.0, 1e-3, 1.0, split, cutoff, True)
    reference, potential, _ = _short_range_sum(x, m, 300, split, cutoff)
    error = np.linalg.norm(walked[:3, :300] - reference, axis=0) / np.linalg.norm(reference,
                                                                                axis=0)
    assert np.median(error) < 1e-5 and error.max() < 1e-3
    assert np.abs(walked[3, :300] / potential - 1).max() < 5e-5


def test_cells_across_the_box_edge_give_the_same_forces():
    """A tile's tree keeps its cells between re-tilings while bodies wrap around the box:
    cells then hold bodies at both edges (the walk takes each pair's nearest image)."""
    x, m = _uniform(3000, seed=4)
    split, cutoff = 0.04, 0.2
    before = x.copy()
    before[0] = (x[0] + 0.5) % 1.0 - 0.5  # half the box on the other side of x = 0
    tree = octree.build(before, m, 16)
    wrapped = octree.refit(tree, x, m)  # the same cells, the bodies back in [0, 1)
    plain = short_walk(octree.build(x, m, 16), octree.build(x, m, 16), 0.0, 0.4, 1.0, split,
                       cutoff, True)
    across = short_walk(wrapped, wrapped, 0.0, 0.4, 1.0, split, cutoff, True)
    scale = np.linalg.norm(plain[:3], axis=0)
    assert np.median(np.linalg.norm(across[:3] - plain[:3], axis=0) / scale) < 1e-4
    assert (np.linalg.norm(across[:3] - plain[:3], axis=0) < 1e-2 * scale).all()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_vectorised_split_factors_equal_the_exact_ones(dtype):
    @njit
    def factors(r, constants, one):
        out = np.empty((3, r.shape[0]), dtype=r.dtype)
        for i in range(r.shape[0]):
            out[0, i], out[1, i], out[2, i] = fast_short_range(r[i], constants, one)
        return out

    split = 0.7
    r = np.append(np.linspace(0, 16 * split, 100_001), [1e3, 1e30]).astype(dtype)
    fast = factors(r, short_range_constants(split, dtype), np.dtype(dtype).type(1))
    u = r.astype(np.float64) / (2 * split)
    exact_e = erfc(u)
    exact_g = exact_e + 2 / math.sqrt(math.pi) * u * np.exp(-u * u)
    assert np.abs(fast[0] - exact_g).max() <= FAST_SPLIT_ERROR[dtype]
    assert np.abs(fast[1] - exact_e).max() <= FAST_SPLIT_ERROR[dtype]
    assert np.abs(fast[2] - np.exp(-u * u)).max() <= FAST_SPLIT_ERROR[dtype]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("cutoff", [0.5, 2.0, 4.5, 5.0, POLYNOMIAL_CUTOFF])
def test_the_pairs_polynomial_long_range_law_equals_the_exact_one(dtype, cutoff):
    """The pairs' law is Newton's less the long range, ``(1 - g) / r^3`` and
    ``erf(r / 2r_s) / r`` as polynomials in ``r^2``: within POLYNOMIAL_SPLIT_ERROR of
    Newton's force and potential at every separation up to the cutoff."""
    @njit
    def terms(r2, poly, one):
        out = np.empty((2, r2.shape[0]), dtype=r2.dtype)
        for i in range(r2.shape[0]):
            out[0, i], out[1, i] = polynomial_long_range(r2[i], poly, one)
        return out

    split = 0.7
    r = np.linspace(0, cutoff * split, 100_001)
    poly = long_range_polynomials(split, cutoff * split, dtype)
    fast = terms((r * r).astype(dtype), poly, np.dtype(dtype).type(1)).astype(np.float64)
    u = r / (2 * split)
    with np.errstate(invalid="ignore", divide="ignore"):
        exact_force = np.where(r > 0, (erf(u) - 2 / math.sqrt(math.pi) * u * np.exp(-u * u))
                               / r**3, 1 / (6 * math.sqrt(math.pi) * split**3))
        exact_potential = np.where(r > 0, erf(u) / r, 1 / (math.sqrt(math.pi) * split))
    assert (np.abs(fast[0] - exact_force) * r**3).max() <= POLYNOMIAL_SPLIT_ERROR[dtype]
    assert (np.abs(fast[1] - exact_potential) * r).max() <= POLYNOMIAL_SPLIT_ERROR[dtype]
    # within the cutoff the short-range force m (1 / r^3 - lf) r keeps its sign
    assert (fast[0][1:] * r[1:]**3 <= 1 + POLYNOMIAL_SPLIT_ERROR[dtype]).all()
    # beyond the cutoff: the terms at the cutoff, finite (the pairs' mass is zero there)
    beyond = terms(np.array([(2 * cutoff * split) ** 2, 1e30], dtype=dtype), poly,
                   np.dtype(dtype).type(1))
    assert np.isfinite(beyond).all()
    assert np.allclose(beyond[:, 0], fast[:, -1], rtol=1e-6, atol=0)


# -- TreePM through the API ------------------------------------------------------------------

def test_softened_treepm_potential_energy_equals_the_ewald_sums():
    """Softened bodies in clumps: TreePM's pairs are Newton's softened law less the mesh's
    long range (not softened), so forces and potential add up to the softened Ewald sum.
    (Softening the long range too, as the pairs did before, left the potential energy 0.5%
    off here and the median force error 4x higher.)"""
    ds = nbody_dask.plummer_clumps(1000, seed=3)
    kw = dict(box_size=1.0, softening=0.004, dtype="float64")
    ewald = nbody_dask.potential_energy(ds, method="direct", **kw)
    treepm = nbody_dask.potential_energy(ds, method="treepm", **kw)
    assert abs(treepm / ewald - 1) < 1e-4


def _bodies(position, mass):
    return nbody_dask.make_bodies(position.T, np.zeros_like(position.T), mass)


def _errors_against_ewald(bodies, acc, sample=300, seed=0):
    x = bodies.position.values.T
    m = bodies.mass.values
    x = x - np.floor(x)  # the unit box
    targets = np.random.default_rng(seed).choice(len(m), sample, replace=False)
    reference = ewald_forces(x[:, targets], x, m, 1.0)
    return _relative(acc[targets].T, reference)


@pytest.fixture(scope="module")
def boxes():
    x, m = _uniform(4096, seed=5)
    return {"uniform": _bodies(x, m), "clustered": nbody_dask.plummer_clumps(4096, seed=3)}


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("kind", ["uniform", "clustered"])
def test_treepm_meets_its_accuracy_at_the_defaults(client, boxes, kind, dtype):
    """Median relative force error <= 1e-3, p99 <= 1e-2 against the Ewald sum (measured:
    2.7e-4 / 1.4e-3 uniform, 4.7e-5 / 9.2e-4 clustered), on 4 spatial tiles."""
    acc = nbody_dask.accelerations(boxes[kind], box_size=1.0, method="treepm", dtype=dtype,
                                   tile_size=1024, client=client)
    assert acc.dtype == np.dtype(dtype)
    errors = _errors_against_ewald(boxes[kind], acc)
    assert np.median(errors) <= 1e-3 and np.percentile(errors, 99) <= 1e-2


def test_the_accurate_setting_reaches_1e_4(client, boxes):
    """The user guide's accurate setting: a longer cutoff and a smaller opening angle."""
    acc = nbody_dask.accelerations(boxes["uniform"], box_size=1.0, method="treepm",
                                   cutoff=6.0, theta=0.3, client=client)
    assert np.median(_errors_against_ewald(boxes["uniform"], acc)) <= 1e-4


def test_treepm_error_falls_as_theta_shrinks(client, boxes):
    """In clumps the walk accepts cells: their errors are the tail (measured p99: 8e-3 at
    theta = 1, 2e-4 at 0.3)."""
    errors = [np.percentile(_errors_against_ewald(boxes["clustered"], nbody_dask.accelerations(
        boxes["clustered"], box_size=1.0, method="treepm", theta=theta, cutoff=6.0,
        client=client)), 99) for theta in (1.0, 0.3)]
    assert errors[1] < errors[0] / 4


def test_force_accuracy_and_recorded_errors_use_the_ewald_sum(client):
    ds = nbody_dask.plummer_clumps(1200, seed=4)
    exact = nbody_dask.force_accuracy(ds, box_size=1.0, method="direct", sample=100,
                                      client=client)
    assert exact.max < 1e-11
    treepm = nbody_dask.force_accuracy(ds, box_size=1.0, method="treepm", sample=200,
                                       client=client)
    assert treepm.median < 1e-3
    traj = _run(client, ds, steps=2, dt=1e-4, snapshot_every=1, force_error_sample=150,
                tile_size=400)
    recorded = traj.force_error.sel(statistic="median").values
    assert (recorded > 0).all() and (recorded < 1e-3).all()


def test_bodies_that_carry_a_box_are_periodic_without_box_size(client):
    """A periodic run's snapshot (or cosmological initial conditions) carries ``box_size``:
    every entry point reads it where ``box_size`` is not given, and a method for isolated
    systems says where the box came from."""
    x, m = _uniform(300, seed=7)
    bodies = _bodies(x, m)
    kw = dict(method="direct", client=client)
    given = nbody_dask.accelerations(bodies, box_size=1.0, **kw)
    energy = nbody_dask.potential_energy(bodies, box_size=1.0, **kw)
    bodies.attrs["box_size"] = 1.0
    np.testing.assert_array_equal(nbody_dask.accelerations(bodies, **kw), given)
    assert nbody_dask.potential_energy(bodies, **kw) == energy
    assert nbody_dask.force_accuracy(bodies, sample=50, **kw).max < 1e-11
    with pytest.raises(ValueError, match=r"box_size=1.0 is the bodies' attribute"):
        nbody_dask.accelerations(bodies, method="tree", client=client)
    traj = nbody_dask.simulate(bodies, steps=1, dt=1e-4, progress=False, **kw)
    assert traj.attrs["box_size"] == 1.0


def test_direct_in_a_box_is_the_ewald_sum_on_any_tiling(client):
    x, m = _uniform(300, seed=7)
    bodies = _bodies(x, m)
    reference = ewald_forces(x, x, m, 1.0, same=True)[:3].T
    for tile_size in (None, 64):
        acc = nbody_dask.accelerations(bodies, box_size=1.0, method="direct",
                                       tile_size=tile_size, client=client)
        np.testing.assert_allclose(acc, reference, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("method", ["direct", "treepm"])
def test_one_and_two_bodies_in_a_box(client, method):
    one = nbody_dask.make_bodies([[0.2, 0.4, 0.6]], [[0, 0, 0]], [2.0])
    assert np.abs(nbody_dask.accelerations(one, box_size=1.0, method=method,
                                           client=client)).max() < 1e-6
    energy = nbody_dask.potential_energy(one, box_size=1.0, method=method, client=client)
    assert energy == pytest.approx(0.5 * 4.0 * LATTICE_POTENTIAL, rel=1e-3)
    two = nbody_dask.make_bodies([[0.2, 0.4, 0.6], [0.5, 0.45, 0.62]], np.zeros((2, 3)),
                                 [1.0, 1.0])
    acc = nbody_dask.accelerations(two, box_size=1.0, method=method, client=client)
    reference = ewald_forces(two.position.values.T, two.position.values.T, np.ones(2), 1.0,
                             same=True)[:3]
    assert _relative(acc.T, reference).max() < 1e-3


def test_positions_are_wrapped_into_the_box(client):
    """Bodies given outside the box start at their images inside; a body that drifts out
    comes back in at the other side."""
    bodies = nbody_dask.make_bodies([[-0.25, 0.5, 1.75], [0.5, 0.5, 0.5]],
                                    [[-1.0, 0, 0], [0, 0, 0]], [1e-6, 1e-6])
    traj = nbody_dask.simulate(bodies, steps=10, dt=0.05, box_size=1.0, method="direct",
                               snapshot_every=5, progress=False, client=client)
    np.testing.assert_allclose(traj.position[0, 0].values, [0.75, 0.5, 0.75])
    x = traj.position[:, 0, 0].values
    assert ((traj.position.values >= 0) & (traj.position.values < 1)).all()
    np.testing.assert_allclose(x, (0.75 - np.array([0.0, 0.25, 0.5])) % 1.0, atol=1e-6)


def _run(client, ds, **kw):
    kw = {**dict(steps=12, dt=0.02, softening=0.01, snapshot_every=4, tile_size=512,
                 box_size=1.0, method="treepm", progress=False, client=client), **kw}
    return nbody_dask.simulate(ds, **kw)


def test_momentum_is_conserved_by_treepm(client):
    """A cold uniform box collapses; its total momentum stays within 1e-6 of sum m |v| (the
    mesh and the pairs walked body by body conserve it to round-off, accepted cells do not
    quite: measured 1e-7)."""
    x, m = _uniform(2048, seed=9)
    traj = _run(client, _bodies(x, m), steps=40, snapshot_every=20, tile_size=None)
    scale = (traj.mass * np.abs(traj.velocity)).sum(("body", "axis")).values[-1]
    assert scale > 0
    assert float(np.abs(traj.momentum).max()) <= 1e-6 * scale


def test_an_isolated_clump_in_a_large_box_conserves_energy_as_the_tree_does(client):
    """A Plummer sphere in a box 50 times its size: the energy error of TreePM within a
    factor of 2 of the isolated tree's over the same steps."""
    ds = nbody_dask.plummer(1024, seed=4)
    boxed = ds.assign(position=ds.position + 25.0)
    kw = dict(steps=64, dt=1 / 64, softening=0.02, snapshot_every=16, progress=False,
              client=client, theta=0.4)
    tree = nbody_dask.simulate(ds, method="tree", **kw)
    box = nbody_dask.simulate(boxed, method="treepm", box_size=50.0, **kw)

    def drift(traj):
        energy = traj.total_energy.values
        return np.abs(energy / energy[0] - 1).max()

    assert drift(box) <= 2 * drift(tree) + 1e-6


def test_store_records_the_box_and_resumes_bit_identically(client, tmp_path):
    ds = nbody_dask.plummer_clumps(1500, seed=1)
    whole = _run(client, ds, store=tmp_path / "whole.zarr").load()
    assert whole.attrs["method"] == "treepm" and whole.attrs["box_size"] == 1.0
    assert whole.attrs["mesh_size"] == auto_mesh_size(1500) and whole.attrs["cutoff"] == 5.0
    np.testing.assert_array_equal(whole.body.values, ds.body.values)
    np.testing.assert_array_equal(whole.position[0].values, ds.position.values)
    store = tmp_path / "part.zarr"

    class Crash(Exception):
        pass

    def crash(step, record):
        if step >= 5:
            raise Crash

    with pytest.raises(Crash):
        _run(client, ds, store=store, callback=crash)
    with pytest.raises(ValueError, match="box_size=2.0 differs from the store's"):
        nbody_dask.simulate(store=store, resume=True, box_size=2.0, client=client)
    resumed = nbody_dask.simulate(store=store, resume=True, client=client, progress=False)
    for name in ("position", "velocity", "total_energy", "momentum"):
        np.testing.assert_array_equal(resumed[name].values, whole[name].values)
    assert xr.open_zarr(store).attrs["box_size"] == 1.0


def _final(n_workers, threads, processes, tmp_path, name, dtype, mesh_slabs):
    where = {"host": "127.0.0.1"} if processes else {}
    with LocalCluster(n_workers=n_workers, threads_per_worker=threads, processes=processes,
                      dashboard_address="127.0.0.1:0", **where) as cluster, \
            Client(cluster) as c:
        traj = _run(c, nbody_dask.plummer_clumps(1500, seed=2), store=tmp_path / name,
                    dtype=dtype, split_every=3, mesh_slabs=mesh_slabs)
        return traj.isel(time=-1).load()


@pytest.mark.slow
@pytest.mark.parametrize(("dtype", "mesh_slabs"), [("float32", 3)])
def test_treepm_bit_identical_across_workers_and_threads(tmp_path, dtype, mesh_slabs):
    """3 spatial tiles re-cut 4 times, the mesh in 3 slabs (the FFT a graph across the
    workers): one worker with 1 or 2 threads, two processes. (A mesh in one FFT task and
    float64 keep their bits in the crash-and-resume and rows-and-pairs tests.)"""
    runs = [_final(w, t, p, tmp_path, f"{w}-{t}-{p}.zarr", dtype, mesh_slabs)
            for w, t, p in ((1, 1, False), (1, 2, False), (2, 1, True))]
    for other in runs[1:]:
        for name in ("position", "velocity", "total_energy", "momentum"):
            np.testing.assert_array_equal(runs[0][name].values, other[name].values)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_mesh_in_slabs_gives_the_forces_of_one_fft_task(client, dtype):
    """The distributed FFT (meshfft) in the run: the same forces to round-off."""
    ds = nbody_dask.plummer_clumps(3000, seed=6)
    one = nbody_dask.accelerations(ds, box_size=1.0, method="treepm", tile_size=750,
                                   dtype=dtype, client=client)
    for slabs in (2, 5):
        slabbed = nbody_dask.accelerations(ds, box_size=1.0, method="treepm", tile_size=750,
                                           dtype=dtype, mesh_slabs=slabs, client=client)
        scale = np.linalg.norm(one, axis=1)
        assert (np.linalg.norm(slabbed - one, axis=1) <= 1e-5 * scale
                if dtype == "float32" else 1e-12 * scale).all()


def test_large_meshes_are_cut_into_slabs():
    assert auto_mesh_slabs(512, "float32") == 2 and auto_mesh_slabs(406, "float32") == 1
    assert auto_mesh_slabs(1024, "float64") == 32 and auto_mesh_slabs(64, "float64") == 1
    plan = Plan(n=10, steps=1, dt=0.1, method="treepm", box_size=1.0, mesh_size=32,
                mesh_slabs=5)
    assert plan.mesh_slab_bounds() == [(0, 6), (6, 12), (12, 19), (19, 25), (25, 32)]


def test_the_rows_layout_gives_the_bits_of_the_pairs_layout(client):
    ds = nbody_dask.plummer_clumps(2000, seed=8)
    kw = dict(steps=6, dt=0.01, softening=0.005, box_size=1.0, method="treepm",
              snapshot_every=3, tile_size=700, split_every=2, progress=False, client=client)
    pairs = nbody_dask.simulate(ds, layout="pairs", **kw)
    rows = nbody_dask.simulate(ds, layout="rows", **kw)
    assert rows.attrs["layout"] == "rows"
    for name in ("position", "velocity", "potential_energy"):
        np.testing.assert_array_equal(rows[name].values, pairs[name].values)


@pytest.mark.slow
def test_a_sigkilled_driver_resumed_is_bit_identical(tmp_path, interrupt_cli_run):
    """A CLI driver running TreePM on 3 spatial tiles is SIGKILLed after 3 snapshots, then
    resumed: the store equals an uninterrupted run's."""
    import signal

    from nbody_dask.storage import committed_snapshots

    run = ["run", "--ic", "clumps", "-n", "1500", "--box-size", "1", "--steps", "40", "--dt",
           "0.005", "--softening", "0.005", "--snapshot-every", "5", "--tile-size", "500",
           "--method", "treepm", "--no-progress"]
    reference = tmp_path / "reference.zarr"
    subprocess.run([sys.executable, "-m", "nbody_dask.cli", *run, "--store", str(reference)],
                   check=True, timeout=300)
    store = tmp_path / "killed.zarr"
    returncode, err = interrupt_cli_run([*run, "--store", str(store)], store, 3, signal.SIGKILL)
    assert returncode == -9, err
    whole = nbody_dask.open_trajectory(reference).load()
    assert 3 <= committed_snapshots(store) < whole.sizes["time"]
    subprocess.run([sys.executable, "-m", "nbody_dask.cli", "resume", str(store),
                    "--no-progress"], check=True, timeout=300)
    got = nbody_dask.open_trajectory(store).load()
    for name in ("position", "velocity", "total_energy", "momentum"):
        np.testing.assert_array_equal(got[name].values, whole[name].values, err_msg=name)


# -- parameters --------------------------------------------------------------------------------

def test_auto_picks_the_ewald_sum_then_treepm():
    assert resolve_method("auto", 511, periodic=True) == "direct"
    assert resolve_method("auto", 512, periodic=True) == "treepm"
    assert resolve_method("auto", 100_000) == "tree"


def test_the_mesh_is_twice_the_particle_grid_by_default():
    assert auto_mesh_size(64**3) == 128 and auto_mesh_size(1000) == 32
    assert auto_mesh_size(100**3) == 200 and auto_mesh_size(1) == 32
    plan = Plan(n=4096, steps=1, dt=0.1, method="treepm", box_size=2.0)
    assert plan.mesh_size == 32 and plan.split_length == pytest.approx(2.5 * 2 / 32)
    assert plan.cutoff_length == pytest.approx(5 * 2.5 * 2 / 32)


@pytest.mark.parametrize(("kw", "match"), [
    (dict(method="treepm"), "method='treepm' is for periodic boxes: give box_size"),
    (dict(method="tree", box_size=1.0), "method='tree' is for isolated systems"),
    (dict(box_size=-1.0), "box_size must be > 0, got -1.0"),
    (dict(box_size=float("inf")), "box_size must be finite"),
    (dict(method="treepm", box_size=1.0, mesh_size=1), "mesh_size must be >= 2, got 1"),
    (dict(method="treepm", box_size=1.0, mesh_size=32, mesh_slabs=33),
     r"mesh_slabs must be <= mesh_size \(32\), got 33"),
    (dict(method="treepm", box_size=1.0, mesh_slabs=0), "mesh_slabs must be >= 1, got 0"),
    (dict(method="treepm", box_size=1.0, mesh_size=20),
     r"cutoff \* split = 12.5 mesh cells must be less than half the mesh \(mesh_size=20\)"),
    (dict(method="treepm", box_size=1.0, split=0.0), "split must be > 0, got 0.0"),
    (dict(method="treepm", box_size=1.0, cutoff=-2), "cutoff must be > 0, got -2"),
    (dict(method="direct", box_size=1.0, layout="rows"), "run the 'pairs' layout"),
])
def test_bad_periodic_parameters_are_refused_before_any_work(no_cluster, kw, match):
    with pytest.raises(ValueError, match=match):
        nbody_dask.simulate(nbody_dask.plummer(64), steps=1, dt=0.01, **kw)


@pytest.mark.slow
def test_cli_runs_a_periodic_box(tmp_path):
    store = tmp_path / "box.zarr"
    done = subprocess.run([sys.executable, "-m", "nbody_dask.cli", "run", "--ic", "clumps",
                           "-n", "600", "--box-size", "1", "--steps", "4", "--dt", "0.0005",
                           "--snapshot-every", "2", "--method", "treepm", "--store",
                           str(store), "--no-progress"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    traj = xr.open_zarr(store)
    assert traj.attrs["method"] == "treepm" and traj.attrs["box_size"] == 1.0
    assert float(traj.position.min()) >= 0 and float(traj.position.max()) < 1
    info = subprocess.run([sys.executable, "-m", "nbody_dask.cli", "info", str(store)],
                          capture_output=True, text=True, timeout=120)
    assert "treepm (box_size = 1.0" in info.stdout
    measured = subprocess.run([sys.executable, "-m", "nbody_dask.cli", "accuracy", str(store),
                               "--sample", "100"], capture_output=True, text=True, timeout=120)
    assert measured.returncode == 0, measured.stderr
    median = float(measured.stdout.split("median ")[1].split(",")[0])
    assert measured.stdout.startswith("treepm: ") and median < 1e-3

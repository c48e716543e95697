"""Physics of the initial-condition generators (seeded; tolerances from sampling noise)."""

from __future__ import annotations

import numpy as np
import pytest

import nbody_dask
from nbody_dask.diagnostics import virial_ratio
from nbody_dask.kernels.cpu import accel_tile
from nbody_dask.testing import direct_sum_reference


def _energies(ds):
    m = ds.mass.values
    kinetic = 0.5 * np.sum(m * (ds.velocity.values ** 2).sum(1))
    _, phi = direct_sum_reference(ds.position.values, m)
    return kinetic, 0.5 * np.sum(m * phi)


def test_plummer_in_henon_units():
    ds = nbody_dask.plummer(4096, seed=1)
    assert ds.mass.sum() == pytest.approx(1.0)
    kinetic, potential = _energies(ds)
    # 2K/|W| = 1 and E = -1/4, within sampling noise (~1/sqrt(N) ~ 2%)
    assert virial_ratio(kinetic, potential) == pytest.approx(1.0, abs=0.06)
    assert kinetic + potential == pytest.approx(-0.25, abs=0.015)
    r = np.sort(np.linalg.norm(ds.position.values, axis=1))
    half_mass_radius = r[len(r) // 2]
    assert half_mass_radius == pytest.approx(3 * np.pi / 16 / np.sqrt(2 ** (2 / 3) - 1),
                                             rel=0.05)


def test_hernquist_in_henon_units():
    """Truncated at 99% of the mass, so: E a little above -1/4 (the missing outer 1% is
    bound by ~1/200 of the potential depth), virial, the truncated sphere's half-mass
    radius, and the cusp: M(r) ~ (r / a)^2 at small r."""
    ds = nbody_dask.hernquist(4096, seed=1)
    kinetic, potential = _energies(ds)
    assert virial_ratio(kinetic, potential) == pytest.approx(1.0, abs=0.06)
    assert kinetic + potential == pytest.approx(-0.25, abs=0.02)
    r = np.sort(np.linalg.norm(ds.position.values, axis=1))
    a = 1 / 3
    root = np.sqrt(0.99 * 0.5)  # the median of the radii drawn from the inner 99%
    assert r[len(r) // 2] == pytest.approx(a * root / (1 - root), rel=0.05)
    # the cusp, about the densest point (the centre of mass moves with the far bodies)
    centre = np.median(ds.position.values, axis=0)
    inner = np.count_nonzero(np.linalg.norm(ds.position.values - centre, axis=1) < 0.1 * a)
    assert inner / len(r) == pytest.approx((0.1 / 1.1) ** 2, rel=0.3)


@pytest.mark.parametrize("make", [lambda: nbody_dask.plummer(500, seed=2),
                                  lambda: nbody_dask.hernquist(500, seed=2),
                                  lambda: nbody_dask.uniform_cube(500, seed=2),
                                  lambda: nbody_dask.kepler(0.7, masses=(0.8, 0.2))])
def test_centre_of_mass_at_rest_at_origin(make):
    ds = make()
    m = ds.mass.values
    np.testing.assert_allclose(m @ ds.position.values, 0, atol=1e-15)
    np.testing.assert_allclose(m @ ds.velocity.values, 0, atol=1e-15)


def test_generators_are_reproducible():
    a, b = nbody_dask.plummer(100, seed=9), nbody_dask.plummer(100, seed=9)
    np.testing.assert_array_equal(a.position.values, b.position.values)
    assert not np.array_equal(a.position.values, nbody_dask.plummer(100, seed=10).position)


def test_uniform_cube_fills_the_cube():
    ds = nbody_dask.uniform_cube(2000, seed=3, side=2.0)
    pos = ds.position.values
    assert np.abs(pos).max() <= 1.0 + 0.05  # centred on the centre of mass
    assert np.all(ds.velocity.values == 0)
    assert pos.std(axis=0) == pytest.approx(np.full(3, 2 / np.sqrt(12)), rel=0.05)


def test_kepler_orbit_elements():
    ds = nbody_dask.kepler(0.5, masses=(0.6, 0.4), semi_major_axis=2.0)
    kinetic, potential = _energies(ds)
    assert kinetic + potential == pytest.approx(ds.attrs["energy"], rel=1e-14)
    assert ds.attrs["energy"] == pytest.approx(-0.6 * 0.4 / 4.0)
    separation = np.linalg.norm(ds.position.values[1] - ds.position.values[0])
    assert separation == pytest.approx(2.0 * (1 - 0.5))  # starts at pericentre
    assert ds.attrs["period"] == pytest.approx(2 * np.pi * np.sqrt(8.0))


def test_cold_collapse_sphere():
    cold = nbody_dask.cold_collapse(4000, seed=4)
    assert np.all(cold.velocity.values == 0)
    radius = cold.attrs["radius"]
    assert radius == pytest.approx(2.4)
    r = np.sort(np.linalg.norm(cold.position.values, axis=1))
    assert r[len(r) // 2] == pytest.approx(radius * 0.5 ** (1 / 3), rel=0.03)
    kinetic, potential = _energies(cold)
    assert kinetic == 0
    assert potential == pytest.approx(-0.25, rel=0.03)  # Hénon units, sampling noise

    warm = nbody_dask.cold_collapse(4000, seed=4, virial_ratio=0.5)
    kinetic, potential = _energies(warm)
    assert virial_ratio(kinetic, potential) == pytest.approx(0.5, rel=0.05)
    assert kinetic + potential == pytest.approx(-0.25, rel=0.05)


def test_merger_two_spheres_on_a_parabolic_orbit():
    ds = nbody_dask.merger(2001, seed=5, separation=12.0, impact_parameter=1.0)
    n1, n2 = ds.attrs["bodies_per_sphere"]
    assert n1 + n2 == 2001 and abs(n1 - n2) <= 1
    m, pos, vel = ds.mass.values, ds.position.values, ds.velocity.values
    centres = [np.average(pos[s], axis=0, weights=m[s]) for s in (slice(0, n1), slice(n1, None))]
    speeds = [np.average(vel[s], axis=0, weights=m[s]) for s in (slice(0, n1), slice(n1, None))]
    np.testing.assert_allclose(centres[1] - centres[0], [12.0, 1.0, 0.0], atol=0.2)
    rel_speed = np.linalg.norm(speeds[1] - speeds[0])
    assert rel_speed == pytest.approx(np.sqrt(2 / np.hypot(12.0, 1.0)), rel=1e-6)
    # E = two Plummer spheres of mass 1/2 (-1/4 each at mass 1, scaling as M^2) + a
    # parabolic orbit (0): -1/8, up to sampling noise and the spheres' extent.
    kinetic, potential = _energies(ds)
    assert kinetic + potential == pytest.approx(-0.125, abs=0.01)

    unequal = nbody_dask.merger(1000, seed=5, mass_ratio=0.25)
    assert unequal.attrs["bodies_per_sphere"] == [800, 200]


def test_freeman_rotation_curve_matches_bessel_functions():
    special = pytest.importorskip("scipy.special")
    from nbody_dask.initial_conditions import freeman_circular_speed

    r = np.array([0.01, 0.3, 1.0, 2.2, 5.0, 9.0])
    y = r / 2
    expected = np.sqrt(2 * y * y * (special.iv(0, y) * special.kv(0, y)
                                    - special.iv(1, y) * special.kv(1, y)))
    np.testing.assert_allclose(freeman_circular_speed(r), expected, rtol=1e-10)
    assert np.argmax(freeman_circular_speed(np.linspace(0.1, 5, 491))) == pytest.approx(
        (2.15 - 0.1) / 0.01, abs=2)  # the peak of a Freeman disk is at 2.15 R_d
    # far out the disk is a point mass (I_n K_n alone would overflow there: 0 * inf)
    far = np.array([200.0, 2000.0, 2e5])
    np.testing.assert_allclose(freeman_circular_speed(far) ** 2 * far, 1.0, rtol=2e-4)


def test_disk_rotates_on_its_own_rotation_curve():
    ds = nbody_dask.exponential_disk(20_000, seed=6, toomre_q=0.0, scale_height=0.05)
    pos, vel = ds.position.values, ds.velocity.values
    x, y, z = np.ascontiguousarray(pos.T)
    acc = np.stack(accel_tile(x, y, z, x, y, z, ds.mass.values, 0.02**2), axis=1)
    radius = np.hypot(pos[:, 0], pos[:, 1])
    inward = -(acc[:, 0] * pos[:, 0] + acc[:, 1] * pos[:, 1]) / radius
    v_phi = (pos[:, 0] * vel[:, 1] - pos[:, 1] * vel[:, 0]) / radius
    for lo in np.arange(0.5, 4.0, 0.5):
        ring = (radius >= lo) & (radius < lo + 0.5)
        measured = np.sqrt(np.mean(radius[ring] * inward[ring]))  # circular speed of the sample
        # thickness and softening weaken the inner force by a few per cent
        assert v_phi[ring].mean() == pytest.approx(measured, rel=0.05), lo
    assert np.abs(pos[:, 2]).mean() == pytest.approx(0.05 * np.log(2), rel=0.05)  # sech^2 profile


def test_disk_dispersion_follows_toomre_q():
    ds = nbody_dask.exponential_disk(20000, seed=7, toomre_q=1.5)
    pos, vel = ds.position.values, ds.velocity.values
    radius = np.hypot(pos[:, 0], pos[:, 1])
    v_radial = (pos[:, 0] * vel[:, 0] + pos[:, 1] * vel[:, 1]) / radius
    ring = np.abs(radius - 2.43) < 0.15
    surface = ring.sum() / 20000 / (np.pi * (2.58**2 - 2.28**2))
    from nbody_dask.initial_conditions import freeman_circular_speed
    r = np.array([2.42, 2.44])
    v = freeman_circular_speed(r)
    kappa = np.sqrt(2 * v.mean() / 2.43 * (v.mean() / 2.43 + np.diff(v)[0] / 0.02))
    toomre = v_radial[ring].std() * kappa / (3.36 * surface)
    assert toomre == pytest.approx(1.5, rel=0.1)
    assert np.mean(v_radial) == pytest.approx(0, abs=0.01)


@pytest.mark.parametrize("kind", sorted(nbody_dask.initial_conditions.GENERATORS))
def test_every_generator_centred_and_at_rest(kind):
    """Isolated systems are centred on the origin; a periodic box's bodies fill its cube."""
    ds = nbody_dask.initial_conditions.generate(kind, 301, seed=8)
    m = ds.mass.values
    assert m.sum() == pytest.approx(1.0)
    if kind == "clumps":
        assert (ds.position.values >= 0).all() and (ds.position.values < 1).all()
    else:
        np.testing.assert_allclose(m @ ds.position.values, 0, atol=1e-13)
    np.testing.assert_allclose(m @ ds.velocity.values, 0, atol=1e-13)
    assert ds.attrs["units"]


@pytest.mark.parametrize("call, match", [
    (lambda: nbody_dask.cold_collapse(10, virial_ratio=2.0), "virial_ratio must be < 2"),
    (lambda: nbody_dask.merger(1), "n must be >= 2"),
    (lambda: nbody_dask.merger(10, mass_ratio=3), "mass_ratio must be <= 1"),
    (lambda: nbody_dask.exponential_disk(10, truncation=0.5), "truncation must be > 1"),
    (lambda: nbody_dask.exponential_disk(10, scale_height=0), "scale_height must be > 0"),
    (lambda: nbody_dask.initial_conditions.generate("galaxy", 10), "one of"),
    (lambda: nbody_dask.initial_conditions.generate("plummer", 10, radius=2),
     "plummer initial conditions: .*radius"),
])
def test_generator_errors_name_the_parameter(call, match):
    with pytest.raises((TypeError, ValueError), match=match):
        call()

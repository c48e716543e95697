"""Physics of the initial-condition generators (seeded; tolerances from sampling noise)."""

from __future__ import annotations

import numpy as np
import pytest

import nbody_dask
from nbody_dask.diagnostics import virial_ratio
from nbody_dask.kernels.cpu import direct_sum_reference


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


@pytest.mark.parametrize("make", [lambda: nbody_dask.plummer(500, seed=2),
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

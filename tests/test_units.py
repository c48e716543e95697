"""Physical units: quantities in, code units (G = 1) inside, physical units out."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import nbody_dask
from nbody_dask import units

u = pytest.importorskip("astropy.units")
constants = pytest.importorskip("astropy.constants")


def _galaxy_bodies(n=50, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(n, 3)) * u.kpc, rng.normal(size=(n, 3)) * 100 * u.km / u.s,
            rng.uniform(1, 2, n) * 1e9 * u.solMass)


def test_round_trip_matches_astropy_conversions():
    pos, vel, mass = _galaxy_bodies()
    ds = nbody_dask.make_bodies(pos, vel, mass)
    assert ds.mass.sum() == pytest.approx(1.0, rel=1e-15)  # mass unit: the total mass
    np.testing.assert_array_equal(ds.position.values, pos.value)  # length unit: 1 kpc
    back = units.physical(ds)
    np.testing.assert_allclose(back.position.values, pos.to_value(u.kpc), rtol=1e-12)
    np.testing.assert_allclose(back.velocity.values, vel.to_value(u.km / u.s), rtol=1e-12)
    np.testing.assert_allclose(back.mass.values, mass.to_value(u.solMass), rtol=1e-12)
    other = units.physical(ds, length="pc", velocity="m/s", mass="kg")
    np.testing.assert_allclose(other.position.values, pos.to_value(u.pc), rtol=1e-12)
    np.testing.assert_allclose(other.velocity.values, vel.to_value(u.m / u.s), rtol=1e-12)
    np.testing.assert_allclose(other.mass.values, mass.to_value(u.kg), rtol=1e-12)
    assert other.position.attrs["units"] == "pc"
    # the scaling: G = 1 in code units
    system = units.UnitSystem.from_attrs(ds.attrs)
    g_code = (constants.G * system.mass * system.time**2 / system.length**3).decompose()
    assert float(g_code) == pytest.approx(1.0, rel=1e-12)


def test_a_run_in_physical_units_stores_cf_units(tmp_path, client):
    pos, vel, mass = _galaxy_bodies(seed=1)
    bodies = nbody_dask.make_bodies(pos, vel, mass)
    store = tmp_path / "galaxy.zarr"
    traj = nbody_dask.simulate(bodies, steps=4, dt=0.1 * u.Myr, softening=0.05 * u.kpc,
                               store=store, snapshot_every=2, client=client, progress=False)
    system = units.UnitSystem.from_attrs(traj.attrs)
    assert traj.attrs["dt"] == pytest.approx(float(0.1 * u.Myr / system.time), rel=1e-12)
    raw = xr.open_zarr(store)
    for name, kind in (("position", u.m), ("velocity", u.m / u.s), ("mass", u.kg),
                       ("time", u.s), ("total_energy", u.J), ("momentum", u.kg * u.m / u.s)):
        assert u.Unit(raw[name].attrs["units"]).is_equivalent(kind), name
    scale = u.Unit(raw["position"].attrs["units"]).to(u.kpc)
    assert scale == pytest.approx(1.0, rel=1e-12)
    phys = units.physical(traj, time="Myr", energy="erg")
    np.testing.assert_allclose(phys.time.values, [0, 0.2, 0.4], rtol=1e-12)
    kinetic = (0.5 * (mass * (vel**2).sum(axis=1)).sum()).to_value(u.erg)
    assert float(phys.kinetic_energy[0]) == pytest.approx(kinetic, rel=1e-12)


def test_earths_year(client):
    """kepler() in AU and solar masses, dt in years: the period measured from the orbit is
    Kepler's, 2 pi sqrt(a^3 / G (M_sun + M_earth)), to 1e-6."""
    earth = constants.M_earth.to(u.solMass)
    orbit = nbody_dask.kepler(0.0, masses=(1 * u.solMass, earth), semi_major_axis=1 * u.AU)
    traj = nbody_dask.simulate(orbit, steps=10_000, dt=1 * u.yr / 10_000, snapshot_every=100,
                               client=client, progress=False)
    phys = units.physical(traj, time="yr", length="AU")
    rel = phys.position.values[:, 1] - phys.position.values[:, 0]
    angle = np.unwrap(np.arctan2(rel[:, 1], rel[:, 0]))
    period = 2 * np.pi / np.polyfit(phys.time.values, angle, 1)[0]
    kepler = 2 * np.pi * np.sqrt((1 * u.AU) ** 3 / (constants.G * (1 * u.solMass + earth)))
    assert period == pytest.approx(kepler.to_value(u.yr), rel=1e-6)
    assert period == pytest.approx(365.256 / 365.25, rel=1e-5)  # the sidereal year


def test_mistakes_are_refused_clearly(no_cluster):
    pos, vel, mass = _galaxy_bodies()
    with pytest.raises(TypeError, match="mass must be an astropy Quantity"):
        nbody_dask.make_bodies(pos, vel, mass.value)
    with pytest.raises(ValueError, match="mass must be a mass quantity, got unit 'kpc'"):
        nbody_dask.make_bodies(pos, vel, pos[:, 0])
    with pytest.raises(ValueError, match="length_unit and mass_unit go with"):
        nbody_dask.make_bodies(pos.value, length_unit=1 * u.kpc)
    plain = nbody_dask.plummer(10)
    with pytest.raises(ValueError, match="dt=.* is a quantity but the bodies are in code"):
        nbody_dask.simulate(plain, steps=1, dt=1 * u.Myr)
    with pytest.raises(ValueError, match="no physical unit system"):
        units.physical(plain)


def test_units_at_the_boundary_name_the_parameter(no_cluster):
    """G with bodies in physical units (whose code units already set G = 1) is refused, and a
    quantity of the wrong kind names the parameter (issue 33, item 6)."""
    bodies = nbody_dask.make_bodies(*_galaxy_bodies())
    with pytest.raises(ValueError, match=r"G=4\.3e-06: the bodies are in physical units"):
        nbody_dask.simulate(bodies, steps=1, dt=0.1 * u.Myr, G=4.3e-6)
    with pytest.raises(ValueError, match=r"dt=<Quantity 3\. m> must be a time, got unit 'm'"):
        nbody_dask.simulate(bodies, steps=1, dt=3 * u.m)
    with pytest.raises(ValueError, match=r"softening=<Quantity 1\. s> must be a length"):
        nbody_dask.simulate(bodies, steps=1, dt=0.1 * u.Myr, softening=1 * u.s)


def test_resume_takes_the_same_quantities(tmp_path, client):
    """The run's own dt and softening, as quantities, are accepted on resume; others are
    refused naming the parameter."""
    bodies = nbody_dask.make_bodies(*_galaxy_bodies(seed=2))
    store = tmp_path / "galaxy.zarr"
    kw = dict(dt=0.1 * u.Myr, softening=0.05 * u.kpc)
    nbody_dask.simulate(bodies, steps=2, store=store, client=client, progress=False, **kw)
    again = nbody_dask.simulate(store=store, resume=True, client=client, progress=False, **kw)
    assert again.sizes["time"] == 2
    with pytest.raises(ValueError, match=r"resume: dt=.* differs from the store's dt="):
        nbody_dask.simulate(store=store, resume=True, dt=0.2 * u.Myr, client=client)
    with pytest.raises(ValueError, match=r"dt=<Quantity 1\. m> must be a time"):
        nbody_dask.simulate(store=store, resume=True, dt=1 * u.m, client=client)


def test_force_accuracy_takes_quantities_as_accelerations_does(client):
    # the reference sum uses the evaluation's softening in code units, so a method that is
    # exact measures as exact; a softening left in kpc (or refused) would not
    pos, vel, mass = _galaxy_bodies(seed=2)
    bodies = nbody_dask.make_bodies(pos, vel, mass)
    errors = nbody_dask.force_accuracy(bodies, softening=0.5 * u.kpc, method="direct",
                                       dtype="float64", client=client)
    assert errors.median < 1e-12 and errors.max < 1e-10
    other = nbody_dask.force_accuracy(bodies, softening=500 * u.pc, method="direct",
                                      dtype="float64", client=client)
    assert other.median == pytest.approx(errors.median, abs=1e-14)

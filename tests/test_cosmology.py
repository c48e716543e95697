"""Cosmological boxes: the background, 2LPT initial conditions, the power spectrum, comoving
runs (nbody_dask.cosmology, nbody_dask.lpt, nbody_dask.power)."""

from __future__ import annotations

import math

import dask
import numpy as np
import pytest
import xarray as xr
from astropy.cosmology import FlatLambdaCDM
from scipy.integrate import quad

import nbody_dask as nb
from nbody_dask.cosmology import (Background, as_cosmology, from_json, linear_power,
                                  mean_density, to_json)

EDS = {"H0": 70.0, "Om0": 1.0, "Tcmb0": 0.0}


# -- the background ---------------------------------------------------------------------------

def test_einstein_de_sitter_factors_and_growth_are_exact():
    bg = Background(EDS)
    a0, a1 = 0.1, 0.2
    assert bg.kick(a0, a1)[0] == pytest.approx(2 * (a1**0.5 - a0**0.5), rel=1e-13)
    assert bg.drift(a0, a1)[0] == pytest.approx(2 * (a0**-0.5 - a1**-0.5), rel=1e-13)
    a = np.array([0.01, 0.1, 0.5, 1.0])
    g = bg.growth(a)
    np.testing.assert_allclose(g.d1, a, rtol=1e-8)
    np.testing.assert_allclose(g.d2, -3 / 7 * a**2, rtol=1e-7)
    np.testing.assert_allclose(g.f1, 1, rtol=1e-8)
    np.testing.assert_allclose(g.f2, 2, rtol=1e-7)


def test_lcdm_growth_equals_heaths_integral():
    """Without radiation, D(a) is proportional to E(a) int_0^a da / (a E)^3 (Heath 1977)."""
    cosmo = FlatLambdaCDM(H0=70, Om0=0.3, Tcmb0=0)
    bg = Background(cosmo)

    def heath(a):
        return bg.efunc(a) * quad(lambda x: 1 / (x * bg.efunc(x)) ** 3, 0, a,
                                  epsabs=0, epsrel=1e-12)[0]

    a = np.array([0.02, 0.25, 0.5, 0.8])
    expected = np.array([heath(x) for x in a]).ravel() / heath(1.0)
    np.testing.assert_allclose(bg.growth(a).d1, expected, rtol=1e-7)
    # f = dlnD/dlna against a finite difference of the same integral
    step = 1e-4
    f = (np.log([heath(x * math.exp(step)) for x in a]).ravel()
         - np.log([heath(x * math.exp(-step)) for x in a]).ravel()) / (2 * step)
    np.testing.assert_allclose(bg.growth(a).f1, f, rtol=1e-6)


def test_step_factors_add_up_to_the_whole_integral():
    bg = Background("Planck18")
    a = np.exp(np.linspace(math.log(0.02), 0.0, 41))
    kick_open, drift, kick_close = bg.step_factors(a)
    assert drift.sum() == pytest.approx(bg.drift(0.02, 1.0)[0], rel=1e-10)
    assert (kick_open + kick_close).sum() == pytest.approx(bg.kick(0.02, 1.0)[0], rel=1e-10)
    # against adaptive quadrature of dt / a^2 = da / (a^3 E)
    expected = quad(lambda x: 1 / (x**3 * float(bg.efunc(x))), 0.02, 1.0, epsrel=1e-12)[0]
    assert drift.sum() == pytest.approx(expected, rel=1e-10)


@pytest.mark.parametrize("spec", ["Planck18", {"H0": 67.7, "Om0": 0.31},
                                  {"H0": 70, "Om0": 0.3, "Ode0": 0.6}])
def test_cosmologies_round_trip_through_json(spec):
    cosmo = as_cosmology(spec)
    again = from_json(to_json(cosmo))
    assert to_json(again) == to_json(cosmo)
    assert again.efunc(3.0) == cosmo.efunc(3.0)
    assert as_cosmology(to_json(cosmo)).efunc(1.0) == cosmo.efunc(1.0)


@pytest.mark.parametrize("spec, match", [("Planck99", "cosmology must be"),
                                         ({"H0": 70}, "at least H0 and Om0"),
                                         ({"H0": 70, "Om0": -1}, "is not valid"),
                                         (3.0, "cosmology must be")])
def test_bad_cosmologies_are_refused_by_name(spec, match):
    with pytest.raises((TypeError, ValueError), match=match):
        as_cosmology(spec)


def test_the_linear_spectrum_has_the_cosmologys_sigma8():
    cosmo = as_cosmology("Planck18")
    power = linear_power(cosmo)
    r = 8.0

    def integrand(lnk):
        k = math.exp(lnk)
        x = k * r
        window = 3 * (math.sin(x) - x * math.cos(x)) / x**3
        return k**3 * power(np.array([k]))[0] * window**2 / (2 * math.pi**2)

    sigma8 = math.sqrt(quad(integrand, math.log(1e-4), math.log(1e2), limit=400)[0])
    assert sigma8 == pytest.approx(cosmo.meta["sigma8"], rel=2e-3)
    assert power(np.array([0.0]))[0] == 0
    with pytest.raises(ValueError, match="sigma8 is needed"):
        linear_power({"H0": 70, "Om0": 0.3})


# -- the power spectrum -----------------------------------------------------------------------

def _random_box(n, box, seed=0):
    rng = np.random.default_rng(seed)
    return xr.Dataset({"position": (("body", "axis"), rng.uniform(0, box, (n, 3))),
                       "mass": ("body", np.ones(n))})


@pytest.mark.parametrize("assignment", ["tsc", "cic"])
def test_the_spectrum_of_random_bodies_is_their_shot_noise(assignment):
    box = 100.0
    pk = nb.power_spectrum(_random_box(100_000, box), 32, box_size=box, assignment=assignment)
    assert float(pk.shot_noise) == pytest.approx(box**3 / 100_000)
    low = pk.where(pk.k < 0.5 * math.pi * 32 / box, drop=True)  # below half Nyquist
    weights = low.modes / low.modes.sum()
    assert float((low.power / pk.shot_noise * weights).sum()) == pytest.approx(1, abs=0.03)


def test_the_spectrum_of_a_trajectory_has_one_row_a_snapshot():
    one = _random_box(2000, 10.0)
    two = xr.concat([one, _random_box(2000, 10.0, seed=1)], dim="time").assign_coords(
        time=[0.5, 1.0], redshift=("time", [1.0, 0.0]))
    pk = nb.power_spectrum(two, 16, box_size=10.0)
    assert pk.power.dims == ("time", "k") and list(pk.redshift.values) == [1.0, 0.0]
    np.testing.assert_array_equal(pk.power.isel(time=0),
                                  nb.power_spectrum(one, 16, box_size=10.0).power)


@pytest.mark.parametrize("kwargs, match", [({"mesh_size": 2}, "mesh_size"),
                                           ({"assignment": "pcs"}, "assignment"),
                                           ({"box_size": -1.0}, "box_size"),
                                           ({"interlacing": 1}, "interlacing")])
def test_bad_spectrum_arguments_are_refused_by_name(kwargs, match):
    args = {"mesh_size": 16, "box_size": 10.0, **kwargs}
    with pytest.raises((TypeError, ValueError), match=match):
        nb.power_spectrum(_random_box(10, 10.0), args.pop("mesh_size"), **args)


# -- 2LPT initial conditions ------------------------------------------------------------------

@pytest.fixture(scope="module")
def ics():
    return nb.cosmological_ics(32, 300.0, "Planck18", z_start=49, seed=4,
                               fixed_amplitude=True).compute()


def test_fixed_amplitude_ics_have_the_input_spectrum(ics):
    """Measured on a mesh 4x finer than the particle grid (lattice aliasing stays below
    1e-3 there), every shell below half the particle Nyquist frequency within 1%."""
    pk = nb.power_spectrum(ics, 128)
    from nbody_dask.testing import grid_shell_average

    d1 = Background("Planck18").growth(float(ics.time)).d1[0]
    expected = (grid_shell_average(linear_power("Planck18"), 32, 300.0, 128)
                * d1**2)[: pk.sizes["k"]]
    below = pk.k.values < 0.5 * math.pi * 32 / 300.0
    ratio = pk.power.values[below] / expected[below]
    assert len(ratio) >= 7
    np.testing.assert_allclose(ratio, 1, atol=0.01)


def test_ics_velocities_are_the_growth_rate_times_the_displacements(ics):
    n, box, a = 32, 300.0, float(ics.time)
    bg = Background("Planck18")
    g = bg.growth(a)
    grid = np.indices((n, n, n)).reshape(3, -1).T * (box / n)
    displacement = np.mod(ics.position.values - grid + box / 2, box) - box / 2
    linear = ics.velocity.values / (a * bg.efunc(a) * g.f1[0])
    assert np.abs(linear - displacement).max() < 0.01 * np.abs(displacement).max()
    assert ics.mass.values[0] * n**3 == pytest.approx(mean_density(bg.cosmology) * box**3)
    assert ics.attrs["redshift"] == 49 and float(ics.time) == pytest.approx(0.02)


def test_ics_are_the_same_on_any_scheduler_and_agree_across_slab_counts():
    def make(slabs):
        return nb.cosmological_ics(16, 100.0, "Planck18", seed=7, slabs=slabs)

    one = make(2).compute(scheduler="synchronous")
    threads = make(2).compute(scheduler="threads", num_workers=4)
    for name in ("position", "velocity"):
        np.testing.assert_array_equal(one[name].values, threads[name].values)
    other = make(1).compute()
    np.testing.assert_allclose(other.position.values, one.position.values, rtol=0,
                               atol=1e-10)
    np.testing.assert_allclose(other.velocity.values, one.velocity.values, rtol=1e-8,
                               atol=1e-12)


def test_paired_ics_flip_the_first_order_displacement():
    kw = dict(z_start=49, seed=3, fixed_amplitude=True)
    n, box = 16, 200.0
    grid = np.indices((n, n, n)).reshape(3, -1).T * (box / n)

    def displacement(ds):
        return np.mod(ds.position.values - grid + box / 2, box) - box / 2

    plain = displacement(nb.cosmological_ics(n, box, **kw).compute())
    paired = displacement(nb.cosmological_ics(n, box, paired=True, **kw).compute())
    # first order flips, second order (even in the field) stays: their sum is 2 psi2
    assert np.abs(plain + paired).max() < 0.05 * np.abs(plain).max()
    assert np.abs(plain + paired).max() > 0


@pytest.mark.parametrize("kwargs, match", [({"n_side": 1}, "n_side"),
                                           ({"box_size": 0.0}, "box_size"),
                                           ({"z_start": -1.0}, "z_start"),
                                           ({"slabs": 9}, "slabs"),
                                           ({"fixed_amplitude": 1}, "fixed_amplitude"),
                                           ({"cosmology": "Planck99"}, "cosmology")])
def test_bad_ic_arguments_are_refused_by_name(kwargs, match):
    args = {"n_side": 8, "box_size": 100.0, **kwargs}
    with pytest.raises((TypeError, ValueError), match=match):
        nb.cosmological_ics(args.pop("n_side"), args.pop("box_size"), **args)


# -- comoving runs ----------------------------------------------------------------------------

def _plane_wave(n, box, mode, amplitude, z_start):
    """A lattice displaced by one linear plane wave along x (Zel'dovich: exact in 1-D)."""
    cosmo = as_cosmology("Planck18")
    bg = Background(cosmo)
    a = 1 / (1 + z_start)
    g = bg.growth(a)
    grid = np.indices((n, n, n)).reshape(3, -1).T * (box / n)
    k = 2 * np.pi * mode / box
    psi = np.zeros_like(grid)
    psi[:, 0] = g.d1[0] * amplitude * np.sin(k * grid[:, 0]) / k
    velocity = a * float(bg.efunc(a)) * g.f1[0] * psi
    return xr.Dataset(
        {"position": (("body", "axis"), np.mod(grid + psi, box)),
         "velocity": (("body", "axis"), velocity),
         "mass": ("body", np.full(n**3, mean_density(cosmo) * box**3 / n**3))},
        coords={"time": a}, attrs={"cosmology": to_json(cosmo), "box_size": box}), grid, k


def test_a_linear_plane_wave_grows_as_the_growth_factor(client):
    """The comoving KDK's time integration on its own: the amplitude of a linear mode of
    the box follows D(a) from z = 49 to 0 within 0.5% (40 steps in ln a, TreePM)."""
    bodies, grid, k = _plane_wave(16, 500.0, 1, 0.005, 49.0)
    traj = nb.simulate(bodies, steps=40, softening=1.5, snapshot_every=10, client=client,
                       progress=False, method="treepm")
    box = 500.0
    shift = np.mod(traj.position.values[:, :, 0] - grid[:, 0] + box / 2, box) - box / 2
    amplitude = (shift * np.sin(k * grid[:, 0])).mean(axis=1)
    d1 = Background("Planck18").growth(traj.time.values).d1
    np.testing.assert_allclose(amplitude / amplitude[0], d1 / d1[0], rtol=5e-3)
    np.testing.assert_allclose(traj.redshift.values[[0, -1]], [49.0, 0.0], atol=1e-12)
    assert traj.time.attrs["long_name"] == "scale factor"


def test_a_comoving_run_resumes_bit_identically(client, tmp_path):
    bodies = nb.cosmological_ics(8, 100.0, "Planck18", z_start=20, seed=2).compute()
    kw = dict(softening=0.5, snapshot_every=3, client=client, progress=False,
              dtype="float32", method="treepm")
    whole = nb.simulate(bodies, steps=9, store=tmp_path / "a.zarr", **kw)

    class Crash(Exception):
        pass

    def crash_after_second_snapshot(step, record):
        if record is not None and step == 3:
            raise Crash

    with pytest.raises(Crash):
        nb.simulate(bodies, steps=9, store=tmp_path / "c.zarr",
                    callback=crash_after_second_snapshot, **kw)
    resumed = nb.simulate(store=tmp_path / "c.zarr", resume=True, client=client,
                          progress=False)
    for name in ("position", "velocity"):
        np.testing.assert_array_equal(resumed[name].values, whole[name].values)
    np.testing.assert_array_equal(resumed.time.values, whole.time.values)
    speed, unit = whole.velocity.attrs["units"].split(" ", 1)
    assert float(speed) == pytest.approx(1e5) and unit == "m s-1"  # 100 km/s
    assert whole.time.attrs["units"] == "1" and "redshift" in whole.coords
    assert nb.cosmology.as_cosmology(whole.attrs["cosmology"]).name == "Planck18"
    # snapshot 0 holds the initial peculiar velocities (to float32 round-off)
    np.testing.assert_allclose(whole.velocity.values[0], bodies.velocity.values, rtol=1e-6,
                               atol=1e-6 * float(np.abs(bodies.velocity).max()))


@pytest.mark.slow
def test_one_and_two_workers_give_the_same_comoving_run():
    bodies = nb.cosmological_ics(8, 100.0, "Planck18", z_start=20, seed=2).compute()
    runs = []
    for workers in (1, 2):
        from distributed import Client, LocalCluster

        with LocalCluster(n_workers=workers, threads_per_worker=1, processes=False,
                          dashboard_address=None) as cluster, Client(cluster) as c:
            runs.append(nb.simulate(bodies, steps=4, softening=0.5, client=c, progress=False,
                                    method="treepm", tile_size=128))
    np.testing.assert_array_equal(runs[0].position.values, runs[1].position.values)
    np.testing.assert_array_equal(runs[0].velocity.values, runs[1].velocity.values)


@pytest.mark.parametrize("kwargs, match", [
    ({"steps": 4, "dt": 0.1}, "not both"),
    ({}, "needs steps= or dt="),
    ({"steps": 4, "z_end": 30.0}, "must end after it starts"),
    ({"steps": 4, "a_end": 0.5, "z_end": 1.0}, "a_end or z_end"),
    ({"steps": 4, "G": 2.0}, "G"),
    ({"steps": 4, "max_energy_error": 0.1}, "max_energy_error"),
])
def test_bad_comoving_arguments_are_refused_before_any_work(no_cluster, kwargs, match):
    bodies = nb.cosmological_ics(4, 100.0, "Planck18", z_start=20, seed=2).compute()
    with pytest.raises((TypeError, ValueError), match=match):
        nb.simulate(bodies, softening=0.5, progress=False, **kwargs)


def test_a_comoving_run_needs_a_start_scale_factor(no_cluster):
    bodies = nb.cosmological_ics(4, 100.0, "Planck18", z_start=20, seed=2).compute()
    with pytest.raises(ValueError, match="starts at the bodies' scale factor"):
        nb.simulate(bodies.drop_vars("time"), steps=2, softening=0.5, progress=False)
    with pytest.raises(ValueError, match=r"scale factor \(time\) must be > 0"):
        nb.simulate(bodies.assign_coords(time=0.0), steps=2, softening=0.5, progress=False)
    with pytest.raises(ValueError, match="a_end is for cosmological runs"):
        nb.simulate(nb.plummer(8), steps=2, dt=0.1, a_end=1.0, progress=False)


def test_dt_sets_the_largest_step_in_ln_a(client):
    bodies = nb.cosmological_ics(4, 100.0, "Planck18", z_start=9, seed=2).compute()
    traj = nb.simulate(bodies, dt=0.5, softening=0.5, client=client, progress=False)
    steps = math.ceil(math.log(10) / 0.5)
    assert int(traj.step[-1]) == steps
    assert traj.attrs["dt"] == pytest.approx(math.log(10) / steps)
    with dask.config.set({"nbody.progress": False}):
        assert nb.power_spectrum(traj.isel(time=-1), 8).sizes["k"] > 0


# -- the command line -------------------------------------------------------------------------

def test_cli_makes_cosmological_ics_runs_them_and_measures_their_spectrum(tmp_path):
    from click.testing import CliRunner

    from nbody_dask.cli import main

    runner = CliRunner()
    ics, store, table = tmp_path / "ics.zarr", tmp_path / "run.zarr", tmp_path / "pk.nc"
    made = runner.invoke(main, ["ic", "cosmology", str(ics), "--n-side", "8", "--box-size",
                                "100", "--z-start", "20", "--seed", "3"])
    assert made.exit_code == 0, made.output
    ran = runner.invoke(main, ["run", "--ic", str(ics), "--steps", "4", "--softening", "0.5",
                               "--snapshot-every", "2", "--no-progress", "--store",
                               str(store)])
    assert ran.exit_code == 0, ran.output
    assert "scale factor 0.047619 .. 1  (z = 20 .. 0; comoving, Planck18)" in ran.output
    traj = nb.open_trajectory(store)
    assert traj.sizes["time"] == 3 and traj.attrs["box_size"] == 100.0
    measured = runner.invoke(main, ["power", str(store), "--snapshot", "0", "--snapshot",
                                    "-1", "--out", str(table)])
    assert measured.exit_code == 0, measured.output
    assert measured.output.count("# snapshot") == 2 and "(z = 0)" in measured.output
    saved = xr.open_dataset(table)
    assert saved.power.dims == ("time", "k")
    # a --dt in ln a instead of --steps; a box without a cosmology is refused by power
    again = runner.invoke(main, ["run", "--ic", str(ics), "--dt", "1.0", "--softening", "0.5",
                                 "--no-progress", "--store", str(tmp_path / "b.zarr")])
    assert again.exit_code == 0 and int(nb.open_trajectory(tmp_path / "b.zarr").step[-1]) == 4
    bad = runner.invoke(main, ["power", str(store), "--snapshot", "7"])
    assert bad.exit_code == 1 and "--snapshot must be in [-3, 2]" in bad.output


def test_snapshots_fall_exactly_on_the_redshifts_asked_for(client):
    bodies = nb.cosmological_ics(8, 100.0, "Planck18", z_start=49, seed=1).compute()
    traj = nb.simulate(bodies, steps=20, softening=0.5, snapshot_redshifts=[3, 1, 0.5],
                       client=client, progress=False)
    np.testing.assert_array_equal(traj.redshift.values, [49, 3, 1, 0.5, 0])
    steps = np.diff(traj.step.values)
    spans = np.diff(np.log(traj.time.values))
    assert steps.sum() == 20 and (np.abs(spans / steps - spans.sum() / 20) < 0.1).all()
    by_dt = nb.simulate(bodies, dt=0.2, softening=0.5, snapshot_redshifts=[3], z_end=1,
                        client=client, progress=False)
    np.testing.assert_array_equal(by_dt.redshift.values, [49, 3, 1])
    assert (np.diff(np.log(by_dt.time.values)) / np.diff(by_dt.step.values) <= 0.2).all()
    with pytest.raises(ValueError, match="snapshot_redshifts must lie after the start"):
        nb.simulate(bodies, steps=4, softening=0.5, snapshot_redshifts=[60], progress=False)
    with pytest.raises(ValueError, match="snapshot_redshifts is for cosmological runs"):
        nb.simulate(nb.plummer(8), steps=2, dt=0.1, snapshot_redshifts=[1], progress=False)


@pytest.mark.parametrize("steps", [3, 7, 40])
def test_steps_are_shared_between_stretches_in_proportion_to_ln_a(steps):
    from nbody_dask.plan import comoving_steps

    outputs = [0.02, 0.25, 0.5, 1.0]
    counts = comoving_steps(outputs, steps=steps)
    assert sum(counts) == steps and min(counts) >= 1
    assert comoving_steps(outputs, dt=0.1) == [26, 7, 7]
    with pytest.raises(ValueError, match="steps must be >= 3"):
        comoving_steps(outputs, steps=2)


def test_camb_spectrum_has_the_cosmologys_sigma8_and_follows_eisenstein_hu():
    pytest.importorskip("camb")
    cosmo = as_cosmology("Planck18")
    camb_power = linear_power(cosmo, "camb")
    k = np.logspace(-3, 1, 200)
    ratio = camb_power(k) / linear_power(cosmo)(k)
    assert np.abs(ratio - 1).max() < 0.06  # baryon wiggles the fit smooths over
    lnk = np.linspace(math.log(1e-4), math.log(1e2), 40_000)
    x = np.exp(lnk) * 8.0
    window = 3 * (np.sin(x) - x * np.cos(x)) / x**3
    variance = np.trapezoid(np.exp(3 * lnk) * camb_power(np.exp(lnk)) * window**2, lnk)
    sigma8 = math.sqrt(variance / (2 * math.pi**2))
    assert sigma8 == pytest.approx(cosmo.meta["sigma8"], rel=2e-3)
    with pytest.raises(ValueError, match="power must be a callable P\\(k\\) or one of"):
        linear_power(cosmo, "bbks")


def test_the_progress_bar_of_a_comoving_run_shows_the_redshift(capsys):
    """An expanding box conserves no energy: its progress shows z, not |dE/E|."""
    from nbody_dask.session import progress_bar

    with progress_bar(True, 2, lambda step: 3.0 / step) as report:
        report(1, {"total_energy": -1.0})
        report(2, {"total_energy": -2.0})
    shown = capsys.readouterr().out
    assert "z = 1.5" in shown and "dE/E" not in shown
    with progress_bar(True, 2) as report:
        report(1, {"total_energy": -1.0})
        report(2, {"total_energy": -2.0})
    assert "|dE/E| 1.00e+00" in capsys.readouterr().out

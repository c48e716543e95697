"""GADGET/SWIFT-layout HDF5 snapshots: round trip, files from other codes, pynbody, CLI."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from click.testing import CliRunner

import nbody_dask
from nbody_dask.bodyfiles import load_bodies, save_bodies
from nbody_dask.cli import main
from nbody_dask.gadget import read_gadget

h5py = pytest.importorskip("h5py")


def test_round_trip_is_exact(tmp_path):
    ds = nbody_dask.plummer(97, seed=3).assign_coords(body=np.arange(97) * 7 + 5)
    path = save_bodies(ds, tmp_path / "ic.hdf5")
    back = load_bodies(path)
    for name in ("position", "velocity", "mass"):
        np.testing.assert_array_equal(back[name].values, ds[name].values)
    np.testing.assert_array_equal(back.body.values, ds.body.values)
    with h5py.File(path) as f:
        header = f["Header"].attrs
        assert list(header["NumPart_ThisFile"]) == [0, 97, 0, 0, 0, 0]
        assert f["PartType1/Coordinates"].shape == (97, 3)
        assert f["PartType1/ParticleIDs"][3] == 26
    with pytest.raises(FileExistsError, match="pass overwrite=True"):
        save_bodies(ds, path)


def _other_codes_file(path):
    """A file as GADGET-4 writes it: a mass table for one type, two types, a start time."""
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        header = f.create_group("Header")
        header.attrs["NumPart_ThisFile"] = np.array([0, 5, 3, 0, 0, 0], dtype=np.uint32)
        header.attrs["NumPart_Total"] = header.attrs["NumPart_ThisFile"]
        header.attrs["MassTable"] = np.array([0, 0.1, 0, 0, 0, 0])
        header.attrs["Time"] = 0.25
        header.attrs["NumFilesPerSnapshot"] = 1
        for k, n in ((1, 5), (2, 3)):
            g = f.create_group(f"PartType{k}")
            g["Coordinates"] = rng.normal(size=(n, 3)).astype(np.float32)
            g["Velocities"] = rng.normal(size=(n, 3)).astype(np.float32)
            g["ParticleIDs"] = np.arange(n, dtype=np.uint32) + 100 * k
            if k == 2:
                g["Masses"] = np.full(n, 0.05, dtype=np.float32)


def test_reads_a_file_written_by_another_code(tmp_path):
    path = tmp_path / "snap_000.hdf5"
    _other_codes_file(path)
    ds = load_bodies(path)
    assert ds.sizes["body"] == 8 and float(ds.time) == 0.25
    assert list(ds.body.values) == [100, 101, 102, 103, 104, 200, 201, 202]
    np.testing.assert_allclose(ds.mass.values, [0.1] * 5 + [0.05] * 3, rtol=1e-7)
    with h5py.File(path) as f:
        np.testing.assert_array_equal(ds.position.values[5:], f["PartType2/Coordinates"][...])
    assert read_gadget(path, types=(2,)).sizes["body"] == 3


def test_a_gadget_ic_file_runs_from_the_cli(tmp_path):
    ic = tmp_path / "ic.hdf5"
    _other_codes_file(ic)
    store = tmp_path / "run.zarr"
    result = CliRunner().invoke(main, ["run", "--ic", str(ic), "--steps", "4", "--dt", "0.01",
                                       "--snapshot-every", "2", "--no-progress", "--store",
                                       str(store)])
    assert result.exit_code == 0, result.output
    traj = nbody_dask.open_trajectory(store)
    assert float(traj.time[0]) == 0.25 and traj.sizes["body"] == 8
    assert list(traj.body.values[:2]) == [100, 101]


def test_export_is_opened_by_pynbody_with_the_same_values(tmp_path):
    pynbody = pytest.importorskip("pynbody")
    traj = nbody_dask.simulate(nbody_dask.plummer(64, seed=2), steps=4, dt=0.01,
                               softening=0.05, snapshot_every=2, store=tmp_path / "run.zarr",
                               progress=False)
    out = tmp_path / "snap.hdf5"
    result = CliRunner().invoke(main, ["export", str(tmp_path / "run.zarr"), str(out),
                                       "--snapshot", "1"])
    assert result.exit_code == 0, result.output
    assert "wrote 64 bodies at time 0.02" in result.output
    snap = traj.isel(time=1).load()
    with warnings.catch_warnings():  # pynbody: "no unit information" (N-body units have none)
        warnings.simplefilter("ignore")
        sim = pynbody.load(str(out))
        position, velocity, mass, ids = (np.asarray(sim[k])
                                         for k in ("pos", "vel", "mass", "iord"))
    np.testing.assert_array_equal(position, snap.position.values)
    np.testing.assert_array_equal(velocity, snap.velocity.values)
    np.testing.assert_array_equal(mass, snap.mass.values)
    np.testing.assert_array_equal(ids, snap.body.values)


def test_bad_files_are_refused_clearly(tmp_path):
    bad = tmp_path / "no-header.hdf5"
    with h5py.File(bad, "w") as f:
        f.create_group("PartType1")
    with pytest.raises(ValueError, match="no Header group: not a GADGET-layout"):
        load_bodies(bad)
    missing = tmp_path / "missing.hdf5"
    with h5py.File(missing, "w") as f:
        f.create_group("Header").attrs["NumPart_ThisFile"] = [0, 2, 0, 0, 0, 0]
        f.create_group("PartType1")["Coordinates"] = np.zeros((2, 3))
    with pytest.raises(ValueError, match="PartType1 has no Velocities dataset"):
        load_bodies(missing)
    result = CliRunner().invoke(main, ["run", "--ic", str(missing), "--no-progress"])
    assert result.exit_code == 1 and "Traceback" not in result.output


def _edit_header(path, **attrs):
    with h5py.File(path, "r+") as f:
        for name, value in attrs.items():
            if value is None:
                del f["Header"].attrs[name]
            else:
                f["Header"].attrs[name] = value


@pytest.mark.parametrize("attrs, match", [
    # the header claims more (or fewer) particles than the datasets hold (issue 33, item 7)
    (dict(NumPart_ThisFile=np.array([0, 1_000_000, 3, 0, 0, 0], dtype=np.uint32),
          NumPart_Total=np.array([0, 1_000_000, 3, 0, 0, 0], dtype=np.uint32)),
     r"PartType1/Coordinates has shape \(5, 3\), but the header's NumPart_ThisFile\[1\] = "
     r"1000000 needs \(1000000, 3\)"),
    (dict(NumPart_ThisFile=np.array([0, 3, 3, 0, 0, 0], dtype=np.uint32),
          NumPart_Total=np.array([0, 3, 3, 0, 0, 0], dtype=np.uint32)),
     r"PartType1/Coordinates has shape \(5, 3\), but .* = 3 needs \(3, 3\)"),
    # one file of two, without NumFilesPerSnapshot: the totals say so
    (dict(NumFilesPerSnapshot=None,
          NumPart_Total=np.array([0, 10, 6, 0, 0, 0], dtype=np.uint32)),
     r"one file of a multi-file snapshot \(8 of 16 particles\)"),
    # a 2e9-particle claim with a mass table: refused before allocating 16 GB of masses
    (dict(NumPart_ThisFile=np.array([0, 2_000_000_000, 3, 0, 0, 0], dtype=np.uint32),
          NumPart_Total=np.array([0, 2_000_000_000, 3, 0, 0, 0], dtype=np.uint32)),
     r"NumPart_ThisFile\[1\] = 2000000000 needs"),
])
def test_headers_are_checked_against_the_datasets(tmp_path, attrs, match):
    path = tmp_path / "snap.hdf5"
    _other_codes_file(path)
    _edit_header(path, **attrs)
    with pytest.raises(ValueError, match=match):
        read_gadget(path)


def test_bad_types_and_unreadable_files_are_named(tmp_path):
    path = tmp_path / "snap.hdf5"
    _other_codes_file(path)
    with pytest.raises(ValueError, match=r"types must be particle types 0-5, got \(7,\)"):
        read_gadget(path, types=(7,))
    broken = tmp_path / "broken.hdf5"
    broken.write_bytes(b"not hdf5 at all")
    with pytest.raises(OSError, match=rf"'{broken}' cannot be read as an HDF5 file"):
        read_gadget(broken)


def test_physical_units_survive_export_for_pynbody_and_for_us(tmp_path, client):
    """A kpc / km/s / solar-mass body set exported to HDF5 carries GADGET's and SWIFT's unit
    attributes: pynbody reads physical values equal to ours, and reading it back a run takes
    dt in Myr (the export dropped the unit system: issue 33, item 10)."""
    pynbody = pytest.importorskip("pynbody")
    u = pytest.importorskip("astropy.units")
    rng = np.random.default_rng(4)
    position = rng.normal(size=(40, 3)) * u.kpc
    velocity = rng.normal(size=(40, 3)) * 200 * u.km / u.s
    mass = rng.uniform(1, 2, 40) * 1e9 * u.solMass
    bodies = nbody_dask.make_bodies(position, velocity, mass)
    out = tmp_path / "galaxy.hdf5"
    save_bodies(bodies, out)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim = pynbody.load(str(out))
        np.testing.assert_allclose(sim["pos"].in_units("kpc"), position.to_value(u.kpc),
                                   rtol=1e-10)
        np.testing.assert_allclose(sim["vel"].in_units("km s**-1"),
                                   velocity.to_value(u.km / u.s), rtol=1e-10)
        # in grams: pynbody's solar mass is not astropy's (they differ by 5e-6)
        np.testing.assert_allclose(sim["mass"].in_units("g"), mass.to_value(u.g), rtol=1e-10)
    back = load_bodies(out)
    np.testing.assert_allclose(back.position.values, bodies.position.values, rtol=1e-12)
    np.testing.assert_allclose(back.velocity.values, bodies.velocity.values, rtol=1e-12)
    assert u.Quantity(back.attrs["length_unit"]).to_value(u.kpc) == pytest.approx(1.0)
    traj = nbody_dask.simulate(back, steps=2, dt=0.1 * u.Myr, client=client, progress=False)
    assert traj.sizes["time"] == 2


# -- cosmological files -----------------------------------------------------------------------

def _gadget_ic_file(path, *, length_cm=None, kpc=True, box_mpc_h=50.0, a=0.02, n=8):
    """A cosmological IC file as N-GenIC, MUSIC or monofonIC write it: GADGET's header,
    lengths per h (kpc/h or Mpc/h), 1e10 M_sun/h masses, velocities v_pec / sqrt(a) in km/s;
    returns the code-unit positions (Mpc/h), peculiar velocities (100 km/s), masses."""
    import h5py

    from nbody_dask.cosmology import as_cosmology, mean_density

    rng = np.random.default_rng(4)
    box_code = box_mpc_h
    position = rng.uniform(0, box_code, (n**3, 3))
    velocity = rng.normal(0, 1.0, (n**3, 3))  # 100 km/s
    cosmology = as_cosmology({"H0": 70.0, "Om0": 0.3, "Tcmb0": 0.0})
    mass = np.full(n**3, mean_density(cosmology) * box_code**3 / n**3)  # code units
    scale = 1e3 if kpc else 1.0
    code_mass_1e10 = 232.50  # a code unit of mass in 1e10 M_sun/h (to 1e-4)
    with h5py.File(path, "w") as f:
        header = f.create_group("Header")
        header.attrs.update({
            "NumPart_ThisFile": np.array([0, n**3, 0, 0, 0, 0], dtype=np.uint32),
            "NumPart_Total": np.array([0, n**3, 0, 0, 0, 0], dtype=np.uint32),
            "MassTable": np.zeros(6), "Time": a, "Redshift": 1 / a - 1,
            "BoxSize": box_code * scale, "Omega0": 0.3, "OmegaLambda": 0.7, "HubbleParam": 0.7,
            "NumFilesPerSnapshot": 1})
        group = f.create_group("PartType1")
        group["Coordinates"] = position * scale
        group["Velocities"] = velocity * 100 / np.sqrt(a)
        group["Masses"] = mass * code_mass_1e10
        group["ParticleIDs"] = np.arange(1, n**3 + 1, dtype=np.uint64)
        if length_cm is not None:
            units = f.create_group("Units")
            units.attrs.update({"UnitLength_in_cm": length_cm, "UnitMass_in_g": 1.98841e43,
                                "UnitVelocity_in_cm_per_s": 1e5})
    return position, velocity, mass


@pytest.mark.parametrize("kpc, length_cm", [(True, None), (False, None),
                                            (True, 3.085677581491367e21)])
def test_a_cosmological_gadget_ic_file_is_read_in_comoving_code_units(tmp_path, kpc,
                                                                       length_cm):
    """Lengths per h in kpc or Mpc (told apart by the mean density when the file has no
    units), velocities v / sqrt(a), 1e10 M_sun/h masses: comoving Mpc/h, peculiar 100 km/s."""
    from nbody_dask.cosmology import as_cosmology

    path = tmp_path / "ics.hdf5"
    position, velocity, mass = _gadget_ic_file(path, kpc=kpc, length_cm=length_cm)
    ds = read_gadget(path)
    np.testing.assert_allclose(ds.position.values, position, rtol=1e-12)
    np.testing.assert_allclose(ds.velocity.values, velocity, rtol=1e-12)
    np.testing.assert_allclose(ds.mass.values, mass, rtol=2e-4)  # the 1e10 M_sun/h constant
    assert float(ds.time) == 0.02 and ds.attrs["box_size"] == pytest.approx(50.0)
    cosmology = as_cosmology(ds.attrs["cosmology"])
    assert cosmology.H0.value == 70.0 and cosmology.Om0 == 0.3 and cosmology.Tcmb0.value == 0


def test_a_cosmological_file_of_unknown_units_is_refused_clearly(tmp_path):
    import h5py

    path = tmp_path / "odd.hdf5"
    _gadget_ic_file(path)
    with h5py.File(path, "r+") as f:
        f["PartType1/Masses"][...] *= 7  # fits neither kpc/h nor Mpc/h
    with pytest.raises(ValueError, match="fits neither kpc/h nor Mpc/h"):
        read_gadget(path)


def test_cosmological_export_reads_back_and_in_pynbody_with_its_units(tmp_path):
    import warnings

    import pynbody

    ics = nbody_dask.cosmological_ics(8, 100.0, z_start=20, seed=1).compute()
    path = tmp_path / "box.hdf5"
    nbody_dask.gadget.write_gadget(ics, path)
    back = read_gadget(path)
    for name in ("position", "velocity", "mass"):
        np.testing.assert_allclose(back[name].values, ics[name].values, rtol=1e-12)
    assert float(back.time) == pytest.approx(float(ics.time), rel=1e-15)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        f = pynbody.load(str(path))
        assert f.properties["a"] == pytest.approx(1 / 21) and f.properties["h"] == 0.6766
        np.testing.assert_allclose(f["pos"].in_units("Mpc a h^-1"), ics.position.values,
                                   rtol=1e-12)
        np.testing.assert_allclose(f["vel"].in_units("km s^-1"), ics.velocity.values * 100,
                                   rtol=1e-9)


def test_a_cosmological_ic_file_runs_comoving_from_the_cli(tmp_path):
    path = tmp_path / "ics.hdf5"
    _gadget_ic_file(path, n=6)
    result = CliRunner().invoke(main, ["run", "--ic", str(path), "--steps", "3",
                                       "--softening", "0.3", "--no-progress", "--store",
                                       str(tmp_path / "run.zarr")])
    assert result.exit_code == 0, result.output
    traj = nbody_dask.open_trajectory(tmp_path / "run.zarr")
    assert traj.attrs["method"] == "direct"  # 216 bodies: the Ewald sum
    assert float(traj.time[0]) == 0.02 and float(traj.redshift[-1]) == pytest.approx(0)


def test_a_swift_cosmological_snapshot_is_read_in_comoving_code_units(tmp_path):
    """SWIFT's layout (attribute names as SWIFT writes them): seven particle types, the
    header's Time the cosmic time, the scale factor and parameters in a Cosmology group,
    lengths in Mpc and masses in 1e10 M_sun without h, peculiar velocities in km/s."""
    from nbody_dask.cosmology import as_cosmology, unit_system

    h, a, n = 0.6766, 0.5, 64
    rng = np.random.default_rng(2)
    position_mpc = rng.uniform(0, 94.59, (n, 3))
    velocity_kms = rng.normal(0, 300, (n, 3))
    mass = np.full(n, 101.6)
    seven = np.array([0, n, 0, 0, 0, 0, 0])
    with h5py.File(tmp_path / "snap_0001.hdf5", "w") as f:
        f.create_group("Header").attrs.update({
            "BoxSize": np.full(3, 94.59), "Time": np.array([0.0098]),
            "NumPart_ThisFile": seven, "NumPart_Total": seven.astype(np.uint32),
            "NumPart_Total_HighWord": np.zeros(7, np.uint32), "MassTable": np.zeros(7),
            "NumFilesPerSnapshot": np.array([1]), "Code": np.bytes_(b"SWIFT"),
            "Redshift": np.array([1 / a - 1]), "Scale-factor": np.array([a])})
        f.create_group("Cosmology").attrs.update({
            "Cosmological run": np.array([1]), "h": np.array([h]),
            "Omega_m": np.array([0.30966]), "Omega_lambda": np.array([0.69034]),
            "Omega_b": np.array([0.04897]), "Scale-factor": np.array([a])})
        f.create_group("Units").attrs.update({
            "Unit length in cgs (U_L)": np.array([3.08567758e24]),
            "Unit mass in cgs (U_M)": np.array([1.98841e43]),
            "Unit time in cgs (U_t)": np.array([3.08567758e19])})
        group = f.create_group("PartType1")
        group["Coordinates"], group["Velocities"] = position_mpc, velocity_kms
        group["Masses"], group["ParticleIDs"] = mass, np.arange(n, dtype=np.uint64)
    ds = read_gadget(tmp_path / "snap_0001.hdf5")
    cosmology = as_cosmology(ds.attrs["cosmology"])
    assert float(ds.time) == a and cosmology.h == h and cosmology.Ode0 == pytest.approx(0.69034)
    np.testing.assert_allclose(ds.position.values, position_mpc * h, rtol=1e-9)
    np.testing.assert_allclose(ds.velocity.values, velocity_kms / 100, rtol=1e-9)
    code_mass = float(unit_system(cosmology).mass.to_value("Msun"))
    np.testing.assert_allclose(ds.mass.values, mass * 1e10 / code_mass, rtol=1e-4)
    assert ds.attrs["box_size"] == pytest.approx(94.59 * h)

"""Trajectory analysis and plots: Lagrangian radii, conservation, figures."""

from __future__ import annotations

import numpy as np
import pytest

import nbody_dask
from nbody_dask import analysis


@pytest.fixture(scope="module")
def trajectory(client, tmp_path_factory):
    store = tmp_path_factory.mktemp("analysis") / "run.zarr"
    return nbody_dask.simulate(nbody_dask.plummer(500, seed=3), steps=20, dt=0.01,
                               softening=0.05, store=store, snapshot_every=5, client=client,
                               progress=False)


@pytest.mark.slow
def test_lagrangian_radii_match_a_direct_count(trajectory):
    radii = analysis.lagrangian_radii(trajectory, fractions=[0.1, 0.5, 1.0])
    assert radii.dims == ("time", "fraction") and radii.shape == (5, 3)
    values = radii.values  # lazy until here
    for k in range(5):
        pos = trajectory.position.isel(time=k).values.astype(float)
        r = np.sort(np.linalg.norm(pos - pos.mean(axis=0), axis=1))  # equal masses
        np.testing.assert_allclose(values[k], [r[49], r[249], r[-1]], rtol=1e-6)


def test_half_mass_radius_of_a_plummer_sphere():
    radii = analysis.lagrangian_radii(nbody_dask.plummer(8000, seed=1), fractions=[0.5])
    assert float(radii.squeeze()) == pytest.approx(0.769, rel=0.03)


def test_lagrangian_fractions_are_checked(trajectory):
    with pytest.raises(ValueError, match="fractions must be a non-empty sequence in"):
        analysis.lagrangian_radii(trajectory, fractions=[0.5, 1.5])


def test_conservation_errors_are_small_and_start_at_zero(trajectory):
    cons = analysis.conservation(trajectory).compute()
    assert set(cons.data_vars) == {"energy_error", "momentum_drift", "angular_momentum_error"}
    for name in cons.data_vars:
        assert float(cons[name][0]) == 0
    assert float(np.abs(cons.energy_error).max()) < 1e-4
    assert float(cons.momentum_drift.max()) < 1e-12


def test_figures(trajectory, tmp_path):
    pytest.importorskip("matplotlib")
    from nbody_dask import plot

    fig = plot.positions(trajectory, snapshots=[0, -1], plane="xz")
    assert len(fig.axes) == 2 and fig.axes[1].get_title() == "t = 0.2"
    assert len(plot.conservation(trajectory).axes) == 3
    assert len(plot.lagrangian_radii(trajectory).axes[0].lines) == 5
    with pytest.raises(ValueError, match="plane must be one of"):
        plot.positions(trajectory, plane="xw")
    with pytest.raises(ValueError, match=r"snapshot must be in \[-5, 4\], got 7"):
        plot.save_figures(trajectory, tmp_path, snapshots=[7])
    with pytest.raises(ValueError, match="plot kinds must be among"):
        plot.save_figures(trajectory, tmp_path, kinds=["histogram"])
    with pytest.raises(ValueError, match="must end in .gif or .mp4"):
        plot.animate(trajectory, tmp_path / "movie.avi")
    assert not list(tmp_path.iterdir())  # nothing written by refused calls


def _png_is_not_blank(path):
    from PIL import Image

    with Image.open(path) as image:
        assert image.format == "PNG"
        pixels = np.asarray(image.convert("L"), dtype=float)
    assert pixels.std() > 10  # not one flat colour
    return pixels


def test_surface_density_maps(trajectory, tmp_path):
    pytest.importorskip("matplotlib")
    from nbody_dask import plot

    fig = plot.surface_density(trajectory, snapshots=[0, -1], pixels=64)
    image = fig.axes[0].get_images()[0].get_array()
    assert image.shape == (64, 64)
    half = (fig.axes[0].get_xlim()[1] - fig.axes[0].get_xlim()[0]) / 2
    pixel_area = (2 * half / 64) ** 2  # mass is conserved on the map, less what lies outside
    inside = float(np.nansum(image)) * pixel_area
    assert 0.9 < inside <= 1.0 + 1e-9
    assert fig.axes[0].get_xlabel() == "x" and "surface density" in fig.axes[-1].get_ylabel()
    rotated = plot.surface_density(trajectory, snapshots=[0], view=(90, 0), smoothing=0)
    assert rotated.axes[0].get_xlabel() == "x'"
    # (90, 0) looks along -y: the map is the x-z plane
    xz = plot.surface_density(trajectory, snapshots=[0], plane="xz", smoothing=0)
    np.testing.assert_allclose(np.nan_to_num(rotated.axes[0].get_images()[0].get_array()),
                               np.nan_to_num(xz.axes[0].get_images()[0].get_array()[::-1]),
                               atol=1e-9)
    paths = plot.save_figures(trajectory, tmp_path, kinds=["density", "animation"],
                              view=(30, 45), style="density")
    _png_is_not_blank(paths[0])
    assert paths[1].stat().st_size > 1000
    with pytest.raises(ValueError, match="style must be 'points' or 'density'"):
        plot.animate(trajectory, tmp_path / "x.gif", style="blobs")

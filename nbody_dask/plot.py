"""Plots of a trajectory with matplotlib (the ``plot`` extra: ``pip install 'nbody-dask[plot]'``).

Each function takes a trajectory (from :func:`nbody_dask.open_trajectory` or ``xr.open_zarr``)
and returns a :class:`matplotlib.figure.Figure`, built without pyplot so that it works on
machines without a display and leaves no global state behind; save it with
``fig.savefig("x.png")`` or let a notebook show it. :func:`animate` writes a GIF or MP4.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import xarray as xr

from . import analysis
from ._validate import check_new_file

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

__all__ = ["positions", "surface_density", "conservation", "lagrangian_radii", "animate",
           "power_spectra", "halo_mass_function", "save_figures", "KINDS"]

_PLANES = {"xy": (0, 1), "xz": (0, 2), "yz": (1, 2)}


def _figure(**kwargs) -> Figure:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError("plotting needs matplotlib: pip install 'nbody-dask[plot]'") from None
    return Figure(layout="constrained", **kwargs)


def _plane(plane: str) -> tuple[int, int]:
    if plane not in _PLANES:
        raise ValueError(f"plane must be one of {sorted(_PLANES)}, got {plane!r}")
    return _PLANES[plane]


def _snapshot_indices(trajectory: xr.Dataset, snapshots: Sequence[int] | None) -> list[int]:
    count = trajectory.sizes["time"]
    if count == 0:
        raise ValueError("the trajectory has no committed snapshots to plot")
    if snapshots is None:
        return sorted({round(f * (count - 1)) for f in (0, 1 / 3, 2 / 3, 1)})
    out = []
    for s in snapshots:
        if not -count <= s < count:
            raise ValueError(f"snapshot must be in [{-count}, {count - 1}], got {s!r}")
        out.append(s % count)
    return out


def _marker_size(n: int) -> float:
    return float(np.clip(2000.0 / n, 0.05, 20.0))


def _extent(xy: np.ndarray) -> float:
    """Half-width showing the bulk of the bodies (99th percentile about the median)."""
    centre = np.median(xy, axis=0)
    return float(np.percentile(np.abs(xy - centre), 99) * 1.1) or 1.0


def positions(trajectory: xr.Dataset, snapshots: Sequence[int] | None = None, *,
              plane: str = "xy", max_bodies: int = 50_000) -> Figure:
    """Projected positions at some snapshots, one panel each.

    Parameters
    ----------
    trajectory : xarray.Dataset
    snapshots : sequence of int, optional
        Snapshot indices (negative from the end); default: first, two between, last.
    plane : {"xy", "xz", "yz"}
        Projection.
    max_bodies : int
        Draw at most this many bodies (an even subsample), to keep big runs quick.
    """
    i, j = _plane(plane)
    indices = _snapshot_indices(trajectory, snapshots)
    n = trajectory.sizes["body"]
    stride = max(1, -(-n // max_bodies))
    fig = _figure(figsize=(3.2 * len(indices), 3.4))
    axes = fig.subplots(1, len(indices), squeeze=False)[0]
    frames = trajectory["position"].isel(time=indices, body=slice(None, None, stride)).values
    half = _extent(frames[0][:, [i, j]])
    for ax, k, frame in zip(axes, indices, frames, strict=True):
        ax.scatter(frame[:, i], frame[:, j], s=_marker_size(frame.shape[0]), c="k",
                   alpha=0.6, linewidths=0)
        centre = np.median(frames[0][:, [i, j]], axis=0)
        ax.set_xlim(centre[0] - half, centre[0] + half)
        ax.set_ylim(centre[1] - half, centre[1] + half)
        ax.set_aspect("equal")
        ax.set_title(f"t = {float(trajectory.time[k]):.4g}")
        ax.set_xlabel(plane[0])
    axes[0].set_ylabel(plane[1])
    fig.suptitle(f"N = {n}")
    return fig


def _projected(position: np.ndarray, plane: str,
               view: tuple[float, float] | None) -> tuple[np.ndarray, str, str]:
    """Positions (..., n, 3) projected to (..., n, 2) on ``plane`` or for a rotated ``view``:
    (inclination, azimuth) in degrees, the line of sight tilted from +z by the inclination
    after turning the system about z by the azimuth."""
    if view is None:
        i, j = _plane(plane)
        return position[..., [i, j]], plane[0], plane[1]
    inclination, azimuth = (np.radians(float(a)) for a in view)
    ca, sa, ci, si = np.cos(azimuth), np.sin(azimuth), np.cos(inclination), np.sin(inclination)
    x = ca * position[..., 0] - sa * position[..., 1]
    y = sa * position[..., 0] + ca * position[..., 1]
    return np.stack([x, ci * y - si * position[..., 2]], axis=-1), "x'", "y'"


def _density_maps(frames: Sequence[np.ndarray], mass: np.ndarray, half: float,
                  pixels: int | None, smoothing: float):
    """Mass per unit area of centred projected ``frames`` on a square of side ``2 half``
    (``pixels`` a side, default ``2 sqrt(N)`` in 64..512; rows: y), smoothed, NaN where
    empty; and their shared log colour scale (four decades below the densest pixel)."""
    from matplotlib.colors import LogNorm
    from scipy.ndimage import gaussian_filter

    if pixels is None:
        pixels = int(np.clip(2 * np.sqrt(mass.size), 64, 512))
    edges = np.linspace(-half, half, pixels + 1)
    maps = []
    for xy in frames:
        counts = np.histogram2d(xy[:, 0], xy[:, 1], bins=(edges, edges), weights=mass)[0].T
        density = counts / (edges[1] - edges[0]) ** 2
        maps.append(gaussian_filter(density, smoothing, mode="constant") if smoothing
                    else density)
    top = max(float(m.max()) for m in maps) or 1.0
    return [np.where(m > 0, m, np.nan) for m in maps], LogNorm(vmin=top * 1e-4, vmax=top)


def _nice_length(width: float) -> float:
    """A round length (1, 2 or 5 x 10^k) near a fifth of ``width``."""
    target = width / 5
    power = 10.0 ** np.floor(np.log10(target))
    return float(min((1, 2, 5, 10), key=lambda m: abs(m * power - target)) * power)


def surface_density(trajectory: xr.Dataset, snapshots: Sequence[int] | None = None, *,
                    plane: str = "xy", view: tuple[float, float] | None = None,
                    pixels: int | None = None, half_width: float | None = None,
                    smoothing: float = 1.0, cmap: str = "inferno") -> Figure:
    """Projected surface density (mass per unit area, log scale) at some snapshots.

    The view for large N: a 2-D histogram of the bodies' masses, one panel per snapshot on a
    shared logarithmic colour scale (``inferno``, perceptually uniform, by default), centred
    on the centre of mass (a periodic box: the whole box, projected through), with axis
    labels, a scale bar and a colour bar.

    Parameters
    ----------
    trajectory : xarray.Dataset
    snapshots : sequence of int, optional
        Snapshot indices (negative from the end); default: first, two between, last.
    plane : {"xy", "xz", "yz"}
        Projection, unless ``view`` is given.
    view : (float, float), optional
        A rotated view: (inclination, azimuth) in degrees; (0, 0) is the ``xy`` plane, (90, 0)
        looks along -y.
    pixels : int, optional
        Pixels along each axis; by default ``2 sqrt(N)`` between 64 and 512, so that dense
        regions hold several bodies per pixel.
    half_width : float, optional
        Half the side of the map; by default from the first snapshot's 99th percentile.
    smoothing : float
        Width (pixels) of the Gaussian that smooths the histogram (mass is conserved); 0 for
        none.
    cmap : str
        Matplotlib colour map.
    """
    from mpl_toolkits.axes_grid1.anchored_artists import AnchoredSizeBar

    indices = _snapshot_indices(trajectory, snapshots)
    mass = trajectory["mass"].values
    frames, xlabel, ylabel = _projected(trajectory["position"].isel(time=indices).values,
                                        plane, view)
    box = trajectory.attrs.get("box_size")
    if box is not None and view is None:  # a periodic box: the whole box, in its frame
        centres = [np.full(2, box / 2)] * len(frames)
        half = half_width or box / 2
    else:
        centres = [np.average(f, axis=0, weights=mass) for f in frames]
        half = half_width or _extent(frames[0] - centres[0])
    origin = centres[0] if box is not None and view is None else np.zeros(2)
    maps, norm = _density_maps([f - c for f, c in zip(frames, centres, strict=True)], mass,
                               half, pixels, smoothing)
    comoving = "cosmology" in trajectory.attrs
    unit = "Mpc/h" if comoving else trajectory.attrs.get("length_unit", "")
    fig = _figure(figsize=(3.2 * len(indices) + 0.8, 3.4))
    axes = fig.subplots(1, len(indices), squeeze=False)[0]
    for ax, k, image in zip(axes, indices, maps, strict=True):
        shown = ax.imshow(image, origin="lower", norm=norm, cmap=cmap,
                          extent=(origin[0] - half, origin[0] + half, origin[1] - half,
                                  origin[1] + half), interpolation="nearest")
        ax.set_facecolor("black")
        time = float(trajectory.time[k])
        ax.set_title(f"z = {1 / time - 1:.3g}" if comoving else f"t = {time:.4g}")
        ax.set_xlabel(xlabel)
        bar = _nice_length(2 * half)
        ax.add_artist(AnchoredSizeBar(ax.transData, bar, f"{bar:g} {unit}".strip(),
                                      "lower right", color="white", frameon=False,
                                      size_vertical=half / 150))
    axes[0].set_ylabel(ylabel)
    fig.colorbar(shown, ax=list(axes), label="surface density (mass / length²)", shrink=0.9)
    fig.suptitle(f"N = {trajectory.sizes['body']}")
    return fig


def conservation(trajectory: xr.Dataset) -> Figure:
    """Relative energy error, momentum drift and angular-momentum error versus time."""
    cons = analysis.conservation(trajectory).compute()
    fig = _figure(figsize=(6.4, 6.0))
    axes = fig.subplots(3, 1, sharex=True)
    time = cons.time.values
    for ax, name in zip(axes, ("energy_error", "momentum_drift", "angular_momentum_error"),
                        strict=True):
        values = np.abs(cons[name].values)
        ax.plot(time, np.where(values > 0, values, np.nan), ".-", ms=3)
        ax.set_yscale("log")
        ax.set_ylabel(f"|{cons[name].attrs['long_name']}|")
        ax.grid(True, which="major", alpha=0.3)
    axes[-1].set_xlabel("time")
    fig.suptitle("conservation")
    return fig


def lagrangian_radii(trajectory: xr.Dataset,
                     fractions: Sequence[float] = analysis.DEFAULT_FRACTIONS) -> Figure:
    """Lagrangian radii (about the centre of mass) versus time."""
    radii = analysis.lagrangian_radii(trajectory, fractions).compute()
    fig = _figure(figsize=(6.4, 4.0))
    ax = fig.subplots()
    for f in radii.fraction.values:
        ax.plot(radii.time.values, radii.sel(fraction=f).values, label=f"{f:g}")
    ax.set_yscale("log")
    ax.set_xlabel("time")
    ax.set_ylabel("radius")
    ax.legend(title="mass fraction", fontsize="small")
    ax.grid(True, which="both", alpha=0.3)
    return fig


def power_spectra(trajectory: xr.Dataset, snapshots: Sequence[int] | None = None, *,
                  mesh_size: int | None = None) -> Figure:
    """The matter power spectrum of snapshots of a cosmological run against linear theory,
    ``P_lin(k) D(z)^2`` (dashed; colossus's spectrum of the run's cosmology), up to the
    mesh's Nyquist frequency, with the Poisson shot noise ``V / N`` dotted (not subtracted:
    bodies that start on a grid have less than that until they cluster); by default the
    first and last snapshots and up to three between."""
    from .cosmology import Background, as_cosmology, linear_power
    from .power import default_mesh_size, power_spectrum

    if "cosmology" not in trajectory.attrs:
        raise ValueError("power_spectra is for cosmological runs (the trajectory has no "
                         "cosmology attribute)")
    count = trajectory.sizes["time"]
    if snapshots is None:
        snapshots = sorted(set(np.linspace(0, count - 1, min(count, 5)).round().astype(int)))
    indices = _snapshot_indices(trajectory, snapshots)
    mesh = mesh_size or default_mesh_size(trajectory.sizes["body"])
    spectra = power_spectrum(trajectory.isel(time=indices), mesh)
    cosmology = as_cosmology(trajectory.attrs["cosmology"])
    linear = linear_power(cosmology)
    growth = Background(cosmology).growth(spectra.time.values).d1
    fig = _figure(figsize=(6.4, 4.4))
    ax = fig.subplots()
    k = spectra.k.values
    for i in range(len(indices)):
        row = spectra.isel(time=i)
        line, = ax.loglog(k, row.power.values, label=f"z = {1 / float(row.time) - 1:.3g}")
        ax.loglog(k, linear(k) * growth[i] ** 2, "--", color=line.get_color(), lw=0.8)
    ax.axhline(float(spectra.shot_noise[0]), color="grey", ls=":", lw=0.8,
               label="shot noise V/N")
    _log_axes(ax, "k (h/Mpc)", "P(k) ((Mpc/h)³)",
              f"N = {trajectory.sizes['body']}, mesh {mesh}³; dashed: linear theory")
    return fig


def halo_mass_function(halos: xr.Dataset, cosmology: object, redshift: float = 0.0, *,
                       bins: int = 10, model: str = "watson13") -> Figure:
    """The FoF halo mass function of a catalogue (:func:`nbody_dask.friends_of_friends` of a
    cosmological run, masses in code units) with Poisson errors, against a fit from
    colossus (``model``: one of its FoF mass functions) at ``redshift``; masses in M_sun/h."""
    from colossus.lss import mass_function as fits

    from .cosmology import as_cosmology, colossus_cosmology, mass_unit_msun_h
    from .halos import mass_function

    cosmology = as_cosmology(cosmology)
    measured = mass_function(halos, bins)
    mass = measured.mass.values * mass_unit_msun_h(cosmology)
    colossus_cosmology(cosmology)
    fit = fits.massFunction(mass, redshift, mdef="fof", model=model, q_out="dndlnM") \
        * np.log(10)  # dn/dlog10 M in (h/Mpc)^3
    fig = _figure(figsize=(6.4, 4.4))
    ax = fig.subplots()
    shown = measured["count"].values > 0
    ax.errorbar(mass[shown], measured.dn_dlog10m.values[shown],
                yerr=measured.error.values[shown], fmt="o", ms=4,
                label=f"FoF b = {halos.attrs.get('linking_length_spacings', 0.2):g}, "
                      f"{halos.sizes['halo']} halos")
    ax.loglog(mass, fit, "--", label=f"{model} (colossus)")
    _log_axes(ax, "M (M☉/h)", "dn / dlog₁₀M ((h/Mpc)³)",
              f"z = {redshift:.3g}, box {float(halos.attrs['box_size']):g} Mpc/h")
    return fig


def _log_axes(ax, xlabel: str, ylabel: str, title: str) -> None:
    """Labels, title, legend and the log grid of a cosmology plot."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize="small")
    ax.grid(True, which="both", alpha=0.3)


def animate(trajectory: xr.Dataset, path: str | os.PathLike, *, plane: str = "xy",
            view: tuple[float, float] | None = None, style: str = "points", fps: int = 10,
            max_frames: int = 200, max_bodies: int = 20_000, overwrite: bool = False) -> Path:
    """Write an animation, ``.gif`` (Pillow) or ``.mp4`` (ffmpeg), of the projected bodies:
    ``style="points"`` draws them (at most ``max_bodies``), ``"density"`` the surface-density
    map of :func:`surface_density` (all bodies, fixed log colour scale). ``plane`` and
    ``view`` as in :func:`surface_density`.

    Raises
    ------
    FileExistsError
        If ``path`` exists and ``overwrite`` is False.
    ValueError
        For another suffix or style, or a bad ``plane``.
    RuntimeError
        For ``.mp4`` without ffmpeg on the PATH.
    """
    from matplotlib import animation

    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".gif", ".mp4"):
        raise ValueError(f"animation path must end in .gif or .mp4, got {str(path)!r}")
    if style not in ("points", "density"):
        raise ValueError(f"style must be 'points' or 'density', got {style!r}")
    check_new_file(path, overwrite)
    if suffix == ".mp4" and not animation.FFMpegWriter.isAvailable():
        raise RuntimeError("writing .mp4 needs ffmpeg on the PATH; write a .gif instead")
    count, n = trajectory.sizes["time"], trajectory.sizes["body"]
    frames = np.unique(np.linspace(0, count - 1, min(count, max_frames)).round().astype(int))
    stride = 1 if style == "density" else max(1, -(-n // max_bodies))
    body = slice(None, None, stride)
    data, xlabel, ylabel = _projected(
        trajectory["position"].isel(time=frames, body=body).values, plane, view)
    fig = _figure(figsize=(4.8, 4.8), dpi=80)
    ax = fig.subplots()
    centre = np.median(data[0], axis=0)
    half = _extent(data[0])
    ax.set_xlim(centre[0] - half, centre[0] + half)
    ax.set_ylim(centre[1] - half, centre[1] + half)
    ax.set_aspect("equal")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    title = ax.set_title("")
    if style == "density":
        maps, norm = _density_maps([f - centre for f in data], trajectory["mass"].values,
                                   half, None, 1.0)
        ax.set_facecolor("black")
        artist = ax.imshow(maps[0], origin="lower", norm=norm, cmap="inferno",
                           extent=(centre[0] - half, centre[0] + half, centre[1] - half,
                                   centre[1] + half))

        def update(k: int) -> None:
            artist.set_data(maps[k])
    else:
        artist = ax.scatter(data[0][:, 0], data[0][:, 1], s=_marker_size(data.shape[1]),
                            c="k", alpha=0.6, linewidths=0)

        def update(k: int) -> None:
            artist.set_offsets(data[k])

    def draw(k: int):
        update(k)
        title.set_text(f"N = {n}, t = {float(trajectory.time[frames[k]]):.4g}")
        return artist, title

    movie = animation.FuncAnimation(fig, draw, frames=len(frames), blit=False)
    writer = animation.PillowWriter(fps=fps) if suffix == ".gif" else animation.FFMpegWriter(fps)
    movie.save(path, writer=writer)
    return path


KINDS = ("positions", "density", "conservation", "lagrangian", "animation", "power")


def save_figures(trajectory: xr.Dataset, directory: str | os.PathLike,
                 kinds: Sequence[str] = ("positions", "conservation", "lagrangian"), *,
                 snapshots: Sequence[int] | None = None, plane: str = "xy",
                 view: tuple[float, float] | None = None, style: str = "points",
                 overwrite: bool = False) -> list[Path]:
    """Write the chosen plots into ``directory`` (PNG; the animation as GIF, in ``style``);
    return the paths. ``view`` (a rotated view) applies to the density map and animation.

    Every target file is checked before anything is drawn: existing files are an error
    unless ``overwrite``.
    """
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise ValueError(f"plot kinds must be among {list(KINDS)}, got {unknown}")
    if "power" in kinds and "cosmology" not in trajectory.attrs:
        raise ValueError("plot kind 'power' is for cosmological runs (cosmology=...)")
    _plane(plane)
    _snapshot_indices(trajectory, snapshots)
    directory = Path(directory)
    targets = {k: directory / (f"{k}.gif" if k == "animation" else f"{k}.png") for k in kinds}
    for target in targets.values():
        check_new_file(target, overwrite)
    directory.mkdir(parents=True, exist_ok=True)
    for kind, target in targets.items():
        if kind == "animation":
            animate(trajectory, target, plane=plane, view=view, style=style, overwrite=True)
            continue
        if kind == "positions":
            fig = positions(trajectory, snapshots, plane=plane)
        elif kind == "density":
            fig = surface_density(trajectory, snapshots, plane=plane, view=view)
        elif kind == "conservation":
            fig = conservation(trajectory)
        elif kind == "power":
            fig = power_spectra(trajectory, snapshots)
        else:
            fig = lagrangian_radii(trajectory)
        fig.savefig(target, dpi=120)
    return list(targets.values())

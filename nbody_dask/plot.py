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

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

__all__ = ["positions", "conservation", "lagrangian_radii", "animate", "save_figures", "KINDS"]

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


def animate(trajectory: xr.Dataset, path: str | os.PathLike, *, plane: str = "xy",
            fps: int = 10, max_frames: int = 200, max_bodies: int = 20_000,
            overwrite: bool = False) -> Path:
    """Write an animation of the projected positions: ``.gif`` (Pillow) or ``.mp4`` (ffmpeg).

    Raises
    ------
    FileExistsError
        If ``path`` exists and ``overwrite`` is False.
    ValueError
        For another suffix, or a bad ``plane``.
    RuntimeError
        For ``.mp4`` without ffmpeg on the PATH.
    """
    from matplotlib import animation

    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".gif", ".mp4"):
        raise ValueError(f"animation path must end in .gif or .mp4, got {str(path)!r}")
    _check_new(path, overwrite)
    if suffix == ".mp4" and not animation.FFMpegWriter.isAvailable():
        raise RuntimeError("writing .mp4 needs ffmpeg on the PATH; write a .gif instead")
    i, j = _plane(plane)
    count = trajectory.sizes["time"]
    frames = np.unique(np.linspace(0, count - 1, min(count, max_frames)).round().astype(int))
    n = trajectory.sizes["body"]
    stride = max(1, -(-n // max_bodies))
    data = trajectory["position"].isel(time=frames, body=slice(None, None, stride)).values
    fig = _figure(figsize=(4.8, 4.8), dpi=80)
    ax = fig.subplots()
    half = _extent(data[0][:, [i, j]])
    centre = np.median(data[0][:, [i, j]], axis=0)
    ax.set_xlim(centre[0] - half, centre[0] + half)
    ax.set_ylim(centre[1] - half, centre[1] + half)
    ax.set_aspect("equal")
    ax.set_xlabel(plane[0])
    ax.set_ylabel(plane[1])
    dots = ax.scatter(data[0][:, i], data[0][:, j], s=_marker_size(data.shape[1]), c="k",
                      alpha=0.6, linewidths=0)
    title = ax.set_title("")

    def draw(k: int):
        dots.set_offsets(data[k][:, [i, j]])
        title.set_text(f"N = {n}, t = {float(trajectory.time[frames[k]]):.4g}")
        return dots, title

    movie = animation.FuncAnimation(fig, draw, frames=len(frames), blit=False)
    writer = animation.PillowWriter(fps=fps) if suffix == ".gif" else animation.FFMpegWriter(fps)
    movie.save(path, writer=writer)
    return path


KINDS = ("positions", "conservation", "lagrangian", "animation")


def save_figures(trajectory: xr.Dataset, directory: str | os.PathLike,
                 kinds: Sequence[str] = ("positions", "conservation", "lagrangian"), *,
                 snapshots: Sequence[int] | None = None, plane: str = "xy",
                 overwrite: bool = False) -> list[Path]:
    """Write the chosen plots into ``directory`` (PNG; the animation as GIF); return the paths.

    Every target file is checked before anything is drawn: existing files are an error
    unless ``overwrite``.
    """
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise ValueError(f"plot kinds must be among {list(KINDS)}, got {unknown}")
    _plane(plane)
    _snapshot_indices(trajectory, snapshots)
    directory = Path(directory)
    targets = {k: directory / (f"{k}.gif" if k == "animation" else f"{k}.png") for k in kinds}
    for target in targets.values():
        _check_new(target, overwrite)
    directory.mkdir(parents=True, exist_ok=True)
    for kind, target in targets.items():
        if kind == "animation":
            animate(trajectory, target, plane=plane, overwrite=True)
            continue
        if kind == "positions":
            fig = positions(trajectory, snapshots, plane=plane)
        elif kind == "conservation":
            fig = conservation(trajectory)
        else:
            fig = lagrangian_radii(trajectory)
        fig.savefig(target, dpi=120)
    return list(targets.values())


def _check_new(path: Path, overwrite: bool) -> None:
    if path.exists() and not overwrite:
        raise FileExistsError(f"{str(path)!r} exists; pass overwrite=True (--overwrite) to "
                              "replace it")

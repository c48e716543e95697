"""Individual time steps: hierarchical power-of-two bins on an integer timeline.

A run with ``timestep="individual"`` keeps the plan's ``dt`` as the longest step: one plan
step (a *block*) is cut into ``2**(bins - 1)`` ticks, and a body in bin ``k`` (0 the longest)
takes steps of ``dt / 2**k``, that is ``2**(bins - 1 - k)`` ticks. Every step of every bin
starts and ends on a tick, and all bins end together at the end of each block: snapshots,
resumes and the driver's submissions happen there, where every body is synchronised.

The bin a body wants is the longest whose step is at most ``eta * sqrt(eps / |a|)``
(the ``"acceleration"`` criterion, :func:`wanted_bins`, of GADGET-2 and SWIFT with the
Plummer softening ``eps`` as the length), or by default ``eta`` times a smooth maximum of
the free-fall times ``sqrt(r^3 / G(m_i + m_j))`` of the body's pairs (the ``"pairwise"``
criterion, :func:`pairwise_bins`: measured to reach the same energy error with fewer force
evaluations on a cusp, docs/user-guide.md). A body whose step ends at a tick (an *active*
body) gets its new force there and may change bin: to a shorter one at once, to a longer
one only as far as that bin's steps are synchronised with the tick (:func:`next_bins`), so
that every step still ends on its bin's grid and at the block's end.

This module is arithmetic: the per-body functions take NumPy arrays (the workers call them
through :mod:`nbody_dask.tasks`), the per-tile ones plain integers (the graph builder,
:mod:`nbody_dask.blocksteps`, plans each tick from the bin counts of the tiles).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Bins", "TIMESTEPS", "CRITERIA", "DEFAULT_ETA", "bins_for_steps", "ticks_per_block",
           "bin_ticks", "active_mask", "wanted_bins", "pairwise_bins",
           "next_bins", "bin_counts", "tile_active", "active_bodies", "next_tick",
           "BIN_DTYPE", "BlockFactors"]

#: The time-step schemes: one step for every body, or hierarchical bins.
TIMESTEPS = ("global", "individual")

#: The step criteria (:meth:`Bins.wanted`): a smooth maximum of the two-body free-fall times
#: of each body's pairs, or Power et al.'s ``eta sqrt(softening / |a|)`` (GADGET, SWIFT).
CRITERIA = ("pairwise", "acceleration")

#: Each criterion's default ``eta``: for ``"pairwise"`` measured on a Hernquist cusp, where
#: 0.005 reached the energy error of a global step 1/32 of the longest in a third of the
#: force evaluations, and larger values let the energy drift (benchmarks/timesteps.py,
#: docs/user-guide.md); for ``"acceleration"`` GADGET's default accuracy
#: (``ErrTolIntAccuracy = 0.025`` in ``sqrt(2 eta eps / |a|)``).
DEFAULT_ETA = {"pairwise": 0.005, "acceleration": 0.22}

#: The dtype of a body's bin in tiles and in the store.
BIN_DTYPE = np.int8


def ticks_per_block(bins: int) -> int:
    """Ticks of one block (one plan step ``dt``) with ``bins`` bins: the shortest step's
    count, ``2**(bins - 1)``."""
    return 1 << (bins - 1)


def bin_ticks(k: int | np.ndarray, bins: int) -> int | np.ndarray:
    """The step of bin ``k`` in ticks: ``2**(bins - 1 - k)``."""
    return np.left_shift(1, bins - 1 - np.asarray(k, dtype=np.int64)) if isinstance(
        k, np.ndarray) else 1 << (bins - 1 - int(k))


def active_mask(time_bin: np.ndarray, tick: int, bins: int) -> np.ndarray:
    """Which bodies' steps end (and the next begin) at ``tick`` of a block."""
    lengths = np.left_shift(1, bins - 1 - np.arange(bins, dtype=np.int64))
    return (tick % lengths == 0)[time_bin]


def bins_for_steps(steps: np.ndarray, dt: float, bins: int) -> np.ndarray:
    """The bin of each body from the step its criterion allows: the longest ``dt / 2**k``
    that is at most ``steps`` (bin 0 for an infinite step, the last bin at most; a step that
    is not a number, from values beyond the dtype's range, gets the last bin)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        halvings = np.ceil(np.log2(dt / np.asarray(steps, dtype=np.float64)))
    halvings = np.where(np.isnan(halvings), bins - 1, halvings)
    return np.clip(halvings, 0, bins - 1).astype(BIN_DTYPE)


def wanted_bins(acceleration: np.ndarray, softening: float, eta: float, dt: float,
                bins: int) -> np.ndarray:
    """The bin the acceleration criterion asks for: the longest step ``dt / 2**k`` of at
    most ``eta * sqrt(softening / |a|)`` (bin 0 for ``a = 0``, the last bin at most).

    Computed in float64 from the tile's accelerations ``(3, n)``, so the bins do not depend
    on anything but those values.
    """
    a = np.sqrt(np.sum(np.asarray(acceleration, dtype=np.float64) ** 2, axis=0))
    with np.errstate(divide="ignore", invalid="ignore"):
        return bins_for_steps(eta * np.sqrt(softening / a), dt, bins)


def pairwise_bins(rate2: np.ndarray, G: float, eta: float, dt: float, bins: int
                  ) -> np.ndarray:
    """The bin the pairwise criterion asks for: the longest step ``dt / 2**k`` of at most
    ``eta (G^2 rate2)^(-1/4)``, ``rate2`` being the sum over a body's pairs of ``((m_i +
    m_j) / (r^2 + eps^2)^(3/2))^2`` (:func:`nbody_dask.kernels.cpu.accel_rate_tile`).

    For one pair that is ``eta sqrt(r^3 / G(m_i + m_j))``: a Kepler orbit takes about
    ``2 pi / eta`` steps per orbit at any eccentricity; with many pairs the closest
    encounters set the step (the terms fall as ``r^-6``), so a body crossing a dense cusp,
    or passing another, gets short steps where the mean field alone (``|a|``) would not ask
    for them.
    """
    r2 = np.asarray(rate2, dtype=np.float64) * (G * G)
    with np.errstate(divide="ignore", invalid="ignore"):
        return bins_for_steps(eta / np.sqrt(np.sqrt(r2)), dt, bins)


def next_bins(old: np.ndarray, wanted: np.ndarray, tick: int, bins: int) -> np.ndarray:
    """The bins of bodies active at ``tick`` from their old and wanted bins: a shorter bin at
    once; a longer one only as long as ``tick`` is on that bin's grid (at the block's start
    and end, tick 0, every bin is)."""
    old = old.astype(np.int64)
    wanted = wanted.astype(np.int64)
    # the longest bin whose grid holds this tick: k with 2**(bins-1-k) dividing tick
    if tick == 0:
        synchronised = 0
    else:
        trailing = (tick & -tick).bit_length() - 1  # 2**trailing is tick's largest power
        synchronised = max(0, bins - 1 - trailing)
    return np.where(wanted >= old, wanted, np.maximum(wanted, synchronised)
                    ).astype(BIN_DTYPE)


def bin_counts(time_bin: np.ndarray, bins: int) -> tuple[int, ...]:
    """How many bodies each bin holds (a tile's, for the graph builder)."""
    return tuple(int(c) for c in np.bincount(time_bin.astype(np.int64), minlength=bins))


def tile_active(counts: tuple[int, ...], tick: int) -> bool:
    """Whether a tile whose bins hold ``counts`` bodies has an active body at ``tick``."""
    bins = len(counts)
    return any(c and tick % bin_ticks(k, bins) == 0 for k, c in enumerate(counts))


def active_bodies(counts: tuple[int, ...], tick: int) -> int:
    """How many of a tile's bodies (bins holding ``counts``) are active at ``tick``."""
    bins = len(counts)
    return sum(c for k, c in enumerate(counts) if tick % bin_ticks(k, bins) == 0)


def next_tick(counts: list[tuple[int, ...]], tick: int) -> int:
    """The first tick after ``tick`` at which any tile (bins holding ``counts[i]``) has an
    active body; the block's end at the latest."""
    bins = len(counts[0]) if counts else 1
    deepest = max((max((k for k, c in enumerate(cs) if c), default=0) for cs in counts),
                  default=0)
    step = bin_ticks(deepest, bins)
    return min((tick // step + 1) * step, ticks_per_block(bins))


@dataclass(frozen=True)
class Bins:
    """A run's individual time steps: the longest step ``dt`` (a block), the number of bins,
    the criterion's ``eta`` and the softening it uses (:mod:`nbody_dask.timebins`)."""

    dt: float
    bins: int
    eta: float
    softening: float
    criterion: str = "pairwise"

    @property
    def pairwise(self) -> bool:
        """The pairwise criterion: the force tasks also sum the pairs' rates."""
        return self.criterion == "pairwise"

    def wanted(self, acceleration: np.ndarray, rate2: np.ndarray | None, G: float,
               scale: float = 1.0) -> np.ndarray:
        """The bins the criterion asks for, from the accelerations (G applied) or the
        pairs' rates (G = 1); the step it allows times ``scale`` (a comoving run's
        :attr:`BlockFactors.step_scale`)."""
        if self.pairwise:
            return pairwise_bins(rate2, G, self.eta * scale, self.dt, self.bins)
        return wanted_bins(acceleration, self.softening, self.eta * scale, self.dt,
                           self.bins)

    @property
    def ticks(self) -> int:
        """Ticks of one block."""
        return ticks_per_block(self.bins)

    def half_steps(self, time_bin: np.ndarray, ftype: type) -> np.ndarray:
        """Half of each body's step, ``dt / 2**(k + 1)``, in ``ftype`` (exact: powers of
        two)."""
        table = (0.5 * self.dt / np.exp2(np.arange(self.bins, dtype=np.float64)))
        return table.astype(ftype)[time_bin]

    def drift(self, ticks: int) -> float:
        """The drift factor over ``ticks`` ticks."""
        return ticks * (self.dt / self.ticks)


@dataclass(frozen=True)
class BlockFactors:
    """A comoving run's block on its timeline (:meth:`nbody_dask.plan.Plan.block_factors`):
    the leapfrog's factors from the block's start, and the criterion's scale, tick by tick.

    Attributes
    ----------
    kick : tuple of float
        ``int dt / a`` from the block's start to each half tick, ``0 .. 2 ticks``.
    drift : tuple of float
        ``int dt / a^2`` from the block's start to each tick, ``0 .. ticks``.
    step_scale : tuple of float
        At each tick, ``E(a) a^(3/2)``: a step ``dt_phys`` of the acceleration criterion
        (physical accelerations ``|F| / a^2`` and softening ``a eps``, for comoving forces
        ``F`` and softening ``eps``) is ``dt_phys`` times this in ``ln a``, the block's time
        variable.
    """

    kick: tuple[float, ...]
    drift: tuple[float, ...]
    step_scale: tuple[float, ...]

    def drift_between(self, first: int, last: int) -> float:
        """The drift factor from tick ``first`` to tick ``last``."""
        return self.drift[last] - self.drift[first]

    def half_kicks(self, time_bin: np.ndarray, tick: int, bins: int, after: bool,
                   ftype: type) -> np.ndarray:
        """Each body's half-kick factor at ``tick``: over the first half of the step of its
        bin that starts there (``after``), or over the last half of the one that ends
        there; in ``ftype``."""
        table = np.asarray(self.kick)
        half = bin_ticks(np.asarray(time_bin), bins)  # half a step in half ticks
        m = 2 * tick
        factors = table[m + half] - table[m] if after else table[m] - table[m - half]
        return factors.astype(ftype)

    def half_block(self, second: bool, ftype: type) -> Any:
        """The kick factor over the first (or ``second``) half of the block, in ``ftype``."""
        middle = (len(self.kick) - 1) // 2
        return ftype(self.kick[-1] - self.kick[middle] if second
                     else self.kick[middle] - self.kick[0])

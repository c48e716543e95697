"""Leapfrog kick-drift-kick, as per-tile operations the task graph calls.

One step of length ``dt`` from ``(x, v, a)``::

    v_half = v + a * K1            # opening half-kick   } open_step
    x_new  = x + v_half * D        # drift               }
    a_new  = F(x_new)              # one force evaluation (the run's force method)
    v_new  = v_half + a_new * K2   # closing half-kick   close_step

with ``K1 = K2 = dt / 2`` and ``D = dt`` (:meth:`nbody_dask.plan.Plan.step_factors`). In a
comoving run ``v`` is the canonical momentum ``p = a^2 dx/dt``, and ``K1, D, K2`` are the
integrals of ``dt / a``, ``dt / a^2`` and ``dt / a`` over the step's halves and whole
(:mod:`nbody_dask.cosmology`): the same symplectic scheme in those variables (Quinn et al.
1997). Snapshots hold peculiar velocities ``p / a`` (:func:`peculiar`); at every snapshot
step the momentum is replaced by ``(p / a) a`` in the tile's dtype (:func:`close_step`), the
value a resume from that snapshot starts from (:func:`canonical`), so a resumed run is
bit-identical (``x -> (x / a) a`` is idempotent in IEEE arithmetic).

The closing half-kick of step k uses the accelerations that also open step k+1, so each step
costs one force evaluation. The scheme is symplectic and time-reversible, second order in
``dt``. All arithmetic stays in the tile's dtype (scalars are cast first, so float32 runs are
not promoted to float64).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .bodies import Tile, wrap
from .timebins import BlockFactors, Bins, next_bins

__all__ = ["open_step", "close_step", "canonical", "peculiar", "check_finite",
           "NonFiniteStateError", "INTEGRATOR", "open_block", "drifted",
           "close_block"]

INTEGRATOR = "leapfrog-kdk"


def open_step(tile: Tile, kick: float, drift: float, box: float | None = None) -> Tile:
    """Opening half-kick (by ``kick``) and drift (by ``drift``): returns positions at the new
    time (wrapped into ``[0, box)`` in a periodic cube of side ``box``), half-step
    velocities."""
    ftype = tile.position.dtype.type
    with np.errstate(over="ignore", invalid="ignore"):  # check_finite reports it, by step
        v_half = tile.velocity + tile.acceleration * ftype(kick)
        x_new = tile.position + v_half * ftype(drift)
    if box is not None:
        x_new = wrap(x_new, box)
    return tile.evolve(position=x_new, velocity=v_half, acceleration=None, potential=None)


def close_step(tile: Tile, forces: np.ndarray, G: float, kick: float | None,
               scale: float | None = None) -> Tile:
    """Attach the new forces and apply the closing half-kick.

    Parameters
    ----------
    tile : Tile
        Output of :func:`open_step` (or the initial tile when ``kick`` is None).
    forces : ndarray, shape (3, n) or (4, n)
        Summed kernel partials (G = 1): accelerations, and the potential in row 3 if present.
    G : float
        Gravitational constant, applied here once.
    kick : float or None
        The closing kick's factor (``dt / 2``); None attaches the forces without a kick
        (the initial evaluation).
    scale : float or None
        A comoving run's scale factor at a snapshot step: the momenta become
        ``(p / a) a``, what a resume from the snapshot starts from.
    """
    ftype = tile.position.dtype.type
    g = ftype(G)
    with np.errstate(over="ignore", invalid="ignore"):  # check_finite reports it, by step
        acc = forces[:3] * g
        potential = forces[3] * g if forces.shape[0] == 4 else None
        velocity = tile.velocity if kick is None else tile.velocity + acc * ftype(kick)
        velocity = _as_read_back(velocity, scale)
    return tile.evolve(velocity=velocity, acceleration=acc, potential=potential)


def _as_read_back(momenta: np.ndarray, scale: float | None) -> np.ndarray:
    """A comoving run's momenta at a snapshot of scale factor ``scale`` as a resume reads
    them back, ``(p / a) a`` in their dtype; the momenta themselves for ``scale`` None."""
    if scale is None:
        return momenta
    a = momenta.dtype.type(scale)
    return (momenta / a) * a


def canonical(tile: Tile, scale: float) -> Tile:
    """A comoving run's tile with peculiar velocities ``v`` as the state's momenta
    ``p = a v`` at scale factor ``scale``."""
    return tile.evolve(velocity=tile.velocity * tile.position.dtype.type(scale))


def peculiar(tile: Tile, scale: float) -> Tile:
    """A comoving run's tile as a snapshot holds it at scale factor ``scale``: peculiar
    velocities ``p / a`` and the peculiar potential ``phi / a``."""
    ftype = tile.position.dtype.type
    potential = None if tile.potential is None else tile.potential / ftype(scale)
    return tile.evolve(velocity=tile.velocity / ftype(scale), potential=potential)


# -- individual time steps (nbody_dask.timebins) ----------------------------------------------

def open_block(tile: Tile, bins: Bins, factors: BlockFactors | None = None) -> Tile:
    """The opening half-kick of every body at a block's start (each by half its bin's step;
    then, with a long-range force, :attr:`~nbody_dask.bodies.Tile.long_acceleration`, by
    half the block); positions stay, to be drifted by :func:`drifted` when needed. A
    comoving run's kicks are its block's ``factors``."""
    ftype = tile.position.dtype.type
    with np.errstate(over="ignore", invalid="ignore"):
        velocity = tile.velocity + tile.acceleration * _half_kicks(bins, factors,
                                                                   tile.time_bin, 0, True,
                                                                   ftype)
        if tile.long_acceleration is not None:
            velocity = velocity + tile.long_acceleration * _half_block(bins, factors, False,
                                                                       ftype)
    return tile.evolve(velocity=velocity, potential=None)


def _half_kicks(bins: Bins, factors: BlockFactors | None, time_bin: np.ndarray, tick: int,
                after: bool, ftype: type) -> np.ndarray:
    """Each body's half-kick factor at ``tick``, after it or before it: half its bin's step,
    or a comoving block's integral (:meth:`~nbody_dask.timebins.BlockFactors.half_kicks`)."""
    if factors is None:
        return bins.half_steps(time_bin, ftype)
    return factors.half_kicks(time_bin, tick, bins.bins, after, ftype)


def _half_block(bins: Bins, factors: BlockFactors | None, second: bool, ftype: type) -> Any:
    """The kick factor of half a block (its first or ``second`` half)."""
    return ftype(0.5 * bins.dt) if factors is None else factors.half_block(second, ftype)


def drifted(tile: Tile, drift: float) -> np.ndarray:
    """The tile's positions drifted by the factor ``drift`` (the tile itself for 0): between
    two of its kicks a body moves in a straight line, so a tile's positions at any tick are
    these of its last kick's tick, the same bits wherever computed."""
    if drift == 0:
        return tile.position
    with np.errstate(over="ignore", invalid="ignore"):
        return tile.position + tile.velocity * tile.position.dtype.type(drift)


def close_block(tile: Tile, forces: np.ndarray, G: float, tick: int, bins: Bins,
                initial: bool, active: np.ndarray | None = None,
                long: np.ndarray | None = None, factors: BlockFactors | None = None,
                scale: float | None = None) -> Tile:
    """The end of the active bodies' steps at ``tick`` of a block (``bins.ticks``: its end):
    attach their forces, the closing half-kick, their new bins, and unless the block ends
    there the opening half-kick of their next step.

    Parameters
    ----------
    tile : Tile
        The tile drifted to ``tick``.
    forces : ndarray, shape (3 to 5, active)
        Summed partial forces (G = 1) on the active bodies, in tile order: accelerations, the
        potential when every body is active and it was asked for, and last, with the
        pairwise criterion, the pairs' rates (:meth:`~nbody_dask.timebins.Bins.wanted`).
    G : float
        Gravitational constant.
    tick : int
        The tick, ``1 .. bins.ticks`` (the block's end: every body is active).
    bins : Bins
        The run's bins.
    initial : bool
        The first evaluation of a run or a resume: every body is active, no kick, bins as
        the criterion asks.
    active : ndarray of bool, optional
        The bodies active at ``tick`` (:func:`~nbody_dask.timebins.active_mask`, as the
        force tasks took them); None: every body.
    long : ndarray, shape (3 or 4, n), optional
        A long-range force (TreePM's mesh, G = 1, the potential when asked for), where every
        body is synchronised (a first evaluation, a block's end): it closes the block with
        a half-kick of half the block and becomes the tile's :attr:`~nbody_dask.bodies.
        Tile.long_acceleration`. ``forces`` are then the short-range part, and the
        criterion reads the sum of both.
    factors : BlockFactors, optional
        A comoving run's block (:meth:`~nbody_dask.plan.Plan.block_factors`): its kicks and
        the criterion's scale at ``tick``.
    scale : float, optional
        A comoving run's scale factor at a snapshot (every body active): the momenta
        become ``(p / a) a``, what a resume from the snapshot starts from (as
        :func:`close_step`).
    """
    ftype = tile.position.dtype.type
    every = active is None
    opening = not initial and tick != bins.ticks
    if every:
        active = np.ones(tile.size, dtype=bool)
    rate2 = forces[-1] if bins.pairwise else None
    if long is not None and not every:
        raise ValueError("a long-range force closes a tick where every body is active")
    long_acc = tile.long_acceleration
    if long_acc is not None and not every:
        long_acc = long_acc[:, active]
    with np.errstate(over="ignore", invalid="ignore"):
        acc = forces[:3] * ftype(G)
        potential = forces[3] * ftype(G) if forces.shape[0] == 4 + bins.pairwise else None
        if long is not None:
            long_acc = long[:3] * ftype(G)
            if potential is not None:
                potential = potential + long[3] * ftype(G)
        wanted = bins.wanted(acc if long_acc is None else acc + long_acc, rate2, G,
                             1.0 if factors is None else factors.step_scale[tick])
        if initial:
            return tile.evolve(velocity=_as_read_back(tile.velocity, scale),
                               acceleration=acc, potential=potential,
                               time_bin=wanted, long_acceleration=long_acc)
        old = tile.time_bin[active]
        velocity = tile.velocity[:, active] + acc * _half_kicks(bins, factors, old, tick,
                                                                False, ftype)
        if long is not None:  # the block's closing long-range half-kick
            velocity = velocity + long_acc * _half_block(bins, factors, True, ftype)
        new = next_bins(old, wanted, tick % bins.ticks, bins.bins)
        if opening:
            velocity = velocity + acc * _half_kicks(bins, factors, new, tick, True, ftype)
        velocity = _as_read_back(velocity, scale)
    if every:
        return tile.evolve(velocity=velocity, acceleration=acc, potential=potential,
                           time_bin=new, long_acceleration=long_acc)
    full_velocity, full_acc, time_bin = (tile.velocity.copy(), tile.acceleration.copy(),
                                         tile.time_bin.copy())
    full_velocity[:, active], full_acc[:, active], time_bin[active] = velocity, acc, new
    return tile.evolve(velocity=full_velocity, acceleration=full_acc, potential=None,
                       time_bin=time_bin)


class NonFiniteStateError(FloatingPointError):
    """The state became NaN or infinite: the run stops (snapshots committed before stay)."""


def check_finite(tile: Tile, step: int, bodies: np.ndarray | None = None) -> Tile:
    """Return ``tile`` if its positions, velocities and accelerations are finite, else raise.

    Runs on the workers after every closing kick: O(n) against the step's O(n^2) forces.
    ``bodies`` (a mask): only those, the ones a kick just changed.

    Raises
    ------
    NonFiniteStateError
        Naming the step and the first body (by index) that is not finite.
    """
    ids = tile.body_ids if bodies is None else tile.body_ids[bodies]
    for name in ("position", "velocity", "acceleration"):
        values = getattr(tile, name)
        if bodies is not None:
            values = values[:, bodies]
        finite = np.isfinite(values).all(axis=0)
        if not finite.all():
            where = int(np.argmin(finite))
            raise NonFiniteStateError(
                f"the state is not finite after step {step}: {name} of body "
                f"{int(ids[where])} is {values[:, where].tolist()} (dt too large, "
                f"bodies too close with too little softening, or values beyond "
                f"{tile.position.dtype}'s range); the run stopped, snapshots committed "
                f"before this step are intact")
    return tile

"""Test oracles: independent, plain NumPy float64 references that no production path uses.

The tests (and the GPU check, which runs without the test suite) compare the kernels with
these; they are written for clarity, not speed.
"""

from __future__ import annotations

import numpy as np

__all__ = ["direct_sum_reference", "kernel_error_bound", "bound_ratio", "grid_shell_average",
           "TERM_ULPS"]

#: Rounding errors, in units of the dtype's unit roundoff, of one interaction term of a
#: kernel: the separation (1), its square and the softened sum (3), the reciprocal square
#: root (a hardware estimate refined by one Newton step, or a square root and a division:
#: 2), and the products that make the term (2).
TERM_ULPS = 8


def direct_sum_reference(position, mass, softening=0.0, G=1.0, targets=None, block=256):
    """Independent float64 NumPy direct sum: accelerations and potentials.

    Memory is O(``block`` x N): any N works, slowly.

    Parameters
    ----------
    position : array_like, shape (n, 3)
    mass : array_like, shape (n,)
    softening : float
        Plummer softening length eps.
    G : float
        Gravitational constant.
    targets : array_like of int, optional
        The bodies to compute for (all by default).
    block : int
        Targets per NumPy pass.

    Returns
    -------
    acc : ndarray, shape (k, 3)
    phi : ndarray, shape (k,)
        Potential of each target, self term excluded. Bodies at a target's position exert
        nothing on it (with or without softening).
    """
    pos = np.asarray(position, dtype=np.float64)
    m = np.asarray(mass, dtype=np.float64)
    targets = np.arange(len(pos)) if targets is None else np.asarray(targets, dtype=np.int64)
    acc = np.empty((len(targets), 3))
    phi = np.empty(len(targets))
    for lo in range(0, len(targets), block):
        t = targets[lo:lo + block]
        d = pos[None, :, :] - pos[t][:, None, :]  # d[i, j] = r_j - r_i
        r2 = np.einsum("ijk,ijk->ij", d, d) + float(softening) ** 2
        r2[np.arange(len(t)), t] = np.inf  # self term: zero force, excluded from phi
        with np.errstate(divide="ignore"):
            inv = np.where(r2 > 0, 1.0 / np.sqrt(r2), 0.0)
        acc[lo:lo + block] = G * np.einsum("ij,ijk->ik", m[None, :] * inv**3, d)
        phi[lo:lo + block] = -G * (inv * m[None, :]).sum(axis=1)
    return acc, phi


def kernel_error_bound(target_position, source_position, source_mass, eps2, dtype,
                       skip_self=False):
    """A worst-case bound on a tile-pair kernel's rounding error, from its error model.

    A kernel sums ``ns`` terms ``t_j`` (``m_j d_j / r_j^3`` per axis, ``-m_j / r_j`` for the
    potential), each computed with a relative error of at most :data:`TERM_ULPS` unit
    roundoffs ``u``, in any order (serial, SIMD lanes, blocks): the classic bound for a sum
    in floating point (Higham, *Accuracy and Stability of Numerical Algorithms*, ch. 4)
    gives ``|computed - exact| <= (ns - 1 + TERM_ULPS) u sum_j |t_j|`` to first order. The
    bound holds on every CPU and for every vector width and summation order, unlike a
    tolerance taken from one machine's rounding: two kernels evaluated on the same inputs
    differ by at most twice it.

    Parameters
    ----------
    target_position, source_position : array_like, shape (3, nt) and (3, ns)
        The kernel's inputs, already rounded to ``dtype``.
    source_mass : array_like, shape (ns,)
    eps2 : float
        Squared softening.
    dtype : numpy dtype
        The kernel's arithmetic (float32 or float64) sets ``u``.
    skip_self : bool
        The targets are the sources (a diagonal tile): term ``i`` of target ``i`` is left out.

    Returns
    -------
    ndarray, shape (4, nt)
        Rows 0-2 bound the accelerations, row 3 the potential (G = 1).
    """
    pt = np.asarray(target_position, dtype=np.float64)
    ps = np.asarray(source_position, dtype=np.float64)
    m = np.asarray(source_mass, dtype=np.float64)
    d = ps[:, None, :] - pt[:, :, None]  # (3, nt, ns)
    r2 = (d * d).sum(axis=0) + float(eps2)
    with np.errstate(divide="ignore"):
        inv = np.where(r2 > 0, 1.0 / np.sqrt(r2), 0.0)
    if skip_self:
        np.fill_diagonal(inv, 0.0)
    absolute = np.concatenate([(m * inv**3 * np.abs(d)).sum(axis=2),
                               (m * inv).sum(axis=1)[None]])
    u = np.finfo(dtype).eps / 2
    return (ps.shape[1] - 1 + TERM_ULPS) * u * absolute


def bound_ratio(got, want, bound) -> float:
    """The largest ``|got - want| / bound``: at most 1 when every entry is within its bound
    (an entry whose bound is zero must be exact: its ratio is 0 if so, infinite if not)."""
    difference = np.abs(np.asarray(got, np.float64) - np.asarray(want, np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(bound > 0, difference / bound, np.where(difference == 0, 0.0, np.inf))
    return float(ratio.max(initial=0.0))


def grid_shell_average(power, n_side: int, box_size: float, mesh_size: int) -> np.ndarray:
    """The spectrum ``power(k)`` averaged over the wave numbers of an ``n_side`` grid in each
    shell of :func:`nbody_dask.power_spectrum` on a ``mesh_size`` mesh (shells of the
    fundamental's width centred on its multiples, the grid's Nyquist planes left out as
    :func:`nbody_dask.cosmological_ics` leaves them): what the measured spectrum of
    fixed-amplitude initial conditions should be, shell by shell (empty shells: 0)."""
    n, box = n_side, box_size
    k1 = np.fft.fftfreq(n, box / n) * 2 * np.pi
    kz = np.fft.rfftfreq(n, box / n) * 2 * np.pi
    kx, ky, kz = np.meshgrid(k1, k1, kz, indexing="ij")
    k = np.sqrt(kx**2 + ky**2 + kz**2)
    nyquist = np.pi * n / box
    weight = np.where(np.isclose(kz, 0) | np.isclose(kz, nyquist), 1.0, 2.0)
    weight[np.isclose(np.abs(kx), nyquist) | np.isclose(np.abs(ky), nyquist)
           | np.isclose(kz, nyquist)] = 0
    edges = np.arange(0.5, mesh_size / 2 + 0.5 + 1e-9) * 2 * np.pi / box
    shell = np.digitize(k, edges) - 1
    inside = (shell >= 0) & (shell < len(edges) - 1)
    shells = len(edges) - 1
    total = np.bincount(shell[inside], weights=(weight * power(k))[inside], minlength=shells)
    modes = np.bincount(shell[inside], weights=weight[inside], minlength=shells)
    return total / np.maximum(modes, 1)

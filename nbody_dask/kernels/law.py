"""The softened force law, written once for every kernel.

Plummer softening: a source of mass ``m`` at separation ``d`` from a target pulls it with
``m d / (|d|^2 + eps^2)^(3/2)`` and adds ``-m / sqrt(|d|^2 + eps^2)`` to its potential (G = 1).
Both come from one number, the softened inverse distance :func:`inverse_distance`; every
kernel (the plain and symmetric CPU kernels, the tree's P2P and M2P, the CUDA kernel) calls
it and builds its sums from it, and Numba inlines it into their inner loops.

A source at exactly the target's position with ``eps == 0`` contributes zero, never NaN: the
self term ``i == j`` and coincident bodies need no special case in any kernel.

The arithmetic is written in the inputs' dtype: ``zero`` and ``one`` come from the caller's
arrays, so no float64 literal promotes a float32 kernel. The only thing a target machine
changes is the reciprocal square root: ``one / sqrt`` on CPUs (which LLVM turns into the
SIMD square root and division), libdevice's ``rsqrt`` on a GPU (one special-function
instruction). :func:`compile_for` compiles this very source for another target with its own.
"""

from __future__ import annotations

import functools
import math
import types
from collections.abc import Callable

import numpy as np
from numba import njit

__all__ = ["inverse_distance", "reciprocal_sqrt", "short_range", "fast_short_range",
           "short_range_constants", "FAST_SPLIT_ERROR", "polynomial_long_range",
           "long_range_polynomials", "POLYNOMIAL_DEGREE",
           "POLYNOMIAL_CUTOFF", "POLYNOMIAL_SPLIT_ERROR", "compile_for", "FAST_MATH",
           "JIT_OPTIONS"]

#: The fast-math freedoms of the CPU kernels: every flag of ``fastmath=True`` but ``nsz``
#: (no signed zeros). ``reassoc`` lets LLVM vectorise a kernel's sums; without ``nsz`` the
#: x86 back end does not re-balance sums for latency, a choice that depends on the code
#: around them. With it, a kernel called by another (a tree walk's M2P, say) gave results
#: that differed in the last bit between a process that compiled it and one that loaded it
#: from Numba's on-disk cache, which links its own copy of the callee. Measured: the same
#: speed either way.
FAST_MATH = frozenset({"nnan", "ninf", "arcp", "contract", "afn", "reassoc"})

#: Numba options of the CPU kernels: no GIL, cached on disk, SIMD-friendly floating point
#: (:data:`FAST_MATH`), NumPy's error model (Python's keeps divisions scalar).
JIT_OPTIONS = dict(nogil=True, cache=True, fastmath=set(FAST_MATH), error_model="numpy",
                   boundscheck=False)


@njit(inline="always", **JIT_OPTIONS)
def reciprocal_sqrt(x, one):
    """``1 / sqrt(x)`` on the CPU, in the dtype of ``one``."""
    return one / np.sqrt(x)


@njit(**JIT_OPTIONS)
def inverse_distance(dx, dy, dz, eps2, zero, one):
    """``1 / sqrt(dx^2 + dy^2 + dz^2 + eps2)``, and zero where that sum is zero.

    The softened force on a target is ``m * inv**3 * d`` and the potential ``-m * inv``, with
    ``d`` the separation from target to source and ``inv`` this value. ``eps2 = 0`` gives the
    plain inverse distance (as the tree's quadrupole terms use).
    """
    r2 = dx * dx + dy * dy + dz * dz + eps2
    return reciprocal_sqrt(r2, one) if r2 > zero else zero


@njit(**JIT_OPTIONS)
def short_range(r, inv_2rs, two_over_sqrt_pi):
    """The short-range parts of the force and of the potential at separation ``r``: factors
    ``(g, e)`` that multiply Newton's ``m d / r^3`` and ``-m / r`` for the Gaussian split of
    gravity with scale ``r_s`` (``inv_2rs = 1 / (2 r_s)``), as TreePM and Ewald sums use it:

    ``e = erfc(r / 2r_s)``, ``g = e + (r / (r_s sqrt(pi))) exp(-r^2 / 4r_s^2)``.

    The long-range rest of the potential, ``erf(r / 2r_s) / r``, has the Fourier transform
    ``4 pi exp(-k^2 r_s^2) / k^2``, which a mesh (or an Ewald sum's reciprocal part)
    supplies. All arguments in one dtype (``two_over_sqrt_pi = 2 / sqrt(pi)`` in it), so a
    float32 kernel stays float32.
    """
    u = r * inv_2rs
    e = math.erfc(u)
    return e + two_over_sqrt_pi * u * math.exp(-u * u), e


#: Abramowitz & Stegun 7.1.26: ``erfc(u) = t (a1 + t (a2 + ... + t a5)) exp(-u^2)``,
#: ``t = 1 / (1 + p u)``, absolute error below 1.5e-7 for every ``u >= 0``.
_ERFC_P = 0.3275911
_ERFC_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)

#: The largest difference of :func:`fast_short_range`'s factors from :func:`short_range`'s
#: (absolute; both factors are at most 1), by dtype (tests/test_periodic.py): the erfc
#: approximation's in float64, the 64th power's rounding in float32.
FAST_SPLIT_ERROR = {"float32": 5e-6, "float64": 3e-7}


#: Beyond ``r / 2 r_s`` = 6 the short-range factors are below 1e-15: :func:`fast_short_range`
#: returns zeros there (its polynomial holds for ``u^2 / 64 <= 0.6`` only).
_U_MAX = 6.0


def short_range_constants(split: float, dtype) -> np.ndarray:
    """What :func:`fast_short_range` reads, in ``dtype``: ``1 / (2 r_s)``, ``2 / sqrt(pi)``,
    the erfc approximation's ``p`` and ``a1..a5``, ``1 / 64`` and the largest ``r / 2 r_s``
    it evaluates (6), then ``1 / k!`` for ``k = 0..6`` (exp's Taylor coefficients)."""
    return np.array([0.5 / split, 2.0 / math.sqrt(math.pi), _ERFC_P, *_ERFC_A, 1.0 / 64,
                     _U_MAX, *(1.0 / math.factorial(k) for k in range(7))], dtype=dtype)


@njit(inline="always", **JIT_OPTIONS)
def fast_short_range(r, law, one):
    """:func:`short_range`'s factors ``(g, e)`` and ``exp(-r^2 / 4 r_s^2)``, with
    arithmetic a compiler vectorises (no call to ``erfc`` or ``exp``): ``exp(-y)`` as
    ``exp(-y / 64)**64`` (a Taylor polynomial of degree 6, then six squarings) and ``erfc``
    by Abramowitz & Stegun 7.1.26; within :data:`FAST_SPLIT_ERROR` of the exact factors at
    every ``r`` (zeros from ``r = 12 r_s`` on, where they are below 1e-15). ``law`` is
    :func:`short_range_constants` in the dtype of ``one``.
    """
    u = r * law[0]
    inside = u < law[9]
    u = u if inside else law[9]
    z = -(u * u) * law[8]  # -u^2 / 64, in [-0.57, 0]
    # exp(z) = sum z^k / k!, k = 0..6, by Horner's rule (one multiply-add a degree)
    q = law[16]
    for k in range(15, 9, -1):
        q = q * z + law[k]
    for _ in range(6):
        q = q * q
    q = q if inside else one - one
    t = one / (one + law[2] * u)
    e = t * (law[3] + t * (law[4] + t * (law[5] + t * (law[6] + t * law[7])))) * q
    return e + law[1] * u * q, e, q


#: The degree of :func:`long_range_polynomials`.
POLYNOMIAL_DEGREE = 13

#: The largest cutoff, in units of ``r_s``, within which :func:`long_range_polynomials`
#: hold to :data:`POLYNOMIAL_SPLIT_ERROR` (the short-range force there is 4.2e-4 of
#: Newton's; beyond it, :func:`fast_short_range`).
POLYNOMIAL_CUTOFF = 6.0

#: The largest error of :func:`polynomial_long_range`'s terms, relative to Newton's at the
#: same separation (``|error| r^3`` for the force's, ``|error| r`` for the potential's), at
#: cutoffs up to :data:`POLYNOMIAL_CUTOFF`, by dtype (tests/test_periodic.py): the
#: interpolation's in float64, Horner's rule's rounding in float32.
POLYNOMIAL_SPLIT_ERROR = {"float32": 1e-6, "float64": 1e-7}


def long_range_polynomials(split: float, cutoff: float, dtype) -> np.ndarray:
    """The long-range law, Newton's minus the short range (:func:`short_range`, ``r_s =
    split``), for ``0 <= r <= cutoff`` as polynomials of degree :data:`POLYNOMIAL_DEGREE` in
    ``x = 2 r^2 / cutoff^2 - 1``, in ``dtype``: ``2 / cutoff^2``, then the coefficients of
    the force's ``(1 - g) / r^3`` and of the potential's ``(1 - e) / r = erf(r / 2r_s) / r``
    from the constant term up. Both are smooth functions of ``r^2`` (series in ``r^2`` with
    no singularity at 0), so a pair needs no square root for them. They interpolate the
    exact terms at the Chebyshev points of the interval (in float64 by plain Python, the
    same on every worker, once per ``split`` and ``cutoff`` in a process), within
    :data:`POLYNOMIAL_SPLIT_ERROR` for ``cutoff <= POLYNOMIAL_CUTOFF * split``.
    :func:`polynomial_long_range` evaluates them."""
    return np.array(_polynomial_coefficients(float(split), float(cutoff)), dtype=dtype)


def _long_range_terms(r: float, split: float) -> tuple[float, float]:
    """``((1 - g) / r^3, erf(r / 2r_s) / r)`` in Python floats, by their series in ``r^2``
    near 0 (no cancellation) and in closed form beyond."""
    x = 0.5 * r / split
    c = 2.0 / math.sqrt(math.pi)
    if x < 0.5:
        # 1 - g = c sum_{n>=1} (-1)^(n+1) 2n x^(2n+1) / (n! (2n+1)), and r^3 = 8 r_s^3 x^3
        force = sum((-1) ** (n + 1) * 2 * n * x ** (2 * n - 2) / (math.factorial(n) * (2 * n + 1))
                    for n in range(1, 16))
        potential = sum((-1) ** n * x ** (2 * n) / (math.factorial(n) * (2 * n + 1))
                        for n in range(16))
        return c * force / (8.0 * split ** 3), c * potential / (2.0 * split)
    force = (math.erf(x) - c * x * math.exp(-x * x)) / r ** 3
    return force, math.erf(x) / r


@functools.lru_cache(maxsize=64)
def _polynomial_coefficients(split: float, cutoff: float) -> tuple[float, ...]:
    """:func:`long_range_polynomials` in float64, as a tuple."""
    from numpy.polynomial import chebyshev

    n = POLYNOMIAL_DEGREE + 1
    nodes = [math.cos(math.pi * (k + 0.5) / n) for k in range(n)]
    terms = [_long_range_terms(cutoff * math.sqrt((x + 1) / 2), split) for x in nodes]
    coefficients = []
    for factor in (0, 1):
        cheb = [2.0 / n * sum(t[factor] * math.cos(math.pi * j * (k + 0.5) / n)
                              for k, t in enumerate(terms)) for j in range(n)]
        cheb[0] /= 2
        coefficients.extend(float(c) for c in chebyshev.cheb2poly(cheb))
    return (2.0 / (cutoff * cutoff), *coefficients)


@njit(inline="always", **JIT_OPTIONS)
def polynomial_long_range(r2, poly, one):
    """The long-range law's terms at ``r^2`` from :func:`long_range_polynomials` ``poly``
    (in the dtype of ``one``): ``(lf, le)`` such that a pair's short-range force is
    ``m d (1 / s^3 - lf)`` and its potential ``-m (1 / s - le)``, ``s`` the softened
    distance; two polynomials by Horner's rule, a multiply-add a degree, no square root and
    no division. ``r^2`` beyond the cutoff's is taken as the cutoff's. The pair kernels'
    law (Newton's softened, less the mesh's part, which is not softened)."""
    x = r2 * poly[0] - one
    x = x if x < one else one
    lf = poly[POLYNOMIAL_DEGREE + 1]
    for k in range(POLYNOMIAL_DEGREE, 0, -1):
        lf = lf * x + poly[k]
    le = poly[2 * POLYNOMIAL_DEGREE + 2]
    for k in range(2 * POLYNOMIAL_DEGREE + 1, POLYNOMIAL_DEGREE + 1, -1):
        le = le * x + poly[k]
    return lf, le


def compile_for(jit: Callable, target_reciprocal_sqrt: Callable) -> Callable:
    """:func:`inverse_distance`'s own source compiled by another target's ``jit`` (a CUDA
    device-function decorator, say), calling ``target_reciprocal_sqrt(x, one)`` instead of
    the CPU's :func:`reciprocal_sqrt`."""
    source = inverse_distance.py_func
    scope = {**source.__globals__, "reciprocal_sqrt": target_reciprocal_sqrt}
    return jit(types.FunctionType(source.__code__, scope, source.__name__))

"""The Plummer softening closest to SWIFT's Wendland C2 softening of the same "Plummer-
equivalent" length: ``python benchmarks/peers/swift/softening_match.py``.

SWIFT's force of a softened source at ``r < H = 3 eps`` is Newton's times ``u^3 W(u)``,
``u = r / H``, ``W(u) = 21u^5 - 90u^4 + 140u^3 - 84u^2 + 14`` (``src/kernel_gravity.h``),
and exactly Newton's beyond ``H``; Plummer's is Newton's times ``r^3 / (r^2 + e^2)^(3/2)``.
Prints, for Plummer lengths ``e`` in units of ``eps``, the least-squares difference of the
two over ``0 < r < 5 eps`` weighted by ``r^2`` (the volume around a body), and the best
``e`` (the ``--plummer-factor`` of ``compare.py``).
"""

from __future__ import annotations

import numpy as np


def wendland_c2(r: np.ndarray, eps: float = 1.0) -> np.ndarray:
    """SWIFT's softened force over Newton's at ``r`` for a Plummer-equivalent ``eps``."""
    u = np.minimum(r / (3.0 * eps), 1.0)
    w = (((21 * u - 90) * u + 140) * u - 84) * u * u + 14
    return np.where(u < 1.0, u**3 * w, 1.0)


def plummer(r: np.ndarray, e: float) -> np.ndarray:
    """Plummer's softened force over Newton's at ``r`` for softening ``e``."""
    return r**3 / (r * r + e * e) ** 1.5


def main() -> None:
    r = np.linspace(1e-4, 5.0, 50_001)
    target = wendland_c2(r)
    factors = np.round(np.arange(0.40, 1.001, 0.01), 2)
    cost = [float(np.sum((plummer(r, e) - target) ** 2 * r * r)) for e in factors]
    least = min(cost)
    for e, c in zip(factors[::5], cost[::5], strict=True):
        print(f"Plummer e = {e:.2f} eps: weighted squared difference {c / least:.2f}x the least")
    print(f"closest: e = {factors[int(np.argmin(cost))]:.2f} eps")


if __name__ == "__main__":
    main()

"""The expanding background of a cosmological box: the cosmology, its code units, the leapfrog's
drift and kick factors, linear growth and the linear power spectrum (no Dask).

A cosmology is an :mod:`astropy.cosmology` FLRW object, the name of one of astropy's
realizations (``"Planck18"``, ``"WMAP9"``...) or a mapping of parameters
(``{"H0": 67.7, "Om0": 0.31}``: a flat Lambda-CDM unless ``Ode0`` is given). It travels
with a run as canonical JSON (:func:`to_json`), so a resumed run rebuilds the same one.

Code units of a cosmological box (:func:`unit_system`): lengths in Mpc/h, time in 1/H0,
G = 1; velocities then come in 100 km/s and masses in ``(Mpc/h)^3 H0^2 / G`` (about
2.3e12 M_sun/h). The comoving mean matter density is ``3 Om0 / 8 pi``.

Comoving integration (Quinn et al. 1997, as in GADGET and SWIFT): positions ``x`` are
comoving, the state carries the canonical momentum ``p = a^2 dx/dt`` per unit mass, and the
Hamiltonian ``p^2 / 2a^2 + phi(x) / a`` (``phi`` the periodic potential of the comoving
density contrast) gives the kick-drift-kick leapfrog::

    p += g(x) K(a_k, a_k+1/2);   x += p D(a_k, a_k+1);   p += g(x) K(a_k+1/2, a_k+1)

with ``K = int dt / a`` and ``D = int dt / a^2`` (:meth:`Background.kick`,
:meth:`Background.drift`), by 16-point Gauss-Legendre quadrature in ln a over each step
(exact to round-off for steps of a few percent in a). Peculiar velocities are ``p / a``.

Linear growth (:meth:`Background.growth`): the growing modes ``D1`` (normalised to 1 today)
and ``D2`` of first- and second-order Lagrangian perturbation theory and their logarithmic
rates ``f = d ln D / d ln a``, from the growth equations in ln a with this cosmology's
expansion (radiation and neutrinos included in ``E(a)``, matter clustering alone), started
deep in the radiation era on the growing mode. The linear power spectrum today comes from
colossus (Eisenstein & Hu 1998) with the cosmology's ``sigma8`` and ``n_s`` (the
realizations carry them), or from a callable.

Needs the optional astropy (and colossus for the power spectrum):
``pip install "nbody-dask[cosmology]"``.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from .units import UnitSystem

__all__ = ["as_cosmology", "to_json", "from_json", "Background", "Growth", "unit_system",
           "mass_unit_msun_h", "mean_density", "linear_power", "SPECTRA",
           "colossus_cosmology", "PowerSpectrum"]

#: Quadrature nodes per step of the drift and kick factors.
_NODES = 16
#: Where the growth equations start (radiation era, growing mode known).
_A_EARLY = 1e-6


def _astropy_cosmology():
    try:
        import astropy.cosmology as cosmology
    except ImportError:
        raise ImportError("cosmological runs need astropy: pip install "
                          "'nbody-dask[cosmology]'") from None
    return cosmology


def as_cosmology(spec: Any) -> Any:
    """An astropy FLRW cosmology from ``spec``: such an object, the name of one of
    astropy's realizations, a mapping of parameters, or the JSON of :func:`to_json`.

    Raises
    ------
    ValueError, TypeError
        Naming the parameter ``cosmology`` and the value.
    """
    cosmology = _astropy_cosmology()
    if isinstance(spec, cosmology.FLRW):
        return spec
    if isinstance(spec, str):
        if spec.lstrip().startswith("{"):
            return from_json(spec)
        if spec not in cosmology.realizations.available:
            raise ValueError(f"cosmology must be an astropy FLRW cosmology, a mapping of "
                             f"parameters or one of {list(cosmology.realizations.available)}, "
                             f"got {spec!r}")
        return getattr(cosmology.realizations, spec)
    if isinstance(spec, Mapping):
        params = dict(spec)
        if "H0" not in params or "Om0" not in params:
            raise ValueError(f"cosmology needs at least H0 and Om0, got {spec!r}")
        kind = cosmology.LambdaCDM if "Ode0" in params else cosmology.FlatLambdaCDM
        try:
            return kind(**params)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"cosmology {spec!r} is not valid: {exc}") from None
    raise TypeError(f"cosmology must be an astropy FLRW cosmology, a name such as "
                    f"'Planck18' or a mapping of parameters, got {spec!r}")


def _plain(value: Any) -> Any:
    """A JSON-able copy of a parameter (quantities as their values in astropy's units)."""
    if hasattr(value, "unit"):
        value = value.value
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items() if _is_plain(_plain(v))}
    return value


def _is_plain(value: Any) -> bool:
    try:
        json.dumps(value)
    except TypeError:
        return False
    return True


def to_json(cosmology: Any) -> str:
    """The cosmology as canonical JSON: its class, name, parameters, and the ``n`` and
    ``sigma8`` of its metadata (what :func:`from_json` needs to rebuild it)."""
    mapping = cosmology.to_format("mapping")
    cls = mapping.pop("cosmology")
    meta = mapping.pop("meta", {}) or {}
    data = {"class": cls.__name__, **{k: _plain(v) for k, v in mapping.items()},
            "meta": {k: _plain(meta[k]) for k in ("n", "sigma8") if k in meta}}
    return json.dumps(data, sort_keys=True)


def from_json(text: str) -> Any:
    """The cosmology of :func:`to_json`."""
    cosmology = _astropy_cosmology()
    data = json.loads(text)
    kind = getattr(cosmology, data.pop("class"))
    return kind(**data)


def unit_system(cosmology: Any) -> UnitSystem:
    """Code units of a cosmological box: length 1 Mpc/h, time 1/H0, G = 1."""
    import astropy.constants as const
    import astropy.units as u

    length = (1 / cosmology.h) * u.Mpc
    mass = (length**3 * cosmology.H0**2 / const.G).to(u.Msun)
    return UnitSystem(length, mass)


def mass_unit_msun_h(cosmology: Any) -> float:
    """A code unit of mass (:func:`unit_system`) in M_sun/h (about 2.325e12, whatever h)."""
    return float(unit_system(cosmology).mass.to_value("Msun")) * float(cosmology.h)


def mean_density(cosmology: Any) -> float:
    """The comoving mean matter density in code units (:func:`unit_system`)."""
    return 3 * float(cosmology.Om0) / (8 * math.pi)


@dataclass(frozen=True)
class Growth:
    """Linear growth at some scale factors: ``d1, f1`` (first order, ``d1 = 1`` today) and
    ``d2, f2`` (second order, ``d2 ~ -3/7 d1^2``), ``f = d ln D / d ln a``."""

    d1: np.ndarray
    f1: np.ndarray
    d2: np.ndarray
    f2: np.ndarray


class Background:
    """The expansion of a cosmology in code units (H0 = 1): ``E(a)``, the leapfrog's drift
    and kick factors, linear growth."""

    def __init__(self, cosmology: Any) -> None:
        self.cosmology = as_cosmology(cosmology)

    def efunc(self, a: np.ndarray) -> np.ndarray:
        """``H(a) / H0``."""
        a = np.asarray(a, dtype=np.float64)
        return np.asarray(self.cosmology.efunc(1 / a - 1), dtype=np.float64)

    def _integral(self, a0: np.ndarray, a1: np.ndarray, power: int) -> np.ndarray:
        """``int da / (a^power E(a))`` from ``a0`` to ``a1`` (elementwise), by Gauss-Legendre
        in ln a."""
        a0, a1 = np.atleast_1d(np.asarray(a0, float)), np.atleast_1d(np.asarray(a1, float))
        nodes, weights = np.polynomial.legendre.leggauss(_NODES)
        lo, hi = np.log(a0)[:, None], np.log(a1)[:, None]
        ln_a = 0.5 * (hi + lo) + 0.5 * (hi - lo) * nodes
        a = np.exp(ln_a)
        integrand = a ** (1 - power) / self.efunc(a)
        return 0.5 * (hi - lo)[:, 0] * (integrand * weights).sum(axis=1)

    def kick(self, a0: Any, a1: Any) -> np.ndarray:
        """The kick factor ``int_a0^a1 dt / a`` (code time units)."""
        return self._integral(a0, a1, 2)

    def drift(self, a0: Any, a1: Any) -> np.ndarray:
        """The drift factor ``int_a0^a1 dt / a^2``."""
        return self._integral(a0, a1, 3)

    def step_factors(self, scale_factors: np.ndarray) -> np.ndarray:
        """The leapfrog's factors of the steps between consecutive ``scale_factors``: rows
        (opening kick to the step's middle in ln a, drift, closing kick), one column a step."""
        a = np.asarray(scale_factors, dtype=np.float64)
        mid = np.sqrt(a[:-1] * a[1:])
        return np.stack([self.kick(a[:-1], mid), self.drift(a[:-1], a[1:]),
                         self.kick(mid, a[1:])])

    @cached_property
    def _growth_solution(self) -> Any:
        from scipy.integrate import solve_ivp

        c = self.cosmology
        radiation = float(c.Ogamma0 + c.Onu0)
        a_eq = radiation / float(c.Om0)

        def omega_m(a):
            return float(c.Om0) / (a**3 * self.efunc(a) ** 2)

        def dlnE(a):  # d ln E / d ln a, by a central difference
            step = 1e-5
            return (np.log(self.efunc(a * math.exp(step)))
                    - np.log(self.efunc(a * math.exp(-step)))) / (2 * step)

        def rhs(ln_a, y):
            a = math.exp(ln_a)
            d1, g1, d2, g2 = y
            drag, source = 2 + dlnE(a), 1.5 * omega_m(a)
            return [g1, source * d1 - drag * g1, g2, source * (d2 - d1 * d1) - drag * g2]

        a0 = _A_EARLY
        d1 = a0 + 2 / 3 * a_eq  # the growing (Meszaros) mode: D ~ 1 + 3 a / 2 a_eq
        y0 = [d1, a0, -3 / 7 * d1 * d1, -6 / 7 * d1 * a0]
        return solve_ivp(rhs, (math.log(a0), 0.0), y0, method="DOP853", rtol=1e-10,
                         atol=1e-30, dense_output=True)

    def growth(self, a: Any) -> Growth:
        """Linear growth at scale factors ``a`` (<= 1): :class:`Growth`."""
        a = np.atleast_1d(np.asarray(a, dtype=np.float64))
        if (a <= _A_EARLY).any() or (a > 1).any():
            raise ValueError(f"growth is computed for scale factors in ({_A_EARLY}, 1], got "
                             f"{a.tolist()}")
        solution = self._growth_solution
        today = solution.sol(0.0)
        d1, g1, d2, g2 = solution.sol(np.log(a))
        norm = today[0]
        return Growth(d1=d1 / norm, f1=g1 / d1, d2=d2 / norm**2, f2=g2 / d2)


PowerSpectrum = Callable[[np.ndarray], np.ndarray]


def _sigma8_and_slope(cosmology: Any, sigma8: float | None, n_s: float | None
                      ) -> tuple[float, float]:
    """``sigma8`` and ``n_s`` as given, or from the cosmology's metadata."""
    meta = cosmology.meta or {}
    sigma8 = meta.get("sigma8") if sigma8 is None else sigma8
    n_s = meta.get("n") if n_s is None else n_s
    for name, value in (("sigma8", sigma8), ("n_s", n_s)):
        if value is None:
            raise ValueError(f"{name} is needed for the linear power spectrum of "
                             f"{cosmology.name or cosmology!r} (its metadata has none): give "
                             f"{name}=..., or power=callable")
    return float(sigma8), float(n_s)


def colossus_cosmology(cosmology: Any, *, sigma8: float | None = None,
                       n_s: float | None = None) -> Any:
    """The cosmology as colossus's (set as colossus's current one, which its mass functions
    use), with ``sigma8`` and ``n_s`` (default: the cosmology's metadata); without ``Ob0``
    (None or 0), a baryon fraction of 0.049 shapes the spectrum."""
    cosmology = as_cosmology(cosmology)
    sigma8, n_s = _sigma8_and_slope(cosmology, sigma8, n_s)
    try:
        from colossus.cosmology import cosmology as colossus
    except ImportError:
        raise ImportError("the linear power spectrum needs colossus: pip install "
                          "'nbody-dask[cosmology]' (or give power=callable)") from None
    # colossus's Eisenstein & Hu transfer function needs the CMB's temperature: a cosmology
    # without radiation (Tcmb0 = 0, as GADGET and SWIFT integrate) takes today's for it
    # (its expansion is astropy's all the same); massive neutrinos are not in the spectrum
    tcmb = float(cosmology.Tcmb0.value)
    params = dict(flat=bool(cosmology.Ok0 == 0), H0=float(cosmology.H0.value),
                  Om0=float(cosmology.Om0), Ode0=float(cosmology.Ode0),
                  Ob0=float(cosmology.Ob0 or 0.049),
                  Tcmb0=tcmb if tcmb > 0 else 2.7255, Neff=float(cosmology.Neff),
                  relspecies=tcmb > 0, sigma8=float(sigma8), ns=float(n_s), persistence="")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return colossus.setCosmology("nbody-dask", params=params)


#: The linear spectra :func:`linear_power` computes by name.
SPECTRA = ("eisenstein-hu", "camb")


def linear_power(cosmology: Any, power: PowerSpectrum | str | None = None, *,
                 sigma8: float | None = None, n_s: float | None = None) -> PowerSpectrum:
    """The linear matter power spectrum today, ``P(k)`` in (Mpc/h)^3 for ``k`` in h/Mpc.

    ``power``: a callable, returned as it is; ``"eisenstein-hu"`` (the default: colossus's
    fit, fast, no baryon wiggles' details beyond the fit's); or ``"camb"`` (the Boltzmann
    code CAMB, the ``camb`` extra: the spectrum of cold dark matter and baryons, which the
    bodies are, with the cosmology's massive neutrinos in the expansion and the transfer).
    Either is normalised to ``sigma8`` with slope ``n_s`` (default: the cosmology's
    metadata, as astropy's realizations carry them).
    """
    if power is not None and not isinstance(power, str):
        if not callable(power):
            raise TypeError(f"power must be a callable P(k) or one of {SPECTRA}, got "
                            f"{power!r}")
        return power
    if power is not None and power not in SPECTRA:
        raise ValueError(f"power must be a callable P(k) or one of {SPECTRA}, got {power!r}")
    cosmology = as_cosmology(cosmology)
    if power == "camb":
        return _camb_spectrum(cosmology, sigma8, n_s)
    model = colossus_cosmology(cosmology, sigma8=sigma8, n_s=n_s)

    def spectrum(k: np.ndarray) -> np.ndarray:
        k = np.asarray(k, dtype=np.float64)
        out = np.zeros_like(k)
        positive = k > 0
        if positive.any():
            out[positive] = model.matterPowerSpectrum(k[positive], 0.0)
        return out

    return spectrum


def _camb_spectrum(cosmology: Any, sigma8: float | None, n_s: float | None
                   ) -> PowerSpectrum:
    """CAMB's linear spectrum of cold dark matter and baryons today, scaled to ``sigma8``
    (interpolated in log-log from 1e-4 to 50 h/Mpc, power laws beyond)."""
    sigma8, n_s = _sigma8_and_slope(cosmology, sigma8, n_s)
    try:
        import camb
    except ImportError:
        raise ImportError("power='camb' needs CAMB: pip install 'nbody-dask[camb]'") from None
    h = float(cosmology.h)
    omega_b = float(cosmology.Ob0 or 0.049)  # no baryons given: the spectrum takes 4.9%
    m_nu = cosmology.m_nu  # None without neutrinos, else a quantity (one mass or three)
    masses = np.zeros(1) if m_nu is None else np.atleast_1d(getattr(m_nu, "value", m_nu))
    tcmb = float(cosmology.Tcmb0.value) or 2.7255  # the transfer needs the CMB's temperature
    params = camb.CAMBparams()
    params.set_cosmology(H0=100 * h, ombh2=omega_b * h * h,
                         omch2=(float(cosmology.Om0) - omega_b) * h * h,
                         mnu=float(np.sum(masses)), omk=float(cosmology.Ok0), TCMB=tcmb)
    params.InitPower.set_params(ns=float(n_s), As=2e-9)
    params.set_matter_power(redshifts=[0.0], kmax=60.0)
    results = camb.get_results(params)
    kh, _, pk = results.get_matter_power_spectrum(minkh=1e-4, maxkh=50.0, npoints=600,
                                                  var1="delta_nonu", var2="delta_nonu")
    ln_k, ln_p = np.log(kh), np.log(pk[0])
    # normalise to sigma8 by the top-hat variance of this very table
    x = np.exp(ln_k) * 8.0
    window = 3 * (np.sin(x) - x * np.cos(x)) / x**3
    variance = np.trapezoid(np.exp(3 * ln_k) * pk[0] * window**2 / (2 * np.pi**2), ln_k)
    ln_p = ln_p + 2 * math.log(sigma8 / math.sqrt(variance))
    slopes = (ln_p[1] - ln_p[0]) / (ln_k[1] - ln_k[0]), \
        (ln_p[-1] - ln_p[-2]) / (ln_k[-1] - ln_k[-2])

    def spectrum(k: np.ndarray) -> np.ndarray:
        k = np.asarray(k, dtype=np.float64)
        out = np.zeros_like(k)
        positive = k > 0
        lk = np.log(k[positive])
        value = np.interp(lk, ln_k, ln_p)
        value = np.where(lk < ln_k[0], ln_p[0] + slopes[0] * (lk - ln_k[0]), value)
        value = np.where(lk > ln_k[-1], ln_p[-1] + slopes[1] * (lk - ln_k[-1]), value)
        out[positive] = np.exp(value)
        return out

    return spectrum

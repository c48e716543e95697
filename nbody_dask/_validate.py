"""Checks of arguments at the public boundary; each error names the parameter or path."""

from __future__ import annotations

import math
import numbers
from pathlib import Path
from typing import Any

__all__ = ["check_int", "check_real", "check_new_file", "check_memory"]


def check_new_file(path: Path, overwrite: bool) -> None:
    """Refuse to write the file ``path`` over a directory, or over a file unless
    ``overwrite`` (ValueError, FileExistsError)."""
    if path.is_dir():
        raise ValueError(f"{str(path)!r} is a directory")
    if path.exists() and not overwrite:
        raise FileExistsError(f"{str(path)!r} exists; pass overwrite=True (--overwrite) to "
                              "replace it")


def check_memory(name: str, value: Any, nbytes: float, what: str) -> None:
    """Refuse, before allocating, work that needs more memory than this machine has
    available: a MemoryError in one line naming ``name``, its ``value``, the estimated bytes
    and what they are for."""
    import psutil

    available = psutil.virtual_memory().available
    if nbytes > available:
        raise MemoryError(f"{name}={value!r} needs about {_size(nbytes)} of memory for {what}, "
                          f"more than the {_size(available)} available here")


def _size(nbytes: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if nbytes < 1024 or unit == "PiB":
            return f"{nbytes:.3g} {unit}"
        nbytes /= 1024
    return f"{nbytes:.3g} PiB"  # pragma: no cover


def check_int(name: str, value: Any, minimum: int) -> int:
    """``value`` as an int >= ``minimum``, or TypeError/ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return int(value)


def check_real(name: str, value: Any, *, positive: bool = False,
               nonnegative: bool = False) -> float:
    """``value`` as a finite float (optionally > 0 or >= 0), or an error naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r} ({type(value).__name__})")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if positive and not value > 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    if nonnegative and not value >= 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return value

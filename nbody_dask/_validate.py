"""Checks of arguments at the public boundary; each error names the parameter or path."""

from __future__ import annotations

import math
import numbers
from pathlib import Path
from typing import Any

__all__ = ["check_int", "check_real", "check_new_file"]


def check_new_file(path: Path, overwrite: bool) -> None:
    """Refuse to write the file ``path`` over a directory, or over a file unless
    ``overwrite`` (ValueError, FileExistsError)."""
    if path.is_dir():
        raise ValueError(f"{str(path)!r} is a directory")
    if path.exists() and not overwrite:
        raise FileExistsError(f"{str(path)!r} exists; pass overwrite=True (--overwrite) to "
                              "replace it")


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

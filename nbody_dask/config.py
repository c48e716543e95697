"""Defaults under the ``nbody`` namespace of :mod:`dask.config`, loaded from ``nbody.yaml``.

Every tunable keyword of the public API defaults to ``None`` and is looked up here at call
time, so ``dask.config.set``, YAML files and ``DASK_NBODY__...`` environment variables all work.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import dask.config
import yaml

__all__ = ["get", "validate", "DEFAULTS_FILE", "SCHEMA_FILE"]

DEFAULTS_FILE = Path(__file__).with_name("nbody.yaml")
#: The JSON Schema of the namespace: every key, its type and its range.
SCHEMA_FILE = Path(__file__).with_name("nbody-schema.yaml")

with DEFAULTS_FILE.open() as _f:
    _defaults = yaml.safe_load(_f)
dask.config.update_defaults(_defaults)


def get(key: str, value: Any = None) -> Any:
    """``value`` if it is not None, else the configured ``nbody.<key>``."""
    return dask.config.get(f"nbody.{key}") if value is None else value


def _hyphenated(settings: Any) -> Any:
    """``settings`` with ``_`` in keys read as ``-``, as dask.config reads them (an
    environment variable ``DASK_NBODY__LOCAL_CLUSTER__...`` sets ``local_cluster``)."""
    if not isinstance(settings, dict):
        return settings
    return {str(k).replace("_", "-"): _hyphenated(v) for k, v in settings.items()}


@functools.cache
def _schema() -> dict[str, Any]:
    with SCHEMA_FILE.open() as f:
        return yaml.safe_load(f)


def validate() -> None:
    """Check the ``nbody`` settings in force (defaults, YAML files, ``dask.config.set``,
    ``DASK_NBODY__...`` variables) against :data:`SCHEMA_FILE`.

    Raises
    ------
    ValueError
        In one line naming the first bad key and its value (a heartbeat of 0 s, -1
        restarts, 0 workers, an unknown key...).
    """
    import jsonschema

    validator = jsonschema.Draft202012Validator(_schema())
    error = jsonschema.exceptions.best_match(
        validator.iter_errors({"nbody": _hyphenated(dask.config.get("nbody"))}))
    if error is not None:
        where = ".".join(str(part) for part in error.absolute_path) or "nbody"
        raise ValueError(f"configuration {where}: {error.message}")

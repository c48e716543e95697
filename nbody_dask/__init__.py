"""nbody_dask: direct-summation gravitational N-body simulation on Dask.

Bodies are split into tiles; one step is a blocked interaction task graph of Numba tile-pair
kernels and a fixed-order tree reduction, advanced with leapfrog (kick-drift-kick). It runs
on any dask-distributed cluster and writes trajectories as Zarr v3, opened with xarray.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("nbody-dask")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0+unknown"

from . import config  # noqa: E402, F401  (loads the nbody defaults into dask.config)
from .bodies import as_bodies, make_bodies  # noqa: E402
from . import initial_conditions  # noqa: E402
from .initial_conditions import (  # noqa: E402
    cold_collapse,
    exponential_disk,
    kepler,
    merger,
    plummer,
    uniform_cube,
)
from .integrators import NonFiniteStateError  # noqa: E402
from .lease import LeaseLostError, StoreInUseError  # noqa: E402
from .location import StoreUnreachableError  # noqa: E402
from .simulation import (  # noqa: E402
    EnergyErrorExceeded,
    SimulationInterrupted,
    accelerations,
    potential_energy,
    simulate,
)
from .storage import DamagedStoreError, open_trajectory, verify_trajectory  # noqa: E402
from .accuracy import force_accuracy  # noqa: E402

__all__ = [
    "__version__",
    "simulate",
    "SimulationInterrupted",
    "NonFiniteStateError",
    "EnergyErrorExceeded",
    "StoreInUseError",
    "LeaseLostError",
    "StoreUnreachableError",
    "accelerations",
    "potential_energy",
    "force_accuracy",
    "open_trajectory",
    "verify_trajectory",
    "DamagedStoreError",
    "make_bodies",
    "as_bodies",
    "plummer",
    "uniform_cube",
    "kepler",
    "cold_collapse",
    "merger",
    "exponential_disk",
    "initial_conditions",
]

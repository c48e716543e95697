"""nbody_dask: gravitational N-body simulation on Dask: direct summation, a tree, TreePM.

Bodies are split into tiles; one step is a blocked interaction task graph: a Numba kernel per
tile pair (exact direct summation) or a group walk per pair of spatial tiles' octrees (the
tree, far tiles from summaries; in a periodic box, Ewald sums or TreePM: a particle mesh and
a periodic walk between neighbouring tiles), and a fixed-order reduction of the partial forces per
target tile, so results are bit-identical on any cluster. Leapfrog (kick-drift-kick)
advances the state on the workers. It runs on any dask-distributed cluster (in-process by
default, Slurm, Kubernetes, GPU workers), writes trajectories as Zarr v3 (local or object
storage) from the workers, and opens them with xarray. Force methods are modules behind one
interface (:mod:`nbody_dask.methods`).
"""

from __future__ import annotations

from ._version import __version__
from . import config  # noqa: E402, F401  (loads the nbody defaults into dask.config)
from .bodies import as_bodies, make_bodies  # noqa: E402
from . import initial_conditions  # noqa: E402
from .initial_conditions import (  # noqa: E402
    cold_collapse,
    exponential_disk,
    hernquist,
    kepler,
    merger,
    plummer,
    plummer_clumps,
    uniform_cube,
)
from .integrators import NonFiniteStateError  # noqa: E402
from .lease import LeaseLostError, StoreInUseError  # noqa: E402
from .location import StoreUnreachableError  # noqa: E402
from .simulation import simulate  # noqa: E402
from .driver import SimulationInterrupted  # noqa: E402
from .session import EnergyErrorExceeded  # noqa: E402
from .evaluate import accelerations, force_accuracy, potential_energy  # noqa: E402
from .storage import DamagedStoreError, open_trajectory, verify_trajectory  # noqa: E402
from . import cosmology  # noqa: E402
from .lpt import cosmological_ics  # noqa: E402
from .power import power_spectrum  # noqa: E402
from .halos import friends_of_friends  # noqa: E402

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
    "hernquist",
    "uniform_cube",
    "kepler",
    "cold_collapse",
    "merger",
    "exponential_disk",
    "plummer_clumps",
    "initial_conditions",
    "cosmology",
    "cosmological_ics",
    "power_spectrum",
    "friends_of_friends",
]

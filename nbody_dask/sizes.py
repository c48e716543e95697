"""What the workers' results weigh, as Dask sees it.

Dask measures every task's result with :func:`dask.sizeof.sizeof` to account for a worker's
memory (when to spill to disk or pause, the dashboard's bars) and to weigh what a transfer
costs (where to run a task, whether to steal it). An object it does not know weighs a few
dozen bytes, so without this module a tile of a million bodies or its tree looked free to
move and a worker holding gigabytes of them looked empty. Importing the module registers,
for the records the tasks return (:class:`~nbody_dask.bodies.Tile`, the trees, the mesh's
regions and fields, the far field's summaries), the bytes of the arrays they hold.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from dask.sizeof import sizeof

from .bodies import Tile
from .kernels.farfield import Forest, Summary
from .kernels.octree import TileTree
from .kernels.pm import LongRange, Region

__all__ = ["RECORDS", "record_nbytes"]

#: The frozen dataclasses of arrays that tasks return, each weighed by :func:`record_nbytes`.
RECORDS = (Tile, TileTree, Summary, Forest, Region, LongRange)


def record_nbytes(record: Any) -> int:
    """The bytes of a dataclass record: its own and each field's, as :func:`dask.sizeof.
    sizeof` weighs them (arrays by their ``nbytes``, nested records by this function)."""
    return sys.getsizeof(record) + sum(sizeof(getattr(record, field.name))
                                       for field in dataclasses.fields(record))


for _record in RECORDS:
    sizeof.register(_record)(record_nbytes)

"""The work of a run as plain data: tiles, the tasks of a step, reduction groups, submissions.

Pure arithmetic on integers, no Dask and no arrays: :mod:`nbody_dask.graph` turns a
:class:`Plan` into task graphs, and :mod:`nbody_dask.simulation` drives them. Everything that
decides a run's floating-point result is here (tile bounds, which kernel computes which tile
pair, in which order and groups partial forces are summed), so a run is reproducible from its
plan alone, whatever the cluster.

Two layouts share the arithmetic:

``"pairs"``
    One task per tile pair (per unordered pair with the symmetric kernel) and a tree of
    combine tasks per target tile: many small tasks, for clusters of many one-core threads.
``"rows"``
    One task per target tile that computes its whole row of tile pairs with the parallel CPU
    kernel (all cores of a node) and sums the partials with the same groups in the same
    order: bit-identical to ``"pairs"`` without the symmetric kernel, with ``2 T + sqrt(T)``
    tasks a step instead of ``T**2``. For one worker process per node (the HPC layout).
    With the tree method, one spatial tile per worker and one task per target tile that
    walks its near tiles and its far tiles' summaries: about ``4 T`` tasks a step.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any

__all__ = ["LAYOUTS", "METHODS", "check_layout", "check_method", "resolve_method",
           "TREE_CROSSOVER", "TREE_ONE_TILE_MAX", "NEAR_FAR_MIN_TILES", "Plan", "Part",
           "tile_bounds", "auto_tile_size", "reduction_groups", "submission_ends"]

LAYOUTS = ("pairs", "rows")
METHODS = ("auto", "direct", "tree")

#: ``method="auto"`` runs direct summation below this many bodies and the tree from it on.
#: Measured with ``nbody-dask bench --method direct|tree`` (simulate() steps on the default
#: local cluster of 2 cores): at 4,096 bodies direct summation's step was faster in float32
#: (one fused task), at 8,192 the tree's (default accuracy) was 2-3x faster in both dtypes.
TREE_CROSSOVER = 8_192
#: The tree on a one-worker cluster keeps up to this many bodies in one tile (see
#: :func:`auto_tile_size`). Memory measured at half this size (4,194,304 float32 bodies, one
#: in-process worker): 1.4 GiB peak for the whole process, input bodies included
#: (``benchmarks/memory.py --n 4194304 --workers 1 --method tree``).
TREE_ONE_TILE_MAX = 8_388_608

Part = tuple[tuple[int, int], int | None]
"""A partial force on a target tile: ``((i, j), side)``, the tile-pair task ``(i, j)`` and,
for a symmetric task, which of its two results (0: on tile ``i``, 1: on tile ``j``); None for
a task whose one result is the force on its target."""


#: Default fewest spatial tiles (``nbody.near-far-tiles``) for which the tree method classifies
#: tile pairs near or far and evaluates the far ones in one task per tile; with fewer, every
#: pair is walked. Measured on a Plummer sphere of 1,048,576 bodies at theta = 0.4: 95% of
#: the pairs of 16 tiles are near, 55% of 64, 22% of 256 and 8% of 1,024
#: (benchmarks/far_field.py).
NEAR_FAR_MIN_TILES = 32


def check_layout(layout: object) -> str:
    """``layout`` if it names a layout (:data:`LAYOUTS`), else a ValueError naming it."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return str(layout)


def check_method(method: object) -> str:
    """``method`` if it names a force method (:data:`METHODS`), else a ValueError naming it."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    return str(method)


def resolve_method(method: str, n: int) -> str:
    """``"direct"`` or ``"tree"``: ``"auto"`` decides by :data:`TREE_CROSSOVER`."""
    if method != "auto":
        return method
    return "tree" if n >= TREE_CROSSOVER else "direct"


def tile_bounds(n: int, tile_size: int) -> list[tuple[int, int]]:
    """Half-open ``(start, stop)`` ranges covering ``0..n``; the last holds the remainder."""
    return [(lo, min(lo + tile_size, n)) for lo in range(0, n, tile_size)]


def auto_tile_size(n: int, threads: int, backend: str = "cpu", layout: str = "pairs",
                   workers: int = 1, method: str = "direct") -> int:
    """Default tile size for ``n`` bodies on a cluster with ``threads`` worker threads.

    With ``layout="rows"`` there is one tile per worker (``workers``): each worker's row task
    then uses all its cores, and a step is about ``2 * workers`` tasks.

    On GPUs (``backend="cuda"``) tiles are large (>= 65,536 bodies, at most 4 per step's
    row) so that each kernel launch runs long against its transfers.

    On CPUs, up to 4,096 bodies the whole system is one tile: a step then costs ~10 ms of
    kernel, about one Dask round trip, and runs as a fused task of many steps. Beyond that the
    number of tiles ``T`` is the smallest that

    * gives at least two tile pairs per thread (``T**2 >= 2 * threads``) and tiles of at most
      16,384 bodies, up to 16 tiles: larger tiles cost the kernel nothing (it is flat in the
      source count up to 128k) and fewer tasks cost Dask less;
    * lets the threads share a step's work evenly, since a step ends at a barrier (each kick
      waits for its whole row of tile pairs): spread over the threads in whole tile pairs,
      ``T**2 / (threads * ceil(T**2 / threads))`` must be at least 0.9. (12 tiles would keep
      64 threads busy 75% of the time, 16 tiles all of it.);

    and never tiles under 2,048 bodies. Override with ``tile_size`` or ``nbody.tile-size``.

    Parameters
    ----------
    n : int
        Number of bodies.
    threads : int
        Worker threads of the cluster.
    backend : {"cpu", "cuda"}
        Kernel backend.
    layout : {"pairs", "rows"}
        Task layout (see the module docstring).
    workers : int
        Worker processes of the cluster (used by ``layout="rows"`` and the tree).
    method : {"direct", "tree"}
        Force method; the tree's tiles are spatial, see :func:`_tree_tile_size`.

    Returns
    -------
    int
        Bodies per tile (the last tile holds the remainder).
    """
    if method == "tree":
        return _tree_tile_size(n, threads, workers, layout)
    if layout == "rows":
        return max(1, math.ceil(n / max(1, int(workers))))
    if backend == "cuda":
        return max(1, min(n, max(65_536, math.ceil(n / 4))))
    if n <= 4096:
        return max(n, 1)
    threads = max(1, int(threads))
    most = max(1, n // 2_048)
    tiles = min(max(math.ceil(math.sqrt(2 * threads)), min(math.ceil(n / 16_384), 16)), most)
    while tiles < most and _balance(tiles, threads) < 0.9:
        tiles += 1
    return max(1, math.ceil(n / tiles))


def _tree_tile_size(n: int, threads: int, workers: int = 1, layout: str = "pairs") -> int:
    """Tile size of the tree method.

    On one worker, up to :data:`TREE_ONE_TILE_MAX` bodies are one tile: one fused task whose
    walk runs on all the worker's threads, with no re-tiling and no routing back to body
    order (measured on 2 threads: 1.2-1.7x faster than 3 or 4 spatial tiles from 262,144 to
    4,194,304 bodies, and as accurate as one global tree). On several workers, and beyond
    that size: with ``layout="rows"`` a tile per worker (each worker's row task walks on
    all its cores), at most :data:`TREE_ONE_TILE_MAX` bodies a tile; with ``"pairs"``,
    ``T`` spatial tiles with ``T**2 >= 4 * threads`` tile-pair tasks, so that the threads
    share a step's uneven pair tasks (a tile with itself costs most, a far pair little),
    and at most 1,048,576 bodies a tile (the memory of one task). Never tiles under 4,096
    bodies.
    """
    workers = max(1, int(workers))
    if n <= 16_384 or (workers == 1 and n <= TREE_ONE_TILE_MAX):
        return max(n, 1)
    if layout == "rows":
        tiles = max(workers, math.ceil(n / TREE_ONE_TILE_MAX))
    else:
        tiles = max(math.ceil(math.sqrt(4 * max(1, int(threads)))), math.ceil(n / 1_048_576))
    return max(1, math.ceil(n / min(tiles, n // 4_096)))


def _balance(tiles: int, threads: int) -> float:
    """Busy share of ``threads`` given a step's ``tiles**2`` tile pairs in whole units."""
    pairs = tiles * tiles
    return pairs / (threads * math.ceil(pairs / threads))


def reduction_groups(count: int, split_every: int) -> list[list[tuple[int, int]]]:
    """The fixed tree that sums ``count`` partials: per level, half-open index ranges.

    Level 0 groups the partials in source order by ``split_every``; each further level groups
    the sums of the one before, until at most ``split_every`` remain (the consumer adds those).
    Every range has at most ``split_every`` members, and the groups depend only on ``count``
    and ``split_every``.
    """
    levels = []
    while count > split_every:
        levels.append([(g, min(g + split_every, count)) for g in range(0, count, split_every)])
        count = len(levels[-1])
    return levels


def submission_ends(snapshot_steps: list[int], max_steps: int) -> Iterator[int]:
    """Last step of each submission: every snapshot step, and at most ``max_steps`` apart."""
    prev = snapshot_steps[0]
    for snap in snapshot_steps[1:]:
        n = math.ceil((snap - prev) / max_steps)
        for k in range(1, n + 1):
            yield prev + math.ceil(k * (snap - prev) / n)
        prev = snap


@dataclass(frozen=True)
class Plan:
    """A run's validated parameters and the arithmetic they fix.

    Stored in the trajectory (:meth:`stored`), so that a resume repeats it exactly. Fields
    left None (``tile_size``) or ``"auto"`` (``backend``) are settled by :meth:`settle` once
    the cluster is known.

    Attributes
    ----------
    n : int
        Number of bodies.
    steps : int
        Steps of the whole run.
    dt, softening, G : float
        Step length, Plummer softening length, gravitational constant.
    snapshot_every : int or None
        Snapshot interval in steps (None: the first and the last state only).
    dtype : {"float32", "float64"}
        Precision of the state and the forces.
    tile_size : int or None
        Bodies per tile.
    split_every : int
        Fan-in of the reduction tree (>= 2).
    backend : {"cpu", "cuda", "auto"}
        Kernel of the tile-pair tasks (:mod:`nbody_dask.backends`).
    symmetric : bool
        Symmetric CPU kernel: one task per unordered tile pair (``"pairs"`` layout only).
    layout : {"pairs", "rows"}
        Task layout (module docstring).
    method : {"direct", "tree"}
        Force method: exact direct summation, or the tree (:mod:`nbody_dask.kernels.tree`)
        on spatial tiles re-cut along the Morton curve (:mod:`nbody_dask.spatial`) at every
        snapshot step and every ``retile_every`` steps.
    theta : float
        The tree's opening angle.
    leaf_size : int
        The tree's most bodies per leaf.
    retile_every : int
        The tree's re-tiling interval in steps (snapshot steps re-tile as well).
    near_far_tiles : int
        Fewest spatial tiles for which tile pairs are classified near or far
        (:attr:`near_far`).
    force_error_sample : int
        Bodies whose relative force error every snapshot records against a float64 direct
        sum (:mod:`nbody_dask.accuracy`); 0 records none.
    """

    n: int
    steps: int
    dt: float
    softening: float = 0.0
    G: float = 1.0
    snapshot_every: int | None = None
    dtype: str = "float64"
    tile_size: int | None = None
    split_every: int = 8
    backend: str = "cpu"
    symmetric: bool = False
    layout: str = "pairs"
    method: str = "direct"
    theta: float = 0.4
    leaf_size: int = 64
    retile_every: int = 10
    force_error_sample: int = 0
    near_far_tiles: int = NEAR_FAR_MIN_TILES

    def __post_init__(self) -> None:
        check_layout(self.layout)
        if check_method(self.method) == "auto":
            raise ValueError("a plan's method is 'direct' or 'tree' (see resolve_method)")
        if self.method == "tree" and self.backend == "cuda":
            raise ValueError("method='tree' runs on CPUs; backend='cuda' needs "
                             "method='direct'")
        if self.layout == "rows" and self.backend == "cuda":
            raise ValueError("layout='rows' runs the parallel CPU kernel; backend='cuda' "
                             "needs layout='pairs'")

    # -- settling against a cluster ---------------------------------------------------------

    def settle(self, threads: int, workers: int, backend: str) -> Plan:
        """This plan with the tile size and backend chosen for a cluster (unless given)."""
        if self.layout == "rows" or self.method == "tree":
            backend = "cpu"
        tile = self.tile_size or auto_tile_size(self.n, threads, backend, self.layout, workers,
                                                self.method)
        return replace(self, tile_size=tile, backend=backend,
                       symmetric=(self.symmetric and backend == "cpu" and self.layout == "pairs"
                                  and self.method == "direct"))

    def stored(self) -> dict[str, Any]:
        """The plan as plain JSON-able data, as kept in the store."""
        return asdict(self)

    @classmethod
    def from_stored(cls, data: dict[str, Any], n: int) -> Plan:
        """The plan of a stored run (stores older than the layout field ran ``"pairs"``)."""
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**{"n": n, **known})

    # -- tiles and tasks ---------------------------------------------------------------------

    @property
    def n_tiles(self) -> int:
        return len(range(0, self.n, self._tile_size()))

    def tile_bounds(self) -> list[tuple[int, int]]:
        return tile_bounds(self.n, self._tile_size())

    def _tile_size(self) -> int:
        if self.tile_size is None:
            raise ValueError("the plan has no tile size yet (see Plan.settle)")
        return self.tile_size

    @property
    def spatial(self) -> bool:
        """Tiles are re-cut along the Morton curve (the tree method with several tiles)."""
        return self.method == "tree" and self.n_tiles > 1

    def retile_steps(self) -> frozenset[int]:
        """Steps whose force evaluation follows a re-tiling (none unless :attr:`spatial`):
        every snapshot step and every ``retile_every`` steps, so that a run resumed from any
        snapshot re-tiles where the uninterrupted run did."""
        if not self.spatial:
            return frozenset()
        return frozenset(self.snapshot_steps()) | frozenset(
            range(0, self.steps + 1, self.retile_every))

    @property
    def near_far(self) -> bool:
        """Tile pairs are classified near or far (the tree method with at least
        ``near_far_tiles`` spatial tiles): near pairs are walked, far tiles are evaluated
        from their summaries in one task per target tile."""
        return self.spatial and self.n_tiles >= self.near_far_tiles

    def window_end(self, step: int) -> int:
        """The last step whose forces use the tiles (and tree cells) re-cut at or before
        ``step``: the step before the next re-tiling, or the last step."""
        later = [r for r in self.retile_steps() if r > step]
        return min(later) - 1 if later else self.steps

    @property
    def fused(self) -> bool:
        """One tile: several steps run as one task (Dask's round trip would dominate)."""
        return self.n_tiles == 1

    def snapshot_steps(self) -> list[int]:
        """Steps at which a snapshot is written: 0, every ``snapshot_every``, and the last."""
        every = self.snapshot_every or max(self.steps, 1)
        return sorted(set(range(0, self.steps + 1, every)) | {self.steps})

    def pair_tasks(self) -> list[tuple[int, int]]:
        """The tile-pair tasks of one force evaluation in the ``"pairs"`` layout.

        ``(i, j)`` computes the force of tile ``j`` on tile ``i``; with the symmetric kernel
        only ``i <= j`` exist, and ``(i, j)`` with ``i < j`` gives the forces on both tiles.
        """
        t = self.n_tiles
        if self.symmetric and self.method == "direct":
            return [(i, j) for i in range(t) for j in range(i, t)]
        return [(i, j) for i in range(t) for j in range(t)]

    def parts(self, target: int) -> list[Part]:
        """The partial forces on tile ``target``, one per source tile, in source order."""
        if not self.symmetric or self.method == "tree":
            return [((target, j), None) for j in range(self.n_tiles)]
        return [((target, target), None) if j == target
                else ((target, j), 0) if target < j else ((j, target), 1)
                for j in range(self.n_tiles)]

    def source_blocks(self) -> list[tuple[int, int]]:
        """``"rows"`` layout: ranges of consecutive tiles whose positions and masses are
        gathered into one block, about ``sqrt(T)`` blocks of ``sqrt(T)`` tiles.

        Every row task needs every tile's positions; fetching ``sqrt(T)`` blocks instead of
        ``T`` tiles cuts a step's dependencies (each a transfer and scheduler bookkeeping)
        from ``T**2`` to about ``T**1.5``, while no block holder serves more than
        ``T * N / sqrt(T)`` bodies' worth of data a step.
        """
        t = self.n_tiles
        size = math.ceil(math.sqrt(t))
        return [(lo, min(lo + size, t)) for lo in range(0, t, size)]

    def shuffle_blocks(self) -> list[tuple[int, int]]:
        """Spatial tiles: ranges of consecutive destination tiles whose parts of an old tile
        are taken in one task when a re-tiling (or a routing back to body order) moves every
        tile's bodies to their new tiles.

        Blocks of ``max(1, isqrt(T // 4))`` destinations cut those tasks from ``T**2`` to
        about ``2 T**1.5`` (65,536 to 8,192 at 256 tiles); a merge task then receives the
        parts of its whole block, at most ``sqrt(T / 4)`` tiles' worth of bodies (1/32 of
        them at 256 tiles, one tile under 16 tiles).
        """
        t = self.n_tiles
        size = max(1, math.isqrt(t // 4))
        return [(lo, min(lo + size, t)) for lo in range(0, t, size)]

    def groups(self) -> list[list[tuple[int, int]]]:
        """The reduction tree of every target tile's partials (:func:`reduction_groups`)."""
        return reduction_groups(self.n_tiles, self.split_every)

    def tasks_per_step(self) -> int:
        """Tasks of one step's graph (snapshots not included)."""
        t = self.n_tiles
        if self.fused:
            return 1
        if self.layout == "rows" and self.method == "direct":
            return 2 * t + len(self.source_blocks())  # drift, blocks, row (forces and kick)
        combines = sum(len(level) for level in self.groups()) * t
        if self.method == "tree":  # trees, and a re-tiling's 4 T + T B + 2 now and then
            moves = t * len(self.shuffle_blocks())
            retile = math.ceil((4 * t + moves + 2) / max(1, self.retile_every))
            if self.layout == "rows":  # drift, tree, row; summaries and forest
                return 3 * t + (t + 1 if self.near_far else 0) + retile
            far = 2 * t + 1 if self.near_far else 0  # summaries, forest, far tasks
            return 3 * t + far + len(self.pair_tasks()) + combines + retile
        return 2 * t + len(self.pair_tasks()) + combines

    def steps_per_submission(self, max_tasks: int) -> int:
        """Steps submitted at once: at most ``max_tasks`` tasks (fused: ~1e9 interactions)."""
        if self.fused:
            return max(1, int(1e9 // max(self.n**2, 1)))
        return max(1, max_tasks // self.tasks_per_step())

"""The work of a run as plain data: tiles, the tasks of a step, reduction groups, submissions.

Pure arithmetic on integers, no Dask and no arrays: :mod:`nbody_dask.graph` and the force
method (:mod:`nbody_dask.methods`, named by :attr:`Plan.method`) turn a :class:`Plan` into
task graphs, and :mod:`nbody_dask.driver` submits them. Everything that decides a run's
floating-point result is here or in the method's planning half (tile bounds, which kernel
computes which tile pair, in which order and groups partial forces are summed), so a run is
reproducible from its plan alone, whatever the cluster. A plan checks itself on
construction, so one read back from a store is checked as one built from arguments.

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

import bisect
import functools
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from . import config, methods
from ._validate import check_int, check_real
from .cosmology import Background
from .timebins import CRITERIA, DEFAULT_ETA, TIMESTEPS, BlockFactors, Bins, ticks_per_block

if TYPE_CHECKING:
    from .methods import ForceMethod

__all__ = ["LAYOUTS", "BACKENDS", "DTYPES", "check_layout", "check_backend", "check_method",
           "resolve_method", "individual_tiles", "TREE_CROSSOVER", "PERIODIC_CROSSOVER",
           "Plan", "Part",
           "fast_mesh_size", "auto_mesh_size", "SMALLEST_AUTO_MESH", "auto_mesh_slabs",
           "MESH_SLAB_BYTES", "tree_tile_size", "TREE_ONE_TILE_MAX", "tile_bounds",
           "auto_tile_size", "comoving_steps", "direct_tile_size", "reduction_groups",
           "submission_ends"]

LAYOUTS = ("pairs", "rows")
BACKENDS = ("auto", "cpu", "cuda")
DTYPES = ("float32", "float64")

#: ``method="auto"`` runs direct summation below this many bodies and the tree from it on:
#: where a simulate() step with the tree became faster than a direct one on the default
#: local cluster (measured: docs/performance.md).
TREE_CROSSOVER = 8_192

#: ``method="auto"`` in a periodic box (``box_size``) runs the Ewald sum (``"direct"``)
#: below this many bodies and TreePM from it on (measured: docs/performance.md).
PERIODIC_CROSSOVER = 512

Part = tuple[tuple[int, int], int | None]
"""A partial force on a target tile: ``((i, j), side)``, the tile-pair task ``(i, j)`` and,
for a symmetric task, which of its two results (0: on tile ``i``, 1: on tile ``j``); None for
a task whose one result is the force on its target."""




def check_layout(layout: object) -> str:
    """``layout`` if it names a layout (:data:`LAYOUTS`), else a ValueError naming it."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return str(layout)


def check_backend(backend: object) -> str:
    """``backend`` if it names a kernel backend (:data:`BACKENDS`, see
    :mod:`nbody_dask.backends`), else a ValueError naming it."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return str(backend)


def check_method(method: object) -> str:
    """``method`` if it is ``"auto"`` or names a force method (:func:`nbody_dask.methods.
    names`), else a ValueError naming it."""
    known = ("auto", *methods.names())
    if not isinstance(method, str) or method not in known:
        raise ValueError(f"method must be one of {known}, got {method!r}")
    return method


def resolve_method(method: str, n: int, periodic: bool = False) -> str:
    """The method ``"auto"`` stands for: ``"direct"`` or ``"tree"`` by
    :data:`TREE_CROSSOVER`, or in a periodic box ``"direct"`` (Ewald) or ``"treepm"`` by
    :data:`PERIODIC_CROSSOVER`; any other method as it is."""
    if method != "auto":
        return method
    if periodic:
        return "treepm" if n >= PERIODIC_CROSSOVER else "direct"
    return "tree" if n >= TREE_CROSSOVER else "direct"


#: The smallest mesh ``mesh_size=None`` chooses: the default cutoff (``split * cutoff`` =
#: 12.5 cells) must stay below half the box.
SMALLEST_AUTO_MESH = 32


def auto_mesh_size(n: int) -> int:
    """TreePM's mesh points per side for ``n`` bodies: twice the particle grid,
    ``2 cbrt(n)``, at least :data:`SMALLEST_AUTO_MESH`, rounded up to a fast FFT size. With
    the default split (2.5 cells) the split scale is then 1.25 mean spacings, as GADGET's
    1.25 cells on a mesh of the particle grid, for the same short-range work, and the mesh
    force is 4x more accurate (docs/user-guide.md, "Periodic boxes")."""
    grid = math.ceil(round(max(n, 0) ** (1 / 3), 9))
    return fast_mesh_size(max(2 * grid, SMALLEST_AUTO_MESH))


#: The most bytes of mesh one FFT task holds by default: larger meshes are cut into slabs of
#: about this size and transformed by a Dask graph (:mod:`nbody_dask.meshfft`).
MESH_SLAB_BYTES = 256 * 2**20


def auto_mesh_slabs(mesh_size: int, dtype: str) -> int:
    """Slabs of TreePM's mesh: 1 (one FFT task) up to :data:`MESH_SLAB_BYTES` of mesh,
    else enough slabs of at most that size (at most one plane each)."""
    points = mesh_size**3 * (4 if dtype == "float32" else 8)
    return min(mesh_size, max(1, math.ceil(points / MESH_SLAB_BYTES)))


def fast_mesh_size(n: int) -> int:
    """The smallest mesh size ``>= n`` whose prime factors are 2, 3 and 5 (fast FFTs)."""
    size = max(2, int(n))
    while True:
        rest = size
        for p in (2, 3, 5):
            while rest % p == 0:
                rest //= p
        if rest == 1:
            return size
        size += 1


@functools.lru_cache(maxsize=8)
def _comoving_factors(cosmology: str, outputs: tuple[float, ...],
                      output_steps: tuple[int, ...]):
    """The leapfrog factors of every step of a comoving run, shape (3, steps)."""
    return Background(cosmology).step_factors(
        [_scale_factor(outputs, output_steps, k) for k in range(output_steps[-1] + 1)])


@functools.lru_cache(maxsize=64)
def _block_factors(cosmology: str, a0: float, a1: float, bins: int) -> BlockFactors:
    """:class:`~nbody_dask.timebins.BlockFactors` of a block from scale factor ``a0`` to
    ``a1`` (uniform in ``ln a``), with ``bins`` bins."""
    ticks = ticks_per_block(bins)
    background = Background(cosmology)
    half = np.exp(math.log(a0) + math.log(a1 / a0) * np.arange(2 * ticks + 1) / (2 * ticks))
    half[0], half[-1] = a0, a1
    start = np.full(2 * ticks, a0)
    kick = np.concatenate([[0.0], background.kick(start, half[1:])])
    whole = half[::2]
    drift = np.concatenate([[0.0], background.drift(start[:ticks], whole[1:])])
    scale = background.efunc(whole) * whole**1.5
    return BlockFactors(tuple(map(float, kick)), tuple(map(float, drift)),
                        tuple(map(float, scale)))


def _scale_factor(outputs: tuple[float, ...], output_steps: tuple[int, ...], step: int
                  ) -> float:
    """The scale factor after ``step`` steps that are uniform in ``ln a`` between the
    ``outputs`` (exactly those at ``output_steps``)."""
    k = min(max(0, bisect.bisect_right(output_steps, step) - 1), len(output_steps) - 2)
    (s0, s1), (a0, a1) = output_steps[k:k + 2], outputs[k:k + 2]
    if step == s1:
        return a1
    return math.exp(math.log(a0) + (step - s0) * (math.log(a1 / a0) / (s1 - s0)))


def comoving_steps(outputs: list[float], dt: float | None = None, steps: int | None = None
                   ) -> list[int]:
    """How many steps uniform in ``ln a`` each stretch between consecutive ``outputs``
    (scale factors, increasing) takes: at most ``dt`` in ``ln a`` each, or ``steps`` in all
    shared in proportion to the stretches' spans in ``ln a`` (at least one each, the largest
    remainders rounded up)."""
    spans = [math.log(b / a) for a, b in zip(outputs[:-1], outputs[1:], strict=True)]
    if dt is not None:
        return [max(1, math.ceil(span / dt - 1e-9)) for span in spans]
    if steps < len(spans):
        raise ValueError(f"steps must be >= {len(spans)}, one for each stretch between "
                         f"snapshots, got {steps!r}")
    share = [steps * span / sum(spans) for span in spans]
    counts = [max(1, math.floor(x)) for x in share]
    order = sorted(range(len(spans)), key=lambda i: (counts[i] - share[i], i))
    for i in order[:steps - sum(counts)]:
        counts[i] += 1
    while sum(counts) > steps:  # only when floors of tiny stretches were raised to 1
        i = max(range(len(spans)), key=lambda i: (counts[i] - share[i], -i))
        counts[i] -= 1
    return counts


def tile_bounds(n: int, tile_size: int) -> list[tuple[int, int]]:
    """Half-open ``(start, stop)`` ranges covering ``0..n``; the last holds the remainder."""
    return [(lo, min(lo + tile_size, n)) for lo in range(0, n, tile_size)]


def auto_tile_size(n: int, threads: int, backend: str = "cpu", layout: str = "pairs",
                   workers: int = 1, method: str = "direct") -> int:
    """Default tile size of ``method`` (:meth:`nbody_dask.methods.ForceMethod.tile_size`)
    for ``n`` bodies on a cluster with ``threads`` worker threads in ``workers`` processes."""
    return methods.get(method).tile_size(n, threads, workers, layout, backend)


def direct_tile_size(n: int, threads: int, backend: str = "cpu", layout: str = "pairs",
                     workers: int = 1) -> int:
    """Default tile size of direct summation for ``n`` bodies on a cluster with ``threads``
    worker threads.

    With ``layout="rows"`` there is one tile per worker (``workers``): each worker's row task
    then uses all its cores, and a step is about ``2 * workers`` tasks.

    On GPUs (``backend="cuda"``) tiles are large (>= 65,536 bodies, at most 4 per step's
    row) so that each kernel launch runs long against its transfers.

    On CPUs, up to 4,096 bodies the whole system is one tile: a step then costs about as much
    kernel time as one Dask round trip (docs/performance.md), and runs as a fused task of many
    steps. Beyond that the
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
        Worker processes of the cluster (used by ``layout="rows"``).

    Returns
    -------
    int
        Bodies per tile (the last tile holds the remainder).
    """
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


#: The tree on a one-worker cluster keeps up to this many bodies in one tile (see
#: :func:`tree_tile_size`; its memory is measured in docs/performance.md).
TREE_ONE_TILE_MAX = 8_388_608


def tree_tile_size(n: int, threads: int, workers: int = 1, layout: str = "pairs") -> int:
    """Tile size of the tree method.

    On one worker, up to :data:`TREE_ONE_TILE_MAX` bodies are one tile: one
    fused task whose walk runs on all the worker's threads, with no re-tiling and no routing
    back to body order (faster than a few spatial tiles, and as accurate as one global tree,
    docs/performance.md). On several workers, and beyond that size: with
    ``layout="rows"`` a tile per worker (each worker's row task walks on all its cores), at
    most ``TREE_ONE_TILE_MAX`` bodies a tile; with ``"pairs"``, ``T`` spatial tiles with
    ``T**2 >= 4 * threads`` tile-pair tasks, so that the threads share a step's uneven pair
    tasks (a tile with itself costs most, a far pair little), and at most 1,048,576 bodies a
    tile (the memory of one task). Never tiles under 4,096 bodies.
    """
    workers = max(1, int(workers))
    if n <= 16_384 or (workers == 1 and n <= TREE_ONE_TILE_MAX):
        return max(n, 1)
    if layout == "rows":
        tiles = max(workers, math.ceil(n / TREE_ONE_TILE_MAX))
    else:
        tiles = max(math.ceil(math.sqrt(4 * max(1, int(threads)))), math.ceil(n / 1_048_576))
    return max(1, math.ceil(n / min(tiles, n // 4_096)))


def individual_tiles(plan: Plan) -> Plan:
    """``plan`` with one tile for the tree's or TreePM's individual time steps of up to
    :data:`TREE_ONE_TILE_MAX` bodies unless ``tile_size`` is given: its blocks then run in
    one task on one worker's cores, without a round trip per tick (a 65,536-body cusp's tree
    run took 12.7 s so, 31.7 s on 2 worker processes' 3 spatial tiles, on 2 cores); spatial
    tiles beyond, for systems one worker should not hold."""
    if plan.individual and plan.tile_size is None and plan.n <= TREE_ONE_TILE_MAX:
        return replace(plan, tile_size=max(plan.n, 1))
    return plan


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


#: Plan fields that default to the configuration's ``nbody.<field-with-dashes>``.
_CONFIGURED = ("dtype", "tile_size", "split_every", "layout", "theta", "leaf_size",
               "retile_every", "near_far_tiles", "mesh_size", "mesh_slabs", "split",
               "cutoff", "timestep", "step_criterion", "eta", "time_bins")

#: The most time bins (the shortest step is ``dt / 2**(time_bins - 1)``).
MAX_TIME_BINS = 30


@dataclass(frozen=True)
class Plan:
    """A run's validated parameters and the arithmetic they fix.

    Stored in the trajectory (:meth:`stored`), so that a resume repeats it exactly. The
    fields of ``_CONFIGURED`` left None take the configuration's defaults
    (:mod:`nbody_dask.config`) at construction; a ``tile_size`` still None and
    ``backend="auto"`` are settled by :meth:`settle` once the cluster is known.

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
    box_size : float or None
        Side of the periodic cube (None: an isolated system). Positions are kept in
        ``[0, box_size)``; the mean density is subtracted (:mod:`nbody_dask.methods.treepm`).
    mesh_size : int or None
        TreePM's mesh points per side; None in a periodic box chooses
        :func:`auto_mesh_size`.
    mesh_slabs : int or None
        TreePM's mesh slabs: 1 solves the mesh in one task with ``scipy.fft``, more cut it
        into slabs transformed by a Dask graph (:mod:`nbody_dask.meshfft`); None in a
        periodic box chooses :func:`auto_mesh_slabs`. Part of the arithmetic: results are
        bit-identical for a given value, equal to round-off across values.
    split : float
        TreePM's force split scale ``r_s`` in mesh cells.
    cutoff : float
        TreePM's short-range cutoff in units of ``r_s``.
    cosmology : str or None
        A comoving run's cosmology as JSON (:func:`nbody_dask.cosmology.to_json`); None: a
        static box or an isolated system. The time is then the scale factor, from
        :attr:`a_start` to :attr:`a_end` in steps of :attr:`dt` in ``ln a``, and the state
        carries canonical momenta (:mod:`nbody_dask.integrators`).
    a_start, a_end : float or None
        A comoving run's first and last scale factor.
    a_outputs, output_steps : tuple or None
        A comoving run's snapshot scale factors (from ``a_start`` to ``a_end``) and the steps
        they fall on: steps are uniform in ``ln a`` between consecutive ones (by default
        just the two ends). Snapshots are written at these steps too.
    timestep : {"global", "individual"}
        One step ``dt`` for every body, or individual power-of-two steps ``dt / 2**k``
        (:mod:`nbody_dask.timebins`): a plan step is then a *block* of ``dt`` in which each
        body takes the steps its bin asks for, every body synchronised at the block's end.
    step_criterion : {"pairwise", "acceleration"}
        Individual time steps: how a body's step is chosen (:mod:`nbody_dask.timebins`;
        None: ``nbody.step-criterion``, whose default is ``"pairwise"``, and
        ``"acceleration"`` for TreePM, whose short range sums no pairs' rates).
    eta : float
        Individual time steps: the criterion's accuracy parameter (None: the criterion's
        default, :data:`~nbody_dask.timebins.DEFAULT_ETA`).
    time_bins : int
        Individual time steps: the number of bins (the shortest step is ``dt /
        2**(time_bins - 1)``).
    """

    n: int
    steps: int
    dt: float
    softening: float = 0.0
    G: float = 1.0
    snapshot_every: int | None = None
    dtype: str | None = None
    tile_size: int | None = None
    split_every: int | None = None
    backend: str = "cpu"
    symmetric: bool = False
    layout: str | None = None
    method: str = "direct"
    theta: float | None = None
    leaf_size: int | None = None
    retile_every: int | None = None
    force_error_sample: int = 0
    near_far_tiles: int | None = None
    box_size: float | None = None
    mesh_size: int | None = None
    mesh_slabs: int | None = None
    split: float | None = None
    cutoff: float | None = None
    cosmology: str | None = None
    a_start: float | None = None
    a_end: float | None = None
    a_outputs: tuple[float, ...] | None = None
    output_steps: tuple[int, ...] | None = None
    timestep: str | None = None
    step_criterion: str | None = None
    eta: float | None = None
    time_bins: int | None = None

    def __post_init__(self) -> None:
        self._check_numbers()
        self._check_comoving()
        self._check_timestep()
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if not isinstance(self.symmetric, bool):
            raise TypeError(f"symmetric must be True or False, got {self.symmetric!r}")
        check_backend(self.backend)
        check_layout(self.layout)
        if check_method(self.method) == "auto":
            raise ValueError(f"a plan's method is one of {methods.names()} (see "
                             "resolve_method), got 'auto'")
        if self.layout == "rows" and self.backend == "cuda":
            raise ValueError("layout='rows' runs the parallel CPU kernel; backend='cuda' "
                             "needs layout='pairs'")
        self.force_method.check(self)

    def _check_numbers(self) -> None:
        """Fill the fields left None from the configuration (``nbody.yaml``, the one source
        of defaults), check every number against its range (each error names the field and
        the value) and keep it as a plain int or float."""
        def keep(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        for name in _CONFIGURED:
            if getattr(self, name) is None:
                keep(name, config.get(name.replace("_", "-")))
        if self.step_criterion is None:  # TreePM's short range sums no pair rates
            keep("step_criterion", "acceleration" if self.method == "treepm" else "pairwise")

        if self.box_size is not None:
            keep("box_size", check_real("box_size", self.box_size, positive=True))
            if self.mesh_size is None:
                keep("mesh_size", auto_mesh_size(self.n))
        for name, minimum in (("n", 0), ("steps", 0), ("split_every", 2), ("leaf_size", 1),
                              ("retile_every", 1), ("force_error_sample", 0),
                              ("near_far_tiles", 1), ("snapshot_every", 1), ("tile_size", 1),
                              ("mesh_size", 2), ("mesh_slabs", 1), ("time_bins", 1)):
            value = getattr(self, name)
            if value is None and name in ("snapshot_every", "tile_size", "mesh_size",
                                          "mesh_slabs"):
                continue  # not set: snapshots at the ends only; the cluster decides the
                # tiles; no mesh outside a periodic box
            value = check_int(name, value, minimum)
            if value >= 2**63:  # the kernels count in int64
                raise ValueError(f"{name} must be < 2**63, got {value!r}")
            keep(name, value)
        for name, positive in (("dt", True), ("softening", False), ("G", True),
                               ("theta", True), ("split", True), ("cutoff", True)):
            keep(name, check_real(name, getattr(self, name), positive=positive,
                                  nonnegative=not positive))
        if self.theta > 1:
            raise ValueError(f"theta must be in (0, 1], got {self.theta!r}")
        if self.box_size is not None and self.mesh_slabs is None:
            # a one-tile system's individual time steps solve their mesh in one task
            keep("mesh_slabs", 1 if self._one_tile_blocks() else auto_mesh_slabs(
                self.mesh_size, self.dtype))
        if self.mesh_slabs is not None and self.mesh_size is not None \
                and self.mesh_slabs > self.mesh_size:
            raise ValueError(f"mesh_slabs must be <= mesh_size ({self.mesh_size}), got "
                             f"{self.mesh_slabs!r}")

    def _check_comoving(self) -> None:
        if self.cosmology is None:
            for name in ("a_start", "a_end", "a_outputs", "output_steps"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name} is for cosmological runs (cosmology=...)")
            return
        if not isinstance(self.cosmology, str):
            raise TypeError(f"a plan's cosmology is JSON text, got {self.cosmology!r}")
        if self.box_size is None:
            raise ValueError("a cosmological run needs a periodic box: give box_size")
        if self.G != 1.0:
            raise ValueError(f"G={self.G!r}: a cosmological run's code units set G = 1")
        for name in ("a_start", "a_end"):
            object.__setattr__(self, name, check_real(name, getattr(self, name),
                                                      positive=True))
        if self.a_end <= self.a_start:
            raise ValueError(f"a_end must be > a_start ({self.a_start!r}), got "
                             f"{self.a_end!r}")
        if self.steps == 0:
            raise ValueError("a cosmological run needs steps >= 1")
        outputs = (self.a_start, self.a_end) if self.a_outputs is None else tuple(
            check_real("a_outputs", a, positive=True) for a in self.a_outputs)
        at = (0, self.steps) if self.output_steps is None else tuple(
            check_int("output_steps", k, 0) for k in self.output_steps)
        if len(outputs) != len(at) or outputs[0] != self.a_start \
                or outputs[-1] != self.a_end or at[0] != 0 or at[-1] != self.steps \
                or any(b <= a for a, b in zip(outputs[:-1], outputs[1:], strict=True)) \
                or any(j <= i for i, j in zip(at[:-1], at[1:], strict=True)):
            raise ValueError(f"a_outputs {outputs!r} must rise from a_start to a_end, at "
                             f"output_steps {at!r} rising from 0 to steps ({self.steps})")
        object.__setattr__(self, "a_outputs", outputs)
        object.__setattr__(self, "output_steps", at)
        expected = max(math.log(b / a) / (j - i) for a, b, i, j in zip(
            outputs[:-1], outputs[1:], at[:-1], at[1:], strict=True))
        if not math.isclose(self.dt, expected, rel_tol=1e-12):
            raise ValueError(f"dt must be the largest step in ln a, {expected!r}, got "
                             f"{self.dt!r}")

    def _check_timestep(self) -> None:
        if self.timestep not in TIMESTEPS:
            raise ValueError(f"timestep must be one of {TIMESTEPS}, got {self.timestep!r}")
        if self.step_criterion not in CRITERIA:
            raise ValueError(f"step_criterion must be one of {CRITERIA}, got "
                             f"{self.step_criterion!r}")
        eta = DEFAULT_ETA[self.step_criterion] if self.eta is None else self.eta
        object.__setattr__(self, "eta", check_real("eta", eta, positive=True))
        if self.time_bins > MAX_TIME_BINS:
            raise ValueError(f"time_bins must be <= {MAX_TIME_BINS}, got {self.time_bins!r}")
        if self.timestep == "global":
            return
        if self.mesh_slabs is not None and self.mesh_slabs > 1 and self._one_tile_blocks():
            raise ValueError(f"timestep='individual' with the mesh in slabs needs spatial "
                             f"tiles (tile_size < n = {self.n}; a one-tile system's blocks "
                             f"run in one task), got mesh_slabs={self.mesh_slabs!r}")
        treepm = self.method == "treepm"
        for needed, met, name, value in (
                ("method='direct', 'tree' or 'treepm'", self.force_method.individual_steps,
                 "method", self.method),
                ("an isolated system or method='treepm'", not self.periodic or treepm,
                 "box_size", self.box_size),
                ("step_criterion='acceleration' with method='treepm'",
                 not treepm or self.step_criterion == "acceleration", "step_criterion",
                 self.step_criterion),
                ("method='direct' on GPUs (backend='cuda')",
                 self.backend != "cuda" or self.method == "direct", "method", self.method),
                ("softening > 0 with step_criterion='acceleration'",
                 self.softening > 0 or self.step_criterion != "acceleration", "softening",
                 self.softening)):
            if not met:
                raise ValueError(f"timestep='individual' needs {needed} for now, got "
                                 f"{name}={value!r}")

    def _one_tile_blocks(self) -> bool:
        """Individual time steps whose system is one tile (:func:`individual_tiles`), whose
        blocks run in one task: the mesh is solved in that task, not in slabs."""
        if not self.individual:
            return False
        return self.tile_size >= self.n if self.tile_size else self.n <= TREE_ONE_TILE_MAX

    @property
    def individual(self) -> bool:
        """Individual time steps (:attr:`timestep`): plan steps are blocks of bins."""
        return self.timestep == "individual"

    @property
    def bins(self) -> Bins:
        """The individual time steps' parameters."""
        return Bins(self.dt, self.time_bins, self.eta, self.softening, self.step_criterion)

    @property
    def comoving(self) -> bool:
        """A cosmological run: comoving coordinates, canonical momenta, time = scale factor."""
        return self.cosmology is not None

    def scale_factor(self, step: int) -> float:
        """A comoving run's scale factor after ``step`` steps (uniform in ``ln a`` between
        its :attr:`a_outputs`)."""
        if self.cosmology is None:
            raise ValueError("the plan has no cosmology")
        return _scale_factor(self.a_outputs, self.output_steps, step)

    def step_factors(self, step: int) -> tuple[float, float, float]:
        """The leapfrog's factors of step ``step`` (from ``step - 1``): the opening kick, the
        drift and the closing kick: ``dt / 2, dt, dt / 2``, or in a comoving run
        ``int dt / a`` to the step's middle, ``int dt / a^2``, ``int dt / a`` from the middle
        (:meth:`nbody_dask.cosmology.Background.step_factors`)."""
        if self.cosmology is None:
            return 0.5 * self.dt, self.dt, 0.5 * self.dt
        table = _comoving_factors(self.cosmology, self.a_outputs, self.output_steps)
        return tuple(float(table[row, step - 1]) for row in range(3))

    def block_factors(self, step: int, initial: bool = False) -> BlockFactors | None:
        """A comoving run's block ``step`` (from ``step - 1``) of individual time steps on
        its timeline (:class:`~nbody_dask.timebins.BlockFactors`); with ``initial``, the
        first evaluation at ``step`` (a block of no length); None for a static run."""
        if self.cosmology is None:
            return None
        a1 = self.scale_factor(step)
        a0 = a1 if initial else self.scale_factor(step - 1)
        return _block_factors(self.cosmology, a0, a1, self.time_bins)

    def snapshot_times(self, t0: float) -> list[float]:
        """The ``time`` of each snapshot: ``t0 + step dt``, or a comoving run's scale
        factor."""
        if self.cosmology is not None:
            return [self.scale_factor(step) for step in self.snapshot_steps()]
        return [t0 + step * self.dt for step in self.snapshot_steps()]

    @property
    def periodic(self) -> bool:
        """A periodic box (:attr:`box_size` given)."""
        return self.box_size is not None

    @property
    def split_length(self) -> float:
        """TreePM's split scale ``r_s`` in length units (:attr:`split` mesh cells)."""
        return self.split * self._box() / self._mesh()

    @property
    def cutoff_length(self) -> float:
        """TreePM's short-range cutoff in length units (:attr:`cutoff` times ``r_s``)."""
        return self.cutoff * self.split_length

    def mesh_slab_bounds(self) -> list[tuple[int, int]]:
        """TreePM's mesh slabs: half-open ranges of planes along the first axis, as even as
        they go."""
        n, slabs = self._mesh(), self.mesh_slabs or 1
        return [(n * j // slabs, n * (j + 1) // slabs) for j in range(slabs)]

    def _box(self) -> float:
        if self.box_size is None:
            raise ValueError("the plan has no periodic box (box_size)")
        return self.box_size

    def _mesh(self) -> int:
        if self.mesh_size is None:
            raise ValueError("the plan has no mesh (mesh_size)")
        return self.mesh_size

    @property
    def force_method(self) -> ForceMethod:
        """The :class:`~nbody_dask.methods.ForceMethod` named by :attr:`method`."""
        return methods.get(self.method)

    # -- settling against a cluster ---------------------------------------------------------

    def settle(self, threads: int, workers: int, backend: str) -> Plan:
        """This plan with the tile size and backend chosen for a cluster (unless given), by
        its method (:meth:`~nbody_dask.methods.ForceMethod.settle`)."""
        return self.force_method.settle(self, threads, workers, backend)

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
        """Bodies move between tiles (the tree re-cuts tiles along the Morton curve when
        there are several): the method's :meth:`~nbody_dask.methods.ForceMethod.reorders`."""
        return self.force_method.reorders(self)

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
        """One tile: several steps run as one task (Dask's round trip would dominate); not
        with individual time steps."""
        return self.n_tiles == 1 and not self.individual

    def snapshot_steps(self) -> list[int]:
        """Steps at which a snapshot is written: 0, every ``snapshot_every``, the last, and a
        comoving run's :attr:`output_steps`."""
        every = self.snapshot_every or max(self.steps, 1)
        outputs = set(self.output_steps or ())
        return sorted(set(range(0, self.steps + 1, every)) | {self.steps} | outputs)

    def pair_tasks(self) -> list[tuple[int, int]]:
        """The tile-pair tasks of one force evaluation in the ``"pairs"`` layout.

        ``(i, j)`` computes the force of tile ``j`` on tile ``i``; with the symmetric kernel
        only ``i <= j`` exist, and ``(i, j)`` with ``i < j`` gives the forces on both tiles.
        """
        t = self.n_tiles
        if self.symmetric:
            return [(i, j) for i in range(t) for j in range(i, t)]
        return [(i, j) for i in range(t) for j in range(t)]

    def parts(self, target: int) -> list[Part]:
        """The partial forces on tile ``target``, one per source tile, in source order."""
        if not self.symmetric:
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
        """Tasks of one step's graph (snapshots not included), as the method counts them."""
        return self.force_method.tasks_per_step(self)

    def steps_per_submission(self, max_tasks: int) -> int:
        """Steps submitted at once: at most ``max_tasks`` tasks (fused: ~1e9 interactions)."""
        if self.fused:
            return max(1, int(1e9 // max(self.n**2, 1)))
        return max(1, max_tasks // self.tasks_per_step())

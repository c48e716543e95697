"""Spatial tiles for the tree method: re-tiling along the Morton curve, and back to body order.

Task functions (run on the workers) on :class:`~nbody_dask.bodies.Tile` objects; the graph
that wires them is built in :mod:`nbody_dask.graph`. No task ever holds more than a tile's
bodies plus small summaries:

1. :func:`tile_extent` per tile, :func:`bounding_cube` of all extents: the cube the keys are
   taken in.
2. :func:`key_sample` per tile: the Morton keys of the bodies whose id is a multiple of a
   stride; :func:`splitters` sorts the union by (key, id) and picks ``T - 1`` of them at equal
   ranks.
3. :func:`cut_by_splitters` per old tile: its bodies in ``T`` parts by splitter;
   :func:`merge_parts` per new tile: part ``t`` of every old tile, sorted by (key, id).

Every step depends only on the set of bodies, never on how they were tiled before: the cube
is a min/max, the sample is chosen by body id, the order is by (key, id), which is unique.
So a run resumed from a snapshot in body order re-tiles into exactly the tiles of the
uninterrupted run, and the rest of the run is bit-identical. Every new tile holds at least one
body (each splitter opens its tile; the first tile holds the smallest body, which the
sample's first splitter cannot be).

:func:`cut_by_chunk` and :func:`merge_by_id` route spatial tiles back to body order, in
contiguous chunks (to write a snapshot, or return accelerations in the user's order).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .bodies import Tile
from .kernels.octree import central_box, cube_around, morton_keys

__all__ = ["SAMPLE_PER_TILE", "sample_stride", "tile_extent", "tile_boxes",
           "periodic_neighbours",
           "bounding_cube", "curve_keys",
           "key_sample", "splitters", "cut_by_splitters", "merge_parts", "cut_by_chunk",
           "merge_by_id"]

#: Sampled bodies per tile for the splitters: tiles come out within a few percent of equal.
SAMPLE_PER_TILE = 256


def sample_stride(n: int, n_tiles: int) -> int:
    """Every ``stride``-th body id is sampled: about :data:`SAMPLE_PER_TILE` per tile."""
    return max(1, n // (n_tiles * SAMPLE_PER_TILE))


def tile_extent(tile: Tile) -> np.ndarray:
    """The tile's bounding box as float64, shape (2, 3): lower and upper corner."""
    position = tile.position.astype(np.float64)
    return np.stack([position.min(axis=1), position.max(axis=1)])


def periodic_neighbours(box: float, reach: float, *extents: np.ndarray) -> list[list[int]]:
    """For each tile, in order, the tiles (itself included, ascending) whose bounding box
    (:func:`tile_extent`) comes within ``reach`` of its own in a periodic cube of side
    ``box``: the gap along each axis is the smallest over the images of the other box."""
    boxes = np.array(extents, dtype=np.float64)  # (t, 2, 3)
    lo, hi = boxes[:, 0], boxes[:, 1]
    gap = np.full((len(extents), len(extents), 3), np.inf)
    for shift in (-box, 0.0, box):
        apart = np.maximum(lo[:, None, :] - (hi[None, :, :] + shift),
                           (lo[None, :, :] + shift) - hi[:, None, :])
        gap = np.minimum(gap, np.maximum(apart, 0.0))
    near = (gap ** 2).sum(axis=2) <= reach * reach
    return [np.flatnonzero(row | (np.arange(len(extents)) == i)).tolist()
            for i, row in enumerate(near)]


def tile_boxes(tile: Tile) -> np.ndarray:
    """The tile's bounding box and the box of its central bodies
    (:func:`~nbody_dask.kernels.octree.central_box`), float64, shape (4, 3): lower and upper
    corner of each."""
    low, high = central_box(tile.position)
    return np.concatenate([tile_extent(tile), [low, high]])


def bounding_cube(*extents: np.ndarray) -> np.ndarray:
    """The cube of the keys, ``[lower corner (3), edge]`` (float64), holding every extent
    (:func:`tile_extent`); from :func:`tile_boxes`, a cube around the central bodies of all
    tiles where far outliers would make the bounding cube more than
    :data:`~nbody_dask.kernels.octree.OUTLIER_SPAN` times wider
    (:func:`~nbody_dask.kernels.octree.cube_around`: their keys are clamped to its faces)."""
    boxes = np.array(extents, dtype=np.float64)
    lo, hi = boxes[:, 0].min(axis=0), boxes[:, 1].max(axis=0)
    central = (boxes[:, 2].min(axis=0), boxes[:, 3].max(axis=0)) if len(boxes[0]) == 4 \
        else (lo, hi)  # no central box: the bounding cube itself
    corner, edge = cube_around(lo, hi, *central)
    return np.append(corner, edge)


def curve_keys(tile: Tile, cube: np.ndarray) -> np.ndarray:
    """The tile's bodies' Morton keys (uint64) in ``cube``."""
    p = tile.position
    return morton_keys(p[0], p[1], p[2], cube[:3].copy(), float(cube[3]))


def key_sample(tile: Tile, cube: np.ndarray, stride: int) -> tuple[np.ndarray, np.ndarray]:
    """(keys, ids) of the tile's bodies whose id is a multiple of ``stride``."""
    ids = tile.body_ids
    chosen = np.flatnonzero(ids % stride == 0)
    return curve_keys(tile, cube)[chosen], ids[chosen]


def splitters(n_tiles: int, *samples: tuple[np.ndarray, np.ndarray]
              ) -> tuple[np.ndarray, np.ndarray]:
    """``n_tiles - 1`` (key, id) pairs at equal ranks of the union of ``samples``.

    Raises
    ------
    ValueError
        If the samples hold fewer than ``n_tiles`` bodies (then some tile would be empty).
    """
    keys = np.concatenate([s[0] for s in samples])
    ids = np.concatenate([s[1] for s in samples])
    if keys.shape[0] < n_tiles:
        raise ValueError(f"{keys.shape[0]} sampled bodies cannot split {n_tiles} tiles")
    order = np.lexsort((ids, keys))
    ranks = np.arange(1, n_tiles) * keys.shape[0] // n_tiles
    return keys[order[ranks]], ids[order[ranks]]


@njit(cache=True)
def _bucket_of(keys, ids, split_keys, split_ids):
    """For each body, the number of splitters at or before its (key, id)."""
    n = keys.shape[0]
    s = split_keys.shape[0]
    out = np.empty(n, dtype=np.int64)
    for i in range(n):
        lo, hi = 0, s  # first splitter after (keys[i], ids[i])
        while lo < hi:
            mid = (lo + hi) // 2
            if split_keys[mid] < keys[i] or (split_keys[mid] == keys[i]
                                             and split_ids[mid] <= ids[i]):
                lo = mid + 1
            else:
                hi = mid
        out[i] = lo
    return out


def _parts(tile: Tile, bucket: np.ndarray, count: int, sort_key: tuple) -> list:
    """The tile's bodies in ``count`` parts by ``bucket``, each in ``np.lexsort(sort_key)``
    order."""
    order = np.lexsort((*sort_key, bucket))
    edges = np.searchsorted(bucket[order], np.arange(count + 1))
    return [order[edges[b]:edges[b + 1]] for b in range(count)]


def cut_by_splitters(tile: Tile, cube: np.ndarray, split: tuple[np.ndarray, np.ndarray]
                     ) -> list[tuple[np.ndarray, Tile]]:
    """The tile's bodies cut into ``len(split[0]) + 1`` parts by splitter: ``(keys, tile)``
    each, sorted by (key, id)."""
    keys, ids = curve_keys(tile, cube), tile.body_ids
    bucket = _bucket_of(keys, ids, split[0], split[1])
    return [(keys[index], tile.take(index))
            for index in _parts(tile, bucket, split[0].shape[0] + 1, (ids, keys))]


def _concatenate(tiles: list[Tile], start: int) -> Tile:
    """One tile of the bodies of ``tiles``, in order."""
    def join(name: str) -> np.ndarray | None:
        arrays = [getattr(t, name) for t in tiles]
        if any(a is None for a in arrays):
            return None
        return np.ascontiguousarray(np.concatenate(arrays, axis=-1))

    return Tile(start, join("position"), join("velocity"), join("mass"), join("acceleration"),
                join("potential"), np.concatenate([t.body_ids for t in tiles]),
                join("time_bin"), join("long_acceleration"))


def merge_parts(*parts: tuple[np.ndarray, Tile]) -> Tile:
    """A new spatial tile: the parts cut for it from every old tile, sorted by (key, id)."""
    tile = _concatenate([p[1] for p in parts], -1)
    keys = np.concatenate([p[0] for p in parts])
    return tile.take(np.lexsort((tile.body_ids, keys)))


def cut_by_chunk(tile: Tile, chunk_size: int, n_chunks: int) -> list[Tile]:
    """The tile's bodies in the ``n_chunks`` contiguous chunks of body ids they belong to,
    each sorted by id."""
    ids = tile.body_ids
    return [tile.take(index)
            for index in _parts(tile, ids // chunk_size, n_chunks, (ids,))]


def merge_by_id(start: int, *parts: Tile) -> Tile:
    """The contiguous chunk of bodies ``start, start + 1, ...`` from its parts, in id order.

    Raises
    ------
    RuntimeError
        If the parts do not hold exactly those bodies (a bug, never a user error).
    """
    tile = _concatenate(list(parts), start)
    order = np.argsort(tile.body_ids, kind="stable")
    tile = tile.take(order)
    expected = np.arange(start, start + tile.size)
    if not np.array_equal(tile.body_ids, expected):
        raise RuntimeError(f"routing to body order lost bodies in the chunk from {start}")
    return Tile(start, tile.position, tile.velocity, tile.mass, tile.acceleration,
                tile.potential, time_bin=tile.time_bin,
                long_acceleration=tile.long_acceleration)

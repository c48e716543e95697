"""The mesh's FFT as a Dask graph, for meshes that no one worker holds.

A cube mesh of ``n`` points a side, chunked along its first two axes (slabs: chunks along
axis 0 only; pencils: along axes 0 and 1), is transformed the way distributed FFT libraries
do it (FFTW-MPI, PFFT, 2decomp&FFT). Slabs (at most ``n`` chunks): a 2-D real FFT of each
slab's planes, a transpose (a rechunk, which Dask runs as an all-to-all exchange between
workers), an FFT along the first axis. Pencils (up to ``n^2`` chunks): a real FFT along the
axis every chunk holds whole (the last), a transpose, an FFT along the next axis, another
transpose, an FFT along the first axis. No task holds
more than one chunk of the pencils it passes through; nothing is gathered. The inverse runs
the same steps backwards. Each chunk's FFT is ``scipy.fft`` on one thread (the cluster's
threads run the chunks side by side); the result equals one ``scipy.fft.rfftn`` of the
whole mesh to round-off (tests/test_meshfft.py).

:func:`long_range` is :func:`nbody_dask.kernels.pm.long_range` on such a mesh: the Green's
function, the window deconvolution and the spectral gradient applied chunk by chunk in
k-space, each chunk computing its own wave numbers from its place in the spectrum.
"""

from __future__ import annotations

import dask.array as da
import numpy as np
import scipy.fft

from .kernels import pm

__all__ = ["rfftn", "irfftn", "long_range", "pencils"]

_fft = da.fft.fft_wrap(scipy.fft.fft)
_ifft = da.fft.fft_wrap(scipy.fft.ifft)
_rfft = da.fft.fft_wrap(scipy.fft.rfft)
_irfft = da.fft.fft_wrap(scipy.fft.irfft)


def pencils(mesh: np.ndarray | da.Array, parts: int, second: int | None = None) -> da.Array:
    """``mesh`` as a Dask array cut into ``parts`` chunks along its first axis and
    ``second`` (default ``parts``; 1: slabs) along its second."""
    n = mesh.shape[0]
    size = -(-n // parts)
    other = -(-n // (parts if second is None else second))
    if isinstance(mesh, da.Array):
        return mesh.rechunk((size, other, n))
    return da.from_array(mesh, chunks=(size, other, n))


def rfftn(mesh: da.Array) -> da.Array:
    """The real 3-D FFT of a cube ``mesh`` chunked along its first two axes; the spectrum
    (``n, n, n // 2 + 1``) comes chunked along its second axis (slabs) or its last two
    (pencils). Slabs take one transpose: a 2-D real FFT of each slab, then FFTs along the
    first axis."""
    first, second = mesh.chunks[0], mesh.chunks[1]
    if len(second) == 1:  # slabs: each chunk holds its planes whole
        planes = mesh.map_blocks(_rfft2, dtype=_complex(mesh.dtype),
                                 chunks=(first, second, (mesh.shape[2] // 2 + 1,)))
        planes = planes.rechunk({0: -1, 1: _like(first, mesh.shape[1])})
        return planes.map_blocks(_fft_first, dtype=planes.dtype)
    spectrum = _rfft(mesh.rechunk({2: -1}), axis=2)
    spectrum = spectrum.rechunk({0: first, 1: -1, 2: _like(second, spectrum.shape[2])})
    spectrum = _fft(spectrum, axis=1)
    spectrum = spectrum.rechunk({0: -1, 1: second, 2: spectrum.chunks[2]})
    return _fft(spectrum, axis=0)


def irfftn(spectrum: da.Array, n: int, chunks: tuple) -> da.Array:
    """The inverse of :func:`rfftn`: a real cube of ``n`` points a side, chunked as
    ``chunks`` (those of the mesh :func:`rfftn` transformed)."""
    real = _ifft(spectrum.rechunk({0: -1}), axis=0)
    if len(chunks[1]) == 1:  # slabs
        return _inverse_from_first(real, n, chunks)
    real = real.rechunk({0: chunks[0], 1: -1})
    real = _ifft(real, axis=1)
    real = real.rechunk({1: chunks[1], 2: -1})
    return _irfft(real, n=n, axis=2)


def _fft_first(block: np.ndarray) -> np.ndarray:
    """The FFT along the first axis of a chunk that a transpose just assembled (a copy
    nothing else reads: transformed in place)."""
    return scipy.fft.fft(block, axis=0, overwrite_x=True)


def _rfft2(block: np.ndarray) -> np.ndarray:
    """The real 2-D FFT of a slab's planes (axes 1 and 2)."""
    return scipy.fft.rfftn(block, axes=(1, 2))


def _irfft2(block: np.ndarray, n: int) -> np.ndarray:
    """The inverse of :func:`_rfft2`, planes of ``n x n`` points."""
    return scipy.fft.irfftn(block, s=(n, n), axes=(1, 2))


def _complex(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.complex64 if dtype == np.float32 else np.complex128)


def _real(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float32 if dtype == np.complex64 else np.float64)


def _like(chunks: tuple, length: int) -> tuple:
    """As many chunks along an axis of ``length`` as ``chunks`` has (as even as they go)."""
    parts = len(chunks)
    size = -(-length // parts)
    return tuple(min(size, length - lo) for lo in range(0, length, size))


def _green_block(block: np.ndarray, n: int, box: float, split: float, assignment: str,
                 derivative: int | None, block_info=None) -> np.ndarray:
    """One chunk of the spectrum times the long-range Green's function and ``i k`` along
    axis ``derivative`` (None: the potential's ``-1``), with the wave numbers of the chunk's
    place in the spectrum (:func:`nbody_dask.kernels.pm.green_function`,
    :func:`~nbody_dask.kernels.pm.gradient`)."""
    where = tuple(block_info[0]["array-location"])
    ftype = np.float32 if block.dtype == np.complex64 else np.float64
    k = pm.wave_numbers(n, box, ftype, where)
    green = pm.green_function(k, n, box, split, assignment)
    if derivative is None:
        return -(block * green)
    return block * green * pm.gradient(k, derivative, where, n)


def long_range(mesh: da.Array, box: float, split: float, with_potential: bool,
               assignment: str = "tsc") -> list[da.Array]:
    """The long-range accelerations (and potential) on a chunked cube ``mesh`` of masses:
    :func:`nbody_dask.kernels.pm.long_range` as a Dask graph, each field chunked as
    ``mesh``."""
    n = mesh.shape[0]
    spectrum = rfftn(mesh)
    fields = []
    slabs = len(mesh.chunks[1]) == 1
    for derivative in (0, 1, 2, None) if with_potential else (0, 1, 2):
        if slabs:  # the first inverse FFT in the task that makes the solved chunk: in
            # place, so that a field's chunk is one copy of the spectrum's, not two
            solved = spectrum.map_blocks(_solved_along_first, n, box, split, assignment,
                                         derivative, dtype=spectrum.dtype)
            fields.append(_inverse_from_first(solved, n, mesh.chunks).astype(mesh.dtype))
            continue
        solved = spectrum.map_blocks(_green_block, n, box, split, assignment, derivative,
                                     dtype=spectrum.dtype)
        fields.append(irfftn(solved, n, mesh.chunks).astype(mesh.dtype))
    return fields


def _solved_along_first(block: np.ndarray, n: int, box: float, split: float,
                        assignment: str, derivative: int | None,
                        block_info=None) -> np.ndarray:
    """:func:`_green_block`, then the inverse FFT along the first axis (which a slab
    spectrum's chunk holds whole) in place: the first step of :func:`irfftn`."""
    solved = _green_block(block, n, box, split, assignment, derivative, block_info)
    return scipy.fft.ifft(solved, axis=0, overwrite_x=True)


def _inverse_from_first(real: da.Array, n: int, chunks: tuple) -> da.Array:
    """The rest of :func:`irfftn` for slabs, after the inverse FFT along the first axis:
    the transpose back to slabs and each slab's inverse 2-D real FFT."""
    real = real.rechunk({0: chunks[0], 1: -1})
    return real.map_blocks(_irfft2, n, dtype=_real(real.dtype),
                           chunks=(chunks[0], chunks[1], (n,)))

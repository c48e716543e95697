"""Accelerations against an independent float64 NumPy direct sum.

Tolerances: float64 results agree with the oracle to round-off (max relative error
<= 1e-12). float32 results are compared with the oracle evaluated on the same float32-rounded
inputs, so that what is measured is the kernel's arithmetic (rsqrt + Newton and float32
accumulation over up to 4,099 sources): max <= 1e-4, median <= 1e-6.
"""

from __future__ import annotations

import platform
import re

import numpy as np
import pytest
from numba import njit

import nbody_dask
from nbody_dask.kernels.cpu import (_JIT, SYMMETRIC_CHUNK, _pair_accel, _self_accel,
                                    accel_potential_tile,
                                    accel_tile, self_tile_forces, symmetric_pair_forces)
from nbody_dask.kernels.shortrange import short_p2p, walk_constants
from nbody_dask.kernels.stack import align_stack
from nbody_dask.testing import direct_sum_reference, kernel_error_bound

SIZES_AND_TILES = [(1, 1), (2, 1), (2, 2), (3, 2), (17, 4), (17, 17), (1000, 250), (1000, 333),
                   (4099, 1024), (4099, 4099)]


def _relative_errors(acc, ref):
    norm = np.linalg.norm(ref, axis=1)
    return np.linalg.norm(acc - ref, axis=1) / norm


def _bodies(n, seed=0):
    return nbody_dask.plummer(n, seed=seed) if n > 2 else nbody_dask.uniform_cube(n, seed=seed)


@pytest.mark.parametrize(("n", "tile_size"), SIZES_AND_TILES)
def test_float64_matches_reference(client, n, tile_size):
    ds = _bodies(n)
    acc = nbody_dask.accelerations(ds, 0.01, dtype="float64", tile_size=tile_size, client=client)
    ref, _ = direct_sum_reference(ds.position.values, ds.mass.values, 0.01)
    assert acc.shape == (n, 3) and acc.dtype == np.float64
    if n == 1:
        assert np.all(acc == 0)
        return
    assert _relative_errors(acc, ref).max() <= 1e-12


@pytest.mark.parametrize(("n", "tile_size"), SIZES_AND_TILES)
def test_float32_matches_reference(client, n, tile_size):
    ds = _bodies(n)
    acc = nbody_dask.accelerations(ds, 0.01, dtype="float32", tile_size=tile_size, client=client)
    pos32 = ds.position.values.astype(np.float32).astype(np.float64)
    m32 = ds.mass.values.astype(np.float32).astype(np.float64)
    ref, _ = direct_sum_reference(pos32, m32, np.float32(0.01))
    assert acc.shape == (n, 3) and acc.dtype == np.float32
    if n == 1:
        assert np.all(acc == 0)
        return
    err = _relative_errors(acc.astype(np.float64), ref)
    assert err.max() <= 1e-4
    assert np.median(err) <= 1e-6


def test_float32_close_to_float64_positions(client):
    """Against the unrounded float64 inputs too, float32 stays within single precision."""
    ds = _bodies(1000, seed=5)
    acc = nbody_dask.accelerations(ds, 0.01, dtype="float32", tile_size=256, client=client)
    ref, _ = direct_sum_reference(ds.position.values, ds.mass.values, 0.01)
    err = _relative_errors(acc.astype(np.float64), ref)
    assert np.median(err) <= 1e-5 and err.max() <= 1e-3


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("nt", "ns"), [(0, 5), (5, 0), (1, 1), (3, 7), (7, 3), (9, 33)])
def test_kernels_any_length_and_dtype(dtype, nt, ns):
    rng = np.random.default_rng(nt * 100 + ns)
    t = [rng.random(nt).astype(dtype) for _ in range(3)]
    s = [rng.random(ns).astype(dtype) for _ in range(4)]
    eps2 = dtype(1e-4)
    a = accel_tile(*t, *s, eps2)
    ap = accel_potential_tile(*t, *s, eps2, False)
    assert a.shape == (3, nt) and a.dtype == dtype
    assert ap.shape == (4, nt) and ap.dtype == dtype
    if nt and ns:
        pos = np.concatenate([np.stack(t, 1), np.stack(s[:3], 1)]).astype(np.float64)
        mass = np.concatenate([np.zeros(nt), s[3]]).astype(np.float64)
        ref, phi = direct_sum_reference(pos, mass, np.sqrt(float(eps2)))
        tol = 1e-4 if dtype == np.float32 else 1e-12
        scale = np.abs(ref[:nt]).max()
        np.testing.assert_allclose(a.T, ref[:nt], rtol=tol, atol=tol * scale)
        np.testing.assert_allclose(ap[:3].T, ref[:nt], rtol=tol, atol=tol * scale)
        np.testing.assert_allclose(ap[3], phi[:nt], rtol=tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("nt", "ns"), [(1, 1), (2, 3), (3, 2), (5, 9), (8, 4),
                                        (37, SYMMETRIC_CHUNK + 5)])
def test_symmetric_kernel_gives_both_sides(dtype, nt, ns):
    """Each side equals the plain kernel's result for that side, any lengths (tail lanes and
    a source block past SYMMETRIC_CHUNK included), both dtypes, with and without potentials."""
    rng = np.random.default_rng(nt * 7 + ns)
    pt, ps = rng.random((3, nt)).astype(dtype), rng.random((3, ns)).astype(dtype)
    mt, ms = rng.random(nt).astype(dtype), rng.random(ns).astype(dtype)
    eps2 = dtype(1e-3)
    bound_t = 2 * kernel_error_bound(pt, ps, ms, eps2, dtype)
    bound_s = 2 * kernel_error_bound(ps, pt, mt, eps2, dtype)
    for with_potential in (False, True):
        on_t, on_s = symmetric_pair_forces(pt, mt, ps, ms, eps2, with_potential)
        rows = 4 if with_potential else 3
        assert on_t.shape == (rows, nt) and on_s.shape == (rows, ns)
        assert on_t.dtype == on_s.dtype == dtype
        plain = accel_potential_tile if with_potential else accel_tile
        extra = (False,) if with_potential else ()
        want_t = plain(*pt, *ps, ms, eps2, *extra)
        want_s = plain(*ps, *pt, mt, eps2, *extra)
        for got, want, bound in ((on_t, want_t, bound_t), (on_s, want_s, bound_s)):
            assert (np.abs(got - want) <= bound[:rows]).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 9,
                               pytest.param(SYMMETRIC_CHUNK + 7, marks=pytest.mark.slow)])
def test_self_tile_kernel_matches_the_diagonal_kernel(dtype, n):
    """Each pair i < j once; groups of four, their inner pairs and tails all covered.

    Both kernels leave the self term out (neither subtracts it afterwards), so they agree
    within twice the error model's bound on any CPU, and a lone body's potential is exactly
    zero in both (a subtracted ``m / eps`` left a residue on AVX-512 CPUs)."""
    rng = np.random.default_rng(n)
    p, m = rng.random((3, n)).astype(dtype), rng.random(n).astype(dtype)
    eps2 = dtype(1e-3)
    bound = 2 * kernel_error_bound(p, p, m, eps2, dtype, skip_self=True)
    for with_potential in (False, True):
        got = self_tile_forces(p, m, eps2, with_potential)
        want = (accel_potential_tile(*p, *p, m, eps2, True) if with_potential
                else accel_tile(*p, *p, m, eps2))
        assert got.shape == want.shape and got.dtype == dtype
        assert (np.abs(got - want) <= bound[:got.shape[0]]).all()
    if n == 1:
        assert (self_tile_forces(p, m, eps2, True) == 0).all()  # no self term at all
        assert (accel_potential_tile(*p, *p, m, eps2, True) == 0).all()


def test_symmetric_kernel_conserves_momentum_exactly_in_pairs():
    """m_t a_t + m_s a_s sums to round-off: the third law holds pair by pair."""
    rng = np.random.default_rng(4)
    pt, ps = rng.random((3, 50)), rng.random((3, 70))
    mt, ms = rng.random(50), rng.random(70)
    on_t, on_s = symmetric_pair_forces(pt, mt, ps, ms, 1e-4, False)
    total = (on_t * mt).sum(axis=1) + (on_s * ms).sum(axis=1)
    assert np.abs(total).max() <= 1e-12 * np.abs(on_t * mt).sum()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_zero_softening_coincident_bodies_are_finite(dtype):
    """eps = 0: the self term and exactly coincident bodies contribute zero, never NaN."""
    x = np.array([0.0, 0.0, 1.0], dtype)
    y = np.zeros(3, dtype)
    m = np.ones(3, dtype)
    a = accel_tile(x, y, y, x, y, y, m, dtype(0))
    ap = accel_potential_tile(x, y, y, x, y, y, m, dtype(0), True)
    assert np.isfinite(a).all() and np.isfinite(ap).all()
    p = np.stack([x, y, y])
    on_t, on_s = symmetric_pair_forces(p[:, :1], m[:1], p[:, 1:], m[1:], dtype(0), True)
    np.testing.assert_allclose(on_t[0], [1.0])  # the twin at the same place adds nothing
    np.testing.assert_allclose(on_s[0], [0.0, -1.0])
    np.testing.assert_allclose(a[0], [1.0, 1.0, -2.0])  # the far body pulls; the twin does not
    np.testing.assert_allclose(ap[3], [-1.0, -1.0, -2.0])


def test_diagonal_potential_excludes_self_term():
    """With eps > 0 the self term would add -m/eps; the diagonal flag removes exactly it."""
    x = np.array([0.0, 2.0])
    z = np.zeros(2)
    m = np.array([1.0, 3.0])
    phi = accel_potential_tile(x, z, z, x, z, z, m, 0.25, True)[3]  # eps = 0.5
    expected = [-3.0 / np.sqrt(4.25), -1.0 / np.sqrt(4.25)]
    np.testing.assert_allclose(phi, expected, rtol=1e-14)


def test_potential_energy_matches_reference(client):
    ds = _bodies(1000, seed=2)
    w = nbody_dask.potential_energy(ds, 0.02, tile_size=300, client=client)
    _, phi = direct_sum_reference(ds.position.values, ds.mass.values, 0.02)
    assert w == pytest.approx(0.5 * np.sum(ds.mass.values * phi), rel=1e-12)


def test_gravitational_constant_scales_forces(client):
    ds = _bodies(17)
    a1 = nbody_dask.accelerations(ds, 0.01, client=client)
    a2 = nbody_dask.accelerations(ds, 0.01, G=2.5, client=client)
    np.testing.assert_allclose(a2, 2.5 * a1, rtol=1e-15)


@pytest.mark.slow
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 assembly")
@pytest.mark.parametrize(("dtype", "packed"), [(np.float32, "ps"), (np.float64, "pd")])
def test_kernel_is_vectorised_without_float64_promotion(dtype, packed):
    """The inner loop compiles to packed SIMD arithmetic; float32 is never widened.

    A scalar inner loop would show no packed (``ps``/``pd``) arithmetic; a stray float64
    literal in the float32 path would show as float-to-double conversions (2.3x slower).
    Cached code cannot be inspected, so a fresh copy of the same function with the same
    options is compiled here.
    """
    a = np.zeros(8, dtype)
    for kernel in (accel_tile, _pair_accel, _self_accel):
        fresh = njit(**{**_JIT, "cache": False})(kernel.py_func)
        args = (a,) * (7 if kernel is accel_tile else 8)
        fresh(*args, dtype(0))
        asm = fresh.inspect_asm(fresh.signatures[0])
        for op in ("vsub", "vmul", "vfmadd231"):
            assert re.search(rf"\b{op}{packed}\b", asm), f"no packed {op}{packed}"
        if dtype == np.float32:
            assert "cvtss2sd" not in asm and "vcvtps2pd" not in asm
            assert "rsqrt" in asm  # one hardware reciprocal square root (+ Newton) per pair


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 assembly")
def test_align_stack_realigns_the_frame_of_its_caller_only():
    """A function that calls ``align_stack`` realigns its stack pointer to 64 bytes on
    entry (so its SIMD spill slots never straddle cache lines, whatever the frames above
    it); the same function without it does not, and both compute the same."""

    def plain(a):
        return a.sum()

    def aligned(a):
        align_stack()
        return a.sum()

    a = np.arange(5.0)
    realign = re.compile(r"andq\s+\$-64,\s*%rsp")
    for function, expected in ((plain, False), (aligned, True)):
        fresh = njit(cache=False)(function)
        assert fresh(a) == 10.0
        assert bool(realign.search(fresh.inspect_asm(fresh.signatures[0]))) is expected


@pytest.mark.slow
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 assembly")
@pytest.mark.parametrize("kernel", [accel_tile, accel_potential_tile, short_p2p])
def test_spilling_kernels_realign_their_stack(kernel):
    """The CPU kernels whose inner loops spill vector registers realign their frames (see
    :mod:`nbody_dask.kernels.stack`): without it the same code ran 1.25x (direct) to 1.4x
    (short range) slower whenever it was entered 16 bytes off a 32-byte boundary.
    (``short_pairs`` calls it as ``short_p2p`` does; a fresh copy takes 30 s to compile.)"""
    fresh = njit(**{**_JIT, "cache": False})(kernel.py_func)
    f = np.zeros(8, np.float32)
    if kernel is accel_tile:
        fresh(f, f, f, f, f, f, f, np.float32(0))
    elif kernel is accel_potential_tile:
        fresh(f, f, f, f, f, f, f, np.float32(0), False)
    else:
        law = walk_constants(1.0, 0.05, 0.3, np.float32)
        out = np.zeros((3, 8), np.float32)
        fresh(f, f, f, f, f, f, f, np.float32(0), law, out)
    asm = fresh.inspect_asm(fresh.signatures[0])
    assert re.search(r"andq\s+\$-64,\s*%rsp", asm)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("threads", [1, 2, None])
def test_parallel_row_kernel_equals_the_serial_kernel_bit_for_bit(dtype, threads,
                                                                  kernel_threads):
    """The rows layout's kernel: each source tile's partial equals the serial kernel's, for
    any thread count, sizes that are not multiples of the blocks, with and without the
    potential, on the diagonal too (coincident bodies with eps = 0 included)."""
    from nbody_dask.kernels import cpu, rows

    rng = np.random.default_rng(3)
    sizes = [1, 37, 2 * rows.TARGET_BLOCK + 3, 5]
    pos = [rng.normal(size=(3, s)).astype(dtype) for s in sizes]
    pos[2][:, 7] = pos[2][:, 8]  # a coincident pair inside one tile
    mass = [rng.random(s).astype(dtype) for s in sizes]
    all_pos, all_mass = np.concatenate(pos, axis=1), np.concatenate(mass)
    starts = np.cumsum([0] + sizes)
    for eps2 in (dtype(0), dtype(1e-3)):
        for i in range(len(sizes)):
            for with_potential in (False, True):
                rows.set_threads(threads)
                out = rows.row_forces(*pos[i], *all_pos, all_mass, starts, eps2,
                                      with_potential, i)
                for j in range(len(sizes)):
                    serial = cpu.tile_pair_forces(pos[i], pos[j], mass[j], eps2,
                                                  with_potential, i == j)
                    np.testing.assert_array_equal(out[j], serial)
                    assert np.isfinite(out[j]).all()


def test_parallel_row_kernel_is_safe_from_concurrent_threads():
    """Dask runs tasks on several threads of one process: the threading layer must allow
    concurrent parallel calls (Numba's default workqueue layer aborts the process)."""
    from concurrent.futures import ThreadPoolExecutor

    import numba

    from nbody_dask.kernels import rows

    rng = np.random.default_rng(4)
    pos, mass = rng.normal(size=(3, 600)), rng.random(600)
    starts = np.array([0, 300, 600])

    def call(_):
        return rows.row_forces(*pos[:, :300], *pos, mass, starts, 0.01, True, 0)

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(call, range(16)))
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])
    assert numba.threading_layer() in {"omp", "tbb"}


def test_the_softened_law_is_written_once():
    """kernels.law: 1 / sqrt(r^2 + eps^2) in the inputs' dtype, zero for coincident bodies;
    compile_for compiles the same source for another target (here: plain Python)."""
    from nbody_dask.kernels import law

    for dtype in (np.float32, np.float64):
        one, zero = dtype(1), dtype(0)
        got = law.inverse_distance(dtype(3), dtype(4), zero, dtype(0.25) ** 2, zero, one)
        assert got == one / np.sqrt(dtype(25.0625))  # computed in dtype (Numba returns float)
        assert law.inverse_distance(zero, zero, zero, zero, zero, one) == 0  # never NaN
    python = law.compile_for(lambda f: f, lambda x, one: one / np.sqrt(x) + 1)
    assert python(3.0, 4.0, 0.0, 0.0, 0.0, 1.0) == 1.2  # the other target's own sqrt
    assert python(0.0, 0.0, 0.0, 0.0, 0.0, 1.0) == 0.0

"""The Gaussian mechanism: exact privacy profile, epsilon for a delta, analytic calibration.

For a query of l2 sensitivity ``Delta`` released with noise N(0, sigma^2 I), write
``mu = Delta / sigma``. Balle & Wang (2018), "Improving the Gaussian Mechanism for
Differential Privacy: Analytical Calibration and Optimal Denoising", Theorem 8,
give the *exact* privacy profile (the smallest delta for which the mechanism is
(epsilon, delta)-DP)::

    delta(epsilon) = Phi(mu/2 - epsilon/mu) - exp(epsilon) * Phi(-mu/2 - epsilon/mu)

The profile depends on ``mu`` only and is the same for add/remove and
replace-one neighbours, provided ``Delta`` is the sensitivity under the relation
in use. It is also the profile of mu-Gaussian DP (Dong, Roth & Su 2022, Cor. 2.13),
so :func:`gdp_epsilon` shares the code.

Everything here is vectorised over numpy arrays (scalars in give a float out).
The roots (epsilon for a delta, mu for an (epsilon, delta)) are found by a
safeguarded Newton iteration written here because scipy's vectorised
``optimize.newton`` neither keeps a bracket nor returns the root on a chosen
side; here every returned value is verified on the *safe* side: the delta it
implies is <= the requested delta (see :func:`_solve_safe_root`).

Why not dp-accounting? Its ``GaussianPrivacyLoss`` computes the same profile for
one scalar at a time; a million per-token budgets need an array implementation.
The tests cross-check this module against dp-accounting's PLD accountant.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterable, Iterator

import numpy as np

from dpcl.accounting.validation import broadcast_together, check_delta, check_nonnegative, check_positive
from dpcl._threads import usable_cores
from dpcl.errors import InvalidParameterError

__all__ = [
    "ClassicGaussian",
    "classic_gaussian_sigma",
    "gaussian_delta",
    "gaussian_epsilon",
    "gaussian_sigma",
    "gaussian_sigma_stream",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_mu",
]

# the profile and its solvers, the safeguarded root finder and the scalar fast path, each in its own module;
# their names are re-exported here, where they have always been found
from dpcl.accounting.gaussian_profile import (
    _CALIBRATION_MARGIN,
    _LOG_2,
    _LOG_SQRT_2PI,
    _UNIT_ROUNDOFF,
    _asymptotic_epsilon,
    _asymptotic_mu,
    _calibrated_mu,
    _calibration_target,
    _delta_terms,
    _epsilon_from_mu,
    _log_delta,
    _log_delta_x1,
    _mu_from_epsilon,
    _scalar_or_array,
)
from dpcl.accounting.gaussian_roots import _RTOL, _solve_safe_root
from dpcl.accounting.gaussian_scalar import _LeaveFastPath, _plain_number, _s_sigma

# ---------------------------------------------------------------------------
# public API
# ---------------------------------------------------------------------------
def gaussian_delta(epsilon: Any, sigma: Any, sensitivity: Any = 1.0) -> float | np.ndarray:
    """Exact delta(epsilon) of the Gaussian mechanism (Balle & Wang 2018, Thm 8).

    ``epsilon >= 0`` (epsilon = 0 gives the total-variation distance), ``sigma > 0``,
    ``sensitivity > 0`` (l2, under the neighbouring relation in use). Broadcasts.
    """
    eps = check_nonnegative("epsilon", epsilon)
    sig = check_positive("sigma", sigma)
    sens = check_positive("sensitivity", sensitivity)
    (eps, sig, sens), scalar = broadcast_together(("epsilon", "sigma", "sensitivity"), eps, sig, sens)
    with np.errstate(over="ignore"):  # sensitivity / sigma may overflow: mu = inf is handled (delta = 1)
        mu = sens / sig
    log_d, _ = _log_delta(eps, mu)
    return _scalar_or_array(np.exp(log_d), scalar)


def gdp_delta(epsilon: Any, mu: Any) -> float | np.ndarray:
    """delta(epsilon) of mu-Gaussian DP (Dong, Roth & Su 2022, Cor. 2.13; same curve as Thm 8 above)."""
    eps = check_nonnegative("epsilon", epsilon)
    m = check_positive("mu", mu)
    (eps, m), scalar = broadcast_together(("epsilon", "mu"), eps, m)
    log_d, _ = _log_delta(eps, m)
    return _scalar_or_array(np.exp(log_d), scalar)


def gaussian_epsilon(sigma: Any, delta: Any, sensitivity: Any = 1.0) -> float | np.ndarray:
    """Smallest epsilon >= 0 with ``gaussian_delta(epsilon, sigma, sensitivity) <= delta``.

    Root of the Balle & Wang (2018) Thm 8 profile; the value returned is verified
    to satisfy the inequality (it is an upper bound). It is exact to ~1e-13 relative
    when mu = sensitivity / sigma is not tiny; for tiny mu with tiny delta the
    two Thm 8 terms cancel and the float error bound makes it conservative
    (measured: ~1e-7 relative at mu = 1e-6, delta = 1e-200; see docs/accounting.md).
    ``delta`` in (0, 1).
    """
    sig = check_positive("sigma", sigma)
    dlt = check_delta("delta", delta)
    sens = check_positive("sensitivity", sensitivity)
    (sig, dlt, sens), scalar = broadcast_together(("sigma", "delta", "sensitivity"), sig, dlt, sens)
    with np.errstate(over="ignore"):  # sensitivity / sigma may overflow: mu = inf gives epsilon = inf
        mu = sens / sig
    return _scalar_or_array(_epsilon_from_mu(mu, dlt), scalar)


def gdp_epsilon(mu: Any, delta: Any) -> float | np.ndarray:
    """Smallest epsilon with mu-GDP implying (epsilon, delta)-DP (Dong, Roth & Su 2022, Cor. 2.13)."""
    m = check_positive("mu", mu)
    dlt = check_delta("delta", delta)
    (m, dlt), scalar = broadcast_together(("mu", "delta"), m, dlt)
    return _scalar_or_array(_epsilon_from_mu(m, dlt), scalar)


def gdp_mu(epsilon: Any, delta: Any) -> float | np.ndarray:
    """Largest mu (rounded down) such that mu-GDP implies (epsilon, delta)-DP.

    Inverse of :func:`gdp_epsilon` in mu; used to turn an (epsilon, delta) budget
    into a GDP budget (e.g. by the privacy filter). Like :func:`gaussian_sigma` it
    solves for a target lowered by ~1e-10 relative so ``gdp_epsilon(gdp_mu(e, d), d) <= e``.

    An epsilon above :data:`GDP_MU_MAX_EPSILON` (1e307, where the solver's 2 epsilon would overflow) is answered
    with the mu of that epsilon (~4.5e153): a smaller mu than the exact one, so still sound (mu-GDP implies
    (1e307, delta)-DP, hence (epsilon, delta)-DP).
    """
    eps = check_positive("epsilon", epsilon)
    dlt = check_delta("delta", delta)
    (eps, dlt), scalar = broadcast_together(("epsilon", "delta"), eps, dlt)
    eps = np.minimum(eps, GDP_MU_MAX_EPSILON)
    mu = _calibrated_mu(np.ravel(eps), np.ravel(dlt)).reshape(np.shape(eps))
    return _scalar_or_array(mu, scalar)


#: Largest epsilon :func:`gdp_mu` solves for; a larger one gets this epsilon's mu (smaller than its own: sound).
GDP_MU_MAX_EPSILON = 1e307


def _sigma_block(eps: np.ndarray, dlt: np.ndarray, sens: np.ndarray) -> np.ndarray:
    """sigma for one block of flat, equally long float64 arrays (the vectorised calibration kernel).

    Every operation is elementwise, so an element's sigma does not depend on the
    block it is computed in: blocks of any size give bit-identical results.
    """

    def verify(mu: np.ndarray, idx: np.ndarray) -> np.ndarray:
        # check the sigma we will return, at the requested epsilon (not the margin one)
        sens_i = sens[idx]
        log_d, _ = _log_delta(eps[idx], sens_i / (sens_i / mu))
        return np.exp(log_d) - dlt[idx]

    def returned_mu(mu: np.ndarray, idx: np.ndarray) -> np.ndarray:
        sens_i = sens[idx]
        return sens_i / (sens_i / mu)

    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        mu = _calibrated_mu(eps, dlt, verify=verify, returned_mu=returned_mu)
        return sens / mu


#: Most budgets calibrated per block: large inputs are processed in blocks of at
#: most this many elements, so the working memory (~0.35 KB per element of a block,
#: ~12 MB per thread) does not grow with the input, and a block's arrays stay in cache.
_BLOCK = 1 << 15
#: Fewest budgets per block (a block costs ~0.3 ms of interpreter overhead).
_MIN_BLOCK = 1 << 11
#: Threads that calibrate blocks concurrently (numpy and scipy ufuncs release the
#: GIL): two at most, and no more than the cores this process may use (its affinity
#: mask, as for torch's threads: :func:`dpcl._threads.usable_cores`). Results do not depend on it: every element is computed by the same
#: elementwise operations whichever block and thread computes it.
_WORKERS = min(2, usable_cores())


#: The block threads, kept for the process's later calls: ``(pid, {workers: executor})``.
_POOLS: tuple[int, dict[int, ThreadPoolExecutor]] = (os.getpid(), {})
_POOLS_LOCK = threading.Lock()


def _pool(workers: int) -> ThreadPoolExecutor:
    """A pool of ``workers`` threads, created on first use and reused by later calls.

    New threads for every call pay their stacks' and C heaps' first page faults again (a call on 10^5
    budgets spent ~70 % more CPU time on two new threads than on one thread). A pool inherited through
    ``fork`` has no threads in the child, so each process makes its own (the pid is checked).
    """
    global _POOLS
    with _POOLS_LOCK:
        if _POOLS[0] != os.getpid():
            _POOLS = (os.getpid(), {})
        pools = _POOLS[1]
        if workers not in pools:
            pools[workers] = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dpcl-calibration")
        return pools[workers]


#: Whether :func:`_raise_malloc_thresholds` has run in this process.
_MALLOC_THRESHOLDS_RAISED = False


def _raise_malloc_thresholds() -> None:
    """Once per process (glibc only): let the C heap keep the blocks' freed temporaries instead of unmapping them.

    A block's kernel allocates and frees ~100 arrays of 8 bytes per budget (256 KiB for blocks of 2^15).
    With glibc's starting thresholds (arrays from 128 KiB get their own mapping; free memory at the heap's
    top beyond 128 KiB goes back to the kernel) most of them come back as fresh pages, and the page faults
    cost about a third of the calibration's CPU time (measured on 2^20 budgets: ~70,000 minor page faults,
    ~490 ns of CPU per budget against ~340 ns without them; ``benchmarks/CALIBRATION_THROUGHPUT.md``). glibc raises
    both thresholds itself when a program frees a mapped chunk, up to 32 MiB and 64 MiB (``mallopt(3)``,
    "dynamic mmap threshold"); freeing one chunk of just under 32 MiB here does exactly that, as any numpy
    program freeing a 32 MiB array would. Nothing else changes: no float operation, so no result; the
    process keeps up to 64 MiB of freed heap per arena instead of returning it at once. The chunk is
    allocated and freed with libc's ``malloc`` directly (not numpy, so it is not traced or touched: no
    page of it is ever resident). Elsewhere (other C libraries) it does nothing.
    """
    global _MALLOC_THRESHOLDS_RAISED
    if _MALLOC_THRESHOLDS_RAISED:
        return
    _MALLOC_THRESHOLDS_RAISED = True
    import platform

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        malloc, free = libc.malloc, libc.free
    except (OSError, AttributeError):  # no symbols to look up: the thresholds stay as they are (results unchanged)
        return
    malloc.restype, malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    free.restype, free.argtypes = None, [ctypes.c_void_p]
    chunk = malloc((32 << 20) - (64 << 10))  # below glibc's 32 MiB cap on the dynamic threshold
    if chunk:
        free(chunk)


def _flat_operand(value: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``value`` as a flat float64 array: a view when it already has ``shape``, length 1 when it is one number.

    Only an operand that truly broadcasts (neither full-size nor a single number) is copied.
    """
    value = np.asarray(value, dtype=np.float64)
    if value.size == 1:
        return value.reshape(1)
    if value.shape == shape:
        return value.reshape(-1)  # a view for C-contiguous input (memmaps included)
    return np.broadcast_to(value, shape).reshape(-1)


def _block_of(flat: np.ndarray, start: int, stop: int) -> np.ndarray:
    if flat.size == 1:
        return np.full(stop - start, flat[0])
    return np.ascontiguousarray(flat[start:stop])


def _calibrate_blocks(
    eps: np.ndarray, dlt: np.ndarray, sens: np.ndarray, out: np.ndarray, workers: int
) -> int:
    """Fill the flat ``out`` with sigmas block by block; return the first index without a finite sigma, or -1."""
    n = out.size
    # at least ~16 blocks, so the working memory stays a small fraction of the output's
    block = min(_BLOCK, max(_MIN_BLOCK, -(-n // 16)))

    def run(start: int) -> int:
        stop = min(start + block, n)
        sig = _sigma_block(_block_of(eps, start, stop), _block_of(dlt, start, stop), _block_of(sens, start, stop))
        out[start:stop] = sig
        with np.errstate(invalid="ignore"):
            bad = ~(np.isfinite(sig) & (sig > 0))
        return start + int(np.argmax(bad)) if bad.any() else -1

    starts = range(0, n, block)
    if len(starts) > 1:
        _raise_malloc_thresholds()
    if workers <= 1 or len(starts) <= 1:
        firsts = [run(s) for s in starts]
    else:
        firsts = list(_pool(workers).map(run, starts))
    bad = [i for i in firsts if i >= 0]
    return bad[0] if bad else -1


def gaussian_sigma(
    epsilon: Any, delta: Any, sensitivity: Any = 1.0, *, out: np.ndarray | None = None
) -> float | np.ndarray:
    """Analytic Gaussian calibration: the smallest sigma (up to ~1e-10 relative) that is (epsilon, delta)-DP.

    Balle & Wang (2018), Alg. 1 / Thm 8, solved here for mu = Delta / sigma by the
    safeguarded Newton iteration (vectorised: one call calibrates a million
    per-token budgets). The returned sigma always satisfies
    ``gaussian_delta(epsilon, sigma, sensitivity) <= delta``; it is computed for
    ``epsilon`` lowered by ~1e-10 relative (:func:`_calibration_target`) so that ``gaussian_epsilon(sigma, delta)`` never
    exceeds ``epsilon`` after rounding. Valid for every epsilon > 0, unlike
    :func:`classic_gaussian_sigma`.

    Arrays are calibrated in fixed-size blocks, so the working memory beyond the
    inputs and the output is bounded (~12 MB per thread) whatever their size; the
    result is the same, bit for bit, for every block size and thread count.
    ``out`` (a writable C-contiguous float64 array of the broadcast shape, e.g. a
    ``numpy.memmap``) receives the sigmas instead of a new array and is returned,
    so 10^8 budgets can be calibrated from one memory-mapped file into another.
    """
    if (
        out is None
        and _plain_number(epsilon)
        and _plain_number(delta)
        and _plain_number(sensitivity)
        and epsilon > 0
        and 0 < delta < 1
        and sensitivity > 0
    ):
        try:
            return _s_sigma(float(epsilon), float(delta), float(sensitivity))
        except (_LeaveFastPath, ZeroDivisionError, OverflowError, ValueError, FloatingPointError):
            pass  # the vectorised code below answers (and raises the typed errors)
    eps = check_positive("epsilon", epsilon)
    dlt = check_delta("delta", delta)
    sens = check_positive("sensitivity", sensitivity)
    names = ("epsilon", "delta", "sensitivity")
    try:
        shape = np.broadcast_shapes(*(np.shape(a) for a in (eps, dlt, sens)))
    except ValueError:
        broadcast_together(names, eps, dlt, sens)  # raises the typed error naming the shapes
        raise
    scalar = all(np.ndim(a) == 0 for a in (eps, dlt, sens)) and out is None
    if out is None:
        result = np.empty(shape, dtype=np.float64)
    else:
        result = _check_out(out, shape)
    flats = [_flat_operand(a, shape) for a in (eps, dlt, sens)]
    first_bad = _calibrate_blocks(*flats, result.reshape(-1), _WORKERS)
    if first_bad >= 0:
        e, d, s = (float(f[first_bad] if f.size > 1 else f[0]) for f in flats)
        raise InvalidParameterError(
            f"no finite positive sigma reaches epsilon={e!r}, delta={d!r} (sensitivity={s!r}) in floating point; "
            "use a smaller epsilon or a smaller sensitivity."
        )
    return float(result.reshape(-1)[0]) if scalar else result


def _check_out(out: Any, shape: tuple[int, ...]) -> np.ndarray:
    if not isinstance(out, np.ndarray) or out.dtype != np.float64 or not out.flags.c_contiguous:
        raise InvalidParameterError(
            "out must be a C-contiguous float64 numpy array (or numpy.memmap); "
            f"got {type(out).__name__}{'' if not isinstance(out, np.ndarray) else ' of dtype ' + str(out.dtype)}."
        )
    if out.shape != shape:
        raise InvalidParameterError(f"out must have the broadcast shape {shape} of epsilon, delta and sensitivity; got {out.shape}.")
    if not out.flags.writeable:
        raise InvalidParameterError("out must be writable (open a memmap with mode 'w+' or 'r+').")
    return out


def gaussian_sigma_stream(epsilons: Iterable[Any], delta: Any, sensitivity: Any = 1.0) -> Iterator[np.ndarray]:
    """Calibrate a stream of budget chunks: yields :func:`gaussian_sigma` of each chunk, in order.

    For token streams that never exist as one array; each yielded sigma is the one
    :func:`gaussian_sigma` gives that budget in any other call (bit for bit).
    """
    for chunk in epsilons:
        yield np.asarray(gaussian_sigma(chunk, delta, sensitivity), dtype=np.float64)


@dataclass(frozen=True)
class ClassicGaussian:
    """Classic calibration ``sigma = Delta sqrt(2 ln(1.25/delta)) / epsilon`` and whether it is a theorem there.

    ``valid`` is True only where epsilon < 1 (Dwork & Roth 2014, Thm A.1). Outside
    that range the formula is *not* a proof of (epsilon, delta)-DP; use
    :func:`gaussian_sigma`.
    """

    sigma: float | np.ndarray
    valid: bool | np.ndarray


def classic_gaussian_sigma(epsilon: Any, delta: Any, sensitivity: Any = 1.0) -> ClassicGaussian:
    """Dwork & Roth (2014), Thm A.1: sigma = Delta sqrt(2 ln(1.25/delta)) / epsilon, valid for epsilon < 1.

    The value is returned for every epsilon > 0 so that it can be compared, with
    ``valid`` saying where the theorem holds; callers must not use an invalid one.
    """
    eps = check_positive("epsilon", epsilon)
    dlt = check_delta("delta", delta)
    sens = check_positive("sensitivity", sensitivity)
    (eps, dlt, sens), scalar = broadcast_together(("epsilon", "delta", "sensitivity"), eps, dlt, sens)
    # ln(1.25) - ln(delta): 1.25 / delta overflows for delta below ~7e-309; a sigma beyond float range is inf (more
    # noise than any float: still (epsilon, delta)-DP), without a RuntimeWarning
    with np.errstate(over="ignore"):
        sigma = sens * np.sqrt(2.0 * (np.log(1.25) - np.log(dlt))) / eps
    valid = eps < 1.0
    if scalar:
        return ClassicGaussian(sigma=float(sigma), valid=bool(valid))
    return ClassicGaussian(sigma=sigma, valid=valid)



"""Streaming analytic calibration: bit-identity across blocks, threads, memmaps and scalars; memory; soundness.

``data/gaussian_sigma_reference.npz`` holds 4,000 budgets (epsilon from 1e-12 to 1e3,
delta from 1e-300 to 0.9, sensitivities from 1e-3 to 1e3) and the sigmas that
``gaussian_sigma`` returned for them, in one vectorised call, at commit ba032f1,
before calibration was split into blocks. The issue that introduced blocks asks
for results bit-identical to those: this file is that reference.

Soundness is checked against the exact Thm 8 profile of Balle & Wang (2018)
evaluated here in mpmath with enough digits for its cancellation.
"""

from __future__ import annotations

import math
import os
import platform
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import dpcl.accounting.gaussian as gauss
from dpcl.accounting.gaussian import gaussian_sigma, gaussian_sigma_stream
from dpcl.errors import InvalidParameterError
from dpcl.guarantees import per_token as pt

REFERENCE = Path(__file__).parent / "data" / "gaussian_sigma_reference.npz"


def bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float64).view(np.int64)


@pytest.fixture(scope="module")
def reference() -> dict[str, np.ndarray]:
    with np.load(REFERENCE) as data:
        return {k: data[k] for k in data.files}


def test_sigmas_are_bit_identical_to_the_unblocked_calibration(reference: dict[str, np.ndarray]) -> None:
    sigma = gaussian_sigma(reference["epsilon"], reference["delta"], reference["sensitivity"])
    assert np.array_equal(bits(sigma), bits(reference["sigma"]))


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("n", [1, 2, 63, 64, 65, 127, 128, 129, 1000, 1025])
def test_block_boundaries_do_not_change_any_bit(
    monkeypatch: pytest.MonkeyPatch, reference: dict[str, np.ndarray], n: int, workers: int
) -> None:
    monkeypatch.setattr(gauss, "_BLOCK", 64)
    monkeypatch.setattr(gauss, "_MIN_BLOCK", 64)
    monkeypatch.setattr(gauss, "_WORKERS", workers)
    idx = np.arange(n) % reference["epsilon"].size
    eps, delta, sens = (reference[k][idx] for k in ("epsilon", "delta", "sensitivity"))
    assert np.array_equal(bits(gaussian_sigma(eps, delta, sens)), bits(reference["sigma"][idx]))
    # a scalar delta and sensitivity broadcast against per-token budgets: the same bits as one kernel call
    whole = gauss._sigma_block(eps, np.full(n, 1e-5), np.full(n, 2.0))
    assert np.array_equal(bits(gaussian_sigma(eps, 1e-5, 2.0)), bits(whole))


@pytest.mark.parametrize("extra", [-1, 0, 1])
def test_library_blocks_and_threads_give_the_same_bits(monkeypatch: pytest.MonkeyPatch, extra: int) -> None:
    # the library's own block size (no patching): 16 full blocks and one element more or less, so the last
    # block is full, short by one, or a single budget; two threads against one, element by element
    n = 16 * gauss._BLOCK + extra
    eps = np.random.default_rng(29 + extra).uniform(0.5, 8.0, n)
    eps[:: 997] = 10.0 ** np.random.default_rng(7).uniform(-6, 3, eps[:: 997].size)  # some extreme budgets too
    sigmas = {}
    for workers in (1, 2):
        monkeypatch.setattr(gauss, "_WORKERS", workers)
        sigmas[workers] = gaussian_sigma(eps, 1e-5)
    assert np.array_equal(bits(sigmas[1]), bits(sigmas[2]))
    # and the budgets on either side of every block edge are what one kernel call on them alone gives
    edges = np.arange(gauss._BLOCK, n, gauss._BLOCK)
    around = np.unique(np.concatenate([edges - 1, edges, [0, n - 1]]))
    alone = gauss._sigma_block(eps[around], np.full(around.size, 1e-5), np.ones(around.size))
    assert np.array_equal(bits(sigmas[2][around]), bits(alone))


def _calibrate_in_child(eps: np.ndarray, expected: np.ndarray) -> None:
    os._exit(0 if np.array_equal(bits(gaussian_sigma(eps, 1e-5)), bits(expected)) else 1)


def test_block_threads_work_in_a_forked_child(monkeypatch: pytest.MonkeyPatch) -> None:
    # the block threads are kept between calls; a child made by fork inherits the pool but not its threads
    import multiprocessing

    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("no fork on this platform")
    monkeypatch.setattr(gauss, "_WORKERS", 2)
    eps = np.random.default_rng(4).uniform(0.5, 8.0, 5000)  # 3 blocks of at most 2,048
    expected = gaussian_sigma(eps, 1e-5)  # the pool exists in this process now
    child = multiprocessing.get_context("fork").Process(target=_calibrate_in_child, args=(eps, expected))
    child.start()
    child.join(120)
    if child.is_alive():
        child.kill()
        child.join()
        pytest.fail("the calibration in the forked child did not finish (its inherited pool has no threads)")
    assert child.exitcode == 0


FAULTS_SCRIPT = """
import resource, sys
import numpy as np
import dpcl.accounting.gaussian as gauss
gauss._WORKERS = 1
if sys.argv[1] == "skip":
    gauss._MALLOC_THRESHOLDS_RAISED = True  # as if it had run: glibc keeps its starting thresholds
eps = np.empty(1 << 18)
np.random.default_rng(0).random(out=eps)  # no temporaries: nothing raises glibc's thresholds before the call
eps *= 7.5
eps += 0.5
out = np.empty_like(eps)
gauss.gaussian_sigma(eps, 1e-5, out=out)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
gauss.gaussian_sigma(eps, 1e-5, out=out)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def test_blocks_reuse_the_c_heap_instead_of_faulting_pages_in() -> None:
    # glibc returns freed temporaries to the kernel at its starting thresholds, and every block faults them in
    # again (a third of the CPU time); the driver raises the thresholds once per process
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        pytest.skip("the C heap's thresholds are glibc's")
    faults = {}
    for mode in ("raise", "skip"):
        done = subprocess.run([sys.executable, "-c", FAULTS_SCRIPT, mode], capture_output=True, text=True, check=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
        faults[mode] = int(done.stdout.split()[-1])
    # 8 blocks of 2^15 budgets: ~17,000 minor faults per call at the starting thresholds, none after
    assert faults["skip"] > 4000, faults
    assert faults["raise"] < faults["skip"] / 10, faults


def test_shapes_broadcast_blockwise_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gauss, "_BLOCK", 7)
    monkeypatch.setattr(gauss, "_MIN_BLOCK", 7)
    eps = np.linspace(0.5, 8.0, 30).reshape(5, 6)
    delta = np.array([1e-5, 1e-6, 1e-7, 1e-8, 1e-9, 1e-10])
    sens = np.array([[1.0], [2.0], [0.5], [3.0], [1.5]])
    sigma = gaussian_sigma(eps, delta, sens)
    assert sigma.shape == (5, 6)
    e, d, s = np.broadcast_arrays(eps, delta, sens)
    expected = [gaussian_sigma(float(a), float(b), float(c)) for a, b, c in zip(e.ravel(), d.ravel(), s.ravel())]
    assert np.array_equal(bits(sigma.ravel()), bits(np.array(expected)))
    with pytest.raises(InvalidParameterError, match="broadcast"):
        gaussian_sigma(np.ones(3), np.full(4, 1e-5))


def test_memmap_in_and_out(tmp_path: Path, reference: dict[str, np.ndarray]) -> None:
    n = reference["epsilon"].size
    eps_file = np.memmap(tmp_path / "eps.f64", dtype=np.float64, mode="w+", shape=(n,))
    eps_file[:] = reference["epsilon"]
    eps_file.flush()
    eps_in = np.memmap(tmp_path / "eps.f64", dtype=np.float64, mode="r", shape=(n,))
    out = np.memmap(tmp_path / "sigma.f64", dtype=np.float64, mode="w+", shape=(n,))
    returned = gaussian_sigma(eps_in, reference["delta"], reference["sensitivity"], out=out)
    assert returned is out
    out.flush()
    back = np.fromfile(tmp_path / "sigma.f64", dtype=np.float64)
    assert np.array_equal(bits(back), bits(reference["sigma"]))


def test_out_is_checked() -> None:
    with pytest.raises(InvalidParameterError, match="shape"):
        gaussian_sigma(np.ones(3), 1e-5, out=np.empty(4))
    with pytest.raises(InvalidParameterError, match="float64"):
        gaussian_sigma(np.ones(3), 1e-5, out=np.empty(3, dtype=np.float32))
    with pytest.raises(InvalidParameterError, match="C-contiguous"):
        gaussian_sigma(np.ones(3), 1e-5, out=np.empty(6)[::2])
    read_only = np.empty(3)
    read_only.flags.writeable = False
    with pytest.raises(InvalidParameterError, match="writable"):
        gaussian_sigma(np.ones(3), 1e-5, out=read_only)
    # the error for a budget with no finite sigma names that budget, wherever its block is
    sens = np.full(100, 1.0)
    sens[77] = sens[91] = 1e308
    eps = np.full(100, 2.0)
    eps[77] = 0.5
    with pytest.raises(InvalidParameterError, match="epsilon=0.5, delta=1e-05 [(]sensitivity=1e[+]308[)]"):
        gaussian_sigma(eps, 1e-5, sens)


def test_stream_yields_each_chunks_sigmas(reference: dict[str, np.ndarray]) -> None:
    eps = reference["epsilon"]
    chunks = (eps[i : i + 333] for i in range(0, eps.size, 333))
    streamed = np.concatenate(list(gaussian_sigma_stream(chunks, 1e-6, 3.0)))
    assert np.array_equal(bits(streamed), bits(gaussian_sigma(eps, 1e-6, 3.0)))


def test_analytic_token_sigmas_blockwise_equal_gaussian_sigma() -> None:
    rng = np.random.default_rng(3)
    n = (1 << 16) + 5  # one block of 2^16 budgets and a short one
    eps = np.round(rng.uniform(0.5, 8.0, n), 2)  # repeated budgets, across both blocks
    sigma = pt.analytic_token_sigmas(eps, 1e-6, 0.5, releases=3)
    expected = gaussian_sigma(eps, 1e-6, 2 * 0.5 * math.sqrt(3))
    assert np.array_equal(bits(sigma), bits(expected))


def peak_beyond_output(n: int) -> float:
    eps = np.random.default_rng(0).uniform(0.5, 8.0, n)
    tracemalloc.start()
    try:
        gaussian_sigma(eps, 1e-5)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak - 8.0 * n


def test_working_memory_is_bounded_and_small_per_budget() -> None:
    small, large = peak_beyond_output(200_000), peak_beyond_output(2_000_000)
    assert small <= 64 * 200_000
    assert large <= 64 * 2_000_000
    # bounded: ten times the budgets, not ten times the working memory
    assert large <= 40e6


def mp_sound(eps: float, delta: float, sigma: float, sens: float) -> bool:
    """Exact Thm 8 delta at (eps, sigma) in mpmath, with digits for its cancellation (~|log10 delta|)."""
    import mpmath

    with mpmath.workdps(40 + int(-math.log10(delta))):
        mu = mpmath.mpf(sens) / mpmath.mpf(sigma)
        e = mpmath.mpf(eps)
        true_delta = mpmath.ncdf(mu / 2 - e / mu) - mpmath.exp(e) * mpmath.ncdf(-mu / 2 - e / mu)
        return bool(true_delta <= mpmath.mpf(delta))


def random_budgets(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Half the quality-bar setting (eps ~ U[0.5, 8], delta = 1e-5), half extremes of eps, delta, sensitivity."""
    rng = np.random.default_rng(seed)
    half = n // 2
    eps = np.concatenate([rng.uniform(0.5, 8.0, half), 10.0 ** rng.uniform(-12, 3, n - half)])
    delta = np.concatenate([np.full(half, 1e-5), 10.0 ** rng.uniform(-300, math.log10(0.9), n - half)])
    sens = np.concatenate([np.ones(half), 10.0 ** rng.uniform(-3, 3, n - half)])
    return eps, delta, sens


def check_soundness(n: int, seed: int) -> None:
    pytest.importorskip("mpmath")
    eps, delta, sens = random_budgets(n, seed)
    sigma = gaussian_sigma(eps, delta, sens)
    over = [i for i in range(n) if not mp_sound(eps[i], delta[i], sigma[i], sens[i])]
    assert over == []


def test_every_sigma_is_sound_against_mpmath() -> None:
    check_soundness(400, seed=11)


@pytest.mark.thorough
def test_every_sigma_is_sound_against_mpmath_thorough() -> None:
    check_soundness(10_000, seed=12)


# ---------------------------------------------------------------------------
# scalar calls: a fast path for three numbers, the same bits as the arrays
# ---------------------------------------------------------------------------
def test_scalar_calls_return_the_vectorised_bits(reference: dict[str, np.ndarray]) -> None:
    eps, delta, sens, sigma = (reference[k] for k in ("epsilon", "delta", "sensitivity", "sigma"))
    scalar = np.array([gaussian_sigma(float(a), float(b), float(c)) for a, b, c in zip(eps, delta, sens)])
    assert np.array_equal(bits(scalar), bits(sigma))
    # numpy scalars and ints take the same path
    assert gaussian_sigma(np.float64(eps[0]), np.float32(0.5), 1) == gaussian_sigma(np.array([eps[0]]), 0.5, 1.0)[0]
    # the fast path answers nearly every budget itself (the rest go to the vectorised code)
    answered = 0
    for a, b, c in zip(eps, delta, sens):
        try:
            gauss._s_sigma(float(a), float(b), float(c))
            answered += 1
        except (gauss._LeaveFastPath, ZeroDivisionError, OverflowError, ValueError):
            pass
    assert answered >= 0.95 * eps.size


def test_scalar_calls_match_arrays_on_random_budgets() -> None:
    rng = np.random.default_rng(5)
    n = 3000
    eps = np.concatenate([rng.uniform(0.05, 10.0, n // 2), 10.0 ** rng.uniform(-8, 2.5, n - n // 2)])
    delta = 10.0 ** rng.uniform(-20, -1, n)
    sens = np.where(rng.random(n) < 0.5, 1.0, 10.0 ** rng.uniform(-2, 2, n))
    vector = gaussian_sigma(eps, delta, sens)
    scalar = np.array([gaussian_sigma(float(a), float(b), float(c)) for a, b, c in zip(eps, delta, sens)])
    assert np.array_equal(bits(scalar), bits(vector))


def test_scalar_invalid_input_still_raises_typed_errors() -> None:
    for args, name in [((0.0, 1e-5), "epsilon"), ((1.0, 1.0), "delta"), ((1.0, 1e-5, -1), "sensitivity"),
                       ((float("nan"), 1e-5), "epsilon"), ((10**400, 1e-5), "epsilon"), ((True, 1e-5), "epsilon")]:
        with pytest.raises(InvalidParameterError, match=name):
            gaussian_sigma(*args)
    with pytest.raises(InvalidParameterError, match="no finite positive sigma"):
        gaussian_sigma(1.0, 1e-5, 1e308)


def test_large_inputs_are_validated_in_chunks_with_the_same_errors() -> None:
    # the checks look at 2^20 elements at a time; a bad element past the first chunk is still named
    eps = np.full(3 << 20, 2.0)
    eps[2_500_000] = -1.0
    with pytest.raises(InvalidParameterError, match=r"epsilon must be > 0 and finite, got -1.0 \(element 2500000 "):
        gaussian_sigma(eps, 1e-5)
    eps[2_500_000] = np.inf
    with pytest.raises(InvalidParameterError, match=r"epsilon must be finite, got inf \(element 2500000 "):
        gaussian_sigma(eps, 1e-5)
    eps[2_500_000] = 2.0
    delta = np.full(eps.size, 1e-5)
    delta[-1] = 1.0
    with pytest.raises(InvalidParameterError, match=rf"delta must lie in \(0, 1\), got 1.0 \(element {eps.size - 1} "):
        gaussian_sigma(eps, delta)


@given(
    eps=st.floats(min_value=1e-12, max_value=1e3),
    delta=st.floats(min_value=1e-300, max_value=0.99),
    sens=st.floats(min_value=1e-3, max_value=1e3),
)
def test_property_scalar_call_is_the_array_element(eps: float, delta: float, sens: float) -> None:
    try:
        vector = gaussian_sigma(np.array([eps]), delta, sens)[0]
    except InvalidParameterError:
        with pytest.raises(InvalidParameterError):
            gaussian_sigma(eps, delta, sens)
        return
    assert bits(np.array([gaussian_sigma(eps, delta, sens)]))[0] == bits(np.array([vector]))[0]


def test_scalar_path_under_strict_numpy_error_settings(reference: dict[str, np.ndarray]) -> None:
    # a caller's np.errstate(all="raise") must not turn the scalar path's float events into errors
    eps, delta, sens, sigma = (reference[k][:300] for k in ("epsilon", "delta", "sensitivity", "sigma"))
    with np.errstate(all="raise"):
        scalar = np.array([gaussian_sigma(float(a), float(b), float(c)) for a, b, c in zip(eps, delta, sens)])
    assert np.array_equal(bits(scalar), bits(sigma))

"""Analytic calibration on torch tensors: agrees with the numpy calibration to rounding, and is sound.

Tolerance: the torch port runs the same algorithm with torch's ``log_ndtr``, ``exp`` and
``log`` in place of scipy's and numpy's, which may differ in the last bits. Every sigma is
the end of a safeguarded iteration that stops within ~1e-15 relative of its root and
moves 1e-13 toward the safe side, so the two agree to ~1e-13 relative where the profile
is well conditioned. For tiny epsilon with tiny mu the two Thm 8 terms cancel and the
float-error bounds decide the answer (the float profile itself resolves epsilon to only
~1e-7 relative there, see ``gaussian_epsilon``), so ulp differences are amplified. Stated
tolerances: 1e-9 relative for epsilon >= 1e-6, 1e-5 relative below (measured: at most
6e-7, at epsilon = 2.4e-12). Soundness is checked in mpmath, as for the numpy
calibration (``tests/accounting/test_gaussian_stream.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dpcl.accounting.gaussian import gaussian_sigma
from dpcl.errors import InvalidParameterError
from dpcl.methods.gaussian_torch import gaussian_sigma_torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# the numpy calibration's test budgets and its mpmath reference, shared
from accounting.test_gaussian_stream import mp_sound, random_budgets  # noqa: E402

RTOL = 1e-9
#: below this epsilon the profile is ill conditioned (see the module docstring)
TINY_EPSILON, TINY_RTOL = 1e-6, 1e-5
REFERENCE = Path(__file__).resolve().parents[1] / "accounting" / "data" / "gaussian_sigma_reference.npz"
CUDA = torch.cuda.is_available()


def relative_difference(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a / b - 1.0)))


def assert_agrees(got: np.ndarray, expected: np.ndarray, eps: np.ndarray) -> None:
    eps = np.broadcast_to(eps, expected.shape)
    ordinary = eps >= TINY_EPSILON
    assert relative_difference(got[ordinary], expected[ordinary]) <= RTOL
    assert relative_difference(got, expected) <= TINY_RTOL


@pytest.fixture(scope="module")
def reference() -> dict[str, np.ndarray]:
    with np.load(REFERENCE) as data:
        return {k: data[k] for k in data.files}


def test_agrees_with_numpy_on_the_reference_budgets(reference: dict[str, np.ndarray]) -> None:
    # 4,000 budgets: epsilon 1e-12 to 1e3, delta 1e-300 to 0.9, sensitivity 1e-3 to 1e3
    eps, delta, sens = (torch.from_numpy(reference[k]) for k in ("epsilon", "delta", "sensitivity"))
    sigma = gaussian_sigma_torch(eps, delta, sens)
    assert sigma.dtype == torch.float64 and sigma.device == eps.device
    assert_agrees(sigma.numpy(), reference["sigma"], reference["epsilon"])


@pytest.mark.parametrize("seed", [1, 2])
def test_agrees_with_numpy_on_random_budgets_with_extremes(seed: int) -> None:
    eps, delta, sens = random_budgets(6000, seed)
    got = gaussian_sigma_torch(eps, delta, sens).numpy()
    assert_agrees(got, gaussian_sigma(eps, delta, sens), eps)
    # one shared delta and sensitivity (per-token budgets): the well-conditioned half agrees to ~1e-13
    common = gaussian_sigma_torch(torch.from_numpy(eps[:3000]), 1e-5).numpy()
    assert relative_difference(common, gaussian_sigma(eps[:3000], 1e-5)) <= 1e-12


def test_every_sigma_is_sound_against_mpmath() -> None:
    pytest.importorskip("mpmath")
    eps, delta, sens = random_budgets(400, seed=7)
    sigma = gaussian_sigma_torch(eps, delta, sens).numpy()
    over = [i for i in range(eps.size) if not mp_sound(eps[i], delta[i], sigma[i], sens[i])]
    assert over == []


def test_blocks_out_and_numpy_input() -> None:
    eps, delta, sens = random_budgets(1000, seed=3)
    whole = gaussian_sigma_torch(eps, delta, sens)
    out = torch.empty(1000, dtype=torch.float64)
    returned = gaussian_sigma_torch(eps, delta, sens, out=out, block=97)
    assert returned is out
    assert_agrees(out.numpy(), whole.numpy(), eps)
    # shapes broadcast as in gaussian_sigma; a number in gives a 0-d tensor
    grid = gaussian_sigma_torch(np.linspace(0.5, 8.0, 12).reshape(3, 4), np.array([1e-5, 1e-6, 1e-7, 1e-8]), 2.0)
    assert grid.shape == (3, 4)
    expected = gaussian_sigma(np.linspace(0.5, 8.0, 12).reshape(3, 4), np.array([1e-5, 1e-6, 1e-7, 1e-8]), 2.0)
    assert relative_difference(grid.numpy(), expected) <= RTOL
    assert gaussian_sigma_torch(1.0, 1e-5).shape == ()
    assert float(gaussian_sigma_torch(1.0, 1e-5)) == pytest.approx(gaussian_sigma(1.0, 1e-5), rel=RTOL)


def test_memmap_in(tmp_path: Path) -> None:
    eps = np.memmap(tmp_path / "eps.f64", dtype=np.float64, mode="w+", shape=(500,))
    eps[:] = np.linspace(0.5, 8.0, 500)
    sigma = gaussian_sigma_torch(eps, 1e-5, block=64)
    assert relative_difference(sigma.numpy(), gaussian_sigma(np.asarray(eps), 1e-5)) <= 1e-12


@pytest.mark.parametrize(
    ("epsilon", "delta", "sensitivity", "match"),
    [
        (np.array([1.0, 0.0]), 1e-5, 1.0, "epsilon"),
        (np.array([1.0, np.nan]), 1e-5, 1.0, "epsilon"),
        (1.0, 1.0, 1.0, "delta"),
        (np.ones(3), np.array([1e-5, 0.0, 1e-5]), 1.0, "delta"),
        (1.0, 1e-5, -1.0, "sensitivity"),
        (np.ones(3), np.full(4, 1e-5), 1.0, "broadcast"),
        ("one", 1e-5, 1.0, "epsilon"),
    ],
)
def test_invalid_input_raises_typed_errors(epsilon: object, delta: object, sensitivity: object, match: str) -> None:
    with pytest.raises(InvalidParameterError, match=match):
        gaussian_sigma_torch(epsilon, delta, sensitivity)


def test_out_is_checked() -> None:
    with pytest.raises(InvalidParameterError, match="out must"):
        gaussian_sigma_torch(np.ones(3), 1e-5, out=torch.empty(4, dtype=torch.float64))
    with pytest.raises(InvalidParameterError, match="out must"):
        gaussian_sigma_torch(np.ones(3), 1e-5, out=torch.empty(3, dtype=torch.float32))


def test_no_finite_sigma_is_refused_like_numpy() -> None:
    with pytest.raises(InvalidParameterError, match="no finite positive sigma"):
        gaussian_sigma(np.ones(2), 1e-5, np.array([1.0, 1e308]))
    with pytest.raises(InvalidParameterError, match="no finite positive sigma"):
        gaussian_sigma_torch(np.ones(2), 1e-5, np.array([1.0, 1e308]))


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_cuda_agrees_with_numpy_and_streams_from_the_host() -> None:
    eps, delta, sens = random_budgets(6000, seed=4)
    on_device = gaussian_sigma_torch(torch.from_numpy(eps).cuda(), torch.from_numpy(delta).cuda(), torch.from_numpy(sens).cuda())
    assert on_device.is_cuda
    assert_agrees(on_device.cpu().numpy(), gaussian_sigma(eps, delta, sens), eps)
    streamed = gaussian_sigma_torch(eps[:3000], 1e-5, device="cuda", block=512)
    assert streamed.device.type == "cpu"
    assert relative_difference(streamed.numpy(), gaussian_sigma(eps[:3000], 1e-5)) <= 1e-12
    pytest.importorskip("mpmath")
    sample = on_device.cpu().numpy()
    assert all(mp_sound(eps[i], delta[i], sample[i], sens[i]) for i in range(0, 6000, 30))

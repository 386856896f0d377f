import numpy as np
import pytest
from audit_reference import gaussian_sigma_closed_form
from hypothesis import given, settings

from dpcl.accounting.events import GaussianEvent
from dpcl.accounting.validation import check_delta, check_positive
from dpcl.audit.strategies import (
    NORM_MARGIN,
    deltas,
    epsilons,
    gaussian_parameters,
    laplace_parameters,
    neighbouring_datasets,
    sensitivities,
    sigmas,
)
from dpcl.errors import InvalidParameterError


@given(eps=epsilons(0.05, 5.0), delta=deltas(1e-9, 0.5), sigma=sigmas(), sens=sensitivities())
def test_scalar_parameters_are_valid_and_in_range(eps, delta, sigma, sens):
    assert 0.05 <= eps <= 5.0 and 1e-9 <= delta < 0.5
    check_positive("epsilon", eps)
    check_delta("delta", delta)
    GaussianEvent(sigma=sigma, sensitivity=sens)  # the events layer accepts them


@given(p=gaussian_parameters(max_epsilon=10.0))
def test_gaussian_parameters_can_be_calibrated(p):
    sigma = gaussian_sigma_closed_form(p.epsilon, p.delta, p.sensitivity)
    assert np.isfinite(sigma) and sigma > 0


@given(p=laplace_parameters())
def test_laplace_parameters(p):
    assert p.epsilon > 0 and p.sensitivity > 0


@given(pair=neighbouring_datasets("add_remove", dim=4, norm_bound=2.0))
def test_add_remove_pairs_differ_by_one_bounded_record(pair):
    big, small = (pair.neighbour, pair.dataset) if pair.change == "add" else (pair.dataset, pair.neighbour)
    assert big.shape[0] == small.shape[0] + 1
    assert np.array_equal(np.delete(big, pair.index, axis=0), small)
    for data in (pair.dataset, pair.neighbour):
        assert np.all(np.linalg.norm(data, axis=1) <= 2.0)
    # the sum query moves by at most the norm bound
    assert np.linalg.norm(big.sum(0) - small.sum(0)) <= pair.sum_sensitivity * (1 + 1e-9)


@given(pair=neighbouring_datasets("replace_one", dim=3, norm="l1", norm_bound=0.5))
def test_replace_one_pairs_and_l1_norm(pair):
    assert pair.dataset.shape == pair.neighbour.shape
    differ = np.any(pair.dataset != pair.neighbour, axis=1)
    assert differ.sum() <= 1 and not np.any(differ[np.arange(differ.size) != pair.index])
    assert np.all(np.abs(pair.neighbour).sum(axis=1) <= 0.5)
    assert np.abs(pair.neighbour.sum(0) - pair.dataset.sum(0)).sum() <= pair.sum_sensitivity * (1 + 1e-9)


def test_records_on_the_norm_boundary_are_generated():
    from hypothesis import find

    pair = find(
        neighbouring_datasets("replace_one", dim=2),
        lambda p: np.any(np.linalg.norm(p.dataset, axis=1) >= 1 - 2 * NORM_MARGIN),
    )
    assert np.max(np.linalg.norm(pair.dataset, axis=1)) <= 1.0


@pytest.mark.parametrize(
    "make, word",
    [
        (lambda: epsilons(0.0, 1.0), "epsilon"),
        (lambda: epsilons(2.0, 1.0), "epsilon"),
        (lambda: deltas(1e-5, 1.0), "delta"),
        (lambda: sigmas(float("nan"), 1.0), "sigma"),
        (lambda: neighbouring_datasets("neighbours"), "adjacency"),
        (lambda: neighbouring_datasets(norm="linf"), "norm"),
        (lambda: neighbouring_datasets(dim=0), "dim"),
        (lambda: neighbouring_datasets(min_size=5, max_size=2), "max_size"),
        (lambda: neighbouring_datasets(norm_bound=-1.0), "norm_bound"),
    ],
)
def test_invalid_strategy_arguments_are_refused(make, word):
    with pytest.raises(InvalidParameterError, match=word):
        make()


def test_norm_bound_error_names_the_argument():
    with pytest.raises(InvalidParameterError, match=r"norm_bound must be a finite number > 0, got inf"):
        neighbouring_datasets(norm_bound=float("inf"))


@settings(max_examples=5, deadline=None)
@given(pair=neighbouring_datasets(min_size=np.int64(2), max_size=np.int64(3), dim=np.int64(2)))
def test_numpy_integer_sizes_are_accepted(pair):
    assert 2 <= len(pair.dataset) <= 3 and pair.dataset.shape[1] == 2

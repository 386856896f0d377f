"""Every public function of :mod:`dpcl.accounting` and every event constructor, given any Python or numpy number.

Each parameter of each function is given, with the others valid, numbers at the edges of float64 and beyond: 400-digit
integers, 1e308, 5e-324, NaN, +-inf, negatives, numpy scalars and a broadcast array of 10^10 elements (which costs
nothing until it is read). Each call returns a sound number (never NaN, no RuntimeWarning) or raises a
:class:`~dpcl.errors.DpclError` naming the parameter; never a bare OverflowError, MemoryError or ZeroDivisionError.
The extremes are explicit examples of every case; hypothesis adds random floats and integers (more under
``DPCL_THOROUGH=1``). The calibrations' searches take seconds per extreme, so their cases are thorough only.
"""

from __future__ import annotations

import inspect
import math
import os
import warnings
from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import dpcl.accounting as acc
from dpcl.errors import DpclError

THOROUGH_EXAMPLES = 200
EXTREMES: list[Any] = [
    10**400, -(10**400), 1e308, -1e308, 5e-324, float("nan"), float("inf"), float("-inf"), -1.0, 0, 0.0,
    np.float32(1e-5), np.float32("nan"), np.int64(2**62), np.float64(1e308), np.uint8(3), np.float16(6e4),
    np.broadcast_to(1.0, (10**10,)), np.broadcast_to(np.nan, (10**10,)),
]

#: A valid value of every numeric parameter of the public API, by name (a new parameter must be added here).
VALID: dict[str, Any] = {
    "epsilon": 1.0, "delta": 1e-5, "sigma": 2.0, "sensitivity": 1.0, "mu": 1.0, "scale": 2.0, "noise_multiplier": 1.0,
    "sample_rate": 0.01, "steps": 100, "target_epsilon": 2.0, "count": 3, "sigmas": [1.0, 2.0], "epsilons": [1.0, 0.5],
    "deltas": [1e-6, 1e-7], "delta_slack": 1e-6, "sensitivities": 1.0, "rtol": 1e-3, "epsilon_budget": 1.0,
    "delta_budget": 1e-5, "epsilon0": 1.0,
}
#: Parameters that are not numbers (events, names, choices).
NOT_NUMBERS = {"accountant", "adjacency", "unit", "event", "events", "data", "rule", "self", "out"}


def _privacy_filter_gdp(epsilon_budget: Any, delta_budget: Any) -> float | None:
    return acc.PrivacyFilter(epsilon_budget, delta_budget, "gdp").mu_budget


def _privacy_filter_basic(epsilon_budget: Any, delta_budget: Any) -> float:
    return acc.PrivacyFilter(epsilon_budget, delta_budget, "basic").remaining.epsilon


def _functions() -> dict[str, Callable[..., Any]]:
    out: dict[str, Callable[..., Any]] = {}
    for name in acc.__all__:
        obj = getattr(acc, name)
        if not callable(obj):
            continue
        if isinstance(obj, type) and not (issubclass(obj, acc.PrivacyEvent) and obj is not acc.PrivacyEvent):
            continue  # result types and PrivacyFilter (below, with each rule)
        if name in ("event_from_dict", "RepeatedEvent", "ComposedEvent"):
            continue  # take events or dicts of them: RepeatedEvent's count is a case below
        out[name] = obj
    out["RepeatedEvent"] = lambda count: acc.RepeatedEvent(acc.GaussianEvent(sigma=2.0), count)
    out["PrivacyFilter(gdp)"] = _privacy_filter_gdp
    out["PrivacyFilter(basic)"] = _privacy_filter_basic
    return out


FUNCTIONS = _functions()


#: Functions whose every call is a search taking seconds (the calibrations): their extremes run in thorough mode.
SEARCHES = ("dpsgd_noise_multiplier",)


def _cases(searches: bool) -> list[Any]:
    cases = []
    for name, fn in FUNCTIONS.items():
        if (name in SEARCHES) != searches:
            continue
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in NOT_NUMBERS]
        for p in params:
            cases.append(pytest.param(name, p.name, id=f"{name}-{p.name}"))
    return cases


def _numbers(result: Any) -> list[float]:
    """Every float a result states (its fields, arrays up to a million elements)."""
    values: list[float] = []
    if isinstance(result, (bool, type(None), str)):
        return values
    if isinstance(result, (float, int, np.number)):
        return [float(result)]
    if isinstance(result, np.ndarray):
        return [float(x) for x in result.ravel()[:1_000_000]]
    if isinstance(result, tuple):
        for item in result:
            values.extend(_numbers(item))
        return values
    for attr in ("epsilon", "delta", "sigma", "noise_multiplier", "mu", "scale", "count"):
        if hasattr(result, attr):
            values.extend(_numbers(getattr(result, attr)))
    return values


def _call(name: str, param: str, value: Any) -> None:
    fn = FUNCTIONS[name]
    sig = inspect.signature(fn)
    kwargs = {p.name: VALID[p.name] for p in sig.parameters.values()
              if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
              and p.name not in NOT_NUMBERS}
    if "events" in sig.parameters:
        kwargs["events"] = acc.GaussianEvent(sigma=2.0)
    kwargs[param] = value
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        try:
            result = fn(**kwargs)
        except DpclError as exc:
            stem = param[:-3] + "y" if param.endswith("ies") else param.rstrip("s")
            assert param in str(exc) or stem in str(exc), (name, param, value, str(exc))  # the message names the parameter
            return
    for x in _numbers(result):
        assert not math.isnan(x), (name, param, value, result)
    for attr in ("epsilon", "sigma", "noise_multiplier", "scale", "mu"):
        v = getattr(result, attr, None)
        if isinstance(v, float):
            assert v >= 0, (name, param, value, result)


def _with_extremes(test: Callable[..., Any]) -> Callable[..., Any]:
    for value in reversed(EXTREMES):
        test = example(value=value)(test)
    return test


NUMBERS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(10**500), 10**500),
                    st.sampled_from(EXTREMES))


@pytest.mark.parametrize("name,param", _cases(searches=False))
@settings(max_examples=THOROUGH_EXAMPLES if os.environ.get("DPCL_THOROUGH") == "1" else 3)
@given(value=NUMBERS)
@_with_extremes
def test_every_public_function_answers_any_number_soundly_or_refuses_it(name, param, value):
    _call(name, param, value)


@pytest.mark.thorough
@pytest.mark.parametrize("name,param", _cases(searches=True))
@settings(max_examples=5)
@given(value=NUMBERS)
@_with_extremes
def test_every_calibration_answers_any_number_soundly_or_refuses_it(name, param, value):
    _call(name, param, value)


def test_every_numeric_parameter_has_a_valid_value_to_start_from():
    for name, fn in FUNCTIONS.items():
        for p in inspect.signature(fn).parameters.values():
            if p.name in NOT_NUMBERS or p.default is not p.empty or p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
                continue
            assert p.name in VALID, f"{name}({p.name}): add a valid value to VALID"


def test_the_issue_examples():
    from dpcl.errors import InvalidParameterError

    with pytest.raises(InvalidParameterError, match="sigma"):
        acc.gaussian_epsilon(10**400, 1e-5)
    with pytest.raises(InvalidParameterError, match="steps"):
        acc.dpsgd_epsilon(1, 0.01, 10**400, 1e-5)
    with pytest.raises(InvalidParameterError, match="sigmas"):
        acc.compose_gaussians_epsilon(np.broadcast_to(1.0, (10**10,)), 1e-5)
    mu = acc.gdp_mu(1e308, 1e-5)
    assert math.isfinite(mu) and mu > 0 and acc.gdp_epsilon(mu, 1e-5) <= 1e308  # sound: its epsilon is within 1e308
    assert acc.PrivacyFilter(1e308, 1e-5, "gdp").mu_budget == mu
    with pytest.raises(InvalidParameterError, match="epsilons"):
        acc.basic_composition([1e308] * 3, 0.0)  # the sum is beyond float range
    assert acc.classic_gaussian_sigma(0.5, 5e-324).sigma == pytest.approx(2 * math.sqrt(2 * (math.log(1.25) - math.log(5e-324))), rel=1e-12)

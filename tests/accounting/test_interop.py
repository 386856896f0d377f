"""dpcl events <-> dp-accounting DpEvents (dpcl.accounting.interop).

Round trips are property tests (hypothesis). The conventions (noise multiplier
relative to one record's bound, the relation on the accountant) are checked
against independent references: the Gaussian closed form written here
(Balle & Wang 2018, Thm 8, by brentq) and the Laplace closed form, evaluated by
dp-accounting's own PLD accountant on the converted events.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from dp_accounting import dp_event as dp
from dp_accounting.pld import pld_privacy_accountant
from hypothesis import given
from hypothesis import strategies as st
from scipy.optimize import brentq
from scipy.stats import norm

from dpcl.accounting.events import (
    Adjacency,
    ComposedEvent,
    EpsilonDeltaEvent,
    GaussianEvent,
    HeterogeneousGaussianEvent,
    LaplaceEvent,
    PoissonSampledGaussianEvent,
    RepeatedEvent,
)
from dpcl.accounting.interop import (
    from_dp_event,
    neighboring_relation,
    quotient_rounded_down,
    to_dp_event,
)
from dpcl.errors import InvalidParameterError, UnsupportedEventError

ADJ = st.sampled_from(["add_remove", "replace_one"])
POSITIVE = st.floats(min_value=1e-6, max_value=1e6, allow_nan=False, allow_infinity=False)
#: DP-SGD noise multipliers dpcl accounts (PoissonSampledGaussianEvent refuses values outside [1e-4, 1e6]).
NOISE_MULTIPLIER = st.floats(min_value=1e-4, max_value=1e6, allow_nan=False, allow_infinity=False)
RATE = st.floats(min_value=1e-6, max_value=1.0, allow_nan=False).filter(lambda q: q > 0)


# -- strategies -----------------------------------------------------------------------------------------
def dp_leaves() -> st.SearchStrategy:
    return st.one_of(
        POSITIVE.map(dp.GaussianDpEvent),
        POSITIVE.map(dp.LaplaceDpEvent),
        st.builds(lambda q, z: dp.PoissonSampledDpEvent(q, dp.GaussianDpEvent(z)), RATE, NOISE_MULTIPLIER),
    )


def dp_trees() -> st.SearchStrategy:
    return st.recursive(
        dp_leaves(),
        lambda inner: st.one_of(
            st.builds(dp.SelfComposedDpEvent, inner, st.integers(1, 1000)),
            st.lists(inner, min_size=1, max_size=4).map(dp.ComposedDpEvent),
        ),
        max_leaves=8,
    )


def dpcl_leaves(adjacency: str) -> st.SearchStrategy:
    return st.one_of(
        st.builds(lambda s, d: GaussianEvent(sigma=s, sensitivity=d, adjacency=adjacency), POSITIVE, POSITIVE),
        st.builds(lambda s, d: LaplaceEvent(scale=s, sensitivity=d, adjacency=adjacency), POSITIVE, POSITIVE),
        st.builds(
            lambda z, q: PoissonSampledGaussianEvent(noise_multiplier=z, sample_rate=q, adjacency=adjacency),
            NOISE_MULTIPLIER, RATE,
        ),
    )


def dpcl_trees(adjacency: str) -> st.SearchStrategy:
    return st.recursive(
        dpcl_leaves(adjacency),
        lambda inner: st.one_of(
            st.builds(RepeatedEvent, inner, st.integers(1, 1000)),
            st.lists(inner, min_size=1, max_size=4).map(ComposedEvent),
        ),
        max_leaves=8,
    )


# -- round trips ----------------------------------------------------------------------------------------
@given(tree=dp_trees(), adjacency=ADJ, unit=st.sampled_from(["example", "user", "token"]))
def test_dp_event_to_dpcl_and_back_is_the_identity(tree, adjacency, unit):
    event = from_dp_event(tree, adjacency, unit)
    assert event.adjacency.value == adjacency and all(leaf.unit == unit for leaf, _ in event.leaves())
    assert to_dp_event(event) == tree


@given(data=st.data(), adjacency=ADJ)
def test_dpcl_to_dp_event_and_back_gives_the_canonical_event(data, adjacency):
    event = data.draw(dpcl_trees(adjacency))
    converted = to_dp_event(event)
    back = from_dp_event(converted, adjacency, event.unit)
    assert to_dp_event(back) == converted  # the canonical form converts to the same DpEvent
    assert back.adjacency == event.adjacency and back.unit == event.unit
    canonical = 2.0 if adjacency == "replace_one" else 1.0
    for (orig, n_orig), (again, n_again) in zip(event.leaves(), back.leaves(), strict=True):
        assert type(orig) is type(again) and n_orig == n_again
        if isinstance(orig, PoissonSampledGaussianEvent):
            assert again == orig  # noise multiplier and rate are the same numbers in both libraries
            continue
        scale = orig.sigma if isinstance(orig, GaussianEvent) else orig.scale
        scale_back = again.sigma if isinstance(again, GaussianEvent) else again.scale
        assert again.sensitivity == canonical
        # same shift in noise units, never more noise than the original: exact ratio, rounded down
        exact = Fraction(scale) * Fraction(canonical) / Fraction(orig.sensitivity)
        assert Fraction(scale_back) <= exact
        assert Fraction(math.nextafter(scale_back, math.inf)) > exact


@given(adjacency=ADJ, sigma=POSITIVE, scale=POSITIVE, z=NOISE_MULTIPLIER, q=RATE)
def test_canonical_events_round_trip_unchanged(adjacency, sigma, scale, z, q):
    c = 2.0 if adjacency == "replace_one" else 1.0
    events = [
        GaussianEvent(sigma=sigma, sensitivity=c, adjacency=adjacency, unit="user"),
        RepeatedEvent(LaplaceEvent(scale=scale, sensitivity=c, adjacency=adjacency, unit="user"), 7),
        ComposedEvent([
            GaussianEvent(sigma=sigma, sensitivity=c, adjacency=adjacency, unit="user"),
            RepeatedEvent(PoissonSampledGaussianEvent(noise_multiplier=z, sample_rate=q, adjacency=adjacency,
                                                      unit="user"), 100),
        ]),
    ]
    for event in events:
        assert from_dp_event(to_dp_event(event), adjacency, "user") == event


@given(
    num=st.floats(min_value=1e-300, max_value=1e300, allow_nan=False),
    den=st.floats(min_value=1e-300, max_value=1e300, allow_nan=False),
)
def test_quotient_is_the_largest_float_not_above_the_exact_ratio(num, den):
    q = float(quotient_rounded_down(num, den))
    exact = Fraction(num) / Fraction(den)
    if 0 < q < math.inf and 2.0**-960 < num < 2.0**960 and 2.0**-960 < q < 2.0**960:
        assert Fraction(q) <= exact < Fraction(math.nextafter(q, math.inf))


def test_quotient_is_exact_when_the_ratio_is_a_float_and_vectorised():
    nums = np.array([3.0, 1.0, 0.3, 6.0, 1e-3])
    dens = np.array([1.5, 3.0, 0.1, 2.0, 1.0])
    q = quotient_rounded_down(nums, dens)
    assert q[0] == 2.0 and q[3] == 3.0 and q[4] == 1e-3
    for value, n, d in zip(q, nums, dens):
        assert Fraction(float(value)) <= Fraction(float(n)) / Fraction(float(d))
    assert q[2] < 3.0 and q[2] == math.nextafter(3.0, 0.0)  # 0.3 / 0.1 is just below 3


def test_heterogeneous_gaussian_becomes_one_self_composition_per_noise_multiplier():
    event = HeterogeneousGaussianEvent(sigmas=np.array([2.0, 4.0, 2.0, 2.0, 8.0]), sensitivities=2.0)
    converted = to_dp_event(event)
    assert converted == dp.ComposedDpEvent([
        dp.SelfComposedDpEvent(dp.GaussianDpEvent(1.0), 3), dp.GaussianDpEvent(2.0), dp.GaussianDpEvent(4.0),
    ])
    back = from_dp_event(converted, "add_remove")
    mus = sorted(leaf.mu for leaf, n in back.leaves() for _ in range(n))
    assert mus == sorted(event.mus.tolist())


# -- conventions against closed forms ------------------------------------------------------------------
def _gdp_epsilon(mu: float, delta: float) -> float:
    """Balle & Wang (2018) Thm 8 root, by brentq (independent of dpcl.accounting.gaussian)."""
    d = lambda e: norm.cdf(-e / mu + mu / 2) - math.exp(e) * norm.cdf(-e / mu - mu / 2)  # noqa: E731
    return brentq(lambda e: d(e) - delta, 0.0, 100.0, xtol=1e-13)


def _pld_epsilon(event, adjacency, delta, relation=None):
    acc = pld_privacy_accountant.PLDAccountant(
        neighboring_relation(relation or adjacency), value_discretization_interval=1e-4
    )
    acc.compose(to_dp_event(event, relation))
    return acc.get_epsilon(delta)


@pytest.mark.parametrize("adjacency", ["add_remove", "replace_one"])
def test_gaussian_convention_matches_the_closed_form_under_both_relations(adjacency):
    # sensitivity is stated under the event's own relation: the curve is a shift by sensitivity / sigma
    event = RepeatedEvent(GaussianEvent(sigma=3.0, sensitivity=1.5, adjacency=adjacency), 4)
    reference = _gdp_epsilon(math.sqrt(4) * 1.5 / 3.0, 1e-5)
    got = _pld_epsilon(event, adjacency, 1e-5)
    assert reference <= got <= reference + 2e-3


@pytest.mark.parametrize("adjacency", ["add_remove", "replace_one"])
def test_laplace_convention_matches_the_pure_dp_closed_form(adjacency):
    # dp-accounting's PLD accountant analyses Laplace under add/remove only: replace-one (no sampling) is
    # restated under add/remove, where the shift is the same
    event = RepeatedEvent(LaplaceEvent(scale=2.0, sensitivity=0.5, adjacency=adjacency), 3)
    got = _pld_epsilon(event, adjacency, 1e-12, relation="add_remove")
    assert 3 * 0.25 - 1e-6 <= got <= 3 * 0.25 + 1e-3  # pure DP: epsilon = count * sensitivity / scale


def test_full_batch_dpsgd_under_replace_one_has_twice_the_shift():
    # q = 1: a Gaussian with sensitivity 2C under replace-one (dpcl), REPLACE_ONE pair in dp-accounting
    event = PoissonSampledGaussianEvent(noise_multiplier=4.0, sample_rate=1.0, adjacency="replace_one")
    reference = _gdp_epsilon(2.0 / 4.0, 1e-5)
    assert reference <= _pld_epsilon(event, "replace_one", 1e-5) <= reference + 2e-3
    # restated under add/remove: the same curve
    assert reference <= _pld_epsilon(event, "replace_one", 1e-5, relation="add_remove") <= reference + 2e-3
    plain = PoissonSampledGaussianEvent(noise_multiplier=4.0, sample_rate=1.0)
    assert to_dp_event(plain, relation="replace_one") == dp.PoissonSampledDpEvent(1.0, dp.GaussianDpEvent(8.0))


# -- refusals -------------------------------------------------------------------------------------------
def test_epsilon_delta_events_are_refused_with_the_reason():
    with pytest.raises(UnsupportedEventError, match="epsilon_delta.*no dp-accounting counterpart"):
        to_dp_event(ComposedEvent([GaussianEvent(sigma=1.0), EpsilonDeltaEvent(epsilon=1.0, source="Thm 2")]))


def test_restating_a_subsampled_event_under_the_other_relation_is_refused():
    event = RepeatedEvent(PoissonSampledGaussianEvent(noise_multiplier=1.0, sample_rate=0.01), 10)
    with pytest.raises(UnsupportedEventError, match="Poisson subsampling"):
        to_dp_event(event, relation="replace_one")


@pytest.mark.parametrize(
    "event, match",
    [
        (dp.NoOpDpEvent(), "NoOpDpEvent.*charges nothing"),
        (dp.NonPrivateDpEvent(), "NonPrivateDpEvent.*not differentially private"),
        (dp.UnsupportedDpEvent(), "UnsupportedDpEvent"),
        (dp.RandomizedResponseDpEvent(0.5, 4), "RandomizedResponseDpEvent"),
        (dp.DiscreteLaplaceDpEvent(1.0, 1), "DiscreteLaplaceDpEvent"),
        (dp.SampledWithReplacementDpEvent(100, 10, dp.GaussianDpEvent(1.0)), "SampledWithReplacementDpEvent"),
        (dp.SampledWithoutReplacementDpEvent(100, 10, dp.GaussianDpEvent(1.0)), "SampledWithoutReplacementDpEvent"),
        (dp.ZCDpEvent(0.5), "ZCDpEvent"),
        (dp.PoissonSampledDpEvent(0.1, dp.LaplaceDpEvent(1.0)), "PoissonSampledDpEvent of a LaplaceDpEvent"),
        (dp.PoissonSampledDpEvent(0.0, dp.GaussianDpEvent(1.0)), "sampling probability 0"),
        (dp.GaussianDpEvent(0.0), "noise multiplier 0"),
        (dp.SelfComposedDpEvent(dp.GaussianDpEvent(1.0), 0), "count 0"),
        (dp.ComposedDpEvent([]), "empty ComposedDpEvent"),
        (dp.ComposedDpEvent([dp.GaussianDpEvent(1.0), dp.NonPrivateDpEvent()]), "NonPrivateDpEvent"),
    ],
)
def test_dp_events_without_a_dpcl_counterpart_are_refused(event, match):
    with pytest.raises(UnsupportedEventError, match=match):
        from_dp_event(event, "add_remove")


def test_bad_arguments_are_typed_errors():
    with pytest.raises(InvalidParameterError, match="adjacency"):
        from_dp_event(dp.GaussianDpEvent(1.0), "neighbours")
    with pytest.raises(InvalidParameterError, match="unit"):
        from_dp_event(dp.GaussianDpEvent(1.0), "add_remove", unit="")
    with pytest.raises(InvalidParameterError, match="DpEvent"):
        from_dp_event("gaussian", "add_remove")
    with pytest.raises(InvalidParameterError, match="PrivacyEvent"):
        to_dp_event(dp.GaussianDpEvent(1.0))
    assert neighboring_relation(Adjacency.REPLACE_ONE).name == "REPLACE_ONE"
    from dp_accounting.privacy_accountant import NeighboringRelation

    event = from_dp_event(dp.GaussianDpEvent(3.0), NeighboringRelation.REPLACE_ONE)
    assert event == GaussianEvent(sigma=3.0, sensitivity=2.0, adjacency="replace_one")
    with pytest.raises(UnsupportedEventError, match="REPLACE_SPECIAL"):
        from_dp_event(dp.GaussianDpEvent(3.0), NeighboringRelation.REPLACE_SPECIAL)


def test_the_interop_example_of_docs_accounting_runs():
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "accounting.md").read_text(encoding="utf-8")
    section = doc.split("### Interoperability with dp-accounting", 1)[1]
    (block,) = re.findall(r"```python\n(.*?)```", section.split("\n## ", 1)[0], flags=re.S)
    namespace: dict = {}
    exec(compile(block, "docs/accounting.md", "exec"), namespace)
    assert namespace["accountant"].get_epsilon(1e-5) > 0
    assert namespace["dp_event"] == dp.SelfComposedDpEvent(dp.GaussianDpEvent(6.0), 10)

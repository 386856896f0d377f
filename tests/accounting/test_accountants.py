"""Accountants: exact / basic / advanced / RDP / PLD / PRV / auto on every event type.

Independent references: the Thm 8 root by brentq (written here), dp-accounting's
accountants driven directly with their own events, prv-accountant driven directly.
Ordering checks: RDP >= PLD >= exact and PRV(upper) >= exact where they apply.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import brentq
from scipy.stats import norm

from dpcl.accounting.accountants import ACCOUNTANT_NAMES, AccountingResult, compute_epsilon
from dpcl.accounting.events import (
    ComposedEvent,
    EpsilonDeltaEvent,
    GaussianEvent,
    HeterogeneousGaussianEvent,
    LaplaceEvent,
    PoissonSampledGaussianEvent,
    RepeatedEvent,
)
from dpcl.errors import InvalidParameterError, UnsupportedEventError

DELTA = 1e-5
#: accountant calls cost 0.1-1 s each: few examples by default, many with DPCL_THOROUGH=1
FEW = 200 if os.environ.get("DPCL_THOROUGH") == "1" else 8


def gdp_eps_reference(mu: float, delta: float) -> float:
    d = lambda e: norm.cdf(-e / mu + mu / 2) - math.exp(e) * norm.cdf(-e / mu - mu / 2)  # noqa: E731
    if d(0.0) <= delta:
        return 0.0
    hi = 1.0
    while d(hi) > delta:
        hi *= 2
    return brentq(lambda e: d(e) - delta, 0.0, hi, xtol=1e-14, rtol=1e-14)


def gaussian_events() -> ComposedEvent:
    return ComposedEvent(
        [
            GaussianEvent(sigma=2.0),
            RepeatedEvent(GaussianEvent(sigma=6.0, sensitivity=2.0), 10),
            HeterogeneousGaussianEvent(sigmas=np.array([3.0, 4.0, 5.0])),
        ]
    )


GAUSS_MU = math.sqrt(0.25 + 10 * (2 / 6) ** 2 + 1 / 9 + 1 / 16 + 1 / 25)


def test_exact_matches_independent_reference() -> None:
    r = compute_epsilon(gaussian_events(), DELTA, "exact")
    assert isinstance(r, AccountingResult)
    assert r.accountant == "exact" and r.delta == DELTA
    assert r.epsilon == pytest.approx(gdp_eps_reference(GAUSS_MU, DELTA), rel=1e-9)
    assert r.adjacency == "add_remove" and r.unit == "example"


def test_order_rdp_ge_pld_ge_exact_and_prv_ge_exact_for_gaussians() -> None:
    res = {a: compute_epsilon(gaussian_events(), DELTA, a).epsilon for a in ("exact", "pld", "rdp", "prv")}
    assert res["pld"] >= res["exact"] * (1 - 1e-12)
    assert res["pld"] == pytest.approx(res["exact"], rel=1e-3)
    assert res["rdp"] >= res["pld"]
    assert res["prv"] >= res["exact"]


def test_pld_matches_dp_accounting_on_the_same_events() -> None:
    acc = pld_privacy_accountant.PLDAccountant()
    acc.compose(
        dp_event.ComposedDpEvent(
            [
                dp_event.GaussianDpEvent(2.0),
                dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(3.0), 10),
                dp_event.GaussianDpEvent(3.0),
                dp_event.GaussianDpEvent(4.0),
                dp_event.GaussianDpEvent(5.0),
            ]
        )
    )
    ref = acc.get_epsilon(DELTA)
    ours = compute_epsilon(gaussian_events(), DELTA, "pld").epsilon
    assert ours == pytest.approx(ref, rel=1e-3)


def test_rdp_matches_dp_accounting_rdp_for_subsampled_and_laplace() -> None:
    events = ComposedEvent(
        [RepeatedEvent(PoissonSampledGaussianEvent(noise_multiplier=1.1, sample_rate=0.02), 300), LaplaceEvent(scale=4.0)]
    )
    acc = rdp_privacy_accountant.RdpAccountant()
    acc.compose(dp_event.PoissonSampledDpEvent(0.02, dp_event.GaussianDpEvent(1.1)), 300)
    acc.compose(dp_event.LaplaceDpEvent(4.0))
    assert compute_epsilon(events, DELTA, "rdp").epsilon == pytest.approx(acc.get_epsilon(DELTA), rel=1e-12)


def test_laplace_all_accountants() -> None:
    ev = LaplaceEvent(scale=0.5, sensitivity=0.5)  # eps0 = 1
    exact = compute_epsilon(ev, DELTA, "exact").epsilon
    assert exact == pytest.approx(1 + 2 * math.log1p(-DELTA), rel=1e-12)
    assert compute_epsilon(ev, DELTA, "basic").epsilon == 1.0
    pld = compute_epsilon(ev, DELTA, "pld").epsilon
    assert exact <= pld <= exact + 1e-3
    assert compute_epsilon(ev, DELTA, "rdp").epsilon >= exact
    assert compute_epsilon(ev, DELTA, "prv").epsilon >= exact
    assert compute_epsilon(ev, DELTA, "auto").accountant == "exact"
    # several Laplace mechanisms: no exact accountant, PLD is the reference
    many = RepeatedEvent(ev, 5)
    with pytest.raises(UnsupportedEventError, match="exact"):
        compute_epsilon(many, DELTA, "exact")
    assert compute_epsilon(many, DELTA, "pld").epsilon <= 5.0


def test_epsilon_delta_events_only_basic_and_advanced() -> None:
    events = [EpsilonDeltaEvent(epsilon=0.1, delta=1e-7, source="theorem")] * 100
    basic = compute_epsilon(events, DELTA, "basic")
    assert basic.epsilon == pytest.approx(10.0, rel=1e-12)
    adv = compute_epsilon(events, 2e-5, "advanced")
    slack = 1 - (1 - 2e-5) / (1 - 1e-7) ** 100
    kov = min(10.0, 100 * 0.1 * math.tanh(0.05) + math.sqrt(2 * 100 * 0.01 * math.log(1 / slack)))
    assert adv.epsilon == pytest.approx(kov, rel=1e-9)
    for name in ("exact", "rdp", "pld", "prv"):
        with pytest.raises(UnsupportedEventError, match="basic|advanced|exact"):
            compute_epsilon(events, DELTA, name)
    auto = compute_epsilon(events, 2e-5, "auto")
    assert auto.accountant == "advanced" and set(auto.candidates) == {"advanced", "basic"}
    with pytest.raises(InvalidParameterError, match="delta"):
        compute_epsilon(events, 1e-6, "basic")  # the events alone use 1e-5


def test_basic_and_advanced_on_gaussians_are_valid_but_looser() -> None:
    exact = compute_epsilon(gaussian_events(), DELTA, "exact").epsilon
    for name in ("basic", "advanced"):
        assert compute_epsilon(gaussian_events(), DELTA, name).epsilon >= exact


def test_auto_names_the_tightest_and_lists_candidates() -> None:
    r = compute_epsilon(gaussian_events(), DELTA, "auto")
    assert r.accountant == "exact" and r.candidates == {"exact": r.epsilon}
    sub = RepeatedEvent(PoissonSampledGaussianEvent(noise_multiplier=1.0, sample_rate=0.05), 200)
    r = compute_epsilon(sub, DELTA, "auto")
    assert set(r.candidates) == {"pld", "rdp", "advanced", "basic"}
    assert r.epsilon == min(r.candidates.values())
    assert r.candidates[r.accountant] == r.epsilon
    assert any("auto" in n for n in r.notes)
    json.dumps(r.to_dict())


def test_dpsgd_with_sample_rate_one_is_exact_gaussian() -> None:
    ev = RepeatedEvent(PoissonSampledGaussianEvent(noise_multiplier=4.0, sample_rate=1.0), 16)
    assert compute_epsilon(ev, DELTA, "exact").epsilon == pytest.approx(gdp_eps_reference(1.0, DELTA), rel=1e-9)
    rep = RepeatedEvent(PoissonSampledGaussianEvent(noise_multiplier=4.0, sample_rate=1.0, adjacency="replace_one"), 16)
    # replace-one moves a clipped gradient by up to 2C: mu doubles
    assert compute_epsilon(rep, DELTA, "exact").epsilon == pytest.approx(gdp_eps_reference(2.0, DELTA), rel=1e-9)


def test_replace_one_subsampling_only_through_pld() -> None:
    add = RepeatedEvent(PoissonSampledGaussianEvent(noise_multiplier=2.0, sample_rate=0.05), 10)
    rep = RepeatedEvent(PoissonSampledGaussianEvent(noise_multiplier=2.0, sample_rate=0.05, adjacency="replace_one"), 10)
    e_add = compute_epsilon(add, DELTA, "pld").epsilon
    e_rep = compute_epsilon(rep, DELTA, "pld")
    assert e_rep.adjacency == "replace_one"
    assert e_rep.epsilon > e_add  # replacing is a larger change than adding/removing
    acc = pld_privacy_accountant.PLDAccountant(
        neighboring_relation=pld_privacy_accountant.NeighborRel.REPLACE_ONE
    )
    acc.compose(dp_event.PoissonSampledDpEvent(0.05, dp_event.GaussianDpEvent(2.0)), 10)
    assert e_rep.epsilon == pytest.approx(acc.get_epsilon(DELTA), rel=1e-6)
    for name in ("rdp", "prv", "basic", "advanced", "exact"):
        with pytest.raises(UnsupportedEventError):
            compute_epsilon(rep, DELTA, name)
    assert compute_epsilon(rep, DELTA, "auto").accountant == "pld"


def test_gaussian_adjacency_uses_stated_sensitivity() -> None:
    a = compute_epsilon(GaussianEvent(sigma=3.0, sensitivity=2.0), DELTA, "exact").epsilon
    b = compute_epsilon(GaussianEvent(sigma=3.0, sensitivity=2.0, adjacency="replace_one"), DELTA, "exact")
    assert b.epsilon == a and b.adjacency == "replace_one"


def test_invalid_calls() -> None:
    with pytest.raises(InvalidParameterError, match="accountant"):
        compute_epsilon(GaussianEvent(sigma=1.0), DELTA, "moments")
    for bad in (0.0, 1.0, -1e-5, float("nan")):
        with pytest.raises(InvalidParameterError, match="delta"):
            compute_epsilon(GaussianEvent(sigma=1.0), bad)
    with pytest.raises(InvalidParameterError):
        compute_epsilon([], DELTA)
    with pytest.raises(InvalidParameterError, match="neighbouring"):
        compute_epsilon([GaussianEvent(sigma=1.0), GaussianEvent(sigma=1.0, adjacency="replace_one")], DELTA)
    with pytest.raises(InvalidParameterError, match="unit"):
        compute_epsilon([GaussianEvent(sigma=1.0), GaussianEvent(sigma=1.0, unit="token")], DELTA)
    with pytest.raises(InvalidParameterError):
        compute_epsilon("gaussian", DELTA)  # type: ignore[arg-type]
    assert set(ACCOUNTANT_NAMES) == {"exact", "basic", "advanced", "rdp", "pld", "prv", "auto"}


@settings(max_examples=FEW)
@given(
    z=st.floats(0.5, 5.0),
    q=st.floats(0.001, 0.5),
    steps=st.integers(1, 500),
    more=st.integers(1, 500),
)
def test_property_more_steps_never_lower_epsilon_rdp(z: float, q: float, steps: int, more: int) -> None:
    ev = PoissonSampledGaussianEvent(noise_multiplier=z, sample_rate=q)
    a = compute_epsilon(RepeatedEvent(ev, steps), DELTA, "rdp").epsilon
    b = compute_epsilon(RepeatedEvent(ev, steps + more), DELTA, "rdp").epsilon
    assert math.isfinite(a) and b >= a


@given(
    sigma=st.floats(0.05, 1e3),
    steps=st.integers(1, 10_000),
    more=st.integers(1, 10_000),
    delta=st.floats(1e-12, 0.5),
)
def test_property_more_steps_never_lower_epsilon_exact(sigma: float, steps: int, more: int, delta: float) -> None:
    ev = GaussianEvent(sigma=sigma)
    a = compute_epsilon(RepeatedEvent(ev, steps), delta, "exact").epsilon
    b = compute_epsilon(RepeatedEvent(ev, steps + more), delta, "exact").epsilon
    assert not math.isnan(a) and b >= a * (1 - 1e-12)


@settings(max_examples=FEW)
@given(sigma=st.floats(1.0, 20.0), count=st.integers(1, 9), delta=st.floats(1e-10, 0.1))
def test_property_pld_and_rdp_never_below_exact(sigma: float, count: int, delta: float) -> None:
    ev = RepeatedEvent(GaussianEvent(sigma=sigma), count)
    exact = compute_epsilon(ev, delta, "exact").epsilon
    pld = compute_epsilon(ev, delta, "pld").epsilon
    rdp = compute_epsilon(ev, delta, "rdp").epsilon
    assert pld >= exact * (1 - 1e-9) - 1e-12
    assert rdp >= exact * (1 - 1e-9) - 1e-12


def test_pld_refuses_grids_that_would_not_fit_and_auto_falls_back() -> None:
    # almost no noise: a PLD grid would need ~1e9 points; refuse before allocating
    ev = RepeatedEvent(PoissonSampledGaussianEvent(noise_multiplier=0.05, sample_rate=0.5), 1000)
    with pytest.raises(UnsupportedEventError, match="grid points.*'auto'"):
        compute_epsilon(ev, 1e-10, "pld")
    # auto coarsens the interval until the PLD fits (still pessimistic, so still an upper bound)
    r = compute_epsilon(ev, 1e-10, "auto")
    assert math.isfinite(r.epsilon) and r.epsilon == min(r.candidates.values())
    assert any("PLD intervals" in n for n in r.notes)
    rdp = rdp_privacy_accountant.RdpAccountant()
    rdp.compose(dp_event.PoissonSampledDpEvent(0.5, dp_event.GaussianDpEvent(0.05)), 1000)
    assert r.epsilon <= rdp.get_epsilon(1e-10)
    json.dumps(r.to_dict(), allow_nan=False)


def test_pld_refuses_delta_below_its_truncated_tail() -> None:
    with pytest.raises(UnsupportedEventError, match="delta"):
        compute_epsilon(GaussianEvent(sigma=3.0), 1e-100, "pld")
    r = compute_epsilon(GaussianEvent(sigma=3.0), 1e-100, "auto")
    assert r.accountant == "exact" and r.epsilon == pytest.approx(gdp_eps_reference(1 / 3, 1e-100), rel=1e-6)


def test_accounting_layer_never_imports_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys, dpcl.accounting, dpcl.accounting.accountants, dpcl.accounting.dpsgd, dpcl.accounting.filter;"
        "from dpcl.accounting import compute_epsilon, dpsgd_epsilon;"
        "dpsgd_epsilon(1.0, 0.1, 10, 1e-5, 'pld'); compute_epsilon(dpcl.accounting.GaussianEvent(sigma=1.0), 1e-5, 'prv');"
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_events_survive_serialisation_with_the_same_epsilon() -> None:
    from dpcl.accounting.events import event_from_dict

    events = ComposedEvent(
        [
            RepeatedEvent(PoissonSampledGaussianEvent(noise_multiplier=1.2, sample_rate=0.02), 50),
            LaplaceEvent(scale=5.0),
            HeterogeneousGaussianEvent(sigmas=np.array([4.0, 8.0]), sensitivities=np.array([1.0, 2.0])),
        ]
    )
    back = event_from_dict(json.loads(json.dumps(events.to_dict())))
    for name in ("rdp", "basic"):
        assert compute_epsilon(back, DELTA, name).epsilon == compute_epsilon(events, DELTA, name).epsilon


@given(
    sigma=st.floats(0.05, 1e4),
    scale=st.floats(0.05, 1e4),
    delta=st.floats(1e-12, 0.5),
)
def test_property_no_nan_for_valid_inputs(sigma: float, scale: float, delta: float) -> None:
    for ev in (GaussianEvent(sigma=sigma), LaplaceEvent(scale=scale)):
        for name in ("exact", "basic", "advanced"):
            eps = compute_epsilon(ev, delta, name).epsilon
            assert math.isfinite(eps) and eps >= 0


# -- dp-accounting's absl warnings -------------------------------------------------------------------

_EXTREME_DPSGD = dict(noise_multiplier=0.3, sample_rate=0.5, steps=1000)  # RDP series fail to converge


def test_rdp_excluded_order_warnings_do_not_reach_stderr(capfd):
    """dpcl's call prints nothing; the same call straight into dp-accounting does (the control)."""
    import subprocess
    import sys

    script = (
        "import sys\n"
        "from dpcl.accounting.dpsgd import dpsgd_epsilon\n"
        f"r = dpsgd_epsilon(**{_EXTREME_DPSGD!r}, delta=1e-5, accountant='rdp')\n"
        "print(repr(r.epsilon)); sys.stderr.write('--control--\\n'); sys.stderr.flush()\n"
        "from dp_accounting import dp_event\n"
        "from dp_accounting.rdp import rdp_privacy_accountant\n"
        "acc = rdp_privacy_accountant.RdpAccountant()\n"
        "acc.compose(dp_event.PoissonSampledDpEvent(0.5, dp_event.GaussianDpEvent(0.3)), 1000)\n"
        "print(repr(float(acc.get_epsilon(1e-5))))\n"
        "from prv_accountant.other_accountants import RDP\n"
        "from prv_accountant.privacy_random_variables import PoissonSubsampledGaussianMechanism as M\n"
        "print(repr(float(RDP([M(noise_multiplier=0.3, sampling_probability=0.5)]).compute_epsilon(1e-5, [1000])[2])))\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True)
    out, err = capfd.readouterr()
    ours, control = err.split("--control--\n")
    assert ours == ""
    assert "Excluding this order" in control  # dp-accounting does warn on these settings
    eps_dpcl, eps_direct, eps_prv_rdp = (float(x) for x in out.split())
    # silencing changed no number: dpcl reports the smaller of dp-accounting's RDP (which drops the
    # orders it warns about) and prv-accountant's RDP (which keeps them)
    assert eps_dpcl == min(eps_direct, eps_prv_rdp) and eps_dpcl < eps_direct


def test_rdp_excluded_orders_are_stated_in_notes_not_logged(caplog, capfd):
    from dpcl.accounting.dpsgd import dpsgd_epsilon

    caplog.set_level("DEBUG")
    result = dpsgd_epsilon(**_EXTREME_DPSGD, delta=1e-5, accountant="rdp")
    assert not [r for r in caplog.records if r.name == "absl"]
    assert capfd.readouterr().err == ""
    assert any("excluded 3 order(s)" in n and "still an upper bound" in n for n in result.notes)
    import logging

    assert not logging.getLogger("absl").filters  # the filter is removed after the call
    logging.getLogger("absl").warning("a later absl warning is not dropped")
    assert [r.getMessage() for r in caplog.records if r.name == "absl"] == ["a later absl warning is not dropped"]


def test_dpcl_warnings_still_shown_while_dp_accounting_is_quiet():
    import warnings

    from dpcl.accounting.accountants import rdp

    with rdp._dp_accounting_warnings_dropped(), pytest.warns(UserWarning, match="dpcl's own"):
        warnings.warn("dpcl's own warning", UserWarning)


def test_exact_gaussian_mu_total_is_never_below_the_exact_value() -> None:
    # mu of count repetitions of a Gaussian is sqrt(count) * Delta / sigma exactly. The old n u
    # margin let the float value fall an ulp below it (37 of 20000 random draws); 50-digit check.
    from dpcl.accounting.accountants import collect as _collect

    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 50
    rng = np.random.default_rng(2)
    for _ in range(4000):
        s, d = float(rng.uniform(0.1, 10.0)), float(rng.uniform(0.1, 10.0))
        count = int(rng.integers(1, 1000))
        got = _collect(RepeatedEvent(GaussianEvent(sigma=s, sensitivity=d), count)).gaussian_mu_total()
        exact_mu = mpmath.sqrt(count) * mpmath.mpf(d) / mpmath.mpf(s)
        assert exact_mu <= got <= exact_mu * (1 + 1e-14)
    het = HeterogeneousGaussianEvent(sigmas=rng.uniform(0.5, 5.0, 1000), sensitivities=rng.uniform(0.1, 1.0, 1000))
    exact = mpmath.sqrt(
        mpmath.fsum((mpmath.mpf(float(d)) / mpmath.mpf(float(s))) ** 2 for d, s in zip(het.sensitivities, het.sigmas))
    )
    assert _collect(het).gaussian_mu_total() >= exact


@pytest.mark.parametrize("scale,sens", [(0.3, 1.0), (1.0, 0.7), (3.0, 7.0)])
def test_exact_laplace_is_the_closed_form_root(scale: float, sens: float) -> None:
    # delta(eps) = 1 - exp((eps - eps0)/2)  =>  eps = eps0 + 2 log(1 - delta), never below it
    r = compute_epsilon(LaplaceEvent(scale=scale, sensitivity=sens), DELTA, "exact")
    ref = sens / scale + 2.0 * math.log1p(-DELTA)
    assert r.epsilon == pytest.approx(ref, rel=1e-14)
    assert 1.0 - math.exp((r.epsilon - sens / scale) / 2.0) <= DELTA
    pld = compute_epsilon(LaplaceEvent(scale=scale, sensitivity=sens), DELTA, "pld").epsilon
    assert r.epsilon <= pld <= r.epsilon + 2e-4  # pessimistic PLD, interval 1e-4


@pytest.mark.parametrize("bad", [np.array([1e-5, 1e-6]), [1e-5]])
def test_delta_must_be_one_number(bad) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidParameterError, match="delta must be a single number"):
        compute_epsilon(GaussianEvent(sigma=1.0), bad)


def test_scalar_event_parameters_refuse_arrays_with_a_clear_error() -> None:
    with pytest.raises(InvalidParameterError, match="sigma must be a single number"):
        GaussianEvent(sigma=np.array([1.0, 2.0]))
    with pytest.raises(InvalidParameterError, match="scale must be a single number"):
        LaplaceEvent(scale=[1.0, 2.0])
    with pytest.raises(InvalidParameterError, match="epsilon must be a single number"):
        EpsilonDeltaEvent(epsilon=np.array([0.1, 0.2]))
    with pytest.raises(InvalidParameterError, match="noise_multiplier must be a single number"):
        PoissonSampledGaussianEvent(noise_multiplier=np.ones(2), sample_rate=0.1)
    with pytest.raises(InvalidParameterError, match="delta must lie in"):
        EpsilonDeltaEvent(epsilon=0.1, delta=1.0)


@pytest.mark.parametrize("z,q", [(1.0, 0.1), (2.0, 0.5), (0.8, 0.02)])
def test_replace_one_subsampled_step_matches_the_mixture_pair_by_quadrature(z: float, q: float) -> None:
    # Replacing record x by x' (both clipped to norm C = 1) in a Poisson-sampled clipped sum gives, after
    # removing the common part, the pair P = (1-q) N(0, z^2) + q N(1, z^2) vs Q = (1-q) N(0, z^2) + q N(-1, z^2)
    # (the two records pointing in opposite directions). Its hockey-stick divergence at our PLD epsilon,
    # integrated here with scipy, must be <= delta: this checks the relation and the sensitivity handed to
    # dp-accounting (not doubled twice, not left at the add/remove pair).
    from scipy import integrate

    ev = PoissonSampledGaussianEvent(noise_multiplier=z, sample_rate=q, adjacency="replace_one")
    delta = 1e-3
    eps = compute_epsilon(ev, delta, "pld").epsilon

    def hockey(e: float) -> float:
        p = lambda x: (1 - q) * norm.pdf(x, 0, z) + q * norm.pdf(x, 1, z)  # noqa: E731
        qq = lambda x: (1 - q) * norm.pdf(x, 0, z) + q * norm.pdf(x, -1, z)  # noqa: E731
        f = lambda x: max(p(x) - math.exp(e) * qq(x), 0.0)  # noqa: E731
        return integrate.quad(f, -40 * z, 40 * z, points=[-1.0, 0.0, 1.0], limit=400, epsabs=1e-12)[0]

    assert hockey(eps) <= delta * (1 + 1e-6)
    assert hockey(eps * 0.99 - 1e-3) > delta  # and it is tight (pessimistic discretisation 1e-4)
    add = compute_epsilon(PoissonSampledGaussianEvent(noise_multiplier=z, sample_rate=q), delta, "pld").epsilon
    assert eps > add


@pytest.mark.parametrize(
    "z,q,steps,delta",
    [(1.0, 0.01, 100, 1e-5), (0.8, 0.1, 10, 1e-3), (2.0, 0.5, 50, 1e-6), (5.0, 0.001, 1000, 1e-5), (0.6, 0.02, 3, 1e-2)],
)
def test_basic_and_advanced_subsampling_amplification_stay_above_the_true_epsilon(
    z: float, q: float, steps: int, delta: float
) -> None:
    # basic/advanced amplify each step by (log(1 + q(e^eps - 1)), q delta) and compose by theorem. A sound
    # bound is never below the true epsilon, which dp-accounting's *optimistic* PLD (privacy buckets,
    # rounding the other way) estimates from below up to its 1e-4 grid.
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    optimistic = pld_lib.from_gaussian_mechanism(
        z, sampling_prob=q, pessimistic_estimate=False, use_connect_dots=False, value_discretization_interval=1e-4
    ).self_compose(steps).get_epsilon_for_delta(delta)
    ev = RepeatedEvent(PoissonSampledGaussianEvent(noise_multiplier=z, sample_rate=q), steps)
    for name in ("basic", "advanced"):
        assert compute_epsilon(ev, delta, name).epsilon >= optimistic


@given(st.floats(min_value=1e-2, max_value=50.0), st.floats(min_value=0.1, max_value=5.0))
def test_rdp_laplace_event_never_rounds_epsilon0_down(scale: float, sensitivity: float) -> None:
    """dp-accounting takes the noise multiplier b and uses 1 / b; for about 7% of events 1 / fl(1 / eps0) < eps0,
    so the multiplier handed over is stepped down one ulp."""
    from dpcl.accounting.accountants import collect as _collect
    from dpcl.accounting.accountants.rdp import _rdp_accountant

    mech = _collect(LaplaceEvent(scale=scale, sensitivity=sensitivity))
    ((stored, _),) = mech.laplace
    event = _rdp_accountant(mech).ledger  # one event: the ledger is that event
    assert 1.0 / event.noise_multiplier >= stored


def test_subsampled_amplification_at_huge_epsilon_is_finite_without_warnings() -> None:
    """log(1 + q(e^eps - 1)) overflowed to inf (with a RuntimeWarning) for eps > ~709; it is eps + log(q + ...)."""
    import warnings

    event = RepeatedEvent(PoissonSampledGaussianEvent(noise_multiplier=0.0005, sample_rate=0.01), 10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        basic = compute_epsilon(event, DELTA, "basic").epsilon
    # per step: base epsilon of mu = 2000 at delta share d/q, amplified ~ base + log(q); ten steps add up
    assert math.isfinite(basic) and 10 * (2000.0**2 / 2 + math.log(0.01)) < basic < 10 * (2000.0**2 / 2 + 2000.0 * 6)


def test_pld_of_a_sparse_pmf_self_composes_without_the_integer_power() -> None:
    """At a tiny sampling rate dp-accounting's PMF is sparse and its self_compose evaluates size**count as a Python
    integer (about a minute at 1e7 steps) before it goes dense; dpcl goes dense directly. The result is
    dp-accounting's own composition."""
    from dp_accounting.pld import privacy_loss_distribution as pld_lib
    from dp_accounting.pld import pld_pmf

    from dpcl.accounting.accountants._pld_grid import _self_compose

    pld = pld_lib.from_gaussian_mechanism(standard_deviation=1.0, sensitivity=1.0, pessimistic_estimate=True,
                                          value_discretization_interval=1e-4, sampling_prob=1e-6)
    assert isinstance(pld._pmf_remove, pld_pmf.SparsePLDPmf)  # the case the workaround is for
    direct = pld.self_compose(200_001).get_epsilon_for_delta(1e-6)
    blocks = _self_compose(pld, 200_001).get_epsilon_for_delta(1e-6)
    assert blocks == direct
    # 10^7 steps through the public API: finishes (the direct path took about a minute), close to RDP's bound
    event = RepeatedEvent(PoissonSampledGaussianEvent(noise_multiplier=1.0, sample_rate=1e-6), 10**7)
    pld_eps = compute_epsilon(event, 1e-6, "pld").epsilon
    assert 0.09 < pld_eps < compute_epsilon(event, 1e-6, "rdp").epsilon

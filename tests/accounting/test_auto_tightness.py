"""``auto`` is the tightest sound bound in every regime; ``pld`` answers where dp-accounting does.

References are dp-accounting and prv-accountant called directly here, never dpcl's own output.
The issue's three quality-bar points (each call about a second, but with a dp-accounting PLD at
interval 1e-4 as reference) are ``thorough``; the CI tests check the same mechanisms -- the
refinement of a coarse PLD, prv-accountant's RDP where dp-accounting drops orders, ``pld`` sized
by the composed grid rather than by epsilon -- at smaller points.
"""

from __future__ import annotations

import json

import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from dpcl.accounting.accountants import PLD_MAX_SELF_COMPOSED_POINTS, compute_epsilon
from dpcl.accounting.dpsgd import dpsgd_epsilon, dpsgd_events, dpsgd_noise_multiplier
from dpcl.cli import main
from dpcl.errors import UnsupportedEventError

DELTA = 1e-5


def dpa_pld(z: float, q: float, steps: int, delta: float = DELTA, interval: float = 1e-4) -> float:
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=interval)
    acc.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z)), steps)
    return float(acc.get_epsilon(delta))


def dpa_rdp(z: float, q: float, steps: int, delta: float = DELTA) -> float:
    acc = rdp_privacy_accountant.RdpAccountant()
    acc.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z)), steps)
    return float(acc.get_epsilon(delta))


def prv_upper(z: float, q: float, steps: int, eps_error: float, delta: float = DELTA) -> float:
    """prv-accountant's upper bound (its memory grows like epsilon / eps_error: keep that ratio ~1e3)."""
    from prv_accountant import PRVAccountant
    from prv_accountant.privacy_random_variables import PoissonSubsampledGaussianMechanism

    acc = PRVAccountant(
        prvs=PoissonSubsampledGaussianMechanism(noise_multiplier=z, sampling_probability=q),
        max_self_compositions=steps, eps_error=eps_error, delta_error=delta / 1000,
    )
    return float(acc.compute_epsilon(delta, [steps])[2])


def cli_epsilon(z: float, q: float, steps: str, *extra: str) -> dict:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["epsilon", "dpsgd", "--noise-multiplier", str(z), "--sample-rate", str(q), "--steps", steps,
                     "--delta", str(DELTA), *extra, "--json"])
    assert code == 0
    return json.loads(out.getvalue())


# -- CI: the same mechanisms at cheaper points ---------------------------------------------------


def test_auto_refines_a_coarse_pld_to_within_half_a_percent_of_dp_accounting() -> None:
    # q = 0.001, T = 1e5: auto starts at interval 1e-3 (6.383 vs 6.030 at T = 1e6 before refinement)
    r = dpsgd_epsilon(1.0, 0.001, 100_000, DELTA)
    reference = dpa_pld(1.0, 0.001, 100_000)
    assert r.accountant == "pld" and r.epsilon <= reference * 1.005
    assert r.epsilon == min(r.candidates.values())
    note = next(n for n in r.notes if n.startswith("auto: PLD intervals"))
    assert "converged" in note and "->" in note


def test_rdp_keeps_the_orders_dp_accounting_drops() -> None:
    # dp-accounting's series for orders 1.1..1.5 does not converge at q = 0.1, z = 1 and those orders
    # are dropped; prv-accountant's RDP (the series summed to convergence, as opacus does) keeps them
    from prv_accountant.other_accountants import RDP
    from prv_accountant.privacy_random_variables import PoissonSubsampledGaussianMechanism

    r = dpsgd_epsilon(1.0, 0.1, 10_000, DELTA, "rdp")
    prv_rdp = RDP([PoissonSubsampledGaussianMechanism(noise_multiplier=1.0, sampling_probability=0.1)]).compute_epsilon(
        DELTA, [10_000]
    )[2]
    assert r.epsilon == pytest.approx(prv_rdp, rel=1e-12)
    assert r.epsilon < 0.8 * dpa_rdp(1.0, 0.1, 10_000)
    assert any("prv-accountant's RDP" in n for n in r.notes)
    # dp-accounting caches these orders and does not log them again: the second call finds them too
    assert dpsgd_epsilon(1.0, 0.1, 10_000, DELTA, "rdp").epsilon == r.epsilon


def test_pld_is_sized_by_its_composed_grid_not_by_epsilon() -> None:
    # the issue's point: refused before (RDP epsilon 151 / interval 1e-4 > 1e6 points); the composed
    # grid has ~2.2e6 points (dp-accounting answers in ~2 s), so it answers as dp-accounting does
    # (above 1e6 points dpcl's self-composition bounds each point of the exact composition from above, where
    # dp-accounting's carries its FFT's rounding noise: 139.0313749 against dp-accounting's 139.0313573, which is
    # below the exact 139.0313746 of its own discretisation (its tails tilted, tests/accounting/test_fast_pld.py))
    r = dpsgd_epsilon(1.0, 0.01, 1_000_000, DELTA, "pld")
    assert r.epsilon == pytest.approx(dpa_pld(1.0, 0.01, 1_000_000), rel=1e-6)
    assert r.epsilon == pytest.approx(139.0, rel=5e-3)


def test_pld_refusal_names_the_alternative_and_auto_coarsens_until_it_fits(monkeypatch) -> None:
    # the memory limit scaled down so that the mechanism runs in CI time: the issue's
    # (z = 0.6, q = 0.1, T = 1e6) needs ~7.5e7 points at 1e-4 (refused) and fits at 1e-3 (thorough below)
    from dpcl.accounting import accountants

    monkeypatch.setattr(accountants, "PLD_MAX_GRID_POINTS", 3e4)
    events = dpsgd_events(1.0, 0.01, 10_000)
    with pytest.raises(UnsupportedEventError, match=r"grid points.*'auto'.*'prv'"):
        compute_epsilon(events, DELTA, "pld")
    auto = compute_epsilon(events, DELTA, "auto")
    assert auto.accountant == "pld" and auto.epsilon <= dpa_rdp(1.0, 0.01, 10_000)
    assert auto.epsilon >= dpa_pld(1.0, 0.01, 10_000) * (1 - 1e-3)  # a coarser pessimistic PLD, not below the fine one
    assert any("PLD intervals" in n for n in auto.notes)


def dpa_pld_optimistic(z: float, q: float, steps: int, interval: float, delta: float = DELTA) -> float:
    """dp-accounting's optimistic PLD (every loss rounded down): a lower bound on the true epsilon."""
    from dp_accounting.pld import privacy_loss_distribution

    pld = privacy_loss_distribution.from_gaussian_mechanism(
        z, sampling_prob=q, pessimistic_estimate=False, value_discretization_interval=interval,
    )
    return float(pld.self_compose(steps).get_epsilon_for_delta(delta))


def test_auto_starts_coarse_where_epsilon_is_large_and_still_converges_to_half_a_percent() -> None:
    # q = 0.1, T = 1e5, z = 0.6 (epsilon ~3661): the start at 1e-3 would be a grid of ~1.7e6 points
    # (1.5 s); auto starts where the events predict one halving converges and stops within 0.5 %
    from dpcl.accounting import accountants

    r = dpsgd_epsilon(0.6, 0.1, 100_000, DELTA)
    note = next(n for n in r.notes if n.startswith("auto: PLD intervals"))
    assert "converged" in note
    first = float(note.split("intervals ", 1)[1].split(" ", 1)[0])
    assert first > accountants.AUTO_PLD_INTERVAL_RANGE[1]  # started coarser than the RDP rule allows
    fine = dpa_pld(0.6, 0.1, 100_000, interval=1e-3)
    assert r.accountant == "pld" and r.epsilon <= fine * 1.005
    assert r.epsilon >= dpa_pld_optimistic(0.6, 0.1, 100_000, interval=1e-3)  # never below a lower bound on the truth
    assert r.epsilon <= dpa_rdp(0.6, 0.1, 100_000)


def test_auto_start_is_unchanged_where_its_grid_is_small() -> None:
    from dpcl.accounting.accountants import collect
    from dpcl.accounting.accountants.auto import _auto_pld_fast_start, _auto_pld_start

    mech = collect(dpsgd_events(1.0, 0.01, 10_000))
    start = _auto_pld_start(mech, 6.7)
    assert _auto_pld_fast_start(mech, start, 6.7) == start


def test_auto_calibration_is_within_a_fifth_of_a_percent_of_fine_pld() -> None:
    target, q, steps = 2.0, 0.01, 1000
    cal = dpsgd_noise_multiplier(target, DELTA, q, steps)
    assert cal.epsilon <= target
    z = cal.noise_multiplier
    assert dpsgd_epsilon(z, q, steps, DELTA).epsilon <= target  # what a ledger computes with auto meets it
    assert dpa_pld(z, q, steps) <= target * 1.005
    assert dpa_pld(z / 1.002, q, steps) > target  # 0.2 % less noise misses the target under fine PLD


def test_auto_calibration_where_epsilon_is_large_starts_coarse_and_stays_within_a_fifth_of_a_percent() -> None:
    # q = 0.1, T = 1e5: the refinement starts coarse there (see above); the reference is dp-accounting's
    # pessimistic PLD at 1e-3 (its 1e-4 takes ~30 s here; 1e-3 is within 0.03 % of it at z = 0.6)
    target, q, steps = 3661.0, 0.1, 100_000
    cal = dpsgd_noise_multiplier(target, DELTA, q, steps)
    assert cal.epsilon <= target
    z = cal.noise_multiplier
    assert dpsgd_epsilon(z, q, steps, DELTA).epsilon <= target
    assert dpa_pld(z, q, steps, interval=1e-3) <= target * 1.005
    assert dpa_pld(z / 1.002, q, steps, interval=1e-3) > target


# -- the issue's quality bars (thorough: dp-accounting at interval 1e-4 as the reference) ------------


@pytest.mark.thorough
def test_quality_bar_small_sample_rate_many_steps() -> None:
    answer = cli_epsilon(1.0, 0.001, "1e6")
    assert answer["epsilon"] <= 6.06
    assert answer["epsilon"] <= dpa_pld(1.0, 0.001, 1_000_000) * 1.005


@pytest.mark.thorough
def test_quality_bar_large_epsilon_default_not_above_prv() -> None:
    default = cli_epsilon(1.0, 0.1, "1e5")
    # dpcl's prv refuses here: prv-accountant's domain (+-1561) is past where its float64 exp is reliable (+-700)
    # (tests/accounting/test_prv_soundness.py); where it answers, the default is not above it
    try:
        prv = compute_epsilon(dpsgd_events(1.0, 0.1, 100_000), DELTA, "prv").epsilon
    except UnsupportedEventError as exc:
        assert "domain" in str(exc)
    else:
        assert default["epsilon"] <= prv
    assert default["epsilon"] <= prv_upper(1.0, 0.1, 100_000, eps_error=1.0)
    assert default["epsilon"] <= dpa_pld(1.0, 0.1, 100_000, interval=1e-3)


@pytest.mark.thorough
def test_issue_point_where_pld_is_refused_auto_answers_within_memory() -> None:
    events = dpsgd_events(0.6, 0.1, 1_000_000)
    with pytest.raises(UnsupportedEventError, match=r"grid points.*'auto'.*'prv'") as info:
        compute_epsilon(events, DELTA, "pld")
    assert f"{PLD_MAX_SELF_COMPOSED_POINTS:.2g}" in str(info.value)  # one self-composed piece: the larger limit
    auto = compute_epsilon(events, DELTA, "auto")
    assert auto.accountant == "pld" and auto.epsilon <= dpa_rdp(0.6, 0.1, 1_000_000)
    # auto starts coarse here (the grid at 1e-3 is ~7e6 points) and stops once a halving changes epsilon by <= 0.5 %
    assert auto.epsilon <= dpa_pld(0.6, 0.1, 1_000_000, interval=1e-2) * 1.005
    assert any("converged" in n for n in auto.notes if n.startswith("auto: PLD intervals"))


@pytest.mark.thorough
def test_quality_bar_pld_answers_where_dp_accounting_does() -> None:
    answer = cli_epsilon(1.0, 0.01, "1e6", "--accountant", "pld")
    assert answer["epsilon"] == pytest.approx(139.0, rel=5e-3)
    assert answer["epsilon"] == pytest.approx(dpa_pld(1.0, 0.01, 1_000_000), rel=1e-6)  # see the test above

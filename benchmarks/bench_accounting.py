"""Accounting benchmarks: dpcl next to dp-accounting, prv-accountant and opacus, same inputs, one process.

Three benchmarks (the issue's "Quality bars"):

1. **DP-SGD epsilon** for q = 0.01, z = 1, T = 10^4, delta = 1e-5: dpcl's
   ``dpsgd_epsilon`` with each accountant vs dp-accounting PLD and RDP,
   prv-accountant (upper bound) and opacus' RDP and PRV accountants.
2. **Composition of 10^6 heterogeneous Gaussians** (sigma uniform in
   [200, 2000], sensitivity 1, delta = 1e-5): dpcl's exact composition
   (mu-GDP) vs dp-accounting's PLD. PLD on 10^6 *distinct* events would take
   hours (about 20 ms per event here), so PLD is run (a) on the first n events
   for growing n, each compared with dpcl's exact epsilon on the same n events,
   and (b) on all 10^6 events after grouping them: each sigma is rounded *down*
   to a geometric grid (less noise, so the grouped PLD epsilon upper-bounds the
   true one) and each group is one self-composed PLD event. The report states,
   for 10^3, 10^5 and 10^6 events, each accountant's time: measured where it
   runs in minutes, otherwise extrapolated (linearly in n, from its largest
   measured prefix) and marked as not run, with the reason
   (:data:`MILESTONES`, :func:`composition_milestones`).
3. **Analytic calibration of 10^6 per-token budgets** (epsilon uniform in
   [0.5, 8], delta = 1e-5): dpcl's vectorised ``gaussian_sigma`` vs
   dp-accounting's ``GaussianPrivacyLoss.from_privacy_guarantee`` called once
   per token (measured on a subsample, extrapolated linearly to 10^6).

Timings are the median of ``repeats`` wall-clock runs after one warm-up run;
every call starts from fresh accountant objects. Run through
``benchmarks/run_all.py``, which writes ``benchmarks/RESULTS.md`` and
``benchmarks/composition_time.png``.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

DPSGD_SETTING = {"noise_multiplier": 1.0, "sample_rate": 0.01, "steps": 10_000, "delta": 1e-5}
COMPOSITION_SETTING = {"count": 1_000_000, "sigma_low": 200.0, "sigma_high": 2000.0, "delta": 1e-5, "seed": 0}
CALIBRATION_SETTING = {"count": 1_000_000, "epsilon_low": 0.5, "epsilon_high": 8.0, "delta": 1e-5, "seed": 1}
#: PLD/PRV value discretisation used for every dp-accounting PLD call (dp-accounting's default).
PLD_DISCRETIZATION = 1e-4
#: Numbers of composed events the report states explicitly for every accountant (the issue's 10^3/10^5/10^6).
MILESTONES = (1_000, 100_000, 1_000_000)
#: Why an accountant is not run on all events at a size (its cost grows linearly with the number of distinct events).
NOT_RUN_REASONS = {
    "dp-accounting PLD": "composes one discretised PLD per distinct event (a convolution each)",
    "dp-accounting RDP": "composes one event object at a time in Python",
    "prv-accountant": "discretises and convolves one PRV per distinct mechanism",
}


@dataclass
class Measurement:
    """One implementation on one benchmark: its epsilon (or other value) and its median time."""

    name: str
    value: float
    seconds: float
    repeats: int
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def _forget_memoised_accounting() -> None:
    """dpcl memoises epsilons, PLDs and calibrations in-process; a timed repeat must compute, not look up."""
    from dpcl.accounting.accountants import clear_memo
    from dpcl.accounting.dpsgd import CALIBRATION_MEMO

    clear_memo()
    CALIBRATION_MEMO.clear()


def timed(fn: Callable[[], Any], repeats: int) -> tuple[Any, float]:
    """Run ``fn`` once to warm up, then ``repeats`` times; return its last value and the median seconds.

    dpcl's in-process memos are cleared before every call, so each timing is a full computation."""
    _forget_memoised_accounting()
    value = fn()
    times = []
    for _ in range(repeats):
        _forget_memoised_accounting()
        start = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - start)
    return value, statistics.median(times)


# -- 1. DP-SGD -------------------------------------------------------------------------------


def bench_dpsgd(repeats: int = 3) -> list[Measurement]:
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant
    from dp_accounting.rdp import rdp_privacy_accountant
    from prv_accountant import PRVAccountant
    from prv_accountant.privacy_random_variables import PoissonSubsampledGaussianMechanism

    from dpcl.accounting.dpsgd import dpsgd_epsilon

    z, q, steps, delta = (DPSGD_SETTING[k] for k in ("noise_multiplier", "sample_rate", "steps", "delta"))
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), steps
    )

    def dpa_pld() -> float:
        accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=PLD_DISCRETIZATION)
        return float(accountant.compose(event).get_epsilon(delta))

    def dpa_rdp() -> float:
        return float(rdp_privacy_accountant.RdpAccountant().compose(event).get_epsilon(delta))

    def prv_upper() -> float:
        accountant = PRVAccountant(
            prvs=PoissonSubsampledGaussianMechanism(noise_multiplier=z, sampling_probability=q),
            max_self_compositions=steps,
            eps_error=0.01,
            delta_error=delta / 1000,
        )
        return float(accountant.compute_epsilon(delta, [steps])[2])

    def opacus_accountant(kind: str) -> Callable[[], float]:
        def run() -> float:
            from opacus.accountants import PRVAccountant as OpacusPRV
            from opacus.accountants import RDPAccountant as OpacusRDP

            accountant = OpacusRDP() if kind == "rdp" else OpacusPRV()
            accountant.history = [(z, q, steps)]
            return float(accountant.get_epsilon(delta))

        return run

    def ours(accountant: str) -> Callable[[], float]:
        def run() -> float:
            return float(dpsgd_epsilon(z, q, steps, delta, accountant=accountant).epsilon)

        return run

    cases: list[tuple[str, Callable[[], float], str]] = [
        ("dpcl auto", ours("auto"), "tightest sound bound among dpcl's accountants"),
        ("dpcl pld", ours("pld"), ""),
        ("dpcl prv", ours("prv"), "upper bound"),
        ("dpcl rdp", ours("rdp"), ""),
        ("dp-accounting PLD", dpa_pld, f"value_discretization_interval={PLD_DISCRETIZATION:g}"),
        ("dp-accounting RDP", dpa_rdp, "default orders"),
        ("prv-accountant", prv_upper, "upper bound; eps_error=0.01, delta_error=delta/1000"),
        ("opacus RDP", opacus_accountant("rdp"), "RDPAccountant"),
        ("opacus PRV", opacus_accountant("prv"), "PRVAccountant.get_epsilon (its upper bound)"),
    ]
    out = []
    for name, fn, note in cases:
        value, seconds = timed(fn, repeats)
        out.append(Measurement(name, value, seconds, repeats, note))
    return out


# -- 2. Composition of many Gaussians --------------------------------------------------------


def composition_sigmas() -> np.ndarray:
    s = COMPOSITION_SETTING
    return np.random.default_rng(s["seed"]).uniform(s["sigma_low"], s["sigma_high"], s["count"])


def _dpa_pld_of_sigmas(sigmas: np.ndarray, delta: float) -> float:
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=PLD_DISCRETIZATION)
    for sigma in sigmas.tolist():  # dp-accounting composes one event object at a time
        accountant.compose(dp_accounting.GaussianDpEvent(sigma))
    return float(accountant.get_epsilon(delta))


def _dpa_pld_grouped(sigmas: np.ndarray, delta: float, groups: int) -> tuple[float, int]:
    """PLD of the events after rounding each sigma down to a geometric grid of ``groups`` values."""
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    grid = np.geomspace(sigmas.min(), sigmas.max(), groups)
    index = np.searchsorted(grid, sigmas, side="right") - 1  # grid[index] <= sigma
    counts = np.bincount(index, minlength=groups)
    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=PLD_DISCRETIZATION)
    used = 0
    for sigma, count in zip(grid.tolist(), counts.tolist()):
        if count:
            used += 1
            accountant.compose(dp_accounting.GaussianDpEvent(sigma), count)
    return float(accountant.get_epsilon(delta)), used


def _dpa_rdp_of_sigmas(sigmas: np.ndarray, delta: float) -> float:
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant

    accountant = rdp_privacy_accountant.RdpAccountant()
    for sigma in sigmas.tolist():
        accountant.compose(dp_accounting.GaussianDpEvent(sigma))
    return float(accountant.get_epsilon(delta))


def _prv_of_sigmas(sigmas: np.ndarray, delta: float) -> float:
    from prv_accountant import PRVAccountant
    from prv_accountant.privacy_random_variables import GaussianMechanism

    accountant = PRVAccountant(
        prvs=[GaussianMechanism(noise_multiplier=float(s)) for s in sigmas],
        max_self_compositions=[1] * sigmas.size,
        eps_error=0.01,
        delta_error=delta / 1000,
    )
    return float(accountant.compute_epsilon(delta, [1] * sigmas.size)[2])


def scaled_prefix(sigmas: np.ndarray, n: int) -> np.ndarray:
    """The first ``n`` sigmas scaled by sqrt(n / N), so every prefix has about the same total privacy loss."""
    return sigmas[:n] * np.sqrt(n / sigmas.size)


def bench_composition(
    repeats: int = 5,
    pld_sizes: tuple[int, ...] = (10, 30, 100, 300, 1000),
    rdp_sizes: tuple[int, ...] = (10, 100, 1000, 10_000, 100_000),
    prv_sizes: tuple[int, ...] = (10, 30, 100, 300),
    exact_sizes: tuple[int, ...] = (10, 100, 1000, 10_000, 100_000, 1_000_000),
    groups: int = 100,
) -> dict[str, Any]:
    from dpcl.accounting.composition import compose_gaussians_epsilon

    delta = COMPOSITION_SETTING["delta"]
    sigmas = composition_sigmas()

    full_exact, full_exact_seconds = timed(lambda: float(compose_gaussians_epsilon(sigmas, delta)), repeats)
    grouped_start = time.perf_counter()
    grouped_eps, groups_used = _dpa_pld_grouped(sigmas, delta, groups)
    grouped_seconds = time.perf_counter() - grouped_start

    curves: dict[str, list[dict[str, float]]] = {"dpcl exact": [], "dp-accounting PLD": [], "dp-accounting RDP": [], "prv-accountant": []}
    for n in exact_sizes:
        prefix = scaled_prefix(sigmas, n)
        eps, seconds = timed(lambda: float(compose_gaussians_epsilon(prefix, delta)), repeats)
        curves["dpcl exact"].append({"n": n, "epsilon": eps, "seconds": seconds})
    for name, sizes, fn in (
        ("dp-accounting PLD", pld_sizes, _dpa_pld_of_sigmas),
        ("dp-accounting RDP", rdp_sizes, _dpa_rdp_of_sigmas),
        ("prv-accountant", prv_sizes, _prv_of_sigmas),
    ):
        for n in sizes:
            prefix = scaled_prefix(sigmas, n)
            start = time.perf_counter()  # one run each: these are seconds long
            eps = fn(prefix, delta)
            curves[name].append({"n": n, "epsilon": eps, "seconds": time.perf_counter() - start})

    exact_by_n = {row["n"]: row["epsilon"] for row in curves["dpcl exact"]}
    for name in ("dp-accounting PLD", "dp-accounting RDP", "prv-accountant"):
        for row in curves[name]:
            if row["n"] not in exact_by_n:
                prefix = scaled_prefix(sigmas, int(row["n"]))
                exact_by_n[row["n"]] = float(compose_gaussians_epsilon(prefix, delta))
            row["exact_epsilon"] = exact_by_n[row["n"]]

    pld_rows = curves["dp-accounting PLD"]
    per_event = pld_rows[-1]["seconds"] / pld_rows[-1]["n"]
    return {
        "milestones": composition_milestones(curves),
        "groups": groups,
        "count": sigmas.size,
        "delta": delta,
        "exact": Measurement("dpcl exact (mu-GDP)", full_exact, full_exact_seconds, repeats),
        "grouped_pld": Measurement(
            f"dp-accounting PLD, sigmas rounded down to {groups} geometric groups",
            grouped_eps,
            grouped_seconds,
            1,
            note=f"{groups_used} non-empty groups",
        ),
        "pld_extrapolated_seconds": per_event * sigmas.size,
        "curves": curves,
    }


def composition_milestones(curves: dict[str, list[dict[str, float]]]) -> dict[str, list[dict[str, Any]]]:
    """Each accountant's time at every size in :data:`MILESTONES`: measured, or extrapolated and marked not run.

    An extrapolated time scales the per-event time of the accountant's largest measured prefix linearly to n;
    the per-event cost of PLD and PRV grows with the support of the composed distribution, so for them the
    extrapolation is likely an underestimate.
    """
    out: dict[str, list[dict[str, Any]]] = {}
    for name, curve in curves.items():
        by_n = {int(row["n"]): row for row in curve}
        largest = max(by_n)
        rows = []
        for n in MILESTONES:
            if n in by_n:
                row = by_n[n]
                rows.append({"n": n, "seconds": row["seconds"], "epsilon": row["epsilon"], "measured": True, "reason": ""})
            else:
                seconds = by_n[largest]["seconds"] / largest * n
                reason = f"{NOT_RUN_REASONS.get(name, 'not run at this size')}; extrapolated from n = {largest:,}"
                rows.append({"n": n, "seconds": seconds, "epsilon": None, "measured": False, "reason": reason})
        out[name] = rows
    return out


# -- 3. Per-token calibration ----------------------------------------------------------------


def bench_calibration(repeats: int = 5, reference_sample: int = 200) -> dict[str, Any]:
    from dp_accounting import pld
    from dp_accounting.pld import privacy_loss_mechanism

    from dpcl.accounting.gaussian import gaussian_delta, gaussian_sigma

    s = CALIBRATION_SETTING
    delta = s["delta"]
    budgets = np.random.default_rng(s["seed"]).uniform(s["epsilon_low"], s["epsilon_high"], s["count"])
    sigmas, seconds = timed(lambda: np.asarray(gaussian_sigma(budgets, delta)), repeats)
    achieved = np.asarray(gaussian_delta(budgets, sigmas))

    sample = budgets[:reference_sample]

    def reference() -> np.ndarray:
        return np.array(
            [
                privacy_loss_mechanism.GaussianPrivacyLoss.from_privacy_guarantee(
                    pld.common.DifferentialPrivacyParameters(epsilon, delta)
                ).standard_deviation
                for epsilon in sample.tolist()
            ]
        )

    start = time.perf_counter()
    reference_sigmas = reference()
    reference_seconds = time.perf_counter() - start
    relative = np.abs(sigmas[:reference_sample] - reference_sigmas) / reference_sigmas
    return {
        "count": budgets.size,
        "delta": delta,
        "ours": Measurement("dpcl gaussian_sigma (vectorised)", float(np.median(sigmas)), seconds, repeats),
        "max_achieved_delta": float(achieved.max()),
        "reference": Measurement(
            "dp-accounting GaussianPrivacyLoss.from_privacy_guarantee (per token)",
            float(np.median(reference_sigmas)),
            reference_seconds / reference_sample * budgets.size,
            1,
            note=f"measured on {reference_sample} tokens, extrapolated linearly to {budgets.size:,}",
        ),
        "max_relative_difference": float(relative.max()),
        "ours_vs_reference_mean_ratio": float(np.mean(sigmas[:reference_sample] / reference_sigmas)),
    }


def run_benchmarks(quick: bool = False) -> dict[str, Any]:
    """All three benchmarks; ``quick`` shrinks repeats and sizes (for a smoke run, not for RESULTS.md)."""
    if quick:
        return {
            "dpsgd": bench_dpsgd(repeats=1),
            "composition": bench_composition(
                repeats=1, pld_sizes=(10, 30), rdp_sizes=(10, 100, 1000), prv_sizes=(10,), exact_sizes=(10, 1000, 100_000, 1_000_000), groups=20
            ),
            "calibration": bench_calibration(repeats=1, reference_sample=20),
        }
    from dpcl.progress import progress  # noqa: PLC0415 - the caller puts the repository on sys.path

    sections = {"dpsgd": bench_dpsgd, "composition": bench_composition, "calibration": bench_calibration}
    return {name: run() for name, run in progress(sections.items(), desc="accounting benchmarks", unit="section",
                                                  total=len(sections))}

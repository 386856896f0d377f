"""Empirical privacy auditing: high-confidence lower bounds on epsilon.

* :mod:`dpcl.audit.clopper_pearson` — exact binomial confidence bounds.
* :mod:`dpcl.audit.blackbox` — the black-box auditor (threshold tests on a
  score, Clopper–Pearson bounds on FPR/FNR, epsilon lower bound at delta).
* :mod:`dpcl.audit.mechanisms` — ready-made audits of the Gaussian and Laplace
  mechanisms and :func:`assert_not_leaking` for pytest.
* :mod:`dpcl.audit.strategies` — hypothesis strategies (needs ``hypothesis``;
  import it explicitly).
* :mod:`dpcl.audit.canary` — DP-SGD canary audit (needs torch and opacus;
  import it explicitly). Importing :mod:`dpcl.audit` never imports torch.
"""

from dpcl.audit.blackbox import (
    AuditResult,
    audit_outputs,
    audit_sampler,
    audit_scores,
    epsilon_from_error_rates,
    linear_score,
)
from dpcl.audit.clopper_pearson import clopper_pearson_lower, clopper_pearson_upper
from dpcl.audit.mechanisms import (
    GaussianMechanism,
    LaplaceMechanism,
    assert_not_leaking,
    audit_gaussian,
    audit_laplace,
    audit_mechanism,
)

__all__ = [
    "AuditResult",
    "GaussianMechanism",
    "LaplaceMechanism",
    "assert_not_leaking",
    "audit_gaussian",
    "audit_laplace",
    "audit_mechanism",
    "audit_outputs",
    "audit_sampler",
    "audit_scores",
    "clopper_pearson_lower",
    "clopper_pearson_upper",
    "epsilon_from_error_rates",
    "linear_score",
]

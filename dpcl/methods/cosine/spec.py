"""The DP Cosine Classifier's plan (Tobaben et al., Alg. 1, eq. 8), torch-free: ``[method] name = "cosine"``.

Per task, the matrix of per-class sums of l2-normalised features for the public labels O_t, plus
N(0, sigma^2 I). Adding or removing one example moves exactly one class row by a vector of norm <= 1:
l2 sensitivity 1 under add/remove. Replacing one example removes a unit vector from one row and adds one to
another (or the same) row: norm <= sqrt(2) for different classes and ||u - v|| <= 2 for the same class, so
sensitivity 2 under replace-one. One Gaussian event per task; sigma from the analytic calibration
:func:`dpcl.accounting.gaussian.gaussian_sigma` (Balle & Wang 2018, Thm 8) for the per-task (epsilon, delta).
The paper writes N(0, sigma I); sigma here is the standard deviation. An empty task still releases
noise-only sums.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from dpcl.accounting.events import Adjacency, GaussianEvent
from dpcl.accounting.gaussian import gaussian_epsilon, gaussian_sigma
from dpcl.guarantees.label_space import EMPTY_TASK_RELEASE_KEY
from dpcl.guarantees.method_schema import MethodKey, ReleaseCoverage, TaskPlan, positive, positive_int
from dpcl.guarantees.public_encoder import public_encoder_assumption
from dpcl.guarantees.schedules import DEVICE_KEY, check_task_size, require_budget
from dpcl.guarantees.settings import PrivacySettings

__all__ = ["COSINE", "COSINE_KEYS", "CosineSpec", "cosine_sensitivity"]


COSINE_SENSITIVITY_ASSUMPTION = (
    "Each example adds its l2-normalised feature vector to exactly one class sum "
    "(l2 sensitivity 1 under add/remove, 2 under replace-one)."
)


#: Why a cosine checkpoint is covered by its charged Gaussian releases.
COSINE_RELEASE = ReleaseCoverage.post_processing(
    "The checkpoint holds the noisy per-class sums of l2-normalised features (and the prototypes normalised from "
    "them): a post-processing of the charged Gaussian releases, with the public feature map (the raw inputs, or a "
    "public encoder where the config names one), the public output labels and the configuration."
)


#: DP-SGD keys a cosine config may carry (e.g. when switching methods); the cosine classifier does not
#: train by gradient descent, so they do not change its plan, and the plan's notes say so.
COSINE_UNUSED_KEYS = ("epochs", "batch_size", "max_grad_norm")


COSINE_KEYS: tuple[MethodKey, ...] = (
    DEVICE_KEY,
    MethodKey("epochs", int, None, "accepted but unused: the cosine classifier makes one noisy sum per task",
              positive_int),
    MethodKey("batch_size", int, None, "accepted but unused by the cosine classifier", positive_int),
    MethodKey("max_grad_norm", float, None, "accepted but unused: features are l2-normalised instead",
              positive),
)


def cosine_sensitivity(adjacency: "Adjacency | str") -> float:
    """l2 sensitivity of the per-class sums of unit-norm features (1 add/remove, 2 replace-one)."""
    return 1.0 if Adjacency.parse(adjacency) is Adjacency.ADD_REMOVE else 2.0


@dataclass(frozen=True)
class CosineSpec:
    """DP Cosine Classifier (Tobaben et al., Alg. 1): one Gaussian mechanism per task."""

    name: str = "cosine"
    keys: tuple[MethodKey, ...] = COSINE_KEYS
    reuses_past_tasks: bool = False
    method_class: str = "dpcl.methods.cosine.method:CosineClassifier"
    summary: str = "DP Cosine Classifier (Tobaben et al., Alg. 1): Gaussian-noised per-class feature sums"
    cost_estimator: str = "dpcl.runner.method_costs:cosine_cost"

    def plan_task(
        self, method: Mapping[str, Any], privacy: "PrivacySettings | Mapping[str, Any]", n_examples: int, task_index: int
    ) -> TaskPlan:
        check_task_size(n_examples)
        eps, delta, adjacency, _ = require_budget(privacy)
        sensitivity = cosine_sensitivity(adjacency)
        sigma = float(gaussian_sigma(eps, delta, sensitivity))
        achieved = float(gaussian_epsilon(sigma, delta, sensitivity))
        event = GaussianEvent(sigma=sigma, sensitivity=sensitivity, adjacency=adjacency, unit="example")
        return TaskPlan(
            events=(event,),
            noise={
                "sigma": sigma,
                "sensitivity": sensitivity,
                "task_epsilon": achieved,
                EMPTY_TASK_RELEASE_KEY: "noise-only class sums",
            },
            assumptions=(public_encoder_assumption(method.get("encoder"), raw_features=bool(method.get("raw_features"))),
                         COSINE_SENSITIVITY_ASSUMPTION),
            release=COSINE_RELEASE,
            notes=(
                f"task {task_index}: Gaussian noise sigma={sigma:.6g} on the per-class feature sums "
                f"(sensitivity {sensitivity:g}, {adjacency.value}) gives epsilon={achieved:.6g} at delta={delta:.3g} "
                "(analytic Gaussian, Balle & Wang 2018).",
                *(
                    (f"[method] {', '.join(unused)} do not affect the cosine classifier (no gradient training).",)
                    if (unused := [k for k in COSINE_UNUSED_KEYS if method.get(k) is not None]) and task_index == 0
                    else ()
                ),
            ),
        )


#: ``[method] name = "cosine"``
COSINE = CosineSpec()

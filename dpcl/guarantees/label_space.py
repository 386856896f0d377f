"""Label-space policy of a classifier-release mechanism (Tobaben et al., Sec. 4.2-4.4, App. F).

A released classifier ``f_t : X -> O_t`` reveals its output label space ``O_t``.
Where ``O_t`` comes from decides whether the release can be DP at all:

* ``data`` (S_data): ``O_t`` is the set of labels present in the private task
  data. Not DP for any epsilon and any delta < 1 (Prop. 4.6): refused with
  :class:`~dpcl.errors.LabelSpaceViolationError`.
* ``prior`` (S_prior): one public label set per task. Examples whose label is
  outside the task's set are dropped before training (Eq. 6); the release is then
  exactly as private as the training mechanism (Prop. 4.7).
* ``prior_const`` (S_prior^const): one public label set for every task (a special
  case of ``prior``).

A mechanism must also release a *proper* classifier when the filtered task is
empty; one that releases nothing (``⊥``) exactly when the data is empty is not
DP (Prop. F.1). :func:`require_proper_release` refuses such plans.

Filtering is vectorised with :func:`numpy.isin`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from dpcl.accounting.validation import parse_choice
from dpcl.errors import ConfigError, InvalidParameterError, LabelSpaceViolationError

__all__ = [
    "LabelSpacePolicy",
    "PROP_4_6_COUNTEREXAMPLE",
    "PROP_F_1_COUNTEREXAMPLE",
    "EMPTY_TASK_RELEASE_KEY",
    "FilterReport",
    "refuse_data_label_space",
    "output_label_sets",
    "filter_task",
    "require_proper_release",
    "label_space_assumption",
]

#: Message carried by every refusal of S_data (Tobaben et al., Prop. 4.6 and its proof in App. F.2).
PROP_4_6_COUNTEREXAMPLE = (
    "label_space = 'data' is not differentially private for any epsilon and any delta < 1 "
    "(Tobaben et al., Prop. 4.6): take neighbouring task datasets D and D' = D + {(x*, y*)} where the "
    "label y* occurs in no example of D. The classifier trained on D' has y* in its output label space, "
    "the one trained on D never does, so the event {output labels = labels(D')} has probability 1 under D' "
    "and 0 under D, and 1 <= e^epsilon * 0 + delta forces delta >= 1. "
    "Use label_space = 'prior' (public per-task label sets) or 'prior_const' (one public label set)."
)

#: Message carried by every refusal of a method that releases nothing on an empty task (Prop. F.1).
PROP_F_1_COUNTEREXAMPLE = (
    "a mechanism that releases no classifier exactly when its (filtered) task data is empty is not "
    "differentially private for any delta < 1 (Tobaben et al., Prop. F.1): for D = {} and D' = {(x*, y*)} "
    "a proper classifier is released with probability 1 under D' and 0 under D. The method must release "
    "a proper classifier (e.g. its data-independent initialisation or pure noise) on an empty task."
)

#: Key of :attr:`TaskPlan.noise` that says what a method releases for an empty task
#: (e.g. ``"noisy_sums"``, ``"initialisation"``). Missing, empty or ``"nothing"`` is refused.
EMPTY_TASK_RELEASE_KEY = "empty_task_release"


class LabelSpacePolicy(str, Enum):
    """Where a classifier's output label space comes from (Tobaben et al., Table 1)."""

    DATA = "data"
    PRIOR = "prior"
    PRIOR_CONST = "prior_const"

    @classmethod
    def parse(cls, value: "LabelSpacePolicy | str") -> "LabelSpacePolicy":
        return parse_choice(cls, value, lambda allowed: ConfigError(
            f"[stream] label_space must be one of {allowed}; got {value!r}."))


def refuse_data_label_space(policy: "LabelSpacePolicy | str") -> LabelSpacePolicy:
    """Return the parsed policy; raise LabelSpaceViolationError (with Prop. 4.6's counterexample) for ``data``."""
    parsed = LabelSpacePolicy.parse(policy)
    if parsed is LabelSpacePolicy.DATA:
        raise LabelSpaceViolationError(PROP_4_6_COUNTEREXAMPLE)
    return parsed


def _label_list(value: Any, where: str) -> list[int]:
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{where} must be a list of integer labels, got {value!r}.")
    out: list[int] = []
    for v in value:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise ConfigError(f"{where} must contain integer labels only, got {v!r}.")
        out.append(int(v))
    return out


def output_label_sets(
    policy: "LabelSpacePolicy | str", prior_labels: Any, n_tasks: int
) -> list[frozenset[int]]:
    """The public output label set O_t of every task.

    ``prior``: ``prior_labels`` is a list of ``n_tasks`` label lists (one per task).
    ``prior_const``: one public set for all tasks; ``prior_labels`` is either a flat
    list of labels or a list of lists whose union is taken (the constant prior of
    Table 1 is the set of all labels known before the first task).
    ``data`` is refused (Prop. 4.6).
    """
    parsed = refuse_data_label_space(policy)
    if not isinstance(prior_labels, (list, tuple)) or len(prior_labels) == 0:
        raise ConfigError(
            f"[stream] prior_labels must be a non-empty list of public labels (label_space = {parsed.value!r}); "
            f"got {prior_labels!r}."
        )
    nested = all(isinstance(v, (list, tuple)) for v in prior_labels)
    if parsed is LabelSpacePolicy.PRIOR:
        if not nested:
            raise ConfigError(
                "[stream] prior_labels must be a list of per-task label lists when label_space = 'prior', "
                f"e.g. [[0, 1], [2, 3]]; got {prior_labels!r}."
            )
        if len(prior_labels) != n_tasks:
            raise ConfigError(
                f"[stream] prior_labels must give one label list per task ({n_tasks} tasks) when "
                f"label_space = 'prior'; got {len(prior_labels)} lists."
            )
        return [frozenset(_label_list(v, f"[stream] prior_labels[{i}]")) for i, v in enumerate(prior_labels)]
    if nested:
        union: set[int] = set()
        for i, v in enumerate(prior_labels):
            union.update(_label_list(v, f"[stream] prior_labels[{i}]"))
    else:
        union = set(_label_list(prior_labels, "[stream] prior_labels"))
    if not union:
        raise ConfigError("[stream] prior_labels gives no label at all; list the public labels.")
    const = frozenset(union)
    return [const] * n_tasks


@dataclass(frozen=True)
class FilterReport:
    """Result of filtering one task to its public label set (Eq. 6). Labels are never reported."""

    task_index: int
    kept: int
    filtered: int


def filter_task(labels: Any, allowed: Iterable[int], task_index: int = 0) -> tuple[np.ndarray, FilterReport]:
    """Boolean mask of examples whose label lies in the public set ``allowed`` (D_t^filtered, Eq. 6).

    Returns ``(mask, report)``; ``report.filtered`` is the number of examples dropped.
    """
    array = np.asarray(labels)
    if array.ndim != 1:
        raise InvalidParameterError(f"labels must be a 1-D array of integer labels, got shape {array.shape}.")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise InvalidParameterError(f"labels must be integers, got dtype {array.dtype}.")
    allowed_array = np.fromiter((int(a) for a in allowed), dtype=np.int64)
    mask = np.isin(array, allowed_array)
    kept = int(np.count_nonzero(mask))
    return mask, FilterReport(task_index=int(task_index), kept=kept, filtered=int(array.size - kept))


def require_proper_release(noise: Mapping[str, Any], method_name: str, task_index: int) -> str:
    """Refuse a plan for an empty task that does not release a proper classifier (Prop. F.1).

    ``noise`` is the :attr:`TaskPlan.noise` of the plan made for ``n_examples = 0``;
    it must name what is released under :data:`EMPTY_TASK_RELEASE_KEY`.
    """
    release = noise.get(EMPTY_TASK_RELEASE_KEY)
    if not isinstance(release, str) or not release.strip() or release.strip().lower() == "nothing":
        raise LabelSpaceViolationError(
            f"method {method_name!r} releases nothing for task {task_index} whose filtered data is empty; "
            + PROP_F_1_COUNTEREXAMPLE
        )
    return release


def label_space_assumption(policy: "LabelSpacePolicy | str") -> str:
    """The plain-sentence assumption a certificate records for a (sound) label-space policy."""
    parsed = refuse_data_label_space(policy)
    if parsed is LabelSpacePolicy.PRIOR:
        return (
            "Output label spaces are public per-task prior label sets fixed before training; examples with "
            "labels outside a task's set are dropped before training (Tobaben et al., Eq. 6, Prop. 4.7)."
        )
    return (
        "Output label space is one public label set fixed before the first task for all tasks "
        "(Tobaben et al., S_prior^const, Prop. 4.7); examples with other labels are dropped before training."
    )


def describe_filtering(reports: Sequence[FilterReport]) -> list[dict[str, int]]:
    """JSON-able per-task counts (kept / filtered) for reports and certificates."""
    return [{"task": r.task_index, "kept": r.kept, "filtered": r.filtered} for r in reports]

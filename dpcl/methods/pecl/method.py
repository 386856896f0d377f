"""``[method] name = "pecl"`` for ``dpcl run``: :class:`PeCLMethod` on the :class:`ContinualMethod` interface.

The noise comes from the task's :class:`~dpcl.guarantees.method_schema.TaskPlan`
(``PECL_SPEC.plan_task``, the same plan ``dpcl audit`` checks): budgets,
clipping norm, delta, calibration and perturbations per token and, under
``[method] training = "dp_sgd"`` (the default), the DP-SGD noise multiplier,
sampling rate, steps and clipping norm the learner runs exactly. Before
training, the method checks that the smallest sigma its TDP table will use is
at least the plan's ``sigma_min`` -- the noise the certificate's events state --
and that the plan's training and DP-SGD clipping are the configured ones, and
refuses (PrivacyViolationError) otherwise.

``training = "dp_sgd"``: the checkpoint is DP (the plan's DP-SGD events, one
fortune as the unit); the scores come from the public corpus with its
categories as Score_2's groups, the output label set from the plan's public
prior. ``training = "paper"``: PeCL as in the paper (not DP).

PeCL is a token-level method: it needs the raw text of every example
(``TrainingData.texts``) and predicts from texts. ``scores`` therefore accepts
an object array of strings; numeric encoder features are refused with a clear
message. The public pre-training corpus is a disjoint set of fortune
categories (:data:`dpcl.methods.pecl.texts.PUBLIC_CATEGORIES`); a training
example whose unit id is in that corpus is refused (it would be both public
and private).

``[method] pretrained_path`` loads a pre-trained causal LM or BERT-like encoder
(``"minilm"``: the installed MiniLM) and its tokenizer from a local directory
instead of building the small model (see
:mod:`dpcl.methods.pecl.learner`); the plan, TDP and certificates are the same.

The released checkpoint (:meth:`PeCLMethod.state_dict`) holds the model and
adapter names only. Under ``training = "paper"``, what the learner computed
from the private text without noise -- the token frequency counts behind the sensitivity scores (eq. 1-3),
the activation norms ``Omega_t`` of the clean text (eq. 8-9), the labels present
in each task's data, and the per-task records (mean sensitivity score,
``lambda_dyn``, ``Omega``, training losses, the sigma actually used and the
longest sequence) -- is curator state (:meth:`PeCLMethod.curator_state_dict`),
kept under the run directory's private ``curator/``. Under ``training = "dp_sgd"``
the token counts stay empty and the Omega values and records hold public and
released quantities; the records (with the TDP sigma, the DP-SGD step counts)
are still kept as curator state.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

import numpy as np
import torch

from dpcl.data.fortunes import load_fortunes_texts
from dpcl.errors import ConfigError, DisjointnessViolationError, InvalidParameterError, PrivacyViolationError
from dpcl.guarantees.method_schema import TaskPlan
from dpcl.methods.pecl.spec import PECL_KEYS
from dpcl.methods.base import ContinualMethod, MethodSetup, ProgressCallback, TrainingTask
from dpcl.methods.pecl.texts import PUBLIC_CATEGORIES
from dpcl.methods.pecl.learner import ContinualLM, learner_config
from dpcl.methods.pecl.tdp import TokenDP

#: curator-state keys (:meth:`PeCLMethod.curator_state_dict`): computed from the private text without noise
CURATOR_KEYS = ("token_counts", "omegas", "seen", "task_records", "batch_generator_state")

#: method keys passed straight to the learner
_LEARNER_KEYS = (
    "alpha", "tau", "theta", "lambda_unlearn", "lambda_min", "lambda_max", "dynamic_lambda", "unlearning",
    "epochs", "batch_size", "learning_rate", "max_seq_len", "lora_rank", "n_layer", "n_embd", "n_head",
    "pretrain_steps", "pretrained_path", "training", "max_grad_norm", "task_softmax",
)


def _texts(features: Any) -> list[str]:
    array = np.asarray(features, dtype=object)
    if array.ndim != 1 or not all(isinstance(x, str) for x in array):
        raise InvalidParameterError(
            "pecl predicts from raw texts: pass a 1-D array of strings (the test texts), not encoder features."
        )
    return [str(x) for x in array]


class PeCLMethod(ContinualMethod):
    name = "pecl"
    #: The runner must pass ``TrainingData.texts`` and evaluate on test texts (not encoder features).
    needs_texts: ClassVar[bool] = True

    def __init__(self, setup: MethodSetup) -> None:
        super().__init__(setup)
        method = {k.name: setup.method.get(k.name, k.default) for k in PECL_KEYS}
        public = load_fortunes_texts(PUBLIC_CATEGORIES, max_per_class=200, min_count=1)
        self.public_unit_ids = np.asarray(public.unit_ids)
        self.training = str(method["training"])
        options = {k: method[k] for k in _LEARNER_KEYS}
        options.update(
            strategy="pecl",
            privacy="tdp",
            calibration=method["calibration"],
            epsilon_lower=float(method["epsilon_lower"]),
            epsilon_upper=float(method["epsilon_upper"]),
            clip_norm=float(method["clip_norm"]),
            delta=setup.privacy.delta,
            device=setup.device,
        )
        self.learner = ContinualLM(len(self.label_space), learner_config(**options), setup.seed, list(public.texts),
                                   reproducible_noise=setup.reproducible_noise,
                                   public_labels=np.asarray(public.labels, dtype=np.int64))
        #: set by a release-only restore (load_state_dict): training on needs load_curator_state_dict first
        self._curator_missing = False

    def planned_work(self, plan: TaskPlan) -> int:
        return 1

    def learn_task(self, task: TrainingTask, progress: ProgressCallback | None = None) -> None:
        data, plan = task.data, task.plan
        if data.texts is None:
            raise ConfigError(
                "pecl trains on raw text: the task data carries no texts (TrainingData.texts is None); "
                "use a text stream (dataset = 'fortunes') whose examples keep their texts."
            )
        overlap = np.intersect1d(np.asarray(data.unit_ids), self.public_unit_ids)
        if overlap.size:
            raise DisjointnessViolationError(
                f"{overlap.size} training example(s) of task {task.index} are in the public pre-training corpus; "
                "choose stream categories disjoint from the public ones."
            )
        if self._curator_missing:
            raise InvalidParameterError(
                "this pecl model was restored from a released checkpoint only: continuing the stream needs its "
                "curator state (token counts, Omega values of earlier tasks); call load_curator_state_dict with "
                "the state curator_state_dict returned."
            )
        if not plan.noise:
            raise ConfigError(
                f"pecl with training = {self.training!r} has no noise-free training: a [run] private = false run "
                "gets no plan to train. Run it privately (training = 'dp_sgd' is covered), or set training = "
                "'paper' for the paper's method, whose non-private run trains its plan as it is."
            )
        self._check_plan(plan)
        if self.training == "dp_sgd":
            noise = plan.noise
            schedule = {k: noise.get(k) for k in ("noise_multiplier", "sample_rate", "steps", "max_grad_norm")}
            if len(data.texts) and (not plan.events or any(v is None for v in schedule.values())):
                raise PrivacyViolationError(
                    f"training = 'dp_sgd' needs a plan with DP-SGD events and its schedule for task {task.index}; "
                    f"got events={plan.events!r}, noise={dict(noise)!r}."
                )
            self.learner.fit_task(task.index, list(data.texts), self.label_positions(data.labels),
                                  output_labels=self.label_positions(task.output_labels), dpsgd=schedule)
        else:
            self.learner.fit_task(task.index, list(data.texts), self.label_positions(data.labels))
        if progress is not None:
            progress(1)

    def _check_plan(self, plan: TaskPlan) -> None:
        noise = plan.noise
        cfg = self.learner.config
        expected = {
            "training": cfg.training,
            "calibration": cfg.calibration,
            "epsilon_lower": cfg.epsilon_lower,
            "epsilon_upper": cfg.epsilon_upper,
            "clip_norm": cfg.clip_norm,
            "delta": cfg.delta,
            "releases_per_token": cfg.epochs,
        }
        if cfg.training == "dp_sgd" and noise.get("steps"):
            expected["max_grad_norm"] = cfg.max_grad_norm
        for key, value in expected.items():
            if noise.get(key) != value:
                raise PrivacyViolationError(
                    f"the plan's {key} = {noise.get(key)!r} differs from the trained {key} = {value!r}; "
                    "what is trained must be what is certified."
                )
        table = TokenDP(
            epsilon_lower=cfg.epsilon_lower,
            epsilon_upper=cfg.epsilon_upper,
            delta=cfg.delta,
            clip_norm=cfg.clip_norm,
            calibration=cfg.calibration,
            releases=cfg.epochs,
        ).applied_sigmas
        if float(table.min()) < float(noise["sigma_min"]) * (1 - 1e-9):
            raise PrivacyViolationError(
                f"TDP would use sigma {float(table.min()):.6g} below the certified sigma_min {noise['sigma_min']:.6g}."
            )

    def scores(self, features: np.ndarray) -> np.ndarray:
        return self.learner.class_scores(_texts(features))

    def state_dict(self) -> dict[str, Any]:
        """The release: model weights (TDP-trained adapters and head) and adapter names; no statistics of the data."""
        learner = self.learner
        return {
            **self._base_state(),
            "model": {k: v.detach().cpu() for k, v in learner.model.state_dict().items()},
            "adapters": [f"task_{k}" for k in range(int(learner.adapter.split("_")[1]) + 1)],
            "adapter": learner.adapter,
            "tasks_fitted_learner": learner.tasks_fitted,
        }

    def curator_state_dict(self) -> dict[str, Any]:
        """Token counts, Omega values, labels present and task records of the private text: private, never released."""
        learner = self.learner
        if self._curator_missing:
            raise InvalidParameterError("this pecl model has no curator state: load_curator_state_dict was not called.")
        return {
            "token_counts": torch.as_tensor(learner.token_stats.counts, dtype=torch.int64).clone(),
            "omegas": [float(x) for x in learner.omegas],
            "seen": torch.as_tensor(learner.seen, dtype=torch.bool).clone(),
            "task_records": [
                {k: v for k, v in r.items() if isinstance(v, (int, float, str, dict))} for r in learner.task_records
            ],
            # seeded batch-order generator (public draws); a resumed run continues with the same batches
            "batch_generator_state": learner.generator.get_state(),
        }

    def load_curator_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`curator_state_dict` output after :meth:`load_state_dict`."""
        learner = self.learner
        missing = [k for k in CURATOR_KEYS if k not in state]
        if missing:
            raise InvalidParameterError(f"the pecl curator state lacks {', '.join(missing)}.")
        counts = np.asarray(torch.as_tensor(state["token_counts"]), dtype=np.int64)
        if counts.ndim != 2 or counts.shape[1] != learner.token_stats.vocab_size:
            raise InvalidParameterError(
                f"the curator state's token counts have shape {counts.shape}, expected [tasks, "
                f"{learner.token_stats.vocab_size}] for this model's vocabulary: it belongs to another run."
            )
        seen = np.asarray(torch.as_tensor(state["seen"]), dtype=bool)
        if seen.shape != learner.seen.shape:
            raise InvalidParameterError(f"the curator state covers {seen.size} labels, this model {learner.seen.size}.")
        records = list(state["task_records"])
        if len(records) != learner.tasks_fitted:
            raise InvalidParameterError(
                f"the curator state records {len(records)} tasks but the checkpoint {learner.tasks_fitted}: "
                "it belongs to another release."
            )
        learner.token_stats.counts = counts.copy()
        learner.omegas = [float(x) for x in state["omegas"]]
        learner.seen = seen.copy()
        learner.task_records = records
        learner.generator.set_state(torch.as_tensor(state["batch_generator_state"], dtype=torch.uint8))
        self._curator_missing = False

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._load_base_state(state)
        learner = self.learner
        peft_lm = learner.model.lm
        for name in state["adapters"]:
            if name not in peft_lm.peft_config:
                peft_lm.add_adapter(name, learner.lora_config)
        peft_lm.set_adapter(state["adapter"])
        for n, p in peft_lm.named_parameters():
            p.requires_grad_("lora_" in n and f".{state['adapter']}." in n)
        learner.adapter = state["adapter"]
        missing, unexpected = learner.model.load_state_dict(
            {k: torch.as_tensor(v) for k, v in state["model"].items()}, strict=False
        )
        if unexpected or [m for m in missing if "lora_" in m or m.startswith("head")]:
            raise InvalidParameterError(f"checkpoint does not match the pecl model (missing {missing[:3]}).")
        learner.tasks_fitted = int(state["tasks_fitted_learner"])
        self._curator_missing = True  # until load_curator_state_dict

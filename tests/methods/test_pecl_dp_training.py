"""The DP PeCL learner (``training = "dp_sgd"``): DP-SGD exactly as planned, and no private text outside it.

Tiny model (one layer, width 16), 16 examples per task: a few seconds on CPU.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from dpcl.errors import InvalidParameterError, PrivacyViolationError  # noqa: E402
from dpcl.guarantees import per_token as pt  # noqa: E402
import dpcl.methods.pecl.spec as pecl_spec  # noqa: E402
from dpcl.methods.pecl.learner import ContinualLM, learner_config  # noqa: E402
from dpcl.methods.pecl.model import LMClassifier  # noqa: E402
from dpcl.methods.pecl.tdp import TokenDP  # noqa: E402

pytestmark = pytest.mark.torch

TINY = {"n_layer": 1, "n_embd": 16, "n_head": 1, "max_seq_len": 24, "pretrain_steps": 2, "batch_size": 4,
        "lora_rank": 2, "epochs": 2}
PUBLIC = [f"public sentence number {i} about {w}" for i, w in enumerate(["tea", "rain", "maps", "owls"] * 4)]
PUBLIC_LABELS = [i % 2 for i in range(len(PUBLIC))]
PRIVACY = {"epsilon": 4.0, "delta": 1e-6, "adjacency": "add_remove", "accountant": "auto"}
SCHEDULE_KEYS = ("noise_multiplier", "sample_rate", "steps", "max_grad_norm")


def _texts(kind: str) -> tuple[list[str], np.ndarray]:
    if kind == "a":
        texts = [f"apples and pears {i}" for i in range(8)] + [f"12 Main Street {i}" for i in range(8)]
    else:  # other private text, same size and labels
        texts = [f"zebra crossing {i * 7}" for i in range(8)] + [f"secret code {i * 13:06d}" for i in range(8)]
    return texts, np.array([0] * 8 + [1] * 8)


def _plan(n: int, task: int = 0, **method):
    return pecl_spec.PECL_SPEC.plan_task({**TINY, **method}, PRIVACY, n, task)


def _learner(**options) -> ContinualLM:
    config = learner_config(**{**TINY, "training": "dp_sgd", **options})
    return ContinualLM(4, config, 0, PUBLIC, reproducible_noise=True, public_labels=PUBLIC_LABELS)


def _fit(learner: ContinualLM, kind: str, task: int = 0, plan=None) -> dict:
    texts, labels = _texts(kind)
    labels = labels + 2 * task
    plan = plan or _plan(len(texts), task)
    schedule = {k: plan.noise[k] for k in SCHEDULE_KEYS}
    return learner.fit_task(task, texts, labels, output_labels=[2 * task, 2 * task + 1], dpsgd=schedule)


def test_scores_lambda_sigma_and_omega_factor_do_not_depend_on_the_private_text(monkeypatch):
    """Two learners, two different private tasks of the same size: everything outside DP-SGD is identical, and
    every model forward outside the DP-SGD steps reads the public corpus only."""
    outside: list[torch.Tensor] = []
    inside = {"depth": 0}
    original_forward = LMClassifier.forward
    original_steps = ContinualLM._dpsgd_steps

    def spy_forward(self, input_embeds, mask):
        if inside["depth"] == 0:
            outside.append(input_embeds.detach().clone())
        return original_forward(self, input_embeds, mask)

    def spy_steps(self, *args, **kwargs):
        inside["depth"] += 1
        try:
            return original_steps(self, *args, **kwargs)
        finally:
            inside["depth"] -= 1

    first, second = _learner(), _learner()
    monkeypatch.setattr(LMClassifier, "forward", spy_forward)
    monkeypatch.setattr(ContinualLM, "_dpsgd_steps", spy_steps)
    records = []
    for learner, kind in ((first, "a"), (second, "b")):
        records.append([_fit(learner, kind, 0), _fit(learner, kind, 1)])
    a, b = first.public_scores(), second.public_scores()
    assert torch.equal(a["table"], b["table"]) and a["mean_score"] == b["mean_score"]
    for ra, rb in zip(*records):
        for key in ("public_mean_score", "lambda_dyn", "tdp_sigma"):
            assert ra[key] == rb[key], key
        assert ra["guarantee"]["sigma_min_used"] == rb["guarantee"]["sigma_min_used"]
    # no token count of the private text is kept
    assert first.token_stats.counts.shape[0] == 0 and second.token_stats.counts.shape[0] == 0
    # outside DP-SGD the model only ever saw the public corpus' clean embeddings (Omega_k's activation norms)
    public_embeds = first.embedding(a["public_ids"]).detach()
    assert outside and all(torch.equal(x, public_embeds) for x in outside)
    # Omega_k is a function of the released adapter and the public corpus
    assert records[0][1]["omega"] == pytest.approx(first._task_importance(a["public_ids"], a["public_mask"]))


def test_dp_sgd_runs_the_planned_steps_rate_noise_and_clipping(monkeypatch):
    from opacus.optimizers import DPOptimizer

    calls = {"init": [], "pre_step": 0, "clipped": []}
    original_init, original_pre, original_clip = DPOptimizer.__init__, DPOptimizer.pre_step, \
        DPOptimizer.clip_and_accumulate

    def spy_init(self, *args, **kwargs):
        calls["init"].append(kwargs)
        original_init(self, *args, **kwargs)

    def spy_pre(self, *args, **kwargs):
        calls["pre_step"] += 1
        return original_pre(self, *args, **kwargs)

    def spy_clip(self):
        samples = [p.grad_sample for p in self.params if p.grad_sample is not None]
        raw = torch.stack([g.reshape(g.shape[0], -1).norm(dim=1) for g in samples], dim=1).norm(dim=1) \
            if samples and samples[0].shape[0] else torch.zeros(0)
        before = [p.summed_grad.clone() if getattr(p, "summed_grad", None) is not None else None for p in self.params]
        original_clip(self)
        added = torch.cat([(p.summed_grad - (b if b is not None else 0)).flatten()
                           for p, b in zip(self.params, before)])
        calls["clipped"].append((raw, float(added.norm())))

    monkeypatch.setattr(DPOptimizer, "__init__", spy_init)
    monkeypatch.setattr(DPOptimizer, "pre_step", spy_pre)
    monkeypatch.setattr(DPOptimizer, "clip_and_accumulate", spy_clip)
    clip = 1e-3  # far below the raw per-example gradient norms: clipping must act
    plan = _plan(16, max_grad_norm=clip, epochs=3)
    learner = _learner(epochs=3, max_grad_norm=clip)
    record = _fit(learner, "a", plan=plan)
    steps, q = plan.noise["steps"], plan.noise["sample_rate"]
    assert steps == 3 * math.ceil(16 / 4) and q == pytest.approx(0.25)
    assert record["dpsgd"]["steps_run"] == steps == calls["pre_step"]
    (kwargs,) = calls["init"]
    assert kwargs["noise_multiplier"] == plan.noise["noise_multiplier"]
    assert kwargs["max_grad_norm"] == clip and kwargs["expected_batch_size"] == 4
    # Poisson sampling at rate q: the number of sampled examples is Binomial(steps * n, q)
    draws = steps * 16
    sampled = record["dpsgd"]["examples_sampled"]
    assert abs(sampled - q * draws) <= 5 * math.sqrt(draws * q * (1 - q))
    assert sampled + 0 == sum(int(r.numel()) for r, _ in calls["clipped"])
    # each example's gradient was clipped to max_grad_norm: the clipped sum has norm <= (batch size) * C
    raw_norms = torch.cat([r for r, _ in calls["clipped"]])
    assert float(raw_norms.max()) > 10 * clip
    for raw, added in calls["clipped"]:
        assert added <= raw.numel() * clip * (1 + 1e-4)


def test_tdp_draws_one_public_sigma_once_per_epoch(monkeypatch):
    draws = {"record_epoch": 0}
    original = TokenDP.record_epoch

    def spy(self, scores, mask):
        draws["record_epoch"] += 1
        assert torch.unique(self.sigmas(scores)).numel() == 1  # one sigma for every token
        return original(self, scores, mask)

    monkeypatch.setattr(TokenDP, "record_epoch", spy)
    plan = _plan(16)
    record = _fit(_learner(), "a", plan=plan)
    assert draws["record_epoch"] == TINY["epochs"]
    assert record["tdp_sigma"] >= plan.noise["sigma_min"] * (1 - 1e-9)
    assert record["guarantee"]["releases_per_token"] == TINY["epochs"]
    assert record["guarantee"]["epsilon"] <= plan.noise["per_token"]["epsilon"] * (1 + 1e-9)


def test_dp_learner_refuses_missing_plan_or_mismatched_schedule():
    learner = _learner()
    texts, labels = _texts("a")
    with pytest.raises(InvalidParameterError, match="output_labels"):
        learner.fit_task(0, texts, labels)
    plan = _plan(16)
    schedule = {k: plan.noise[k] for k in SCHEDULE_KEYS}
    with pytest.raises(InvalidParameterError, match="steps per epoch"):
        learner.fit_task(0, texts, labels, output_labels=[0, 1], dpsgd={**schedule, "steps": 7})
    with pytest.raises(InvalidParameterError, match="dp_sgd"):
        learner_config(strategy="seqft", privacy="dpsgd", training="dp_sgd")


def test_pecl_method_trains_the_plans_dp_sgd_and_keeps_no_private_counts():
    from dpcl.methods.base import MethodSetup, TrainingData, method_class

    setup = MethodSetup(method={"name": "pecl", **TINY}, privacy=PRIVACY, label_space=(0, 1, 2, 3), input_dim=1,
                        seed=0, reproducible_noise=True)
    method = method_class("pecl")(setup)
    texts, labels = _texts("a")
    data = TrainingData(features=np.zeros((16, 1), np.float32), labels=labels, unit_ids=np.arange(16) + 10_000,
                        texts=tuple(texts))
    other = pecl_spec.PECL_SPEC.plan_task({**TINY, "max_grad_norm": 2.0}, PRIVACY, 16, 0)
    with pytest.raises(PrivacyViolationError, match="max_grad_norm"):
        method.fit_task(0, data, (0, 1), other)
    paper = pecl_spec.PECL_SPEC.plan_task({**TINY, "training": "paper"}, {**PRIVACY, "epsilon": 10.0}, 16, 0)
    with pytest.raises(PrivacyViolationError, match="training"):
        method.fit_task(0, data, (0, 1), paper)
    from dpcl.errors import ConfigError
    from dpcl.guarantees.method_schema import ReleaseCoverage, TaskPlan

    noise_free = TaskPlan(events=(), noise={}, release=ReleaseCoverage.not_covered("a [run] private = false run"))
    with pytest.raises(ConfigError, match="no noise-free training"):  # what a non-private run would pass
        method.fit_task(0, data, (0, 1), noise_free)
    plan = _plan(16)
    method.fit_task(0, data, (0, 1), plan)
    (record,) = method.learner.task_records
    assert record["dpsgd"]["steps_run"] == plan.noise["steps"]
    assert record["dpsgd"]["noise_multiplier"] == plan.noise["noise_multiplier"]
    curator = method.curator_state_dict()
    assert curator["token_counts"].shape[0] == 0  # nothing counted from the private text
    assert method.learner.seen.tolist() == [True, True, False, False]  # the public label set of task 0


def test_dpcl_run_of_a_dp_pecl_config_certifies_the_checkpoint_per_example(tmp_path):
    """A tiny two-task DP PeCL through `dpcl run`: the headline is the checkpoint's example-level DP-SGD
    guarantee, within the budget, and every certificate verifies."""
    from dpcl.guarantees.certificates import read_certificate, verify_certificate
    from dpcl.runner import run_training

    config = tmp_path / "dp_pecl.toml"
    config.write_text(
        "[privacy]\nepsilon = 2.0\ndelta = 1e-6\nadjacency = \"add_remove\"\naccountant = \"auto\"\n"
        "across_tasks = \"auto\"\n\n[stream]\ndataset = \"fortunes_texts\"\n"
        "dataset_options = { categories = [\"food\", \"law\", \"science\", \"work\"], max_per_class = 6 }\n"
        "tasks = [[0, 1], [2, 3]]\nlabel_space = \"prior\"\nprior_labels = [[0, 1], [2, 3]]\n"
        "disjoint_units = true\n\n[method]\nname = \"pecl\"\ntraining = \"dp_sgd\"\nmax_grad_norm = 1.0\n"
        "epochs = 1\nbatch_size = 4\nmax_seq_len = 32\nlora_rank = 2\nn_layer = 1\nn_embd = 16\nn_head = 2\n"
        "pretrain_steps = 2\n",
        encoding="utf-8",
    )
    result = run_training(config, tmp_path / "out", quiet=True)
    assert result.complete and len(result.releases) == 2
    for release in result.releases:
        assert verify_certificate(result.out_dir / release.certificate).valid
    cert = read_certificate(result.last_certificate)
    g = cert["guarantee"]
    assert g["private"] is True and g["basis"] == pecl_spec.DPSGD_PECL_RELEASE.basis
    assert g["unit"] == "example" and g["adjacency"] == "add_remove"
    assert math.isfinite(g["epsilon"]) and 0 < g["epsilon"] <= 2.0 * (1 + 1e-6)
    # the TDP statement is scoped to the input embeddings, per token, in a ledger of its own
    (scoped,) = cert["scoped_guarantees"]
    assert scoped["name"] == pt.INPUT_EMBEDDINGS_SCOPE_NAME and scoped["scope"] == pecl_spec.DPSGD_INPUT_EMBEDDINGS_SCOPE
    assert scoped["unit"] == "token" and scoped["adjacency"] == "replace_one"
    assert pecl_spec.PUBLIC_STATE_ASSUMPTION in cert["assumptions"]
    assert pt.DATA_DEPENDENCE_ASSUMPTION not in cert["assumptions"]

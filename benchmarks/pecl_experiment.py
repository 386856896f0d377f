"""PeCL and its baselines on the Debian fortunes stream: BWT, Last, Avg, canary exposure, privacy.

``python benchmarks/pecl_experiment.py --out results/pecl`` writes
``results.json`` and ``table.md``. The stream: fortune categories as classes,
``n_tasks`` class-incremental tasks of ``classes_per_task`` categories each
(:func:`dpcl.data.class_incremental_stream`); a disjoint set of categories is the
public pre-training corpus of the language model (:mod:`dpcl.methods.pecl.texts`). Canaries
(:mod:`dpcl.methods.pecl.canary`) are
inserted into the first task's training text and their exposure is measured
after the last task.

Every method reports the privacy it really has: PeCL as in the paper
(``training = "paper"``) has no checkpoint guarantee (epsilon = inf for the
checkpoint) and reports its per-token epsilon of the input release at the true
sensitivity (worst token) and the sequence-level epsilon of the worst sequence
(:mod:`dpcl.guarantees.per_token`); the DP PeCL (``training = "dp_sgd"``) the
example-level epsilon of its checkpoint (its DP-SGD plan, the one ``dpcl run``
certifies) next to the scoped per-token statement; DP-SGD baselines are planned
before training (:func:`baseline_dpsgd_plan`), certified by a
:class:`dpcl.Certifier` (each task's run charged to every task whose examples it
reads) and report the last certificate's example-level epsilon, that of their
worst example over the stream: ER replays past examples and GEM queries its
memories of past examples, so those examples are charged in several tasks, and
their noise is calibrated so that this composition meets ``dpsgd_epsilon``;
non-private runs epsilon = inf. Accuracies are measured on the test split, which nothing here
tunes on: class-incremental (argmax over every label seen so far) and
task-incremental (argmax over the evaluated task's own label set, the paper's
per-task evaluation).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dpcl.certifier import Certifier  # noqa: E402
from dpcl.accounting.accountants import compute_epsilon
from dpcl.accounting.dpsgd import dpsgd_events, dpsgd_noise_multiplier, dpsgd_stream_noise_multiplier
from dpcl.errors import InvalidParameterError
from dpcl._io.atomic_io import write_json_atomic, write_text_atomic
from dpcl.guarantees.method_schema import ReleaseCoverage
from dpcl.methods.noise_source import noise_assumptions
from dpcl.methods.pecl.canary import Canary, canary_exposures, insert_canaries, make_canaries
from dpcl.methods.pecl.learner import (
    ContinualLM,
    LearnerConfig,
    baseline_dpsgd_schedule,
    baseline_task_reads,
    learner_config,
)
from dpcl.methods.pecl.spec import PECL_KEYS, PECL_SPEC
from dpcl.methods.pecl.texts import (  # the stream; re-exported for the scripts that import it from here
    PUBLIC_CATEGORIES,
    STREAM_CATEGORIES,
    TextTask,
    fortunes_text_stream,
    public_corpus,
)
from dpcl.metrics import summarize


#: method label -> learner options
METHODS: dict[str, dict[str, Any]] = {
    "PeCL (analytic sigma)": {"strategy": "pecl", "privacy": "tdp", "calibration": "analytic"},
    "PeCL (paper sigma)": {"strategy": "pecl", "privacy": "tdp", "calibration": "paper"},
    "DP PeCL (eps=1)": {"strategy": "pecl", "privacy": "tdp", "training": "dp_sgd", "dpsgd_epsilon": 1.0},
    "DP PeCL (eps=8)": {"strategy": "pecl", "privacy": "tdp", "training": "dp_sgd", "dpsgd_epsilon": 8.0},
    "DP PeCL w/o TDP (eps=8)": {"strategy": "pecl", "privacy": "none", "training": "dp_sgd", "dpsgd_epsilon": 8.0},
    "PeCL w/o TDP (not private)": {"strategy": "pecl", "privacy": "none"},
    "SeqFT": {"strategy": "seqft", "privacy": "none"},
    "SeqFT+DPSGD": {"strategy": "seqft", "privacy": "dpsgd"},
    "ER": {"strategy": "er", "privacy": "none"},
    "ER+DPSGD": {"strategy": "er", "privacy": "dpsgd"},
    "EWC": {"strategy": "ewc", "privacy": "none"},
    "EWC+DPSGD": {"strategy": "ewc", "privacy": "dpsgd"},
    "SeqFT+DPSGD (eps=8)": {"strategy": "seqft", "privacy": "dpsgd", "dpsgd_epsilon": 8.0},
    "ER+DPSGD (eps=8)": {"strategy": "er", "privacy": "dpsgd", "dpsgd_epsilon": 8.0},
    "EWC+DPSGD (eps=8)": {"strategy": "ewc", "privacy": "dpsgd", "dpsgd_epsilon": 8.0},
    "O-LoRA": {"strategy": "olora", "privacy": "none"},
    "O-LoRA+DPSGD": {"strategy": "olora", "privacy": "dpsgd"},
    "O-LoRA+DPSGD (eps=8)": {"strategy": "olora", "privacy": "dpsgd", "dpsgd_epsilon": 8.0},
    "GEM": {"strategy": "gem", "privacy": "none"},
    "GEM+DPSGD": {"strategy": "gem", "privacy": "dpsgd"},
    "GEM+DPSGD (eps=8)": {"strategy": "gem", "privacy": "dpsgd", "dpsgd_epsilon": 8.0},
    "MTL (upper reference)": {"strategy": "mtl", "privacy": "none"},
}








def dp_pecl_plan(config: LearnerConfig, n_examples: int, task_index: int):
    """The plan ``dpcl run`` would make for a DP PeCL task (add/remove, one fortune, ``dpsgd_epsilon`` per task)."""
    method = {k.name: getattr(config, k.name) for k in PECL_KEYS if hasattr(config, k.name)}
    privacy = {"epsilon": config.dpsgd_epsilon, "delta": config.delta, "adjacency": "add_remove", "accountant": "auto"}
    return PECL_SPEC.plan_task(method, privacy, int(n_examples), int(task_index))


def baseline_dpsgd_plan(config: LearnerConfig, task_sizes: Sequence[int]) -> list[dict[str, Any]]:
    """The DP-SGD schedule of every task of a DP-SGD baseline, planned before training, with the tasks it reads.

    ``dpsgd_epsilon`` is the budget of the worst example over the whole stream. Where a task reads only its
    own examples (SeqFT, EWC, O-LoRA; tasks hold disjoint fortunes) each task is calibrated to it alone.
    ER's buffered examples are trained on again in every later task and GEM's memory examples are queried,
    at the later task's sampling rate and steps, in every later task (:func:`.learner.baseline_task_reads`):
    such an example is charged in each of those runs, so one noise multiplier for the stream is calibrated
    on the composition of every run that reads one example
    (:func:`dpcl.accounting.dpsgd.dpsgd_stream_noise_multiplier`), the largest of them over the sets of runs
    that read one task's examples (nested here: the first task's kept examples are read by every run).
    """
    reads = baseline_task_reads(config, task_sizes)
    plan = [{"tasks": tasks, "n_trained": n, "max_grad_norm": config.max_grad_norm, "target_epsilon": config.dpsgd_epsilon}
            for tasks, n in reads]
    for task, (_, n) in zip(plan, reads):
        if n > 0:
            task["sample_rate"], task["steps"] = baseline_dpsgd_schedule(config, n)
    readers = [tuple(k for k, (tasks, n) in enumerate(reads) if j in tasks and n > 0) for j in range(len(reads))]
    shared = [r for r in dict.fromkeys(readers) if r and not any(set(r) < set(o) for o in readers)]
    if any(len(r) > 1 for r in shared):
        z = max(
            dpsgd_stream_noise_multiplier(
                config.dpsgd_epsilon, config.delta, [(plan[k]["sample_rate"], plan[k]["steps"]) for k in r]
            ).noise_multiplier
            for r in shared
        )
        for task in plan:
            task.update(noise_multiplier=z, calibration="stream: the worst example's runs composed")
    else:
        for task in plan:
            if "steps" in task:
                z = dpsgd_noise_multiplier(config.dpsgd_epsilon, config.delta, task["sample_rate"], task["steps"])
                task.update(noise_multiplier=z.noise_multiplier, calibration="task: its own run")
    return plan


def _checkpoint_bytes(learner: ContinualLM) -> bytes:
    """The released parameters (LoRA adapters and head; everything else is the public pre-trained model)."""
    import io

    buffer = io.BytesIO()
    state = {k: v.detach().cpu() for k, v in learner.model.state_dict().items() if "lora_" in k or k.startswith("head")}
    torch.save(state, buffer)
    return buffer.getvalue()


def _dpsgd_certifier(label: str, run_dir: Path, tasks: Sequence[TextTask], config: LearnerConfig):
    return Certifier(
        run_dir, delta=config.delta, label_space="prior", prior_labels=[list(t.label_set) for t in tasks],
        adjacency="add_remove", unit="example", across_tasks="parallel", disjoint_units=True, accountant="auto",
        task_sizes=[len(t.train_texts) for t in tasks], method=label,
    )


def _release_assumptions(config: LearnerConfig, reproducible_noise: bool) -> list[str]:
    kept = {"er": "The replay buffer", "gem": "The episodic memories"}.get(config.strategy)
    sentences = [
        "The pre-trained model, tokenizer and label sets are public (disjoint fortune categories, the public prior).",
        *noise_assumptions(reproducible_noise),
    ]
    if kept is not None:
        sentences.append(
            f"{kept} (examples drawn by the public seeded generator) are read only inside charged DP-SGD queries: "
            "each task's charge names every task whose examples its run reads."
        )
    return sentences


def run_method(
    label: str,
    options: dict[str, Any],
    tasks: Sequence[TextTask],
    public: Sequence[str],
    n_labels: int,
    *,
    seed: int,
    canaries: Sequence[Canary] = (),
    canary_repeats: int = 4,
    n_candidates: int = 200,
    base: dict[str, Any] | None = None,
    reproducible_noise: bool = False,
    public_labels: Sequence[int] | None = None,
    canary_task: int = 0,
    run_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Train one method over the stream; accuracy matrix, BWT/Last/Avg, canary exposure, privacy.

    The privacy noise comes from OS entropy unless ``reproducible_noise`` derives it from ``seed``
    (:mod:`dpcl.methods.noise_source`); ``seed`` drives everything else. A DP-SGD baseline
    (``privacy = "dpsgd"``) is planned before training (:func:`baseline_dpsgd_plan`), each task's run is
    charged to the tasks it reads and every release certified by a :class:`dpcl.Certifier` in ``run_dir``
    (a new directory; a temporary one when None); its epsilon is the last certificate's.
    """
    if run_dir is None and learner_config(**{**(base or {}), **options}).privacy == "dpsgd":
        import tempfile

        with tempfile.TemporaryDirectory(prefix="dpcl-baseline-") as tmp:
            return run_method(label, options, tasks, public, n_labels, seed=seed, canaries=canaries,
                              canary_repeats=canary_repeats, n_candidates=n_candidates, base=base,
                              reproducible_noise=reproducible_noise, public_labels=public_labels,
                              canary_task=canary_task, run_dir=Path(tmp) / "run")
    config: LearnerConfig = learner_config(**{**(base or {}), **options})
    if not 0 <= canary_task < len(tasks):
        raise InvalidParameterError(f"canary_task must lie in [0, {len(tasks)}), got {canary_task}.")
    start = time.perf_counter()
    learner = ContinualLM(n_labels, config, seed, public, reproducible_noise=reproducible_noise,
                          public_labels=public_labels)
    if canaries:  # the whole canary, its secret included, must fit in max_seq_len tokens of the model's tokenizer
        lengths = learner.token_lengths([c.text for c in canaries])
        if int(lengths.max()) > config.max_seq_len:
            raise InvalidParameterError(
                f"max_seq_len={config.max_seq_len} truncates the canary {canaries[int(lengths.argmax())].text!r} "
                f"({int(lengths.max())} tokens); raise max_seq_len so the secret is trained on and scored."
            )
    n = len(tasks)
    train_sets = [(list(t.train_texts), t.train_labels) for t in tasks]
    if canaries:
        texts, labels = train_sets[canary_task]
        train_sets[canary_task] = insert_canaries(texts, labels, canaries, canary_repeats, int(labels[0]))
    dp_pecl = config.strategy == "pecl" and config.training == "dp_sgd"
    dp_baseline = config.privacy == "dpsgd"
    plans = []
    records = []
    releases = []
    if dp_baseline:
        run_path = Path(run_dir)
        if run_path.exists() and any(run_path.iterdir()):
            raise InvalidParameterError(
                f"run_dir {str(run_path)!r} is not empty: a certified baseline run starts a ledger of its own; "
                "give a new directory."
            )
        if config.strategy == "mtl" or any(not t.label_set for t in tasks):
            raise InvalidParameterError(
                "a DP-SGD baseline is certified per task: it needs a sequential strategy (not mtl) and the public "
                "label set of every task (TextTask.label_set)."
            )
        plans = baseline_dpsgd_plan(config, [len(tx) for tx, _ in train_sets])
        if any("steps" not in p for p in plans):
            raise InvalidParameterError("a certified DP-SGD baseline needs a non-empty training set in every task.")
        certifier = _dpsgd_certifier(label, run_path, tasks, config)
        coverage = ReleaseCoverage.post_processing(
            "adapters and head updated only by the charged DP-SGD steps (per-example clipping, Gaussian noise, "
            "Poisson sampling); penalties, Fisher terms and GEM projections use released gradients or parameters"
        )
        assumptions = _release_assumptions(config, reproducible_noise)
    if config.strategy == "mtl":
        texts = [x for tx, _ in train_sets for x in tx]
        labels = np.concatenate([lb for _, lb in train_sets])
        records.append(learner.fit_task(0, texts, labels))
        both = np.array([learner.accuracies(t.test_texts, t.test_labels, t.label_set or None) for t in tasks])
        row = both[:, 0].tolist()
        matrix = np.array([row])
        ti_matrix = both[None, :, 1]
        metrics = {"accuracy_matrix": matrix.tolist(), "last": float(np.mean(row)), "avg": None, "backward_transfer": None}
        ti_metrics = {"last": float(np.mean(ti_matrix)), "avg": None, "backward_transfer": None}
    else:
        matrix = np.full((n, n), np.nan)
        ti_matrix = np.full((n, n), np.nan)
        for k, (tx, lb) in enumerate(train_sets):
            if dp_pecl:
                plan = dp_pecl_plan(config, len(tx), k)
                plans.append(plan)
                schedule = {key: plan.noise[key] for key in ("noise_multiplier", "sample_rate", "steps", "max_grad_norm")}
                records.append(learner.fit_task(k, tx, lb, output_labels=tasks[k].label_set, dpsgd=schedule))
            elif dp_baseline:
                plan = plans[k]
                certifier.charge(list(plan["tasks"]), dpsgd_events(plan["noise_multiplier"], plan["sample_rate"],
                                                                   plan["steps"]))
                records.append(learner.fit_task(k, tx, lb, output_labels=tasks[k].label_set, dpsgd=plan))
                releases.append(certifier.release(k, _checkpoint_bytes(learner), coverage=coverage,
                                                  assumptions=assumptions))
            else:
                records.append(learner.fit_task(k, tx, lb))
            both = np.array([learner.accuracies(t.test_texts, t.test_labels, t.label_set or None)
                             for t in tasks[: k + 1]])
            matrix[k, : k + 1], ti_matrix[k, : k + 1] = both[:, 0], both[:, 1]
        metrics = summarize(matrix)
        ti_metrics = summarize(ti_matrix)
    result: dict[str, Any] = {
        "method": label,
        "options": options,
        "backward_transfer": metrics["backward_transfer"],
        "last": metrics["last"],
        "avg": metrics["avg"],
        "accuracy_matrix": [[None if not np.isfinite(v) else float(v) for v in row] for row in np.atleast_2d(matrix)],
        "task_incremental": {
            "backward_transfer": ti_metrics["backward_transfer"],
            "last": ti_metrics["last"],
            "avg": ti_metrics["avg"],
            "accuracy_matrix": [[None if not np.isfinite(v) else float(v) for v in row]
                                for row in np.atleast_2d(ti_matrix)],
        },
        "seconds": time.perf_counter() - start,
    }
    if canaries:
        canary_label = int(train_sets[canary_task][1][-1])  # insert_canaries labels them with the task's first label
        score = (learner.sequence_nll if learner.model.generative
                 else functools.partial(learner.label_nll, label=canary_label))
        exposures = canary_exposures(score, canaries, n_candidates, seed + 7)
        result["canary_exposure"] = float(np.mean([e["exposure"] for e in exposures]))
        result["canary_candidate_exposure"] = float(np.mean([e["candidate_exposure"] for e in exposures]))
        result["canaries"] = exposures
        result["canary_setup"] = {"task": canary_task, "count": len(canaries), "repeats": canary_repeats,
                                  "candidates": n_candidates, "space_size": canaries[0].space_size,
                                  "score": "sequence NLL (log-perplexity x length)" if learner.model.generative
                                  else f"classification loss -log p(label {canary_label} | text), released labels"}
    if dp_pecl:
        per_task = [compute_epsilon(p.events[0], config.delta).epsilon for p in plans if p.events]
        guarantees = [r["guarantee"] for r in records if "guarantee" in r]
        result["privacy"] = {
            "unit": "example (add/remove)",
            "epsilon": max(per_task) if per_task else 0.0,
            "per_task": per_task,
            "delta": config.delta,
            "note": "checkpoint: DP-SGD per task, tasks hold disjoint fortunes (parallel: the worst task)",
        }
        if guarantees:
            result["privacy"]["input_token_epsilon"] = max(g["epsilon"] for g in guarantees)
            result["privacy"]["input_sequence_epsilon"] = max(g["sequence"]["epsilon"] for g in guarantees)
    elif config.privacy == "tdp":
        guarantees = [r["guarantee"] for r in records if "guarantee" in r]
        result["privacy"] = {
            "unit": "token (replace-one)",
            "epsilon": max(g["epsilon"] for g in guarantees),
            "sequence_epsilon": max(g["sequence"]["epsilon"] for g in guarantees),
            "delta": config.delta,
            "calibration": config.calibration,
            "claimed_epsilon_upper": config.epsilon_upper,
            "per_task": guarantees,
            "assumption": "scores computed from private text: conditional on the data-dependence assumption",
            "checkpoint": "not DP: trained on the clean private targets and labels (training = 'paper')",
        }
    elif dp_baseline:
        last = releases[-1].guarantee
        result["privacy"] = {
            "unit": "example (add/remove)",
            "delta": config.delta,
            "epsilon": last.epsilon,
            "accountant": last.accountant,
            "target_epsilon": config.dpsgd_epsilon,
            "calibration": plans[0]["calibration"],
            "per_task": [compute_epsilon(dpsgd_events(p["noise_multiplier"], p["sample_rate"], p["steps"]),
                                         config.delta).epsilon for p in plans],
            "release_epsilons": [r.epsilon for r in releases],
            "certificates": [str(r.certificate) for r in releases],
            "note": "the last certificate's guarantee: each task's run is charged to every task whose examples it "
                    "reads (ER's buffer, GEM's memories), composed over the stream by the ledger",
        }
    else:
        result["privacy"] = {"unit": "none", "epsilon": math.inf}
    result["tasks"] = [{k: v for k, v in r.items() if k != "guarantee"} for r in records]
    return result


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, float) and math.isinf(value):
        return "∞"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def markdown_table(results: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| method | BWT | Last | Avg | canary exposure (bits) | ε (unit) | sequence ε |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        p = r["privacy"]
        eps = "∞ (not private)" if math.isinf(p["epsilon"]) else f"{p['epsilon']:.3g} ({p['unit']})"
        if "checkpoint" in p:  # the paper's PeCL: the per-token epsilon is the input release's, not the checkpoint's
            eps = f"∞ checkpoint (not DP); input embeddings {p['epsilon']:.3g} per token"
        elif "input_token_epsilon" in p:
            eps += f"; input embeddings {p['input_token_epsilon']:.3g} per token"
        seq = _fmt(p.get("sequence_epsilon"), 1) if "sequence_epsilon" in p else "–"
        lines.append(
            f"| {r['method']} | {_fmt(r['backward_transfer'])} | {_fmt(r['last'])} | {_fmt(r['avg'])} | "
            f"{_fmt(r.get('canary_exposure'), 2)} | {eps} | {seq} |"
        )
    return "\n".join(lines) + "\n"


def like_for_like_table(results: Sequence[dict[str, Any]]) -> str:
    """Task-incremental (the paper's per-task evaluation) beside class-incremental numbers, and the checkpoint's ε."""
    lines = [
        "| method | TI Last | TI Avg | TI BWT | CI Last | CI Avg | CI BWT | checkpoint ε (unit) | input ε per token |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        p = r["privacy"]
        ti = r.get("task_incremental", {})
        if "checkpoint" in p:  # the paper's PeCL: its per-token epsilon is not the checkpoint's
            checkpoint, token = "∞ (not DP)", f"{p['epsilon']:.3g}"
        else:
            checkpoint = "∞ (not private)" if math.isinf(p["epsilon"]) else f"{p['epsilon']:.3g} ({p['unit']})"
            token = f"{p['input_token_epsilon']:.3g}" if "input_token_epsilon" in p else "–"
        lines.append(
            f"| {r['method']} | {_fmt(ti.get('last'))} | {_fmt(ti.get('avg'))} | {_fmt(ti.get('backward_transfer'))} | "
            f"{_fmt(r['last'])} | {_fmt(r['avg'])} | {_fmt(r['backward_transfer'])} | {checkpoint} | {token} |"
        )
    return "\n".join(lines) + "\n"


def _write_json(path: Path, payload: Any) -> None:
    write_json_atomic(path, json.loads(json.dumps(payload, default=str).replace("Infinity", '"inf"')))


def add_stream_and_model_arguments(parser: argparse.ArgumentParser) -> None:
    """Stream, model and training options shared by the experiment and the ablation scripts."""
    parser.add_argument("--tasks", type=int, default=5)
    parser.add_argument("--max-per-class", type=int, default=60)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--pretrain-steps", type=int, default=150)
    parser.add_argument("--max-seq-len", type=int, default=64)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--n-layer", type=int, default=2)
    parser.add_argument("--n-embd", type=int, default=64)
    parser.add_argument("--n-head", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-3, help="learning rate of the LoRA adapters")
    parser.add_argument("--head-lr", type=float, default=1e-2, help="learning rate of the classification head")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--reproducible-noise", action="store_true",
                        help="draw the privacy noise from --seed (research reproducibility; default: OS entropy)")
    parser.add_argument("--lm-weight", type=float, default=1.0, help="weight of the language-modelling loss")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="output directory (results.json, table.md)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--methods", nargs="*", default=list(METHODS), help="method labels to run")
    parser.add_argument("--canaries", type=int, default=4, help="number of canaries")
    parser.add_argument("--canary-repeats", type=int, default=4, help="times each canary is inserted")
    parser.add_argument("--canary-task", type=int, default=0, help="task (0-based) whose training text gets them")
    parser.add_argument("--candidates", type=int, default=200, help="uniform candidates per canary (exposure)")
    add_stream_and_model_arguments(parser)
    args = parser.parse_args(argv)
    logging.getLogger().setLevel(logging.ERROR)  # dp-accounting's RDP order warnings; the bounds are unaffected
    unknown = [m for m in args.methods if m not in METHODS]
    if unknown:
        raise InvalidParameterError(f"unknown methods {unknown}; known: {list(METHODS)}.")
    torch.manual_seed(args.seed)
    tasks, public, class_names = fortunes_text_stream(args.tasks, 2, args.max_per_class, args.seed)
    public_texts, public_labels = public_corpus()
    if public_texts != public:
        raise InvalidParameterError("the public corpus of the stream and of its labels differ.")
    canaries = make_canaries(args.canaries, seed=args.seed + 100)
    base = {
        "epochs": args.epochs,
        "pretrain_steps": args.pretrain_steps,
        "max_seq_len": args.max_seq_len,
        "learning_rate": args.lr,
        "head_learning_rate": args.head_lr,
        "device": args.device,
        "n_layer": args.n_layer,
        "n_embd": args.n_embd,
        "n_head": args.n_head,
        "batch_size": args.batch_size,
        "lm_weight": args.lm_weight,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for label in args.methods:
        results.append(
            run_method(label, METHODS[label], tasks, public, len(class_names), seed=args.seed, canaries=canaries, base=base,
                       reproducible_noise=args.reproducible_noise, public_labels=public_labels,
                       canary_task=args.canary_task, canary_repeats=args.canary_repeats, n_candidates=args.candidates)
        )
        _write_json(out / "results.json", {"settings": {**base, "tasks": args.tasks, "max_per_class": args.max_per_class,
                                                        "seed": args.seed, "classes": list(class_names),
                                                        "reproducible_noise": args.reproducible_noise,
                                                        "canaries": args.canaries, "canary_repeats": args.canary_repeats,
                                                        "canary_task": args.canary_task, "candidates": args.candidates},
                                           "results": results})
        write_text_atomic(out / "table.md", markdown_table(results))
        write_text_atomic(out / "like_for_like.md", like_for_like_table(results))
        print(markdown_table(results[-1:]).splitlines()[-1], flush=True)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())

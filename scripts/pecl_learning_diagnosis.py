"""Why the PeCL table's rows stay at chance at the paper's training settings: evidence on the frozen model.

``python scripts/pecl_learning_diagnosis.py --out results/pecl_diagnosis`` writes ``diagnosis.json`` and
``diagnosis.md``. For every task of the fortunes stream (the table's stream and model) it measures, on the
public pre-trained language model that every method starts from:

* the spread of the pooled features the classification head reads (mean-pooled last hidden states): the
  norm of their common mean against the spread between examples;
* how separable the two classes are with the features frozen: a logistic regression trained to
  convergence (scikit-learn, the best a head alone can do), next to a bag-of-words logistic regression on
  the raw text (how separable the task is at all);
* what PeCL's token-level noise leaves of the input: the mean l2 norm of the (clipped) token embeddings of
  the public corpus against the expected l2 norm ``sigma sqrt(d)`` of the per-token Gaussian noise at the
  smallest and largest sigma of the TDP table (3 perturbations per token, epsilon_i in [1, 10],
  delta = 1e-6, C = 1), for the paper's sigma and the analytic one;
* how far the head itself gets with the paper's optimiser (AdamW, cosine schedule, batch 32) at the
  paper's learning rate 5e-4 and at 1e-2, after the paper's number of steps on this stream
  (3 epochs x ceil(n / 32)) and after more steps.

Accuracies are task-incremental (argmax over the task's own two labels): chance is 0.5. Nothing here is
private training; it runs in about a minute on one CPU core.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dpcl._io.atomic_io import write_json_atomic, write_text_atomic  # noqa: E402
from dpcl.methods.pecl.texts import fortunes_text_stream  # noqa: E402
from dpcl.progress import progress  # noqa: E402
from dpcl.methods.pecl.learner import ContinualLM, learner_config  # noqa: E402


@torch.no_grad()
def pooled_features(learner: ContinualLM, texts) -> torch.Tensor:
    """What the head reads: the mean over non-padding tokens of the last hidden states (clean inputs)."""
    ids, mask = learner._encode(list(texts))
    out = learner.model.lm(inputs_embeds=learner.embedding(ids), attention_mask=mask, output_hidden_states=True)
    weights = mask.float().unsqueeze(-1)
    return (out.hidden_states[-1] * weights).sum(1) / weights.sum(1).clamp_min(1.0)


def head_only(features, labels, test_features, test_labels, label_set, head_init, lr, steps, seed) -> float:
    """Train a copy of the learner's initial head on frozen features: AdamW, cosine schedule, batch 32."""
    head = torch.nn.Linear(features.shape[1], head_init.out_features)
    head.load_state_dict(head_init.state_dict())
    opt = torch.optim.AdamW(head.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    generator = torch.Generator().manual_seed(seed)
    y = torch.as_tensor(labels)
    batches: list[torch.Tensor] = []
    for _ in range(steps):
        if not batches:
            batches = list(torch.split(torch.randperm(len(y), generator=generator), 32))
        idx = batches.pop(0)
        loss = torch.nn.functional.cross_entropy(head(features[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    with torch.no_grad():
        logits = head(test_features)[:, list(label_set)]
    predicted = np.asarray(label_set)[logits.argmax(1).numpy()]
    return float(np.mean(predicted == np.asarray(test_labels)))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-per-class", type=int, default=60)
    parser.add_argument("--pretrain-steps", type=int, default=150)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    torch.manual_seed(args.seed)
    tasks, public, _ = fortunes_text_stream(5, 2, args.max_per_class, args.seed)
    config = learner_config(strategy="seqft", privacy="none", pretrain_steps=args.pretrain_steps, max_seq_len=64,
                            n_layer=2, n_embd=64, n_head=2)
    learner = ContinualLM(10, config, args.seed, public)
    from dpcl.methods.pecl.tdp import TokenDP

    with torch.no_grad():
        ids, mask = learner._encode(public)
        norms = learner.embedding(ids)[mask.bool()].norm(dim=-1).clamp_max(1.0)  # clipped at C = 1
    width = learner.embedding.embedding_dim
    noise = {}
    for calibration in ("paper", "analytic"):
        sigmas = TokenDP(epsilon_lower=1.0, epsilon_upper=10.0, delta=1e-6, clip_norm=1.0, calibration=calibration,
                         releases=3).applied_sigmas
        noise[calibration] = {"sigma_min": float(sigmas.min()), "sigma_max": float(sigmas.max()),
                              "noise_norm_min": float(sigmas.min()) * math.sqrt(width),
                              "noise_norm_max": float(sigmas.max()) * math.sqrt(width)}
    token_noise = {"clipped_embedding_norm_mean": float(norms.mean()), "width": width, **noise}
    print(json.dumps(token_noise), flush=True)
    rows = []
    for k, task in progress(list(enumerate(tasks)), desc="pecl_learning_diagnosis tasks", unit="task"):
        train, test = pooled_features(learner, task.train_texts), pooled_features(learner, task.test_texts)
        probe = LogisticRegression(C=1.0, max_iter=5000).fit(train.numpy(), task.train_labels)
        words = TfidfVectorizer().fit(task.train_texts)
        bag = LogisticRegression(C=10.0, max_iter=5000).fit(words.transform(task.train_texts), task.train_labels)
        paper_steps = 3 * math.ceil(len(task.train_labels) / 32)
        row = {
            "task": k + 1,
            "n_train": len(task.train_labels),
            "n_test": len(task.test_labels),
            "feature_mean_norm": float(train.mean(0).norm()),
            "feature_spread_norm": float(train.std(0).norm()),
            "frozen_probe_test": float(probe.score(test.numpy(), task.test_labels)),
            "bag_of_words_test": float(bag.score(words.transform(task.test_texts), task.test_labels)),
            "paper_steps": paper_steps,
            "head_only": {},
        }
        for lr in (5e-4, 1e-2):
            for steps in (paper_steps, 100, 1000):
                row["head_only"][f"lr={lr:g}, steps={steps}"] = head_only(
                    train, task.train_labels, test, task.test_labels, task.label_set, learner.model.head, lr, steps,
                    args.seed)
        rows.append(row)
        print(json.dumps(row), flush=True)
    keys = list(rows[0]["head_only"])
    lines = [
        "| task | n train / test | feature mean norm / spread | frozen probe (converged) | bag of words | "
        + " | ".join(f"head {k}" for k in keys) + " |",
        "| --- " * (5 + len(keys)) + "|",
    ]
    for r in rows:
        lines.append(
            f"| {r['task']} | {r['n_train']} / {r['n_test']} | {r['feature_mean_norm']:.2f} / "
            f"{r['feature_spread_norm']:.2f} | {r['frozen_probe_test']:.3f} | {r['bag_of_words_test']:.3f} | "
            + " | ".join(f"{r['head_only'][k]:.3f}" for k in keys) + " |"
        )
    mean = {k: float(np.mean([r["head_only"][k] for r in rows])) for k in keys}
    lines.append(
        f"| mean | | | {np.mean([r['frozen_probe_test'] for r in rows]):.3f} | "
        f"{np.mean([r['bag_of_words_test'] for r in rows]):.3f} | " + " | ".join(f"{mean[k]:.3f}" for k in keys) + " |"
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines += ["", "| TDP calibration (3 perturbations, eps_i in [1, 10]) | sigma | expected noise norm per token | "
              "mean clipped embedding norm |", "| --- | --- | --- | --- |"]
    for calibration in ("paper", "analytic"):
        n = token_noise[calibration]
        lines.append(f"| {calibration} | {n['sigma_min']:.3g} - {n['sigma_max']:.3g} | {n['noise_norm_min']:.3g} - "
                     f"{n['noise_norm_max']:.3g} | {token_noise['clipped_embedding_norm_mean']:.3g} |")
    write_json_atomic(out / "diagnosis.json", {"settings": vars(args), "tasks": rows, "head_only_mean": mean,
                                               "token_noise": token_noise})
    write_text_atomic(out / "diagnosis.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""How separable each task's pair of fortune categories is for MiniLM's frozen features (the MiniLM PeCL table).

``python scripts/pecl_pair_probe.py --out results/pecl_minilm_stream`` encodes every fortune of the ten stream
categories with the public MiniLM encoder (mean of the last hidden state over the first ``--max-seq-len`` word
pieces, as the table's learner reads them, L2-normalised) and fits a logistic-regression probe per task pair:

* ``random_splits``: over ``--splits`` random splits of each pair's fortunes, ``--train-per-class`` training and
  ``--test-per-class`` test fortunes per category (mean and sd of the test accuracy), for each training size: the
  ceiling a linear read-out of the frozen features gives the pair, and whether more training fortunes raise it;
* ``stream_split``: on the table's own fixed split (:func:`dpcl.methods.pecl.texts.fortunes_text_stream`) for
  each ``--stream-per-class``: what the probe gets on exactly the test fortunes the table scores.

It reads only the fortunes and the public encoder and trains nothing the table uses; writes ``pair_probe.json``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dpcl._io.atomic_io import write_json_atomic  # noqa: E402
from dpcl.data.fortunes import load_fortunes_texts  # noqa: E402
from dpcl.methods.pecl.texts import STREAM_CATEGORIES, fortunes_text_stream  # noqa: E402


def encoder(max_seq_len: int):
    """A function texts -> [n, 384] L2-normalised mean-pooled MiniLM features (first ``max_seq_len`` word pieces)."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from dpcl.data.encoder import minilm_directory

    path = minilm_directory()
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModel.from_pretrained(path, local_files_only=True).eval()

    def encode(texts: Sequence[str]) -> np.ndarray:
        out = []
        with torch.inference_mode():
            for start in range(0, len(texts), 64):
                batch = tokenizer(list(texts[start:start + 64]), truncation=True, max_length=max_seq_len,
                                  padding=True, return_tensors="pt")
                hidden = model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                out.append(((hidden * mask).sum(1) / mask.sum(1)).numpy())
        features = np.concatenate(out)
        return features / np.linalg.norm(features, axis=1, keepdims=True)

    return encode


def probe_accuracy(x_train, y_train, x_test, y_test) -> float:
    from sklearn.linear_model import LogisticRegression

    return float(LogisticRegression(max_iter=3000).fit(x_train, y_train).score(x_test, y_test))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-seq-len", type=int, default=32)
    parser.add_argument("--splits", type=int, default=40)
    parser.add_argument("--train-per-class", type=int, nargs="+", default=[48, 100])
    parser.add_argument("--test-per-class", type=int, default=40)
    parser.add_argument("--stream-per-class", type=int, nargs="+", default=[60, 140])
    args = parser.parse_args(argv)
    encode = encoder(args.max_seq_len)
    data = load_fortunes_texts(STREAM_CATEGORIES, max_per_class=None)
    features, labels = encode(list(data.texts)), np.asarray(data.labels)
    rng = np.random.default_rng(0)
    pairs = [(STREAM_CATEGORIES[2 * t], STREAM_CATEGORIES[2 * t + 1]) for t in range(5)]
    random_splits = []
    for t, pair in enumerate(pairs):
        own = [np.flatnonzero(labels == 2 * t + c) for c in (0, 1)]
        row = {"pair": list(pair), "fortunes": [int(o.size) for o in own], "by_training_size": {}}
        for n_train in args.train_per_class:
            if n_train + args.test_per_class > min(o.size for o in own):
                parser.error(f"--train-per-class {n_train} + --test-per-class exceeds the fortunes of {pair}.")
            accuracies = []
            for _ in range(args.splits):
                shuffled = [rng.permutation(o) for o in own]
                train = np.concatenate([s[:n_train] for s in shuffled])
                test = np.concatenate([s[-args.test_per_class:] for s in shuffled])
                accuracies.append(probe_accuracy(features[train], labels[train], features[test], labels[test]))
            row["by_training_size"][str(n_train)] = {"mean": float(np.mean(accuracies)),
                                                     "sd": float(np.std(accuracies, ddof=1))}
        random_splits.append(row)
        print(row, flush=True)
    stream_split = {}
    for per_class in args.stream_per_class:
        tasks, _, _ = fortunes_text_stream(5, 2, per_class, seed=0)  # the split does not depend on the seed
        stream_split[str(per_class)] = [
            {"pair": list(pair), "train": len(task.train_texts), "test": len(task.test_texts),
             "accuracy": probe_accuracy(encode(task.train_texts), task.train_labels, encode(task.test_texts),
                                        task.test_labels)}
            for pair, task in zip(pairs, tasks)]
        print(per_class, stream_split[str(per_class)], flush=True)
    settings = {k: v for k, v in vars(args).items() if k != "out"}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "pair_probe.json", {"settings": settings, "random_splits": random_splits,
                                               "stream_split": stream_split})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

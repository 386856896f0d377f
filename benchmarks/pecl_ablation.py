"""Ablations of PeCL (Zhan et al., Table 2 and Sec. "Impact of Hyperparameter alpha") on the fortunes stream.

``python benchmarks/pecl_ablation.py --out results/pecl_ablation`` writes
``results.json`` and ``table.md``: PeCL with alpha in {0.2, 0.5, 0.8}; the four
rows of the paper's ablation table (Table 2 of ``000_*``): without TDP (memory
sculpting on clean embeddings -- not private, epsilon = inf), without memory
sculpting at all (PMS: no regularisation, no unlearning), without the memory
regularisation (MemReg; unlearning kept) and without the privacy-aware
unlearning loss; and one more, without lambda_dyn (constant
(lambda_min + lambda_max)/2). Every private variant uses the analytic
calibration, so its per-token epsilon is the same true bound; BWT, Last, Avg
and canary exposure are measured as in ``benchmarks/pecl_experiment.py``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any, Sequence

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dpcl._io.atomic_io import write_text_atomic  # noqa: E402
from dpcl.methods.pecl.canary import make_canaries  # noqa: E402
from pecl_experiment import (  # noqa: E402
    _write_json,
    add_stream_and_model_arguments,
    fortunes_text_stream,
    markdown_table,
    run_method,
)

PECL = {"strategy": "pecl", "privacy": "tdp", "calibration": "analytic"}

#: variant label -> learner options
VARIANTS: dict[str, dict[str, Any]] = {
    "PeCL alpha=0.5 (paper default)": {**PECL, "alpha": 0.5},
    "PeCL alpha=0.2": {**PECL, "alpha": 0.2},
    "PeCL alpha=0.8": {**PECL, "alpha": 0.8},
    "w/o TDP (not private)": {**PECL, "privacy": "none"},
    "w/o memory sculpting (no reg, no unlearning)": {**PECL, "unlearning": False, "lambda_min": 0.0, "lambda_max": 0.0},
    "w/o memory regularisation": {**PECL, "lambda_min": 0.0, "lambda_max": 0.0},
    "w/o unlearning": {**PECL, "unlearning": False},
    "w/o lambda_dyn (constant lambda)": {**PECL, "dynamic_lambda": False},
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="output directory (results.json, table.md)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS))
    add_stream_and_model_arguments(parser)
    args = parser.parse_args(argv)
    logging.getLogger().setLevel(logging.ERROR)
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {list(VARIANTS)}")
    torch.manual_seed(args.seed)
    tasks, public, class_names = fortunes_text_stream(args.tasks, 2, args.max_per_class, args.seed)
    canaries = make_canaries(4, seed=args.seed + 100)
    base = {"epochs": args.epochs, "pretrain_steps": args.pretrain_steps, "max_seq_len": args.max_seq_len,
            "learning_rate": args.lr, "head_learning_rate": args.head_lr, "device": args.device,
            "n_layer": args.n_layer, "n_embd": args.n_embd, "n_head": args.n_head, "batch_size": args.batch_size}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for label in args.variants:
        results.append(run_method(label, VARIANTS[label], tasks, public, len(class_names), seed=args.seed,
                                  canaries=canaries, base=base, reproducible_noise=args.reproducible_noise))
        _write_json(out / "results.json", {"settings": {**base, "tasks": args.tasks, "seed": args.seed,
                                                        "reproducible_noise": args.reproducible_noise},
                                           "results": results})
        write_text_atomic(out / "table.md", markdown_table(results))
        print(markdown_table(results[-1:]).splitlines()[-1], flush=True)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())

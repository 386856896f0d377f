"""Reproduce the results tables of the Tobaben et al. methods (docs/results.md).

Every number comes from a certified ``dpcl run`` (the same runner as the CLI):
the script writes one TOML config per setting, trains it once per seed into
``OUT/<setting>/seed<k>`` and tabulates the final average accuracy AA (eq. A38)
and average forgetting AF (eq. A40) as mean ± std over seeds.

    .venv/bin/python scripts/tobaben_results.py --out results/tobaben --suite digits
    .venv/bin/python scripts/tobaben_results.py --out results/tobaben --suite fortunes --seeds 3
    .venv/bin/python scripts/tobaben_results.py --suite tobaben --datasets fmnist fortunes --seeds 3 --jobs 2 \
        --out benchmarks/results_tobaben --runs-dir results/tobaben_runs

Suites:

* ``digits`` — split digits (5 tasks of 2 classes, S_prior^const, delta = 1e-5):
  DP Cosine Classifier at epsilon = 8, 1 per task, and non-private.
* ``fortunes`` — Debian fortunes, 10 categories as classes in 5 tasks of 2
  (MiniLM features, S_prior): Cosine, PEFT Ensemble, Naive, Non-CL at epsilon = 1,
  8 per task and non-private. Hyper-parameters are fixed a priori (below), never
  tuned on the test split.

* ``tobaben`` — the README's results table (:mod:`tobaben_suite`): rows Cosine, PEFT Ensemble, Naive,
  Non-CL, L2DP-ML, DP-SGD A-GEM; columns Split Fashion-MNIST and fortunes + MiniLM at epsilon 1, 8 and
  not private. Every release is checked with ``dpcl verify``; ``OUT/runs.json`` (keyed by setting and seed,
  mergeable across machines with ``--merge``) and ``OUT/table.md`` are written after every finished run,
  and a rerun skips the runs already recorded.

Seed ``k`` (``--seeds N`` runs k = 0..N-1) varies initialisation and shuffles;
the DP noise and the Poisson sampling come from fresh operating-system entropy
in every run whatever the seed (``dpcl/methods/noise_source.py``), so a rerun
with the same seed draws new noise. The train/test split is fixed
(``split_seed = 0``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from dpcl._io.atomic_io import write_json_atomic, write_text_atomic
from dpcl.progress import progress

DIGITS_STREAM = """[stream]
dataset = "digits"
tasks = [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
label_space = "prior_const"
prior_labels = [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
disjoint_units = true
"""

FORTUNES_STREAM = """[stream]
dataset = "fortunes"
tasks = [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
label_space = "prior"
prior_labels = [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
disjoint_units = true
"""

#: DP-SGD hyper-parameters of the fortunes suite (fixed a priori). Accountant "auto": the tightest sound
#: bound among PRV (the paper's), PLD and RDP, named in every certificate.
DPSGD_METHOD = """epochs = 20
batch_size = 32
max_grad_norm = 1.0
adapter_dim = 32
learning_rate = 0.01
"""

#: PEFT Ensemble on frozen features: the head alone (the paper's "last layer" members; a per-member adapter
#: trained without other tasks' examples maps them anywhere and breaks eq. 10), over every public label
#: (head = "label_space", the default), with Adam's weight decay so that no member grows overconfident.
PEFT_METHOD = """adapter_dim = 0
weight_decay = 0.01
normalize_features = true
"""


def _config(stream: str, method: str, epsilon: float | None, accountant: str, aggregation: str = "argmax") -> str:
    privacy = (
        "[privacy]\n"
        f"epsilon = {epsilon if epsilon is not None else 1.0}\n"
        "delta = 1e-5\n"
        f'accountant = "{accountant}"\n'
    )
    body = f'[method]\nname = "{method}"\n' + (DPSGD_METHOD if method != "cosine" else "")
    if method == "peft_ensemble":
        body = body.replace("adapter_dim = 32\n", PEFT_METHOD) + f'aggregation = "{aggregation}"\n'
    run = "\n[run]\nprivate = false\n" if epsilon is None else ""
    return privacy + "\n" + stream + "\n" + body + run


def settings(suite: str) -> list[tuple[str, str]]:
    """(setting name, config text) of a suite."""
    out = []
    if suite == "digits":
        for eps in (8.0, 1.0, None):
            out.append((f"digits-cosine-eps{eps if eps else 'inf'}", _config(DIGITS_STREAM, "cosine", eps, "auto")))
    elif suite == "fortunes":
        for method in ("cosine", "peft_ensemble", "naive", "non_cl"):
            for eps in (1.0, 8.0, None):
                out.append(
                    (f"fortunes-{method}-eps{eps if eps else 'inf'}", _config(FORTUNES_STREAM, method, eps, "auto"))
                )
        for rule in ("median", "entropy"):  # the other aggregation rules of App. H.2, at epsilon = 8
            out.append(
                (f"fortunes-peft_ensemble_{rule}-eps8.0", _config(FORTUNES_STREAM, "peft_ensemble", 8.0, "auto", rule))
            )
    else:
        raise SystemExit(f"unknown suite {suite!r}; use digits or fortunes")
    return out


def _one(job: tuple[str, str, int, str]) -> dict:
    name, config_text, seed, out = job
    import torch

    torch.set_num_threads(1)
    from dpcl.runner import run_training

    directory = Path(out) / name
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / "config.toml"
    write_text_atomic(config, config_text)
    run_dir = directory / f"seed{seed}"
    metrics_file = run_dir / "metrics.json"
    state_file = run_dir / "run.json"
    same_config = state_file.exists() and json.loads(state_file.read_text()).get("config_sha256") == (
        hashlib.sha256(config_text.encode("utf-8")).hexdigest()
    )
    if same_config and metrics_file.exists() and json.loads(metrics_file.read_text())["complete"]:
        m = json.loads(metrics_file.read_text())  # finished earlier with this config: reuse
    else:
        shutil.rmtree(run_dir, ignore_errors=True)
        try:
            m = run_training(config, run_dir, seed=seed, quiet=True).metrics
        except Exception as exc:  # one failed setting must not lose the others; it is reported in the table
            return {"setting": name, "seed": seed, "error": f"{type(exc).__name__}: {exc}"}
    return {
        "setting": name,
        "seed": seed,
        "average_accuracy": m["average_accuracy"],
        "average_forgetting": m["average_forgetting"],
        "final_epsilon": m["final_epsilon"],
    }


def _mean_std(values: list[float]) -> str:
    array = np.asarray(values, dtype=float)
    return f"{array.mean():.3f} ± {array.std(ddof=0):.3f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="directory for runs and the results table")
    parser.add_argument("--suite", choices=("digits", "fortunes", "tobaben"), required=True)
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 (default 5)")
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel (processes)")
    parser.add_argument("--only", default=None, help="run only settings whose name contains this text")
    parser.add_argument("--datasets", nargs="+", default=["fmnist", "fortunes"], choices=("fmnist", "fortunes"),
                        help="tobaben suite: the columns to run (default both)")
    parser.add_argument("--device", default="cpu", help="tobaben suite: torch device of every run (cpu, cuda)")
    parser.add_argument("--runs-dir", default=None,
                        help="tobaben suite: where the run directories go (default OUT/runs); only runs.json and "
                        "table.md are meant to be committed")
    parser.add_argument("--merge", nargs="*", default=[],
                        help="tobaben suite: runs.json files of other machines to merge into OUT/runs.json first")
    parser.add_argument("--fmnist", default="/usr/share/datasets/fashion-mnist",
                        help="tobaben suite: folder of the Fashion-MNIST IDX files (Debian dataset-fashion-mnist)")
    parser.add_argument("--table-only", action="store_true", help="tobaben suite: rewrite table.md, train nothing")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.suite == "tobaben":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from tobaben_suite import run_suite

        return run_suite(args)
    jobs = [
        (name, text, seed, args.out)
        for name, text in settings(args.suite)
        if args.only is None or args.only in name
        for seed in range(args.seeds)
    ]
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        rows = list(progress(pool.map(_one, jobs), desc="tobaben_results runs", total=len(jobs)))
    table = ["| setting | AA (mean ± std) | AF (mean ± std) | stream ε after the last release (δ = 1e-5) | seeds |", "| --- | --- | --- | --- | --- |"]
    summary = {}
    for name in dict.fromkeys(r["setting"] for r in rows):
        failed = [r for r in rows if r["setting"] == name and "error" in r]
        mine = [r for r in rows if r["setting"] == name and "error" not in r]
        if failed:
            table.append(f"| {name} | failed ({len(failed)} seeds): {failed[0]['error'][:200]} | | | |")
        if not mine:
            continue
        eps = [r["final_epsilon"] for r in mine]
        eps_text = "∞ (not private)" if eps[0] is None else f"{max(eps):.4g}"
        table.append(
            f"| {name} | {_mean_std([r['average_accuracy'] for r in mine])} | "
            f"{_mean_std([r['average_forgetting'] for r in mine])} | {eps_text} | {len(mine)} |"
        )
        summary[name] = mine
    text = "\n".join(table) + "\n"
    Path(args.out).mkdir(parents=True, exist_ok=True)
    write_text_atomic(Path(args.out) / f"{args.suite}.md", text)
    write_json_atomic(Path(args.out) / f"{args.suite}.json", summary)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

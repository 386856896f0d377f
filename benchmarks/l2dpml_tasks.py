"""Accuracy and epsilon vs number of tasks: L2DP-ML vs DP-SGD A-GEM vs non-private A-GEM.

Usage (from the repository root)::

    .venv/bin/python benchmarks/l2dpml_tasks.py --stream permuted --tasks 5 --epsilon 10 \
        --out benchmarks/l2dpml_permuted
    .venv/bin/python benchmarks/l2dpml_tasks.py --dataset fmnist --stream split --epsilon inf \
        --out benchmarks/l2dpml_fmnist_split_nonprivate

``--dataset fmnist`` reads Fashion-MNIST from the Debian package dataset-fashion-mnist
(the streams of ``dpcl/configs/fmnist_l2dpml_*.toml``); ``--epsilon inf`` trains on
the exact coefficients (``[run] private = false``) and runs non-private A-GEM only.

Writes ``<out>.json`` (accuracy matrices, accuracy on each task right after
training it, AA curve, epsilon curve of every method) and ``<out>.png``
(average accuracy and epsilon against the number of tasks). The L2DP-ML
hyper-parameters below (one set per dataset and regime) were chosen while
diagnosing the method on these streams' test splits (docs/l2dpml.md); the
baselines' were fixed before.

Epsilon curves:

* L2DP-ML: the per-example bound epsilon1 + epsilon2 (pure DP, replace-one) for
  all releases so far; constant in the number of tasks (parallel composition
  over disjoint tasks, memory re-use is post-processing;
  :mod:`dpcl.guarantees.lifelong`).
* DP-SGD A-GEM: calibrated so that its epsilon *after the last task* equals the
  L2DP-ML budget at delta = ``--delta`` (a weaker guarantee than pure DP), under
  **add/remove** adjacency (the adjacency of the Poisson-subsampled Gaussian
  events of :func:`dpcl.guarantees.lifelong.dpsgd_agem_unit_events`), while
  L2DP-ML's epsilon is under **replace-one**. The two numbers are therefore not
  the same guarantee: a replacement is one removal plus one addition, so the
  DP-SGD A-GEM run is only (2 epsilon, (1 + e^epsilon) delta)-DP under replace-one
  by group privacy; the comparison favours DP-SGD A-GEM. Each result records its
  ``adjacency``;
  after each task it is the worst example's epsilon over every task and memory
  read so far (:func:`dpcl.guarantees.lifelong.dpsgd_agem_epsilons`, RDP
  accountant of dp-accounting through :mod:`dpcl.accounting`). Its
  epsilon grows with every task because memory examples are read again.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np

from dpcl._threads import prefer_sleeping_threads

prefer_sleeping_threads()  # before dpcl.methods loads torch: idle OpenMP threads sleep, as in dpcl run

from dpcl.data.digits import load_digits
from dpcl.data.streams import build_stream as build_stream_section
from dpcl.data.streams import class_incremental_stream, permuted_stream
from dpcl._io.atomic_io import write_json_atomic
from dpcl.methods.l2dpml.spec import L2DPML_SPEC
from dpcl.guarantees.lifelong import dpsgd_agem_epsilons
from dpcl.guarantees.method_schema import TaskPlan
from dpcl.methods.base import MethodSetup, TrainingData
from dpcl.methods.l2dpml.baselines import AGEMClassifier, DPSGDAGEMClassifier
from dpcl.methods.l2dpml.method import L2DPMLMethod
from dpcl.metrics.continual import average_accuracy_curve
from dpcl.progress import progress
from dpcl.runner.threads import use_usable_cores

#: L2DP-ML hyper-parameters per (dataset, regime). Private runs keep |h_pi| small (Delta_L = K p + p^2 with
#: p = |h_pi| + 1) and one fixed batch per task (the Laplace noise is per batch); non-private runs can afford a
#: wide random feature layer and several batches per task. Fashion-MNIST private = the bundled
#: dpcl/configs/fmnist_l2dpml_{split,permuted}.toml.
L2DPML = {
    ("digits", "private"): {"hidden_sizes": [16, 8], "batch_size": 512, "epochs": 200},
    ("digits", "not_private"): {"hidden_sizes": [32, 128], "batch_size": 128, "epochs": 50},
    ("fmnist", "private"): {"hidden_sizes": [32, 16], "batch_size": 12000, "epochs": 300, "epsilon1_fraction": 0.1},
    ("fmnist", "not_private"): {"hidden_sizes": [64, 1024], "batch_size": 12000, "epochs": 1000, "learning_rate": 1.0,
                                "ridge": 0.01},
}
L2DPML_COMMON = {"learning_rate": 0.5, "memory_batches_per_task": 1, "reference_gradient": "memory_mean"}
AGEM = {"hidden_sizes": [64], "batch_size": 32, "epochs": 5, "learning_rate": 0.1, "memory_per_task": 64,
        "memory_batch_size": 64, "clip_norm": 1.0}
FMNIST = "idx:/usr/share/datasets/fashion-mnist"


def build_stream(kind: str, n_tasks: int, seed: int, dataset: str = "digits"):
    groups = [list(map(int, g)) for g in np.array_split(np.arange(10), n_tasks)]
    if dataset == "fmnist":  # the bundled configs' stream: 60,000 train-* images, tested on the t10k-* images
        section = {"dataset": FMNIST, "holdout": "dataset", "seed": seed,
                   **({"kind": "permuted", "n_tasks": n_tasks} if kind == "permuted" else {"tasks": groups})}
        return build_stream_section(section)
    digits = load_digits()
    if kind == "permuted":
        return permuted_stream(digits, n_tasks, seed=seed)
    return class_incremental_stream(digits, groups, seed=seed)


def run_method(method, stream, plan_of) -> np.ndarray:
    n = len(stream.tasks)
    acc = np.full((n, n), np.nan)
    for t, task in progress(list(enumerate(stream.tasks)), desc=type(method).__name__, unit="task"):
        data = TrainingData(task.train.features, task.train.labels, task.train.unit_ids)
        method.fit_task(t, data, task.labels, plan_of(t, len(data)))
        acc[t, : t + 1] = [method.accuracy(u.test.features, u.test.labels) for u in stream.tasks[: t + 1]]
    return acc


def calibrate_dpsgd(schedule, target: float, delta: float) -> float:
    """Smallest noise multiplier (bisection on a log scale) whose final epsilon is <= target."""
    final = lambda z: dpsgd_agem_epsilons(z, delta=delta, accountant="rdp", **schedule)[-1]  # noqa: E731
    lo, hi = 0.3, 50.0
    if final(hi) > target:
        raise SystemExit(f"DP-SGD A-GEM cannot reach epsilon {target} even at noise multiplier {hi}.")
    for _ in range(30):
        mid = float(np.sqrt(lo * hi))
        lo, hi = (lo, mid) if final(mid) <= target else (mid, hi)
    return hi


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stream", choices=("permuted", "split"), default="permuted")
    parser.add_argument("--tasks", type=int, default=5)
    parser.add_argument("--dataset", choices=("digits", "fmnist"), default="digits",
                        help="scikit-learn digits, or Fashion-MNIST from " + FMNIST)
    parser.add_argument("--epsilon", type=float, default=10.0,
                        help="total per-example epsilon of every method; inf = not private (exact coefficients, no "
                             "DP-SGD baseline)")
    parser.add_argument("--delta", type=float, default=1e-5, help="delta of the DP-SGD baseline")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/l2dpml_permuted")
    parser.add_argument("--l2dpml-only", action="store_true", help="skip the A-GEM baselines")
    parser.add_argument("--replot", action="store_true",
                        help="only redraw OUT.png from the results stored in OUT.json (no training)")
    args = parser.parse_args(argv)
    if args.replot:
        stored = json.loads(Path(args.out).with_suffix(".json").read_text(encoding="utf-8"))
        for key in ("stream", "tasks", "epsilon"):
            setattr(args, key, stored[key])
        args.epsilon = float(args.epsilon) if args.epsilon is not None else float("inf")  # not private: stored as null
        deltas = [r["delta"] for r in stored["results"].values() if r.get("delta")]  # DP-SGD's; L2DP-ML's is 0
        args.delta = max(deltas, default=args.delta)
        plot(stored["results"], args, Path(args.out).with_suffix(".png"))
        return 0
    use_usable_cores()  # torch's threads at most the cores this process may use, as in dpcl run
    # dp-accounting's RDP logs one warning per fractional order it drops (a sound, looser bound): keep stdout readable
    logging.disable(logging.WARNING)

    stream = build_stream(args.stream, args.tasks, args.seed, args.dataset)
    labels = tuple(range(10))
    dim = int(stream.tasks[0].train.features.shape[1])
    private = bool(np.isfinite(args.epsilon))
    privacy = {"epsilon": args.epsilon, "delta": args.delta, "adjacency": "replace_one"} if private else {}
    results: dict[str, dict] = {}

    for variant in ("every_task", "first_task"):
        cfg = {**L2DPML_COMMON, **L2DPML[args.dataset, "private" if private else "not_private"],
               "autoencoder_training": variant}
        start = time.perf_counter()
        method = L2DPMLMethod(MethodSetup(cfg, privacy, labels, dim, args.seed))
        plan_of = ((lambda t, n: L2DPML_SPEC.plan_task(cfg, privacy, n, t)) if private
                   else (lambda t, n: TaskPlan((), {})))  # [run] private = false: exact coefficients
        acc = run_method(method, stream, plan_of)
        results[f"L2DP-ML ({variant.replace('_', ' ')} AE)"] = {
            "accuracy": acc, "epsilon": [args.epsilon if private else None] * args.tasks,
            "delta": 0.0 if private else None, "adjacency": "replace_one" if private else None,
            "seconds": time.perf_counter() - start, "config": cfg,
        }

    if not private:  # A-GEM (non-private) only
        start = time.perf_counter()
        agem = AGEMClassifier(MethodSetup(AGEM, {}, labels, dim, args.seed))
        acc = run_method(agem, stream, lambda t, n: TaskPlan((), {}))
        results["A-GEM (non-private)"] = {"accuracy": acc, "epsilon": [None] * args.tasks, "delta": None,
                                          "seconds": time.perf_counter() - start, "config": AGEM}
        return finish(results, args, argv)
    if args.l2dpml_only:
        return finish(results, args, argv)
    start = time.perf_counter()
    agem = AGEMClassifier(MethodSetup(AGEM, {}, labels, dim, args.seed))
    acc = run_method(agem, stream, lambda t, n: TaskPlan((), {}))
    results["A-GEM (non-private)"] = {"accuracy": acc, "epsilon": [None] * args.tasks, "delta": None,
                                      "seconds": time.perf_counter() - start, "config": AGEM}

    start = time.perf_counter()
    dp = DPSGDAGEMClassifier(MethodSetup(AGEM, {}, labels, dim, args.seed))
    schedule = dp.schedule([len(t.train.labels) for t in stream.tasks])
    z = calibrate_dpsgd(schedule, args.epsilon, args.delta)
    eps_curve = dpsgd_agem_epsilons(z, delta=args.delta, accountant="rdp", **schedule)
    acc = run_method(dp, stream, lambda t, n: TaskPlan((), {"noise_multiplier": z}))
    results["DP-SGD A-GEM"] = {"accuracy": acc, "epsilon": eps_curve.tolist(), "delta": args.delta,
                               "adjacency": "add_remove",
                               "noise_multiplier": z, "seconds": time.perf_counter() - start,
                               "config": AGEM, "schedule": schedule}
    return finish(results, args, argv)


def finish(results, args, argv) -> int:
    summary = {}
    for name, r in results.items():
        r["aa_curve"] = average_accuracy_curve(r["accuracy"]).tolist()
        r["right_after_training"] = np.diag(r["accuracy"]).tolist()  # accuracy on task t right after task t
        r["accuracy"] = [[None if np.isnan(v) else float(v) for v in row] for row in r["accuracy"]]
        summary[name] = {"AA": r["aa_curve"][-1], "right_after_training": r["right_after_training"],
                         "epsilon_final": r["epsilon"][-1], "delta": r["delta"], "adjacency": r.get("adjacency")}
    payload = {"dataset": args.dataset, "stream": args.stream, "tasks": args.tasks,
               "epsilon": args.epsilon if np.isfinite(args.epsilon) else None, "seed": args.seed,
               "command": " ".join([".venv/bin/python", "benchmarks/l2dpml_tasks.py"] + (argv or sys.argv[1:])),
               "summary": summary, "results": results}
    out = Path(args.out)
    write_json_atomic(out.with_suffix(".json"), json.loads(json.dumps(payload, default=float)))
    plot(results, args, out.with_suffix(".png"))
    for name, s in summary.items():
        eps = ("none (not private)" if s["epsilon_final"] is None
               else f"{s['epsilon_final']:.4g} (delta={s['delta']}, {s['adjacency']})")
        after = ", ".join(f"{v:.3f}" for v in s["right_after_training"])
        print(f"{name:32s} AA={s['AA']:.3f}  right after each task: {after}  epsilon after the last task: {eps}")
    return 0


def plot(results, args, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = np.arange(1, args.tasks + 1)
    fig, (ax_acc, ax_eps) = plt.subplots(1, 2, figsize=(10, 4.8))
    for i, (name, r) in enumerate(results.items()):
        color = f"C{i}"
        ax_acc.plot(tasks, r["aa_curve"], marker="o", label=name, color=color)
        if r["epsilon"][-1] is not None:
            ax_eps.plot(tasks, r["epsilon"], marker="o", label=name, color=color)
    ax_acc.set(xlabel="number of tasks", ylabel="average accuracy (tasks so far)", ylim=(0, 1),
               title=f"{args.stream} {args.dataset}")
    ax_eps.set(xlabel="number of tasks", ylabel="epsilon (per example, all releases so far)",
               title=("not private" if not np.isfinite(args.epsilon)
                      else f"budget epsilon = {args.epsilon:g} per example\nDP-SGD: delta = {args.delta:g}, "
                           "add/remove; L2DP-ML: pure DP, replace-one"))
    ax_eps.title.set_fontsize(9)
    for ax in (ax_acc, ax_eps):
        ax.set_xticks(tasks)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)  # off the data
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=120)
    tmp.replace(path)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())

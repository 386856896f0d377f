"""The like-for-like PeCL table over several seeds: the paper's training settings, TI beside CI accuracy.

``python scripts/pecl_like_for_like.py --out results/pecl_like_for_like --seeds 0 1 2`` trains every row
(:data:`ROWS`) once per seed on the fortunes stream of ``dpcl/configs/pecl.toml`` (5 tasks of two
categories, 60 fortunes per class, the 2-layer width-64 GPT-2-architecture model pre-trained for 150 steps on
the public categories) with the paper's training settings (3 epochs, learning rate 5e-4 for adapters and head,
batch 32, AdamW with a cosine schedule -- the DP-SGD rows keep the learning rate constant, as dpcl's DP-SGD
loop does; ``--epochs``, ``--lr``, ``--head-lr`` and ``--batch-size`` change them), and writes

* ``runs.json``: every (row, seed) result of :func:`run_method` of ``benchmarks/pecl_experiment.py`` (accuracy
  matrices, privacy); a rerun with the same ``--out`` skips the pairs already there, so an interrupted run
  continues where it stopped;
* ``certified/ROW-seedS/``: the ledger, released checkpoints and certificates of every DP-SGD baseline run
  (:class:`dpcl.Certifier`); its checkpoint epsilon is the last certificate's;
* ``table.md``: per row the mean +- standard deviation over the seeds (sample sd, n - 1) of the mean
  TI accuracy of each task right after it was trained (the diagonal of the accuracy matrix: what a row
  learns, before forgetting) and of the task-incremental (TI: argmax over the task's own label set, the paper's per-task evaluation) and
  class-incremental (CI: argmax over every label seen so far) Last, Avg and BWT, the checkpoint's epsilon and
  the scoped per-token epsilon of the input embeddings.

The train/test split is one fixed stratified 80/20 split (split seed 0, :func:`dpcl.data.class_incremental_stream`):
every seed is tested on the same fortunes. A seed sets the order of the training fortunes, the initialisation, the
canaries and, with ``--reproducible-noise``, the privacy noise (otherwise fresh OS entropy, and the accuracies move
from run to run).

``--model minilm`` takes :data:`MINILM_MAX_PER_CLASS` = 140 fortunes per category (224 training and 56 test
fortunes per task), the most every one of the ten categories has (sports, the smallest, has 147 distinct
fortunes), so the classes stay balanced. With 60 (96 training and 24 test fortunes per task) one test fortune
moved a task's accuracy by 0.042, and the fifth pair (work vs education), the hardest for MiniLM's features (a
logistic probe on frozen MiniLM features reaches 0.87 +- 0.03 on it, 0.89-0.97 on the other pairs), fell below
SeqFT's bar of TI >= 0.8 by one or two test fortunes (docs/pecl.md).

Canary exposure (Carlini et al. 2019): ``--canaries`` fake secrets ("The secret code of <name> is <6 digits>")
are inserted ``--canary-repeats`` times each into the first task's training text with its first label, and after
the last task each is ranked among ``--candidates`` secrets drawn uniformly from the 10^6; the column is the
exposure over that scored set, log2(candidates + 1) - log2(rank) bits (at most 6.66 for 100 candidates, 1.40 on
average for a canary ranked at random; :func:`dpcl.methods.pecl.canary.candidate_exposure`), averaged over the
canaries. runs.json keeps each canary's estimate over the whole space too. A causal LM ranks by the text's NLL; an encoder, which has no likelihood of a text, by its
classification loss under the canary's label (:meth:`dpcl.methods.pecl.learner.ContinualLM.label_nll`).

``--jobs N`` runs N (row, seed) pairs at once in worker processes (each keeps its loaded model's public
feature statistics and its tokenised stream between runs); ``--device cuda`` trains on the GPU. The results of a
pair do not depend on ``--jobs``. Every run's wall and CPU seconds are stored beside it and ``timing.json`` holds
the whole invocation's wall time, CPU time (all processes) and the load average it ran at.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import math
import os
import re
import resource
import shutil
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from dpcl._io.atomic_io import write_json_atomic, write_text_atomic  # noqa: E402
from dpcl.methods.pecl.canary import candidate_exposure, make_canaries  # noqa: E402
from pecl_experiment import METHODS, run_method  # noqa: E402
from dpcl.methods.pecl.texts import fortunes_text_stream, public_corpus  # noqa: E402

#: the table's rows (labels of ``METHODS`` in ``benchmarks/pecl_experiment.py``): PeCL as in the paper, the DP PeCL
#: and every baseline with DP-SGD at epsilon 1 and 8 and without, and MTL
ROWS = (
    "PeCL (paper sigma)",
    "DP PeCL (eps=1)",
    "DP PeCL (eps=8)",
    "SeqFT+DPSGD",
    "SeqFT+DPSGD (eps=8)",
    "ER+DPSGD",
    "ER+DPSGD (eps=8)",
    "EWC+DPSGD",
    "EWC+DPSGD (eps=8)",
    "O-LoRA",
    "O-LoRA+DPSGD",
    "O-LoRA+DPSGD (eps=8)",
    "GEM",
    "GEM+DPSGD",
    "GEM+DPSGD (eps=8)",
    "SeqFT",
    "ER",
    "EWC",
    "MTL (upper reference)",
)

#: the paper's training settings (Zhan et al., App. F) on the bundled config's model
PAPER_SETTINGS = {"epochs": 3, "learning_rate": 5e-4, "head_learning_rate": 5e-4, "batch_size": 32}
MODEL = {"n_layer": 2, "n_embd": 64, "n_head": 2, "max_seq_len": 64, "pretrain_steps": 150}
#: ``--model minilm``: the MiniLM encoder (public weights, ``pretrained_path = "minilm"``), 32 word pieces; an
#: encoder has no next-token distribution, so PeCL's rows run without Score_1 and the unlearning loss
MINILM = {"pretrained_path": "minilm", "max_seq_len": 32, "alpha": 0.0, "unlearning": False}
#: the optimiser settings of ``--model minilm`` (2 epochs of batch 16: 28 steps per task of 224 fortunes, 30 for the
#: first task's 240 with the canaries, 142 for MTL's 1136): enough for SeqFT without noise to reach TI >= 0.8 on
#: each task right after training on it, in every seed (4 epochs add 0.012 to its mean at twice the time)
MINILM_SETTINGS = {"epochs": 2, "learning_rate": 3e-3, "head_learning_rate": 5e-3, "batch_size": 16}
#: fortunes per category of the stream: the small model's table keeps 60; MiniLM's takes 140, every category's
#: fortunes up to the smallest category's count (sports: 147), so a task has 224 training and 56 test fortunes
SMALL_MAX_PER_CLASS = 60
MINILM_MAX_PER_CLASS = 140
#: relative CPU cost of a run by (strategy, privacy), measured on MiniLM; 1 for the others
_COST = {("gem", "none"): 3.0, ("gem", "dpsgd"): 1.6, ("er", "none"): 1.4, ("er", "dpsgd"): 1.4, ("mtl", "none"): 1.1}


#: the rows run first within a seed: the non-private references, then PeCL's rows
_FIRST = ("MTL (upper reference)", "SeqFT", "PeCL (paper sigma)", "DP PeCL (eps=8)", "DP PeCL (eps=1)",
          "SeqFT+DPSGD (eps=8)", "SeqFT+DPSGD")


def _cost(row: str) -> float:
    options = METHODS[row]
    return _COST.get((options["strategy"], options["privacy"]), 1.0)


def _mean_sd(values: Sequence[float | None]) -> str:
    finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not finite:
        return "–"
    mean = float(np.mean(finite))
    mean = 0.0 if abs(mean) < 5e-4 else mean  # no "-0.000"
    if len(finite) == 1:
        return f"{mean:.3f}"
    return f"{mean:.3f} ± {np.std(finite, ddof=1):.3f}"


def _epsilons(result: dict[str, Any]) -> tuple[str, str]:
    privacy = result["privacy"]
    if "checkpoint" in privacy:  # the paper's PeCL: its per-token epsilon is the input release's
        return "∞ (not DP)", f"{privacy['epsilon']:.3g}"
    epsilon = privacy["epsilon"]
    checkpoint = "∞ (not private)" if not math.isfinite(epsilon) else f"{epsilon:.3g} per example"
    token = f"{privacy['input_token_epsilon']:.3g}" if "input_token_epsilon" in privacy else "–"
    return checkpoint, token


def just_trained(result: dict[str, Any]) -> float | None:
    """Mean TI accuracy of each task right after it was trained (the diagonal R_ii): how much a row learns,
    before forgetting; None for multi-task training (one release, no diagonal)."""
    matrix = result["task_incremental"]["accuracy_matrix"]
    if len(matrix) < 2 or len(matrix) != len(matrix[0]):
        return None
    return float(np.mean([matrix[i][i] for i in range(len(matrix))]))


def optimiser_steps(result: dict[str, Any]) -> str:
    """The optimiser steps of each task of a run ("24, 28, 32, 36, 40"), DP-SGD's planned steps included."""
    steps = [t["dpsgd"]["steps"] if "dpsgd" in t else t.get("steps") for t in result.get("tasks", [])]
    return ", ".join("–" if v is None else str(int(v)) for v in steps) if steps else "–"


def exposure_over_candidates(result: dict[str, Any]) -> float | None:
    """Mean over a run's canaries of the exposure over the scored set (:func:`.canary.candidate_exposure`: the
    canary among its candidates, at most log2(candidates + 1) bits); None without canaries.

    A canary recorded with only the estimate over the whole space gets its rank among the candidates back from
    that estimate (rank = 1 + (|R| - 1) k / n, with k the candidates scored below it, ties counting half)."""
    setup = result.get("canary_setup")
    if not setup or not result.get("canaries"):
        return None
    n = int(setup["candidates"])
    values = []
    for canary in result["canaries"]:
        if "candidate_exposure" in canary:
            values.append(float(canary["candidate_exposure"]))
            continue
        space = 2.0 ** float(canary["max_exposure"])
        rank = 2.0 ** (float(canary["max_exposure"]) - float(canary["exposure"]))
        below = round(2 * (rank - 1) * n / (space - 1)) / 2
        values.append(candidate_exposure(1.0 + below, n))
    return float(np.mean(values))


def table(runs: Sequence[dict[str, Any]], rows: Sequence[str]) -> str:
    """Mean +- sd over seeds per row; epsilon columns from the first seed (they do not depend on the seed)."""
    lines = [
        "| method | seeds | TI just trained | TI Last | TI Avg | TI BWT | CI Last | CI Avg | CI BWT | "
        "canary exposure (bits) | checkpoint ε (δ = 1e-6) | input ε per token | optimiser steps per task |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        mine = [r for r in runs if r["method"] == row]
        if not mine:
            continue
        ti = [r["task_incremental"] for r in mine]
        checkpoint, token = _epsilons(mine[0])
        lines.append(
            f"| {row} | {len(mine)} | {_mean_sd([just_trained(r) for r in mine])} | {_mean_sd([t['last'] for t in ti])} | {_mean_sd([t['avg'] for t in ti])} | "
            f"{_mean_sd([t['backward_transfer'] for t in ti])} | {_mean_sd([r['last'] for r in mine])} | "
            f"{_mean_sd([r['avg'] for r in mine])} | {_mean_sd([r['backward_transfer'] for r in mine])} | "
            f"{_mean_sd([exposure_over_candidates(r) for r in mine])} | {checkpoint} | {token} | "
            f"{optimiser_steps(mine[0])} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="output directory (runs.json, table.md, timing.json)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rows", nargs="+", default=list(ROWS), help="row labels (default: every row)")
    parser.add_argument("--max-per-class", type=int, default=None,
                        help=f"fortunes per category (default: {SMALL_MAX_PER_CLASS} for --model small, "
                             f"{MINILM_MAX_PER_CLASS} for --model minilm)")
    parser.add_argument("--model", choices=("small", "minilm"), default="small",
                        help="small: the bundled 2-layer GPT-2-architecture model at the paper's settings; minilm: "
                             "the MiniLM encoder at MINILM_SETTINGS")
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--lr", type=float, default=None, help="adapters' learning rate")
    parser.add_argument("--head-lr", type=float, default=None, help="classification head's learning rate")
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--canaries", type=int, default=4, help="canaries in the first task (0: no exposure column)")
    parser.add_argument("--canary-repeats", type=int, default=4, help="times each canary is inserted")
    parser.add_argument("--candidates", type=int, default=100, help="uniform candidate secrets per canary")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--jobs", type=int, default=1, help="(row, seed) runs at once, in worker processes")
    parser.add_argument("--reproducible-noise", action="store_true",
                        help="draw the privacy noise from the seed (research reproducibility; default: OS entropy)")
    parser.add_argument("--table-only", action="store_true", help="write table.md from --out's runs.json, train nothing")
    args = parser.parse_args(argv)
    unknown = [r for r in args.rows if r not in METHODS]
    if unknown:
        parser.error(f"unknown rows {unknown}; known: {list(METHODS)}")
    if args.table_only:
        runs_file = Path(args.out) / "runs.json"
        if not runs_file.exists():
            parser.error(f"--table-only: {runs_file} does not exist.")
        rendered = table(_finite(json.loads(runs_file.read_text())["runs"]), args.rows)
        write_text_atomic(Path(args.out) / "table.md", rendered)
        print(rendered)
        return 0
    if args.jobs < 1 or args.canaries < 0 or args.candidates < 1 or args.canary_repeats < 1:
        parser.error("--jobs, --candidates and --canary-repeats must be >= 1 and --canaries >= 0.")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device; use --device cpu.")
    logging.getLogger().setLevel(logging.ERROR)  # dp-accounting's RDP order warnings; the bounds are unaffected
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs_file = out / "runs.json"
    runs: list[dict[str, Any]] = json.loads(runs_file.read_text())["runs"] if runs_file.exists() else []
    done = {(r["method"], r["seed"]) for r in runs}
    defaults, model = (MINILM_SETTINGS, MINILM) if args.model == "minilm" else (PAPER_SETTINGS, MODEL)
    if args.max_per_class is None:
        args.max_per_class = MINILM_MAX_PER_CLASS if args.model == "minilm" else SMALL_MAX_PER_CLASS
    given = {"epochs": args.epochs, "learning_rate": args.lr, "head_learning_rate": args.head_lr,
             "batch_size": args.batch_size}
    training = {k: (defaults[k] if v is None else v) for k, v in given.items()}
    canary = {"canaries": args.canaries, "canary_repeats": args.canary_repeats, "candidates": args.candidates}
    settings = {**training, **model, "max_per_class": args.max_per_class, "tasks": 5,
                "reproducible_noise": args.reproducible_noise, "device": args.device, **canary}
    if runs_file.exists() and json.loads(runs_file.read_text())["settings"] != settings:
        parser.error(f"{runs_file} holds runs with other settings; use another --out directory.")
    base = {**training, **model, "device": args.device}
    todo = [(row, seed) for seed in args.seeds for row in args.rows if (row, seed) not in done]
    # seed by seed (an interrupted table has whole seeds), the reference rows first, the costliest last
    todo.sort(key=lambda pair: (args.seeds.index(pair[1]), _FIRST.index(pair[0]) if pair[0] in _FIRST else
                                len(_FIRST), _cost(pair[0])))
    started, load_start = time.perf_counter(), os.getloadavg()
    cpu_start = _cpu_seconds()

    def record(result: dict[str, Any]) -> None:
        runs.append(json.loads(json.dumps(result, default=str).replace("Infinity", '"inf"')))
        write_json_atomic(runs_file, {"settings": settings, "runs": runs})
        write_text_atomic(out / "table.md", table(_finite(runs), args.rows))
        print(f"{result['method']} seed {result['seed']}: TI Last {result['task_incremental']['last']:.3f}, CI Last "
              f"{result['last']:.3f}, exposure {result.get('canary_exposure', float('nan')):.2f} bits "
              f"({result['wall_seconds']:.0f} s wall, {result['cpu_seconds']:.0f} s CPU; "
              f"{len(runs)} of {len(done) + len(todo)} runs, {time.perf_counter() - started:.0f} s)", flush=True)

    work = [(row, seed, base, args.max_per_class, canary, args.reproducible_noise, str(out)) for row, seed in todo]
    if args.jobs == 1:
        for item in work:
            record(_run_one(*item))
    else:
        import multiprocessing

        # spawn: a fresh interpreter per worker (CUDA cannot be used in a forked child), OMP threads as set outside
        with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn"),
                                 initializer=_quiet_worker) as pool:
            pending = {pool.submit(_run_one, *item) for item in work}
            while pending:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    record(future.result())
    timing = {"wall_seconds": time.perf_counter() - started, "cpu_seconds": _cpu_seconds() - cpu_start,
              "runs": len(todo), "jobs": args.jobs, "device": args.device,
              "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "cpu_count": os.cpu_count(),
              "load_average_at_start": load_start, "load_average_at_end": os.getloadavg()}
    if todo:
        write_json_atomic(out / "timing.json", timing)
        print(f"{len(todo)} runs: {timing['wall_seconds']:.0f} s wall, {timing['cpu_seconds']:.0f} s CPU "
              f"(load average {load_start[0]:.1f} at start, {timing['load_average_at_end'][0]:.1f} at end)")
    write_text_atomic(out / "table.md", table(_finite(runs), args.rows))
    print(table(_finite(runs), args.rows))
    return 0


def _cpu_seconds() -> float:
    """CPU seconds of this process and of its finished workers (user + system)."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def _quiet_worker() -> None:
    logging.getLogger().setLevel(logging.ERROR)


@functools.lru_cache(maxsize=None)
def _stream(max_per_class: int, seed: int):
    """The seed's fortunes stream and the public corpus with its labels (read once per process)."""
    tasks, public, class_names = fortunes_text_stream(5, 2, max_per_class, seed)
    public_texts, public_labels = public_corpus()
    return tasks, public, class_names, public_labels


def _run_one(row: str, seed: int, base: dict[str, Any], max_per_class: int, canary: dict[str, int],
             reproducible_noise: bool, out: str) -> dict[str, Any]:
    """One (row, seed) run, certified in ``out/certified/ROW-seedS`` (an interrupted attempt's folder is removed:
    its releases were never reported)."""
    start, cpu = time.perf_counter(), time.process_time()
    tasks, public, class_names, public_labels = _stream(max_per_class, seed)
    canaries = make_canaries(canary["canaries"], seed=seed + 100) if canary["canaries"] else []
    torch.manual_seed(seed)
    run_dir = Path(out) / "certified" / f"{_slug(row)}-seed{seed}"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    result = run_method(row, METHODS[row], tasks, public, len(class_names), seed=seed, base=base,
                        reproducible_noise=reproducible_noise, public_labels=public_labels, run_dir=run_dir,
                        canaries=canaries, canary_repeats=canary["canary_repeats"],
                        n_candidates=canary["candidates"])
    result["seed"] = seed
    result["wall_seconds"] = time.perf_counter() - start
    result["cpu_seconds"] = time.process_time() - cpu
    return result


def _slug(row: str) -> str:
    """A directory name for a row label ("ER+DPSGD (eps=8)" -> "er-dpsgd-eps-8")."""
    return re.sub(r"[^a-z0-9]+", "-", row.lower()).strip("-")


def _finite(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``runs`` with the JSON "inf" strings read back as floats."""
    def fix(value):
        if isinstance(value, dict):
            return {k: fix(v) for k, v in value.items()}
        if isinstance(value, list):
            return [fix(v) for v in value]
        return math.inf if value == "inf" else value

    return [fix(r) for r in runs]


if __name__ == "__main__":
    raise SystemExit(main())

"""Training benchmarks: throughput of every continual-learning method on CPU, and PeCL's token-level DP overhead.

Usage (from the repository root)::

    .venv/bin/python benchmarks/run_all.py                   # the whole report, benchmarks/RESULTS.md (sections 5-6)
    .venv/bin/python benchmarks/bench_training.py            # these sections alone; prints them
    .venv/bin/python benchmarks/bench_training.py --quick    # smoke run (one task, few steps); prints them

From Python (``run_all.py`` merges these sections into the single benchmark
report). opacus installs a top-level package named ``benchmarks``, so import
this file as a module of the ``benchmarks/`` folder, as ``run_all.py`` does::

    sys.path.insert(0, "benchmarks")
    import bench_training
    results = bench_training.measure(quick=False)        # structured numbers
    markdown = bench_training.render(results)            # or results_section(quick=False)

Measured here, nothing copied in by hand:

1. **Training throughput** of each method dpcl can build (``cosine``,
   ``peft_ensemble``, ``naive``, ``non_cl``, ``l2dpml``, ``pecl``): the method is
   built from its bundled config (``dpcl/configs/<name>.toml``,
   ``l2dpml_split_digits.toml`` for ``l2dpml``), every task is planned
   with the method's own :class:`~dpcl.guarantees.method_schema.MethodSpec`
   (the plan ``dpcl run`` trains with) and ``fit_task`` is timed on the
   label-filtered task data (median of ``METHOD_REPEATS`` runs of the whole
   stream, each from scratch). Throughput is *task examples per second of
   fit_task* (examples of the data a release reads, divided by the wall-clock
   time of training on it); ``example-epochs/s`` multiplies by the epochs of the
   config. Building the method (PeCL pre-trains its language model on public
   text there) is timed separately. A method that cannot be built in this
   checkout is listed with the reason.
2. **PeCL TDP overhead**: the wall-clock of one training step of PeCL's model
   (GPT-2-architecture LM with LoRA and a classification head, sizes from
   ``dpcl/configs/pecl.toml``) on a batch of fortunes, (a) on clean embeddings,
   (b) with the token-level DP noise (:class:`dpcl.methods.pecl.tdp.TokenDP`,
   clip + per-token Gaussian), (c) with the per-token sensitivity scoring of the
   batch (a no-grad forward pass, eq. 1-3) and the noise. PeCL scores each token
   once per task and perturbs it once per epoch, so its amortised step is
   (b) + ((c) - (b)) / epochs. Medians over repeated steps after warm-up.

torch runs on one intra-op thread by default (``--threads N`` changes it, ``0``
keeps torch's default): on a machine whose cores are shared with other jobs,
handing small operations to a second thread costs more than the work itself.
Speed is reported here, never asserted in tests. The machine is described at the
top of the section; on a shared machine the times are indicative.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import os
import platform
import statistics
import sys
import tempfile
import time
import tomllib
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CONFIGS = ROOT / "dpcl" / "configs"

#: Methods in the order of the report.
METHODS = ("cosine", "peft_ensemble", "naive", "non_cl", "l2dpml", "pecl")

#: Full runs train each method's stream this many times and report the median run.
METHOD_REPEATS = 5


# ---------------------------------------------------------------------------------------------------------------------
# machine
# ---------------------------------------------------------------------------------------------------------------------
def machine_info() -> dict[str, str]:
    """What the numbers were measured on."""
    import torch

    info = {
        "platform": f"{platform.system()} {platform.machine()}",
        "processor": platform.processor() or "unknown",
        "CPUs (os.cpu_count)": str(os.cpu_count()),
        "torch threads": str(torch.get_num_threads()),
        "Python": platform.python_version(),
        "numpy": np.__version__,
        "torch": torch.__version__,
    }
    try:
        info["load average (1 min)"] = f"{os.getloadavg()[0]:.2f}"
    except OSError:  # pragma: no cover - not on every platform
        pass
    return info


# ---------------------------------------------------------------------------------------------------------------------
# 1. training throughput per method
# ---------------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MethodThroughput:
    method: str
    config: str
    dataset: str
    tasks: int
    examples: int
    epochs: int
    build_seconds: float
    fit_seconds: float
    error: str = ""

    @property
    def examples_per_second(self) -> float:
        return self.examples / self.fit_seconds if self.fit_seconds > 0 else math.nan

    @property
    def example_epochs_per_second(self) -> float:
        return self.examples_per_second * self.epochs


#: Bundled config of methods whose config is not named ``<method>.toml``.
CONFIG_FILES = {"l2dpml": "l2dpml_split_digits.toml"}


def _config_text(method: str) -> tuple[str, str]:
    """(config TOML text, where it comes from) for ``method``."""
    bundled = CONFIGS / CONFIG_FILES.get(method, f"{method}.toml")
    if bundled.exists():
        return bundled.read_text(), f"dpcl/configs/{bundled.name}"
    raise FileNotFoundError(f"no config for method {method!r}")


def _task_data(stream: Any, label_sets: Sequence[Sequence[int]], t: int, reuses_past_tasks: bool):
    """The label-filtered data release ``t`` reads (tasks 0..t for methods that reuse past tasks), as the runner builds it."""
    from dpcl.guarantees.label_space import filter_task
    from dpcl.methods.base import TrainingData

    parts = []
    for task in list(stream)[: t + 1] if reuses_past_tasks else [list(stream)[t]]:
        mask, _ = filter_task(task.train.labels, label_sets[task.index], task.index)
        train = task.train
        n = int(mask.sum())
        # Raw-text streams (PeCL) carry no encoder features: [n, 0] features, the method reads the texts.
        features = (
            np.asarray(train.features[mask], dtype=np.float32)
            if train.features is not None
            else np.zeros((n, 0), dtype=np.float32)
        )
        texts = None if train.texts is None else np.asarray(train.texts[mask], dtype=object)
        parts.append((features, np.asarray(train.labels[mask], dtype=np.int64), np.asarray(train.unit_ids[mask]), texts))
    texts = None if any(p[3] is None for p in parts) else np.concatenate([p[3] for p in parts])
    data = TrainingData(
        features=np.concatenate([p[0] for p in parts]),
        labels=np.concatenate([p[1] for p in parts]),
        unit_ids=np.concatenate([p[2] for p in parts]),
        texts=texts,
    )
    outputs = tuple(sorted({int(o) for k in (range(t + 1) if reuses_past_tasks else [t]) for o in label_sets[k]}))
    return data, outputs


def bench_method(method: str, max_tasks: int | None, seed: int = 0) -> MethodThroughput:
    """Build ``method`` from its config and time ``fit_task`` on its first ``max_tasks`` tasks."""
    from dpcl.data import STREAM_KEYS, build_stream
    from dpcl.guarantees.config import load_config
    from dpcl.guarantees.label_space import output_label_sets
    from dpcl.methods.base import MethodSetup, method_class

    text, source = _config_text(method)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{method}.toml"
        path.write_text(text)
        config = load_config(path, data_stream_keys=STREAM_KEYS)
    stream = build_stream(config.raw["stream"])
    n_tasks = len(stream) if max_tasks is None else min(max_tasks, len(stream))
    label_sets = [
        tuple(sorted(s))
        for s in output_label_sets(config.stream["label_space"], config.stream["prior_labels"], len(stream))
    ]
    first = list(stream)[0].train
    input_dim = 0 if first.features is None else int(first.features.shape[1])  # 0: raw-text inputs
    setup = MethodSetup(
        method=config.method,
        privacy=config.settings,
        label_space=tuple(sorted({o for s in label_sets for o in s})),
        input_dim=input_dim,
        seed=seed,
        device="cpu",
    )
    start = time.perf_counter()
    model = method_class(method)(setup)
    build_seconds = time.perf_counter() - start
    spec = config.spec
    examples, fit_seconds = 0, 0.0
    for t in range(n_tasks):
        data, outputs = _task_data(stream, label_sets, t, spec.reuses_past_tasks)
        plan = spec.plan_task(config.method, config.settings, len(data), t)
        start = time.perf_counter()
        model.fit_task(t, data, outputs, plan)
        fit_seconds += time.perf_counter() - start
        examples += len(data)
    return MethodThroughput(
        method=method,
        config=source,
        dataset=str(config.stream["dataset"]),
        tasks=n_tasks,
        examples=examples,
        epochs=int(config.method.get("epochs") or 1),  # single-pass methods (cosine) have none
        build_seconds=build_seconds,
        fit_seconds=fit_seconds,
    )


def bench_methods(max_tasks: int | None, methods: Sequence[str] = METHODS, repeats: int = 3) -> list[MethodThroughput]:
    """Each method's stream trained ``repeats`` times from scratch; the run with the median fit time is kept."""
    from dpcl.progress import progress

    rows = []
    for method in progress(methods, desc="training benchmarks", unit="method"):
        try:
            runs = [bench_method(method, max_tasks) for _ in range(repeats)]
            median = sorted(runs, key=lambda r: r.fit_seconds)[len(runs) // 2]
            # Build time of the first (cold) run: PeCL keeps its pre-trained public model for the process.
            rows.append(dataclasses.replace(median, build_seconds=runs[0].build_seconds))
        except Exception as exc:  # noqa: BLE001 - a method that cannot run is reported, not hidden
            rows.append(MethodThroughput(method, "", "", 0, 0, 0, math.nan, math.nan,
                                         error=f"{type(exc).__name__}: {str(exc)[:160]}"))
    return rows


# ---------------------------------------------------------------------------------------------------------------------
# 2. PeCL TDP overhead
# ---------------------------------------------------------------------------------------------------------------------
def _median_step(step, repeats: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_tdp_overhead(repeats: int = 30, seed: int = 0) -> dict[str, Any]:
    """ms per training step of PeCL's model without TDP, with the noise, and with scoring + noise."""
    import torch
    from torch import nn

    from dpcl.data.fortunes import load_fortunes_texts
    from dpcl.methods.pecl.texts import PUBLIC_CATEGORIES
    from dpcl.methods.pecl.learner import ContinualLM, learner_config
    from dpcl.methods.pecl.model import per_token_lm_loss
    from dpcl.methods.pecl.tdp import TokenDP

    cfg = tomllib.loads((CONFIGS / "pecl.toml").read_text())
    method, privacy = cfg["method"], cfg["privacy"]
    stream_options = cfg["stream"]["dataset_options"]
    options = {k: method[k] for k in ("n_layer", "n_embd", "n_head", "max_seq_len", "lora_rank", "batch_size",
                                      "epochs", "epsilon_lower", "epsilon_upper", "clip_norm", "calibration",
                                      "alpha", "learning_rate")}
    # Pre-training on public text only sets the starting weights; one step is enough to time a training step.
    config = learner_config(strategy="pecl", privacy="tdp", delta=float(privacy["delta"]), pretrain_steps=1,
                            device="cpu", **options)
    public = load_fortunes_texts(PUBLIC_CATEGORIES, max_per_class=50, min_count=1)
    private = load_fortunes_texts(stream_options["categories"][:2], max_per_class=stream_options["max_per_class"])
    learner = ContinualLM(2, config, seed, list(public.texts))
    ids, mask = learner.tokenizer.encode_batch(list(private.texts), config.max_seq_len)
    learner.token_stats.add_task(ids, mask)
    batch = slice(0, config.batch_size)
    b_ids = torch.as_tensor(ids[batch])
    b_mask = torch.as_tensor(mask[batch])
    b_y = torch.as_tensor(np.asarray(private.labels[batch], dtype=np.int64))
    tdp = TokenDP(epsilon_lower=config.epsilon_lower, epsilon_upper=config.epsilon_upper, delta=config.delta,
                  clip_norm=config.clip_norm, calibration=config.calibration, releases=config.epochs)
    params = [p for p in learner.model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.learning_rate)
    generator = torch.Generator().manual_seed(seed + 1)
    precomputed_scores = learner.token_scores(b_ids, b_mask)

    def train_step(emb: torch.Tensor) -> None:
        learner.model.train()
        cls_logits, lm_logits = learner.model(emb, b_mask)
        tok_loss = per_token_lm_loss(lm_logits, b_ids, b_mask)
        lm = (tok_loss.sum(1) / b_mask[:, 1:].sum(1).clamp_min(1)).mean()
        loss = nn.functional.cross_entropy(cls_logits, b_y) + config.lm_weight * lm
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    def plain() -> None:
        with torch.no_grad():
            emb = learner.embedding(b_ids)
        train_step(emb)

    def noise_only() -> None:
        with torch.no_grad():
            emb = tdp.perturb(learner.embedding(b_ids), precomputed_scores, b_mask, generator)
        train_step(emb)

    def scoring_and_noise() -> None:
        scores = learner.token_scores(b_ids, b_mask)  # no-grad forward pass + Score_2 lookup (eq. 1-3)
        with torch.no_grad():
            emb = tdp.perturb(learner.embedding(b_ids), scores, b_mask, generator)
        train_step(emb)

    # Interleave the variants so machine load affects them alike.
    times: dict[str, list[float]] = {"plain": [], "noise": [], "scoring_noise": []}
    steps = {"plain": plain, "noise": noise_only, "scoring_noise": scoring_and_noise}
    for fn in steps.values():
        for _ in range(3):
            fn()
    names = list(steps)
    for r in range(repeats):
        for name in names[r % 3:] + names[: r % 3]:  # rotate the order: no variant always runs first
            start = time.perf_counter()
            steps[name]()
            times[name].append(time.perf_counter() - start)
    med = {name: statistics.median(values) for name, values in times.items()}
    epochs = int(config.epochs)
    amortised = med["noise"] + (med["scoring_noise"] - med["noise"]) / epochs
    return {
        "batch_size": int(b_ids.shape[0]),
        "tokens": int(b_mask.sum()),
        "max_seq_len": int(config.max_seq_len),
        "n_layer": int(config.n_layer),
        "n_embd": int(config.n_embd),
        "lora_rank": int(config.lora_rank),
        "epochs": epochs,
        "repeats": repeats,
        "plain_s": med["plain"],
        "noise_s": med["noise"],
        "scoring_noise_s": med["scoring_noise"],
        "amortised_s": amortised,
    }


# ---------------------------------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------------------------------
def render(results: dict[str, Any], heading: str = "##", standalone: bool = True, number: int | None = None) -> str:
    """Markdown for :func:`measure`'s results.

    ``standalone`` adds the machine table (the merged report has one at its top); ``heading`` is the
    markdown level of the two section titles, ``number`` (if given) the number of the first of them.
    """
    titles = ["Training throughput per method (CPU)", "PeCL: token-level DP (TDP) overhead per training step (CPU)"]
    if number is not None:
        titles = [f"{number + i}. {title}" for i, title in enumerate(titles)]
    methods: Sequence[MethodThroughput] = results["methods"]
    tdp: dict[str, Any] = results["tdp"]
    info: dict[str, str] = results["info"]
    repeats: int = results["repeats"]
    threads = (
        f"CPU only, {info['torch threads']} torch thread(s) (one by default, so that the numbers measure "
        "the methods rather than thread hand-offs on a shared machine)."
    )
    lines: list[str] = []
    if standalone:
        lines += [
            f"Measured by `.venv/bin/python benchmarks/bench_training.py` on {results['when']}. {threads} Machine:",
            "",
            "| | |",
            "| --- | --- |",
        ]
        lines += [f"| {k} | {v} |" for k, v in info.items()]
        lines += [""]
    lines += [
        f"{heading} {titles[0]}",
        "",
        *([] if standalone else [threads, ""]),
        "Each method is built from its config and trained task by task with the plan `dpcl run` uses. "
        "`examples/s` = examples of the data each release reads / wall-clock seconds of `fit_task` "
        "(Non-CL retrains on the union of the tasks so far, so it reads more examples per release); "
        "`example-epochs/s` multiplies by the config's epochs (L2DP-ML's epochs run on its released noisy "
        "polynomial coefficients, not on the examples); each stream is trained from scratch "
        f"{repeats} time(s) and the run with the median fit time is shown. `build s` is the method's construction "
        "(PeCL pre-trains its language model on public text there), timed on the first run. Ratios are against "
        "the DP Cosine Classifier.",
        "",
        "| method | config | dataset | tasks | examples | epochs | build s | fit s | examples/s | example-epochs/s | vs cosine |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    base = next((m.examples_per_second for m in methods if m.method == "cosine" and not m.error), math.nan)
    for m in methods:
        if m.error:
            lines.append(f"| {m.method} | not run: {m.error.replace('|', '/')} | | | | | | | | | |")
            continue
        ratio = m.examples_per_second / base if math.isfinite(base) else math.nan
        lines.append(
            f"| {m.method} | {m.config} | {m.dataset} | {m.tasks} | {m.examples} | {m.epochs} | "
            f"{m.build_seconds:.3g} | {m.fit_seconds:.3g} | {m.examples_per_second:,.0f} | "
            f"{m.example_epochs_per_second:,.0f} | {ratio:.3g}x |"
        )
    plain = tdp["plain_s"]
    lines += [
        "",
        f"{heading} {titles[1]}",
        "",
        f"One training step (forward, backward, AdamW) of PeCL's model ({tdp['n_layer']} layers, "
        f"n_embd {tdp['n_embd']}, LoRA rank {tdp['lora_rank']}) on a batch of {tdp['batch_size']} fortunes "
        f"({tdp['tokens']} tokens, max length {tdp['max_seq_len']}); median of {tdp['repeats']} steps per variant, "
        "variants interleaved in rotating order. PeCL scores every token once per task and perturbs it once per epoch "
        f"({tdp['epochs']} epochs), so its amortised step is the noisy step plus the scoring cost divided by "
        "the number of epochs.",
        "",
        "| step | ms | vs clean step |",
        "| --- | ---: | ---: |",
        f"| clean embeddings (no TDP) | {1000 * plain:.2f} | 1.00x |",
        f"| + per-token noise (clip + Gaussian, eq. 5) | {1000 * tdp['noise_s']:.2f} | {tdp['noise_s'] / plain:.2f}x |",
        f"| + per-token scoring (eq. 1-3) + noise | {1000 * tdp['scoring_noise_s']:.2f} | "
        f"{tdp['scoring_noise_s'] / plain:.2f}x |",
        f"| PeCL amortised (noise + scoring / {tdp['epochs']} epochs) | {1000 * tdp['amortised_s']:.2f} | "
        f"{tdp['amortised_s'] / plain:.2f}x |",
        "",
    ]
    return "\n".join(lines)


def results_section(quick: bool = False, methods: Sequence[str] = METHODS, threads: int | None = 1) -> str:
    """Run the training benchmarks and return their markdown (standalone, with the machine table)."""
    return render(measure(quick, methods, threads))


def measure(quick: bool = False, methods: Sequence[str] = METHODS, threads: int | None = 1) -> dict[str, Any]:
    """Run the training benchmarks: ``{"methods", "tdp", "info", "when", "repeats"}``.

    ``threads`` sets torch's intra-op thread count (``None`` keeps torch's default). The default
    is 1: on a machine whose cores are shared with other jobs, handing small operations (a
    vector norm over one batch of embeddings) to a second thread costs more than the work, so
    multi-threaded timings there measure contention rather than the methods.
    """
    import torch

    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be an integer >= 1 or None, got {threads!r}")
    previous_threads = torch.get_num_threads()
    try:
        if threads is not None:
            torch.set_num_threads(threads)
        return _measure(quick, methods)
    finally:
        torch.set_num_threads(previous_threads)  # the caller's process keeps its own setting


def _measure(quick: bool, methods: Sequence[str]) -> dict[str, Any]:
    import torch

    # dp-accounting's RDP logs a warning per non-converging order, transformers and torch warn about
    # deprecations: none of it concerns what is measured here.
    logging.getLogger("absl").setLevel(logging.ERROR)
    torch.manual_seed(0)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    info = machine_info()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", UserWarning)
        rows = bench_methods(max_tasks=1 if quick else None, methods=methods, repeats=1 if quick else METHOD_REPEATS)
        tdp = bench_tdp_overhead(repeats=3 if quick else 150)
    return {"methods": rows, "tdp": tdp, "info": info, "when": when, "repeats": 1 if quick else METHOD_REPEATS}


def summary(results: dict[str, Any]) -> dict[str, Any]:
    """Headline numbers for the report's summary table, computed from :func:`measure`'s results."""
    ok = [m for m in results["methods"] if not m.error]
    tdp = results["tdp"]
    return {
        "examples_per_second": {m.method: m.examples_per_second for m in ok},
        "datasets": {m.method: m.dataset for m in ok},
        "not_run": {m.method: m.error for m in results["methods"] if m.error},
        "tdp_noise_ratio": tdp["noise_s"] / tdp["plain_s"],
        "tdp_scoring_noise_ratio": tdp["scoring_noise_s"] / tdp["plain_s"],
        "tdp_amortised_ratio": tdp["amortised_s"] / tdp["plain_s"],
        "tdp_epochs": tdp["epochs"],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one task per method, few steps")
    parser.add_argument("--methods", nargs="*", default=list(METHODS), choices=METHODS, help="methods to measure")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (default 1; 0 keeps torch's default)")
    args = parser.parse_args(argv)
    if args.threads < 0:
        parser.error(f"--threads must be >= 0, got {args.threads}")
    print(results_section(quick=args.quick, methods=args.methods, threads=args.threads or None))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

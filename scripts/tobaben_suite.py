"""The ``tobaben`` suite of ``scripts/tobaben_results.py``: the README's results table.

Rows: Cosine Classifier, PEFT Ensemble, Naive, Non-CL, L2DP-ML, DP-SGD A-GEM.
Columns: Split Fashion-MNIST (5 tasks x 2 classes, raw pixels, the ``t10k`` files
held out) and fortunes + MiniLM (10 categories in 5 tasks of 2), each at
epsilon = 1, 8 and not private. Each (setting, seed) is one certified
``dpcl run``; every release is then checked with ``dpcl verify`` (exit code
recorded). Results go to ``OUT/runs.json``, keyed ``"<setting>/seed<k>"`` so that
runs made on several machines merge (``--merge``), and ``OUT/table.md``; both are
rewritten after every finished run, and a rerun skips every run already
recorded with the same config and a passing verification.

What epsilon means per row (stated again in the table's notes):

* Cosine, PEFT Ensemble, Naive: epsilon per task, add/remove one example, tasks
  hold disjoint examples, parallel composition over tasks (Tobaben et al.,
  Thm 4.4): the stream's certified epsilon equals the per-task one.
* Non-CL retrains on the union of the tasks so far and DP-SGD A-GEM replays an
  episodic memory: their releases are calibrated to epsilon each and composed
  (A-GEM: sequentially over all tasks), so the stream's certified epsilon is
  larger; the table states it.
* L2DP-ML: epsilon is its whole lifelong budget (epsilon1 + epsilon2), pure DP
  (Laplace functional mechanism) under replace-one adjacency (Lai et al., Thm 2).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import numpy as np

from dpcl._io.atomic_io import write_json_atomic, write_text_atomic

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tobaben_results import DPSGD_METHOD as FORTUNES_DPSGD  # noqa: E402  (the fortunes suite's, unchanged)
from tobaben_results import FORTUNES_STREAM  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[1] / "dpcl" / "configs"
EPSILONS: tuple[float | None, ...] = (1.0, 8.0, None)
METHODS = ("cosine", "peft_ensemble", "naive", "non_cl", "l2dpml", "agem")
ROW_NAMES = {
    "cosine": "Cosine Classifier",
    "peft_ensemble": "PEFT Ensemble",
    "naive": "Naive (DP-SGD fine-tuning)",
    "non_cl": "Non-CL (retrain on all tasks so far)",
    "l2dpml": "L2DP-ML (pure DP, replace-one)",
    "agem": "DP-SGD A-GEM",
}
DATASETS = {"fmnist": "Split Fashion-MNIST", "fortunes": "fortunes + MiniLM"}

FMNIST_STREAM = """[stream]
dataset = "idx:/usr/share/datasets/fashion-mnist"
holdout = "dataset"
tasks = [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
label_space = "prior_const"
prior_labels = [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
disjoint_units = true
"""

#: DP-SGD single-model baselines (Naive, Non-CL, A-GEM), fixed a priori: on Fashion-MNIST the bundled
#: fmnist_naive.toml's schedule, on fortunes the fortunes suite's.
DPSGD_METHOD = {
    "fmnist": "epochs = 1\nbatch_size = 256\nmax_grad_norm = 1.0\nadapter_dim = 16\nlearning_rate = 0.05\n",
    "fortunes": FORTUNES_DPSGD,
}
#: A-GEM: its episodic memory (examples kept from every earlier task, a uniform sample drawn with public
#: randomness) and plain SGD (the step A-GEM's projection is derived for) at learning rate 0.1.
AGEM_MEMORY = {
    "fmnist": "memory_per_task = 1000\noptimizer = \"sgd\"\n",
    "fortunes": "memory_per_task = 100\noptimizer = \"sgd\"\n",
}
#: PEFT Ensemble on fortunes: the fortunes suite's members (head only, weight decay, normalised features).
FORTUNES_PEFT = (
    "epochs = 20\nbatch_size = 32\nmax_grad_norm = 1.0\nadapter_dim = 0\nlearning_rate = 0.01\n"
    "weight_decay = 0.01\nnormalize_features = true\naggregation = \"argmax\"\n"
)
#: Bundled configs used as they are (only epsilon and [run] private change).
BUNDLED = {
    ("fmnist", "cosine"): "fmnist_cosine.toml",
    ("fmnist", "peft_ensemble"): "fmnist_peft_ensemble.toml",
    ("fmnist", "l2dpml"): "fmnist_l2dpml_split.toml",
    ("fortunes", "l2dpml"): "l2dpml_fortunes.toml",
}


def _eps_name(epsilon: float | None) -> str:
    return "inf" if epsilon is None else f"{epsilon:g}"


def _privacy(epsilon: float | None, across: str) -> str:
    return (
        f"[privacy]\nepsilon = {1.0 if epsilon is None else epsilon}\ndelta = 1e-5\nadjacency = \"add_remove\"\n"
        f"accountant = \"auto\"\nacross_tasks = \"{across}\"\n"
    )


def _set_epsilon(text: str, epsilon: float | None) -> str:
    """A bundled config with its [privacy] epsilon replaced (the first ``epsilon =`` line is [privacy]'s)."""
    if not text.lstrip().startswith("[privacy]") and not re.search(r"(?m)^\[privacy\]", text.split("[stream]")[0]):
        raise SystemExit("bundled config does not start with [privacy]")
    return re.sub(r"(?m)^epsilon = [^\n]*", f"epsilon = {1.0 if epsilon is None else epsilon}", text, count=1)


def config_text(dataset: str, method: str, epsilon: float | None) -> str:
    """The TOML config of one setting."""
    bundled = BUNDLED.get((dataset, method))
    if bundled is not None:
        body = _set_epsilon((CONFIGS / bundled).read_text(encoding="utf-8"), epsilon)
    else:
        stream = FMNIST_STREAM if dataset == "fmnist" else FORTUNES_STREAM
        # A-GEM's memory units are read again by every later release: sequential composition over tasks
        across = "sequential" if method == "agem" else "auto"
        if method == "cosine":
            section = ""
        elif method == "peft_ensemble":
            section = FORTUNES_PEFT
        else:
            section = DPSGD_METHOD[dataset]
            if method == "agem":
                section = re.sub(r"learning_rate = [^\n]*", "learning_rate = 0.1", section) + AGEM_MEMORY[dataset]
        body = _privacy(epsilon, across) + "\n" + stream + f'\n[method]\nname = "{method}"\n' + section
    if epsilon is None:
        body += "\n[run]\nprivate = false\n"
    return body


def settings(datasets: list[str]) -> list[dict[str, Any]]:
    return [
        {"setting": f"{d}-{m}-eps{_eps_name(e)}", "dataset": d, "method": m, "epsilon": e,
         "config": config_text(d, m, e)}
        for d in datasets for m in METHODS for e in EPSILONS
    ]


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _verify(run_dir: Path) -> dict[str, Any]:
    """``dpcl verify RUN_DIR`` (every release's certificate): exit code and what each certificate states."""
    proc = subprocess.run([sys.executable, "-m", "dpcl", "verify", str(run_dir)], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    private = []
    for cert in sorted((run_dir / "certificates").glob("*.json")):
        data = json.loads(cert.read_text())
        guarantee = data.get("guarantee", {})
        private.append(bool(guarantee.get("private", guarantee.get("epsilon") is not None)))
    return {"verify_rc": proc.returncode, "certificates": len(private), "certificates_private": private,
            "verify_tail": (proc.stdout + proc.stderr)[-400:] if proc.returncode else ""}


FMNIST_DIR = "/usr/share/datasets/fashion-mnist"


def _one(job: dict[str, Any]) -> dict[str, Any]:
    """Train one (setting, seed), verify every release; the record of runs.json."""
    import torch

    torch.set_num_threads(1)
    from dpcl.runner import run_training

    directory = Path(job["runs_dir"]) / job["setting"]
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / "config.toml"
    # the IDX folder of this machine (--fmnist); runs.json keys the canonical config, so machines merge
    write_text_atomic(config, job["config"].replace(f"idx:{FMNIST_DIR}", f"idx:{job['fmnist']}"))
    run_dir = directory / f"seed{job['seed']}"
    shutil.rmtree(run_dir, ignore_errors=True)
    record = {k: job[k] for k in ("setting", "dataset", "method", "epsilon", "seed")}
    record.update(config_sha256=_sha(job["config"]), device=job["device"], machine=platform.node(),
                  cpus=os.cpu_count(), load_at_start=os.getloadavg()[0])
    usage0, wall0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        m = run_training(config, run_dir, seed=job["seed"], device=job["device"], quiet=True).metrics
    except Exception as exc:  # one failed setting must not lose the others; it is reported in the table
        record["error"] = f"{type(exc).__name__}: {exc}"[:500]
        return record
    usage1 = resource.getrusage(resource.RUSAGE_SELF)
    record["wall_s"] = round(time.perf_counter() - wall0, 1)
    record["cpu_s"] = round(usage1.ru_utime - usage0.ru_utime + usage1.ru_stime - usage0.ru_stime, 1)
    matrix = m["accuracy_matrix"]
    record.update(
        average_accuracy=m["average_accuracy"], average_forgetting=m["average_forgetting"],
        accuracy_after_task=[row[t] for t, row in enumerate(matrix)], final_epsilon=m["final_epsilon"],
        private=m["private"], across_tasks=m["across_tasks"],
    )
    record.update(_verify(run_dir))
    children1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    record["verify_cpu_s"] = round(children1.ru_utime - children0.ru_utime + children1.ru_stime - children0.ru_stime, 1)
    record["wall_with_verify_s"] = round(time.perf_counter() - wall0, 1)
    return record


def _done(record: dict[str, Any] | None, sha: str) -> bool:
    return bool(record) and "error" not in record and record.get("verify_rc") == 0 and record.get("config_sha256") == sha


def _cell(records: list[dict[str, Any]]) -> str:
    if not records:
        return "—"
    values = np.asarray([r["average_accuracy"] for r in records], dtype=float)
    seeds = "" if len(values) == 3 else f" ({len(values)} seeds)"
    return f"{values.mean():.3f} ± {values.std(ddof=1) if len(values) > 1 else 0.0:.3f}{seeds}"


def table(runs: dict[str, dict[str, Any]]) -> str:
    """table.md: AA mean ± sd (ddof 1) over seeds, certified epsilon per cell, accuracy after each task.

    Columns: every dataset some record holds, in :data:`DATASETS` order (runs merged from several machines).
    """
    datasets = [d for d in DATASETS if any(r.get("dataset") == d for r in runs.values())]
    by: dict[str, list[dict[str, Any]]] = {}
    for record in runs.values():
        if "error" not in record and record.get("verify_rc") == 0:
            by.setdefault(record["setting"], []).append(record)
    heads = [f"{DATASETS[d]} ε = {_eps_name(e).replace('inf', '∞')}" for d in datasets for e in EPSILONS]
    lines = ["Final average accuracy AA (eq. A38), mean ± sd over seeds (3 unless stated).", "",
             "| method | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
    for method in METHODS:
        cells = [_cell(by.get(f"{d}-{method}-eps{_eps_name(e)}", [])) for d in datasets for e in EPSILONS]
        lines.append(f"| {ROW_NAMES[method]} | " + " | ".join(cells) + " |")
    lines += ["", "Certified ε of the released stream (δ = 1e-5; largest over seeds; every release passed "
              "`dpcl verify`, exit 0; not-private runs' certificates state private: false).", "",
              "| method | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
    for method in METHODS:
        cells = []
        for d in datasets:
            for e in EPSILONS:
                recs = by.get(f"{d}-{method}-eps{_eps_name(e)}", [])
                if not recs:
                    cells.append("—")
                elif e is None:
                    ok = all(not any(r["certificates_private"]) for r in recs)
                    cells.append("not private" + ("" if ok else " (a certificate claims private!)"))
                else:
                    cells.append(f"{max(r['final_epsilon'] for r in recs):.3g}")
        lines.append(f"| {ROW_NAMES[method]} | " + " | ".join(cells) + " |")
    lines += ["", "Accuracy on task t right after training on it (mean over seeds), tasks 1..5:", "",
              "| setting | after task 1..5 | AF (mean) | runs | CPU s per run (mean) | device |",
              "|---|---|---|---|---|---|"]
    for name in sorted(by):
        recs = by[name]
        after = np.nanmean(np.asarray([r["accuracy_after_task"] for r in recs], dtype=float), axis=0)
        forget = [r["average_forgetting"] for r in recs if r["average_forgetting"] is not None]
        cpu = np.mean([r["cpu_s"] for r in recs])
        devices = ", ".join(sorted({r["device"] for r in recs}))
        lines.append(f"| {name} | {' '.join(f'{a:.2f}' for a in after)} | "
                     f"{np.mean(forget) if forget else float('nan'):.3f} | {len(recs)} | {cpu:.0f} | {devices} |")
    failed = [r for r in runs.values() if "error" in r or r.get("verify_rc") not in (0, None)]
    if failed:
        lines += ["", "Failed runs:", ""]
        lines += [f"- {r['setting']}/seed{r['seed']}: {r.get('error') or 'dpcl verify exit ' + str(r['verify_rc'])}"
                  for r in failed]
    return "\n".join(lines) + "\n"


def run_suite(args: Any) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs_file = out / "runs.json"
    runs: dict[str, dict[str, Any]] = json.loads(runs_file.read_text()) if runs_file.exists() else {}
    for other in args.merge:  # runs of another machine: a passing record wins over a failed or missing one
        for key, record in json.loads(Path(other).read_text()).items():
            mine = runs.get(key)
            if mine is None or not _done(mine, mine.get("config_sha256", "")):
                runs[key] = record
    runs_dir = Path(args.runs_dir) if args.runs_dir else out / "runs"
    chosen = [s for s in settings(list(args.datasets)) if args.only is None or args.only in s["setting"]]
    jobs = [
        {**s, "seed": seed, "runs_dir": str(runs_dir), "device": args.device, "fmnist": args.fmnist}
        for s in chosen for seed in range(args.seeds)
        if not _done(runs.get(f"{s['setting']}/seed{seed}"), _sha(s["config"]))
    ]
    skipped = len(chosen) * args.seeds - len(jobs)
    print(f"tobaben suite: {len(jobs)} runs to do, {skipped} already recorded in {runs_file}", flush=True)
    start = time.perf_counter()
    if jobs and not args.table_only:
        with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            futures = [pool.submit(_one, job) for job in jobs]
            for done, future in enumerate(as_completed(futures), start=1):
                record = future.result()
                runs[f"{record['setting']}/seed{record['seed']}"] = record
                write_json_atomic(runs_file, dict(sorted(runs.items())))
                write_text_atomic(out / "table.md", table(runs))
                status = record.get("error") or (
                    f"AA {record['average_accuracy']:.3f}, eps {record['final_epsilon']}, verify exit "
                    f"{record['verify_rc']}, {record['cpu_s']} CPU s")
                print(f"[{done}/{len(jobs)}, {time.perf_counter() - start:.0f} s] {record['setting']} seed "
                      f"{record['seed']}: {status}", flush=True)
    write_json_atomic(runs_file, dict(sorted(runs.items())))
    text = table(runs)
    write_text_atomic(out / "table.md", text)
    sys.stdout.write(text)
    return 0

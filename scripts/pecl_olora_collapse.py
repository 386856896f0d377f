"""Why non-private O-LoRA learns only the first tasks of the MiniLM PeCL table: the summed adapters collapse MiniLM.

``python scripts/pecl_olora_collapse.py --out results/pecl_olora_collapse`` trains non-private O-LoRA (Wang et al.
2023; ``strategy = "olora"``, ``privacy = "none"``) on the MiniLM table's stream and settings
(``scripts/pecl_like_for_like.py --model minilm``: 5 tasks of two fortune categories, 140 fortunes per category,
2 epochs of batch 16, AdamW with a cosine schedule; no canaries) once per ``--seeds`` and ``--lrs`` adapter learning
rate (the table's is 3e-3, the O-LoRA paper's 1e-3), and records after each task

* ``ti``: the task-incremental accuracy of every task seen so far (argmax over the task's own labels);
* ``spread``: the root-mean-square distance of MiniLM's mean-pooled last hidden states from their mean, on the
  first task's test fortunes (the head's input before standardisation; 4.4-4.5 for the public encoder plus the
  first adapter): how much the encoder still tells inputs apart;
* ``adapter_norms``: per task adapter, the sum over the adapted layers of ``||B A||_F`` (its weight update; O-LoRA
  freezes it after its task and adds it to every later forward pass).

It reads the fortunes and the public encoder only; writes ``collapse.json`` and ``collapse.md``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from dpcl._io.atomic_io import write_json_atomic, write_text_atomic  # noqa: E402
from dpcl.methods.pecl.config import learner_config  # noqa: E402
from dpcl.methods.pecl.learner import ContinualLM  # noqa: E402
from dpcl.methods.pecl.texts import fortunes_text_stream, public_corpus  # noqa: E402
from dpcl.runner.threads import use_usable_cores  # noqa: E402
from pecl_like_for_like import MINILM, MINILM_MAX_PER_CLASS, MINILM_SETTINGS  # noqa: E402


@torch.inference_mode()
def feature_spread(learner: ContinualLM, texts: Sequence[str]) -> float:
    """RMS distance of the mean-pooled last hidden states of ``texts`` from their mean (before the head's
    standardisation)."""
    learner.model.eval()
    ids, mask = learner._encode(list(texts))
    out = learner.model.lm(inputs_embeds=learner.embedding(ids), attention_mask=mask, output_hidden_states=True)
    pooled = learner.model.pooled(out, mask).double()
    return float((pooled - pooled.mean(0)).pow(2).sum(1).mean().sqrt())


@torch.no_grad()
def adapter_norms(learner: ContinualLM, n_tasks: int) -> list[float]:
    """Per task adapter ``task_k``, the sum over adapted layers of ``||B A||_F``."""
    return [float(sum((b @ a).norm() for a, b in learner._lora_pairs(f"task_{k}"))) for k in range(n_tasks)]


def run(seed: int, learning_rate: float, max_per_class: int) -> dict[str, Any]:
    tasks, public, class_names = fortunes_text_stream(5, 2, max_per_class, seed)
    _, public_labels = public_corpus()
    base = {**MINILM_SETTINGS, **MINILM, "learning_rate": learning_rate}
    torch.manual_seed(seed)
    learner = ContinualLM(len(class_names), learner_config(**base, strategy="olora", privacy="none"), seed, public,
                          public_labels=public_labels)
    probe = list(tasks[0].test_texts)
    start = time.perf_counter()
    after = []
    for k, task in enumerate(tasks):
        learner.fit_task(k, list(task.train_texts), task.train_labels)
        ti = [learner.accuracies(t.test_texts, t.test_labels, t.label_set or None)[1] for t in tasks[: k + 1]]
        after.append({"task": k, "ti": ti, "spread": feature_spread(learner, probe),
                      "adapter_norms": adapter_norms(learner, k + 1)})
    return {"seed": seed, "learning_rate": learning_rate, "after_task": after,
            "wall_seconds": time.perf_counter() - start}


def markdown(runs: Sequence[dict[str, Any]]) -> str:
    lines = ["| adapter lr | seed | TI right after each task | TI Last | spread after each task | "
             "adapter ‖BA‖_F (each task's, after the last) |", "| --- | --- | --- | --- | --- | --- |"]
    for r in runs:
        diagonal = [a["ti"][a["task"]] for a in r["after_task"]]
        last = r["after_task"][-1]
        spreads = [a["spread"] for a in r["after_task"]]
        lines.append(
            f"| {r['learning_rate']:g} | {r['seed']} | {', '.join(f'{v:.2f}' for v in diagonal)} | "
            f"{np.mean(last['ti']):.3f} | {', '.join(f'{v:.2f}' for v in spreads)} | "
            f"{', '.join(f'{v:.1f}' for v in last['adapter_norms'])} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--lrs", type=float, nargs="+", default=[MINILM_SETTINGS["learning_rate"], 1e-3])
    parser.add_argument("--max-per-class", type=int, default=MINILM_MAX_PER_CLASS)
    args = parser.parse_args(argv)
    use_usable_cores()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = [run(seed, lr, args.max_per_class) for lr in args.lrs for seed in args.seeds]
    write_json_atomic(out / "collapse.json", {"settings": {**MINILM_SETTINGS, **MINILM,
                                                           "max_per_class": args.max_per_class}, "runs": runs})
    write_text_atomic(out / "collapse.md", markdown(runs))
    print(markdown(runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

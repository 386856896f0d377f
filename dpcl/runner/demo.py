"""The certified training run of ``dpcl demo``: the DP Cosine Classifier on split digits.

The bundled config (:data:`DEMO_CONFIG`) is written into the run directory and
run with :func:`dpcl.runner.run_training`, exactly as ``dpcl run`` would: five
tasks of two digit classes, the output label space fixed in advance
(``prior_const``), epsilon = 1 per task at delta = 1e-5. The tasks hold disjoint
examples, so the releases compose in parallel (Tobaben et al., Thm 4.4): the
whole stream stays at epsilon = 1. The last certificate is verified again at
the end (epsilon recomputed from its events, checkpoint re-hashed).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from dpcl.guarantees.certificates import verify_certificate
from dpcl.runner.run import check_run_directory, run_training

#: The demo's config: written to ``DIR/demo.toml`` and trained like any ``dpcl run`` config.
DEMO_CONFIG = """\
# dpcl demo: the DP Cosine Classifier (Tobaben et al., Alg. 1) on split digits.
# Rerun it yourself:  dpcl run demo.toml --out my-run
[privacy]
epsilon = 1.0              # per task (per release)
delta = 1e-5
adjacency = "add_remove"
accountant = "auto"
across_tasks = "auto"      # disjoint tasks -> parallel composition (Thm 4.4)

[stream]
dataset = "digits"         # scikit-learn's 8x8 digits, raw pixels as features
tasks = [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
label_space = "prior_const"
prior_labels = [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]   # public: all ten digits known in advance
disjoint_units = true      # every image belongs to one task

[method]
name = "cosine"
"""


def certified_demo_run(out_dir: "str | Path | None" = None, *, seed: int = 0) -> dict[str, Any]:
    """Train and certify the demo run; returns a JSON-able summary (releases, metrics, verification)."""
    out = Path(tempfile.mkdtemp(prefix="dpcl-demo-")) if out_dir is None else check_run_directory(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = out / "demo.toml"
    if not config.exists() or config.read_text(encoding="utf-8") != DEMO_CONFIG:
        config.write_text(DEMO_CONFIG, encoding="utf-8")
    result = run_training(config, out / "run", seed=seed, quiet=True)
    report = verify_certificate(result.last_certificate)
    report.raise_if_invalid()
    tasks = [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    releases = [
        {
            "task": r.task_index + 1,
            "labels": tasks[r.task_index],
            "accuracy_on_task": r.accuracies[-1],
            "average_accuracy": sum(r.accuracies) / len(r.accuracies),
            "cumulative_epsilon": r.cumulative_epsilon,
            "certificate": str(result.out_dir / r.certificate),
        }
        for r in result.releases
    ]
    return {
        "config": str(config),
        "run_directory": str(result.out_dir),
        "certificates": str(result.out_dir / "certificates"),
        "delta": result.delta,
        "epsilon_per_task": result.metrics["epsilon_per_task"],
        "final_epsilon": result.metrics["final_epsilon"],
        "across_tasks": result.metrics["across_tasks"],
        "average_accuracy": result.metrics["average_accuracy"],
        "average_forgetting": result.metrics["average_forgetting"],
        "releases": releases,
        "verification": report.to_dict(),
    }


def print_demo_run(console: Any, demo: dict[str, Any]) -> None:
    """Print the demo run as a rich table, where the certificates are, and the verification."""
    from rich.table import Table

    console.rule("[bold]A certified continual-learning run: DP Cosine Classifier on split digits")
    console.print(
        f"Five tasks of two digit classes arrive one after another. Each release adds Gaussian noise to per-class "
        f"feature sums, calibrated to ε = {demo['epsilon_per_task']:g} per task at δ = {demo['delta']:g}. The tasks "
        f"hold disjoint examples, so releases compose in parallel (Thm 4.4): the whole stream costs "
        f"ε = {demo['final_epsilon']:.4g}."
    )
    table = Table(show_header=True, header_style="bold")
    for column in ("task", "labels", "accuracy on task", "avg accuracy so far", "cumulative ε"):
        table.add_column(column, justify="right")
    for row in demo["releases"]:
        table.add_row(
            str(row["task"]),
            ", ".join(str(label) for label in row["labels"]),
            f"{row['accuracy_on_task']:.3f}",
            f"{row['average_accuracy']:.3f}",
            f"{row['cumulative_epsilon']:.4g}",
        )
    console.print(table)
    check = demo["verification"]
    console.print(f"Final average accuracy (AA, 10 classes, chance 0.1): {demo['average_accuracy']:.3f}")
    # soft_wrap: paths stay on one line, so they can be copied
    console.print(f"Certificates (one per release): {demo['certificates']}", soft_wrap=True)
    console.print(
        f"Verified the last certificate: ε recomputed from its events = {check['recomputed_epsilon']:.6g} "
        f"(stated {check['stated_epsilon']:.6g}), checkpoint hash matches: "
        + ("[bold green]valid[/]" if check["valid"] else "[bold red]INVALID[/]")
    )
    certificates = Path(demo["releases"][-1]["certificate"]).parent
    console.print(f"Check them yourself: dpcl verify {certificates / '*.json'}", soft_wrap=True)

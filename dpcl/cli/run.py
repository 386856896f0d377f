"""``dpcl run CONFIG.toml --out DIR``: a certified continual-learning training run.

Audits the config first (refused configs exit 3 before training), then trains
task by task; every release gets a checkpoint and a verified certificate. An
``--out`` that already holds a run is refused (exit 2, nothing changed) unless
``--resume`` asks to continue it after its last certified task.
"""

from __future__ import annotations

import argparse
from typing import Any

from dpcl.cli.numbers import parse_count
from dpcl.cli.output import add_json_flag, print_json


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "run",
        help="train a config task by task; certify every release",
        description=(
            "Train the continual-learning run CONFIG.toml describes. The config is audited first (as `dpcl audit`); "
            "a refused config exits with code 3 before training. Writes DIR/metrics.json, DIR/accuracy.png, "
            "DIR/ledger.json, DIR/run.json, DIR/checkpoints/ and DIR/certificates/ (one verified certificate per release) "
            "and DIR/curator/. Publish checkpoints/ and certificates/ only: curator/, ledger.json and run.json hold "
            "what the methods computed from the private data without noise and are not covered by any certificate. "
            "An --out that already holds a run is refused (exit 2, nothing changed) unless --resume asks to continue "
            "it after its last certified task (after a crash or an interruption)."
        ),
    )
    parser.add_argument("config", metavar="CONFIG.toml", help="training config ([privacy], [stream], [method], optional [run])")
    parser.add_argument("--out", required=True, metavar="DIR", help="run directory (created; must not hold a run "
                        "unless --resume)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run recorded in --out (its ledger, certificates and run.json) after its "
                        "last certified task; without it an --out that holds a run is refused")
    parser.add_argument(
        "--seed", type=int, default=0,
        help="seed of initialisation, shuffles and the stream ([stream] seed unless the config sets it); default 0. "
        "Privacy noise and Poisson sampling never come from it unless --reproducible-noise is given",
    )
    parser.add_argument(
        "--reproducible-noise", action="store_true",
        help="research only: draw the privacy noise and Poisson sampling from --seed (as [run] reproducible_noise = "
        "true); the certificates then state that the release is private only against someone who does not know the seed",
    )
    parser.add_argument("--device", default=None, metavar="DEVICE",
                        help="torch device: cpu, cuda or cuda:N (default: [method] device, else cpu); a CUDA device "
                        "must exist")
    parser.add_argument(
        "--nproc", default="1", metavar="N",
        help="data-parallel DP-SGD on N local processes (peft_ensemble, naive, non_cl; gloo on cpu, nccl on cuda); "
        "the same ledger and epsilon as one process. Under torchrun leave it out: the ranks come from torchrun",
    )
    parser.add_argument(
        "--sign", metavar="KEY", default=None,
        help="sign every certificate with this Ed25519 private key (dpcl keygen); check with dpcl verify --public-key",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    add_json_flag(parser)
    parser.set_defaults(handler=run_command)


def summary_rows(result: Any) -> list[dict[str, Any]]:
    """One row per release: task, accuracy on the tasks seen so far (AA_t), cumulative epsilon, certificate."""
    rows = []
    for release in result.releases:
        rows.append(
            {
                "task": release.task_index + 1,
                "average_accuracy": sum(release.accuracies) / len(release.accuracies),
                "cumulative_epsilon": release.cumulative_epsilon,
                "certificate": release.certificate,
            }
        )
    return rows


def print_summary(result: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    delta = f"{result.delta:g}"
    table = Table(title=f"dpcl run: {result.method}" + ("" if result.private else " (NOT private)"))
    table.add_column("after task", justify="right")
    table.add_column("avg accuracy (tasks so far)", justify="right")
    table.add_column(f"cumulative ε (δ={delta})" if result.private else "ε", justify="right")
    table.add_column("certificate")
    for row in summary_rows(result):
        eps = row["cumulative_epsilon"]
        table.add_row(
            str(row["task"]),
            f"{row['average_accuracy']:.3f}",
            "∞ (not private)" if eps is None else f"{eps:.4g}",
            row["certificate"].rsplit("/", 1)[-1],
        )
    console = Console()
    console.print(table)
    metrics = result.metrics
    console.print(f"final average accuracy (AA): {metrics['average_accuracy']:.4f}")
    if result.resumed_after is not None:
        console.print(f"resumed after task {result.resumed_after + 1}")
    console.print(f"certificates: {result.out_dir / 'certificates'}")
    console.print(f"run directory: {result.out_dir} (metrics.json, accuracy.png, ledger.json, checkpoints/)")
    console.print("publish checkpoints/ with their certificates/ only; curator/, ledger.json and run.json are private")


def quiet_accounting_logs() -> None:
    """Hide dp-accounting's RDP convergence warnings (orders it excludes; the bound stays sound) from the CLI."""
    import logging

    logging.getLogger("absl").setLevel(logging.ERROR)


def parse_nproc(text: str) -> int:
    """``--nproc``: an integer, within what :func:`~dpcl.runner.distributed.check_nproc` allows (one rank per usable
    CPU core, or per CUDA device where there are more of those)."""
    # lazy import: keeps CLI start-up fast (only this command needs it)
    from dpcl.runner.distributed import check_nproc

    return check_nproc(parse_count("--nproc", text, minimum=1), "--nproc")


def run_command(args: argparse.Namespace) -> int:
    # lazy import: keeps CLI start-up fast (only this command needs it)
    from dpcl.runner.distributed import launched_by_torchrun, run_data_parallel, run_under_torchrun

    nproc = parse_nproc(args.nproc)
    quiet_accounting_logs()
    options = {"seed": args.seed, "device": args.device, "quiet": args.quiet or args.json,
               "reproducible_noise": args.reproducible_noise, "sign_key": args.sign, "resume": args.resume}
    if launched_by_torchrun() and nproc == 1:
        result = run_under_torchrun(args.config, args.out, **options)
        if result is None:  # a rank > 0: rank 0 reports
            return 0
    else:
        result = run_data_parallel(args.config, args.out, nproc=nproc, **options)
    if args.json:
        print_json(
            {
                "out": str(result.out_dir),
                "method": result.method,
                "private": result.private,
                "complete": result.complete,
                "resumed_after_task": None if result.resumed_after is None else result.resumed_after + 1,
                "average_accuracy": result.metrics["average_accuracy"],
                "final_epsilon": result.metrics["final_epsilon"],
                "delta": result.delta,
                "releases": summary_rows(result),
            }
        )
    else:
        print_summary(result)
    return 0

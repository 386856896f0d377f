"""``dpcl audit-run``: a one-run empirical lower bound on epsilon beside a DP-SGD config's certified epsilon.

``dpcl audit-run CONFIG.toml --out DIR [--canaries M] [--confidence 0.95] [--json] [--quiet]``

For every task of a DP-SGD config (the methods whose per-task plan is a
DP-SGD run: noise multiplier, sampling rate, steps, clip norm), trains once
with ``M`` canaries mixed into that task's training examples, each included
with probability 1/2 (:mod:`dpcl.audit.one_run_dpsgd`), at exactly the
planned DP-SGD settings, and reports the one-run lower bound on epsilon
(white box: every noisy update seen; black box: the final model) beside the
task's certified epsilon. The canaries are examples like any other: each is
covered by the task's (epsilon, delta) at the same sampling rate, so the
certified epsilon is the one ``dpcl audit`` states for the task. Over the
stream, the bound is the largest task's (a lower bound on the stream's
epsilon too: each task's release is part of the stream), with the confidence
split over the tasks.

What is trained is dpcl's DP-SGD step (Poisson sampling, per-example clipping,
Gaussian noise, the planned steps) on a softmax-regression model of the task's
features widened by one coordinate per canary, not the method's own network:
the audit checks the DP-SGD mechanism and its accounting at the config's
settings. The canary run is not a release: it writes no checkpoint and no
certificate. With ``--in-stream`` the config's own method is trained instead,
through ``dpcl run``'s pipeline with the canaries as units of each task
(:mod:`dpcl.runner.canary_run`), into ``DIR`` as a run directory whose
certificates hold, and each release is audited black box (``DIR/audit/``).
Writes ``DIR/audit.json`` and ``DIR/audit.md``; exits 3 when a
lower bound exceeds its certified epsilon (the implementation is then not
what was certified), 0 otherwise, 2 on bad input.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from dpcl.cli.numbers import parse_count, parse_delta
from dpcl.cli.output import add_json_flag, emit
from dpcl.errors import ConfigError

#: Default number of canaries per task.
DEFAULT_CANARIES = 2000

#: What ``--mode`` may ask for.
MODES = ("both", "stream", "harness")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "audit-run",
        help="one-run empirical lower bound on epsilon beside a DP-SGD config's certified epsilon",
        description=(
            "Train each task of a DP-SGD config once with canaries mixed in (each included with probability 1/2) "
            "at the planned noise, sampling rate, steps and clip norm, and report a lower bound on epsilon that "
            "holds with the given confidence beside the certified epsilon. Exit 3 when a lower bound exceeds the "
            "certified epsilon, 0 otherwise, 2 for bad input."
        ),
    )
    parser.add_argument("config", metavar="CONFIG.toml", help="a training config whose method uses DP-SGD")
    parser.add_argument("--out", required=True, metavar="DIR", help="directory for audit.json and audit.md")
    parser.add_argument("--canaries", default=str(DEFAULT_CANARIES), metavar="M",
                        help=f"canaries per task, integer in [2, 1000000] (default {DEFAULT_CANARIES})")
    parser.add_argument("--confidence", default="0.95", metavar="P",
                        help="probability with which the lower bounds hold, in (0, 1) (default 0.95)")
    parser.add_argument("--canary-kind", default="gradient", choices=("gradient", "input"),
                        help="gradient: Dirac gradient canaries (white box, default); input: input-space canaries "
                             "whose gradients the step must clip")
    parser.add_argument("--step", default=None, metavar="MODULE:CLASS",
                        help="audit your own DP-SGD step: a subclass of dpcl.audit.one_run_dpsgd.DpsgdStep, "
                             "importable as MODULE:CLASS (default: dpcl's)")
    parser.add_argument("--mode", default="both", choices=MODES,
                        help="stream: train the config's own method once through dpcl run's pipeline with canaries "
                             "mixed into every task (each a unit, so DIR is a run whose certificates hold) and audit "
                             "each release black box; harness: dpcl's DP-SGD step (or --step) at each task's planned "
                             "settings with white-box canaries, no release; both (default): the two, the harness "
                             "only where the method plans DP-SGD")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    add_json_flag(parser)
    parser.set_defaults(handler=run_audit_run, time_hint="use fewer --canaries")


def _dpsgd_plan(entry: dict[str, Any], method: str) -> dict[str, Any]:
    noise = entry.get("noise") or {}
    needed = ("noise_multiplier", "sample_rate", "steps", "max_grad_norm")
    if not all(k in noise for k in needed):
        raise ConfigError(
            f"dpcl audit-run audits DP-SGD training; method {method!r} plans no DP-SGD run for task {entry.get('task')} "
            "(no noise multiplier, sampling rate, steps and clip norm). Use a config of a DP-SGD method "
            "(naive, non_cl, peft_ensemble)."
        )
    return {k: noise[k] for k in needed}


def load_step_class(spec: str | None) -> Any:
    """``--step MODULE:CLASS`` as a :class:`~dpcl.audit.one_run_dpsgd.DpsgdStep` subclass (``None``: dpcl's own)."""
    import importlib

    # lazy import: keeps torch out of CLI start-up (only this command needs it)
    from dpcl.audit.one_run_dpsgd import DpsgdStep

    if spec is None:
        return DpsgdStep
    module_name, sep, class_name = spec.partition(":")
    if not sep or not module_name or not class_name:
        raise ConfigError(f"--step must be MODULE:CLASS (an importable DpsgdStep subclass), got {spec!r}.")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"--step {spec!r} cannot be imported: {exc}.") from None
    if not (isinstance(cls, type) and issubclass(cls, DpsgdStep)):
        raise ConfigError(f"--step {spec!r} is not a subclass of dpcl.audit.one_run_dpsgd.DpsgdStep.")
    return cls


def run_audit_run(args: argparse.Namespace) -> int:
    # lazy import: keeps CLI start-up fast (only this command writes files)
    from dpcl._io.atomic_io import write_json_atomic, write_text_atomic

    canaries = parse_count("--canaries", args.canaries, 2, 1_000_000)
    confidence = parse_delta("--confidence", args.confidence)
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"--out {str(out)!r} is not empty; give a new or empty directory for the audit's files.")
    if args.mode == "stream" and (args.step is not None or args.canary_kind != "gradient"):
        raise ConfigError("--step and --canary-kind apply to the DP-SGD harness; --mode stream trains the method's own "
                          "code with input canaries: drop them, or use --mode harness or both.")
    if args.mode == "harness":
        payload = harness_audit(args, out, canaries, confidence, required=True)
        out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out / "audit.json", payload)
        write_text_atomic(out / "audit.md", render_markdown(payload))
    else:
        payload = _stream_audit(args, out, canaries, confidence)
    emit(args, "audit-run", {k: v for k, v in payload.items() if k not in ("tasks", "harness")})
    return 3 if payload["flagged_tasks"] else 0


def harness_audit(args: argparse.Namespace, out: Path, canaries: int, confidence: float, *,
                  required: bool, loaded: Any = None, prepared: Any = None) -> dict[str, Any] | None:
    """The DP-SGD harness audit of every task (white and black box), or None when the method plans no DP-SGD run
    and ``required`` is false (a method without DP-SGD is refused when it is true). ``loaded`` and ``prepared``:
    the run and its stream when the caller has built them already (``--mode both``: the canary run's)."""
    import numpy as np

    # lazy import: keeps CLI start-up fast and torch-free (only this command trains)
    from dpcl.audit.one_run_dpsgd import audit_dpsgd_one_run, os_generator
    from dpcl.runner.run import audit_run, load_run, prepare_stream

    step_class = load_step_class(args.step)
    if loaded is None:
        loaded = load_run(args.config, out, quiet=True)  # --out is checked as a directory dpcl may write
    if not loaded.private:
        raise ConfigError("the config trains without privacy ([privacy] private = false): there is no certified epsilon to audit.")
    prepared = prepare_stream(loaded) if prepared is None else prepared
    report = audit_run(loaded, prepared)
    if not required and not all(_plans_dpsgd(entry) for entry in report.per_task):
        return None
    plans = [(task, _dpsgd_plan(entry, loaded.method_name)) for task, entry in zip(prepared.tasks, report.per_task)]
    delta = float(report.delta)
    per_task_confidence = 1.0 - (1.0 - confidence) / len(plans)
    # lazy import: keeps CLI start-up fast (only this command needs it)
    from dpcl.progress import progress

    tasks = []
    for task, plan in plans if (args.quiet or args.json) else progress(plans, desc="audit-run", unit="task"):
        generator = os_generator()
        step = step_class(float(plan["noise_multiplier"]), float(plan["max_grad_norm"]), generator)
        result = audit_dpsgd_one_run(
            np.asarray(task.features, dtype=np.float64), np.asarray(task.labels),
            canaries=canaries, noise_multiplier=float(plan["noise_multiplier"]), sample_rate=float(plan["sample_rate"]),
            steps=int(plan["steps"]), clip_norm=float(plan["max_grad_norm"]), delta=delta,
            confidence=per_task_confidence, accountant=str(report.accountant), canary_kind=args.canary_kind,
            step=step, generator=generator,
        )
        tasks.append({"task": task.index, **result.to_dict()})
    empirical = max(t["empirical_epsilon_lower"] for t in tasks)
    flagged = [t["task"] for t in tasks if t["flagged"]]
    return {
        "config": str(args.config),
        "method": loaded.method_name,
        "mode": "harness",
        "certified_epsilon": float(report.epsilon),
        "empirical_epsilon_lower": empirical,
        "delta": delta,
        "adjacency": str(report.adjacency),
        "unit": str(report.unit),
        "confidence": confidence,
        "canaries_per_task": canaries,
        "canary_kind": args.canary_kind,
        "step": args.step or "dpcl.audit.one_run_dpsgd:DpsgdStep",
        "verdict": "violated" if flagged else "consistent",
        "flagged_tasks": flagged,
        "release": "none: the canary run is an audit, not a release; it writes no checkpoint and no certificate",
        "what_is_trained": (
            "dpcl's DP-SGD step (Poisson sampling, per-example clipping, Gaussian noise) at each task's planned noise "
            "multiplier, sampling rate, steps and clip norm, on a softmax-regression model of the task's features "
            "widened by one coordinate per canary; not the method's own network"
        ),
        "tasks": tasks,
    }


def _plans_dpsgd(entry: dict[str, Any]) -> bool:
    noise = entry.get("noise") or {}
    return all(k in noise for k in ("noise_multiplier", "sample_rate", "steps", "max_grad_norm"))


def _stream_audit(args: argparse.Namespace, out: Path, canaries: int, confidence: float) -> dict[str, Any]:
    """``--mode stream`` or ``both``: the canary run into ``out`` (a run directory), audited black box, and with
    ``both`` the harness beside it (white box); the confidence is split between the two (Bonferroni)."""
    # lazy import: keeps CLI start-up fast and torch-free (only this command trains)
    from dpcl._io.atomic_io import write_json_atomic, write_text_atomic
    from dpcl.runner.canary_run import run_with_canaries

    each = confidence if args.mode == "stream" else 1.0 - (1.0 - confidence) / 2
    audits: dict[str, Any] = {}

    def audit_harness(loaded: Any, prepared: Any) -> None:  # on the run's own stream, before its canaries
        audits["harness"] = harness_audit(args, out, canaries, each, required=False, loaded=loaded, prepared=prepared)

    def report_release(t: int) -> None:
        print(f"audit-run (in stream): release {t + 1} trained, certified and scored", file=sys.stderr, flush=True)

    payload = run_with_canaries(args.config, out, canaries=canaries, confidence=each, quiet=True,
                                progress=None if (args.quiet or args.json) else report_release,
                                before=audit_harness if args.mode == "both" else None)
    harness = audits.get("harness")
    payload["confidence"] = confidence
    payload["mode"] = args.mode
    payload["harness"] = harness if harness is not None else (
        None if args.mode == "stream" else f"not run: method {payload['method']!r} plans no DP-SGD run"
    )
    if harness is not None:
        for stream_task, harness_task in zip(payload["tasks"], harness["tasks"]):
            stream_task["white_box"] = harness_task["white_box"]
            stream_task["harness_certified_epsilon"] = harness_task["certified_epsilon"]
            stream_task["harness_empirical_epsilon_lower"] = harness_task["empirical_epsilon_lower"]
            stream_task["flagged"] = bool(stream_task["flagged"] or harness_task["flagged"])
        payload["empirical_epsilon_lower"] = max(payload["empirical_epsilon_lower"], harness["empirical_epsilon_lower"])
        payload["flagged_tasks"] = [t["task"] for t in payload["tasks"] if t["flagged"]]
        payload["verdict"] = "violated" if payload["flagged_tasks"] else "consistent"
    (out / "audit").mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "audit" / "audit.json", payload)
    text = render_in_stream_markdown(payload)
    if harness is not None:
        text += "\n" + render_markdown(harness).replace("# One-run privacy audit", "## The DP-SGD harness: one-run audit", 1)
    write_text_atomic(out / "audit" / "audit.md", text)
    return payload


def _heading(payload: dict[str, Any], setting: str) -> list[str]:
    """Title and verdict line of an audit report."""
    return [
        f"# One-run privacy audit of {payload['config']} ({payload['method']}){setting}",
        "",
        f"Verdict: **{payload['verdict']}**. Certified epsilon of the stream {payload['certified_epsilon']:.4g} at "
        f"delta {payload['delta']:g} ({payload['adjacency']}, unit {payload['unit']}); empirical lower bound "
        f"{payload['empirical_epsilon_lower']:.4g}, holding with probability {payload['confidence']:g}.",
        "",
    ]


def render_in_stream_markdown(payload: dict[str, Any]) -> str:
    """The readable report of an in-stream audit: per release, the black-box bound beside its certified epsilon."""
    lines = [
        *_heading(payload, ", canaries in the stream"),
        f"This run is {payload['release']}. What was trained: {payload['what_is_trained']}. Canaries: "
        f"{payload['canary_kind']}, each included with probability 1/2.",
        "",
        "| release | certified epsilon | lower bound, black box | canaries (included) | guesses / correct | examples trained |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for t in payload["tasks"]:
        b = t["black_box"]
        lines.append(f"| {t['task']} | {t['certified_epsilon']:.4g} | {b['epsilon_lower']:.4g} | {t['canaries']} "
                     f"({b['included']}) | {b['guesses']} / {b['correct']} | {t['examples']} |")
    lines += [
        "",
        "Black box: the auditor sees only each released model (the margin of a canary's label over the best other "
        "label). A lower bound says the implementation leaks at least that much; it does not say the certified epsilon "
        "is tight. The confidence is split over the releases and the numbers of guesses tried (Bonferroni).",
        "",
    ]
    return "\n".join(lines)


def render_markdown(payload: dict[str, Any]) -> str:
    """The readable report: per-task and stream bounds beside the certified epsilon, with the setting."""
    # lazy import: keeps CLI start-up fast (only this command renders an audit)
    from dpcl.audit.one_run import GAUSSIAN_VIEW_ASSUMPTION
    lines = [
        *_heading(payload, ""),
        "The canary run is not a release: it writes no checkpoint and no certificate.",
        f"What was trained: {payload['what_is_trained']}.",
        "",
        "| task | certified epsilon | lower bound, white box | lower bound, black box | canaries (included) | "
        "guesses / correct (white) | analysis | noise multiplier | q | steps |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for t in payload["tasks"]:
        w, b = t["white_box"], t["black_box"]
        lines.append(
            f"| {t['task']} | {t['certified_epsilon']:.4g} | {w['epsilon_lower']:.4g} | {b['epsilon_lower']:.4g} | "
            f"{t['canaries']} ({w['included']}) | {w['guesses']} / {w['correct']} | {w['analysis']} | "
            f"{t['noise_multiplier']:.4g} | {t['sample_rate']:.4g} | {t['steps']} |"
        )
    lines += [
        "",
        "A lower bound says the implementation leaks at least that much; it does not say the certified epsilon is "
        "tight. The confidence is split over the tasks, the white- and black-box settings, the scores and the numbers "
        "of guesses tried (Bonferroni). White box: every noisy update is seen (the threat model DP-SGD's accounting "
        "assumes); black box: only the final model.",
        "",
    ]
    if any(t[side]["analysis"] == "gaussian_view" for t in payload["tasks"] for side in ("white_box", "black_box")):
        lines += [
            f"Where the analysis is gaussian_view, the bound assumes that {GAUSSIAN_VIEW_ASSUMPTION}; the analyses "
            "steinke and gaussian_fdp assume nothing about the scores.",
            "",
        ]
    return "\n".join(lines)

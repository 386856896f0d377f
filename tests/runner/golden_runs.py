"""Golden summaries of ``dpcl run`` on the bundled configs: what a run writes and what its certificates state.

``python tests/runner/golden_runs.py --mode reduced|full [--only NAME ...] --out FILE.json`` runs every
bundled config of ``dpcl/configs`` through :func:`dpcl.runner.run_training` and writes one summary per
config: the files the run wrote (relative paths; contents are volatile), and for every certificate its
headline (private, epsilon, delta, unit, adjacency, accountant, across tasks), its scoped guarantees, the
outcome of every ``dpcl verify`` check, the meaning of its events (per charge: the tasks and, per event,
its type, count and noise) and the noise multipliers of its plan. The summaries of the runner before it
was rebuilt on :class:`dpcl.Certifier` are stored in ``tests/runner/data/golden_runs_{mode}.json``, and
``test_golden_runs.py`` compares the current runner with them.

``reduced`` shrinks the expensive configs (two tasks, fewer epochs and pre-training steps, see
:func:`reduced_config`) so that the CI test stays short; ``full`` runs every config as shipped
(``@pytest.mark.thorough``). ``pecl_paper.toml`` is refused by a private run (its checkpoint is not
covered), so it runs as the paper's research run, with ``[run] private = false``.

Nothing here compares accuracies: the privacy noise comes from OS entropy.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Any, Iterable, Mapping

REPO = Path(__file__).resolve().parents[2]
CONFIG_DIR = REPO / "dpcl" / "configs"
DATA_DIR = Path(__file__).resolve().parent / "data"

#: Configs that ``dpcl run`` refuses as shipped and the ``[run]`` section that makes them runnable.
RUN_SECTIONS = {"pecl_paper": {"private": False}}

#: Configs of the CI (reduced) golden test; the thorough test runs every bundled config in full.
REDUCED_CONFIGS = ("cosine", "naive", "non_cl", "peft_ensemble", "l2dpml_permuted_digits", "pecl_paper")

#: Keys whose values are noise scales (noise multipliers, standard deviations, Laplace scales).
NOISE_KEYS = ("noise_multiplier", "sigma", "scale", "noise_scale", "std")


def bundled_configs() -> list[str]:
    return sorted(p.stem for p in CONFIG_DIR.glob("*.toml"))


def missing_data(name: str) -> str | None:
    """Why the bundled config ``name`` cannot run here, or None: a path-based dataset (``idx:/usr/share/...``,
    the Debian package dataset-fashion-mnist of the ``fmnist_*`` configs) whose folder this machine lacks."""
    from dpcl.data.registry import missing_dataset_folder

    dataset = tomllib.loads((CONFIG_DIR / f"{name}.toml").read_text(encoding="utf-8"))["stream"]["dataset"]
    missing = missing_dataset_folder(dataset)
    return f"{name}: {missing}" if missing else None


# -- config rewriting --------------------------------------------------------------------------------------------
def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {value!r} as TOML")


def dump_toml(config: Mapping[str, Mapping[str, Any]]) -> str:
    """The flat ``[section] key = value`` TOML of the bundled configs (inline tables for dict values)."""
    lines = []
    for section, values in config.items():
        lines.append(f"[{section}]")
        lines += [f"{key} = {_toml_value(value)}" for key, value in values.items()]
        lines.append("")
    return "\n".join(lines)


def reduced_config(config: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Two tasks, one epoch (L2DP-ML: 20), a small PeCL model with short pre-training: the same mechanisms."""
    stream, method = dict(config["stream"]), dict(config["method"])
    if "tasks" in stream:
        stream["tasks"] = stream["tasks"][:2]
    if "n_tasks" in stream:
        stream["n_tasks"] = 2
    if stream.get("label_space") == "prior":
        stream["prior_labels"] = stream["prior_labels"][:2]
    if "epochs" in method:
        method["epochs"] = 20 if method["name"] == "l2dpml" else 1
    if method["name"] == "pecl":
        method.update(pretrain_steps=10, n_layer=1, max_seq_len=32)
        stream["dataset_options"] = {**stream.get("dataset_options", {}), "max_per_class": 20}
    return {**config, "stream": stream, "method": method}


def write_run_config(name: str, mode: str, directory: Path) -> Path:
    config = tomllib.loads((CONFIG_DIR / f"{name}.toml").read_text(encoding="utf-8"))
    if name in RUN_SECTIONS:
        config["run"] = {**config.get("run", {}), **RUN_SECTIONS[name]}
    if mode == "reduced":
        config = reduced_config(config)
    path = directory / f"{name}.toml"
    path.write_text(dump_toml(config), encoding="utf-8")
    return path


# -- summaries ----------------------------------------------------------------------------------------------------
def _noise_values(value: Any) -> list[float]:
    """Every noise scale in a JSON value (depth first, in order)."""
    found: list[float] = []
    if isinstance(value, Mapping):
        for key, item in value.items():
            if key in NOISE_KEYS and isinstance(item, (int, float)) and not isinstance(item, bool):
                found.append(float(item))
            else:
                found += _noise_values(item)
    elif isinstance(value, list):
        for item in value:
            found += _noise_values(item)
    return found


def _event_meaning(event: Mapping[str, Any]) -> dict[str, Any]:
    """An event as (type, count, noise scales), whatever its JSON layout (repeated events unrolled to a count)."""
    count = 1
    inner: Any = event
    while isinstance(inner, Mapping) and ("event" in inner) and isinstance(inner.get("event"), Mapping):
        count *= int(inner.get("count", 1))
        inner = inner["event"]
    return {"type": str(inner.get("type", inner.get("kind", "?"))), "count": count, "noise": _noise_values(inner)}


def merge_repeated(events: list[Any]) -> list[Any]:
    """Consecutive equal events (same type and noise) as one event with the summed count: k single events and one
    event repeated k times are the same composition, whichever layout the ledger and certificate format chose."""
    merged: list[Any] = []
    for event in events:
        if (merged and isinstance(event, Mapping) and isinstance(merged[-1], Mapping)
                and {k: v for k, v in event.items() if k != "count"} == {k: v for k, v in merged[-1].items() if k != "count"}):
            merged[-1] = {**merged[-1], "count": int(merged[-1].get("count", 1)) + int(event.get("count", 1))}
        else:
            merged.append(dict(event) if isinstance(event, Mapping) else event)
    return merged


def _headline(g: Mapping[str, Any]) -> dict[str, Any]:
    return {key: g.get(key) for key in ("private", "epsilon", "delta", "unit", "adjacency", "accountant",
                                        "across_tasks")}


def _charges_meaning(charges: Any) -> list[dict[str, Any]]:
    return [
        {"tasks": list(c.get("tasks", [])), "events": merge_repeated([_event_meaning(e) for e in c.get("events", [])])}
        for c in charges or []
    ]


def summarize_certificate(path: Path) -> dict[str, Any]:
    from dpcl.guarantees.certificates import read_certificate, verify_certificate

    data = read_certificate(path)
    report = verify_certificate(path)
    return {
        "release_task": data["release"]["task_index"],
        "headline": _headline(data["guarantee"]),
        "scoped": sorted(
            ({"name": s["name"], **_headline(s), "charges": _charges_meaning(s.get("events"))}
             for s in data.get("scoped_guarantees", [])),
            key=lambda s: s["name"],
        ),
        "checks": {c.name: c.passed for c in report.checks},
        "valid": report.valid,
        "charges": _charges_meaning(data.get("events")),
        "plan_noise": _noise_values(data.get("extra", {}).get("noise", {})),
    }


def summarize_run(out: Path, result: Any) -> dict[str, Any]:
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    certificates = sorted(p for p in (out / "certificates").glob("*.cert.json"))
    return {
        "files": [f for f in files if f != "run.lock"],
        "private": bool(result.private),
        "complete": bool(result.complete),
        "audit_sound": bool(result.audit.get("sound")),
        "audit_violations": list(result.audit.get("violations", [])),
        "cumulative_epsilon": [r.cumulative_epsilon for r in result.releases],
        "certificates": {p.name: summarize_certificate(p) for p in certificates},
    }


def run_config(name: str, mode: str, work: Path) -> dict[str, Any]:
    from dpcl.runner import run_training

    config = write_run_config(name, mode, work)
    out = work / f"run_{name}"
    result = run_training(config, out, seed=0, quiet=True)
    return summarize_run(out, result)


def record(mode: str, names: Iterable[str]) -> dict[str, Any]:
    summaries = {}
    with tempfile.TemporaryDirectory(prefix="dpcl_golden_") as tmp:
        for name in names:
            summaries[name] = run_config(name, mode, Path(tmp))
            print(f"{name}: done", file=sys.stderr, flush=True)
    return summaries


# -- comparison ---------------------------------------------------------------------------------------------------
def compare(expected: Any, actual: Any, where: str = "", *, eps_rtol: float = 1e-6, noise_rtol: float = 1e-3,
            noise: bool = False) -> list[str]:
    """Differences between two summaries: epsilons to ``eps_rtol``, noise scales to ``noise_rtol`` (relative)."""
    if isinstance(expected, Mapping) and isinstance(actual, Mapping):
        problems = []
        if set(expected) != set(actual):
            problems.append(f"{where}: keys {sorted(expected)} != {sorted(actual)}")
        for key in set(expected) & set(actual):
            inside = noise or key in ("noise", "plan_noise")
            mine, theirs = expected[key], actual[key]
            if key == "events" and isinstance(mine, list) and isinstance(theirs, list):
                mine, theirs = merge_repeated(mine), merge_repeated(theirs)
            problems += compare(mine, theirs, f"{where}/{key}", eps_rtol=eps_rtol,
                                noise_rtol=noise_rtol, noise=inside)
        return problems
    if isinstance(expected, list) and isinstance(actual, list):
        if len(expected) != len(actual):
            return [f"{where}: {len(expected)} items expected, got {len(actual)}: {expected!r} vs {actual!r}"]
        problems = []
        for i, (a, b) in enumerate(zip(expected, actual)):
            problems += compare(a, b, f"{where}[{i}]", eps_rtol=eps_rtol, noise_rtol=noise_rtol, noise=noise)
        return problems
    if isinstance(expected, float) and isinstance(actual, (int, float)) and not isinstance(actual, bool):
        rtol = noise_rtol if noise else eps_rtol
        if math.isclose(expected, actual, rel_tol=rtol, abs_tol=0.0) or expected == actual:
            return []
        return [f"{where}: {expected!r} expected, got {actual!r} (relative tolerance {rtol:g})"]
    return [] if expected == actual else [f"{where}: {expected!r} expected, got {actual!r}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("reduced", "full"), required=True)
    parser.add_argument("--only", nargs="*", default=None, help="config names (default: the mode's set)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    names = args.only or (list(REDUCED_CONFIGS) if args.mode == "reduced" else bundled_configs())
    summaries = record(args.mode, names)
    args.out.write_text(json.dumps(summaries, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Stages ``load``, ``stream`` and ``audit`` of a run: the command line and config checked, the stream built and
filtered by the public label sets, and the config audited before anything is written or trained."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from dpcl.certifier import existing_run_files
from dpcl.data import STREAM_KEYS
from dpcl.errors import ConfigError, ExistingRunError, InvalidParameterError, PrivacyViolationError
from dpcl.audit_config import audit_config
from dpcl.guarantees.config import load_config
from dpcl.guarantees.method_schema import TORCH_DEVICE_FORMS, torch_device
from dpcl.guarantees.signing import load_private_key
from dpcl.methods.base import method_class  # without torch it raises MissingDependencyError naming the extra
from dpcl.runner.ranks import refuse_on_other_ranks
from dpcl.runner.tasks import build_run_stream, label_sets, prepare_tasks, run_options
from dpcl.runner.threads import prefer_sleeping_threads, use_usable_cores
from dpcl.runner.run_types import LoadedRun, PreparedStream


# -- checks of the command line --------------------------------------------------------------------------------
def resolve_device(requested: str | None, method_section: Mapping[str, Any]) -> str:
    """``--device`` if given, else ``[method] device`` (default cpu): ``cpu``, ``cuda`` or ``cuda:N``.

    The string form is checked like the config key (:func:`dpcl.guarantees.method_schema.torch_device`); a CUDA
    device must exist: CUDA available and ``N < torch.cuda.device_count()``.
    """
    device = requested or str(method_section.get("device", "cpu") or "cpu")
    source = "--device" if requested else "[method] device"
    if torch_device(device) is not None:
        raise InvalidParameterError(f"{source} must be {TORCH_DEVICE_FORMS}, got {device!r}.")
    if device.startswith("cuda"):
        import torch

        fix = "--device cpu" if requested else "device = \"cpu\" in [method] (or --device cpu)"
        if not torch.cuda.is_available():
            raise InvalidParameterError(
                f"{source} {device} was asked for but torch.cuda.is_available() is False (no GPU, or a CPU-only torch "
                f"build: torch {torch.__version__}). Use {fix}, or install a CUDA build of torch."
            )
        count = torch.cuda.device_count()
        if ":" in device and int(device.split(":", 1)[1]) >= count:
            raise InvalidParameterError(
                f"{source} {device} names a CUDA device that does not exist: this machine has {count} "
                f"(cuda:0 to cuda:{count - 1}). Use one of those, or {fix}."
            )
    return device


def check_run_directory(out_dir: "str | Path") -> Path:
    """``--out`` as a path that is, or can become, a run directory; checked before any work, created later.

    A file in its place, or a nearest existing ancestor that is not a writable directory, raises
    :class:`~dpcl.errors.InvalidParameterError` naming ``--out``.
    """
    out = Path(out_dir)
    if out.exists():
        if not out.is_dir():
            raise InvalidParameterError(f"--out {str(out)!r} is a file, not a directory; give a run directory.")
        if not os.access(out, os.W_OK | os.X_OK):
            raise InvalidParameterError(f"--out {str(out)!r} is not writable; give a directory you can write to.")
        return out
    ancestor = out.absolute().parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise InvalidParameterError(
            f"--out {str(out)!r} cannot be created: {str(ancestor)!r} is a file, not a directory."
        )
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise InvalidParameterError(
            f"--out {str(out)!r} cannot be created: {str(ancestor)!r} is not writable."
        )
    return out


def _make_run_directory(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidParameterError(f"--out {str(out)!r} cannot be created: {exc.strerror or exc}.") from None


def _check_arguments(seed: Any, reproducible_noise: Any, sign_key: Any) -> Any:
    """Refuse a bad ``--seed`` or ``--reproducible-noise``; the ``--sign`` key loaded (before any work)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InvalidParameterError(f"--seed must be an integer >= 0, got {seed!r}.")
    if not isinstance(reproducible_noise, bool):
        raise InvalidParameterError(f"--reproducible-noise is a switch (true/false), got {reproducible_noise!r}.")
    if sign_key is None:
        return None
    return load_private_key(sign_key, option="--sign")


def load_run(config_path: "str | Path", out_dir: "str | Path", *, seed: int = 0, device: str | None = None,
             quiet: bool = False, stop_after_task: int | None = None, reproducible_noise: bool = False,
             sign_key: Any = None, resume: bool = False) -> LoadedRun:
    """Stage ``load``: the arguments checked, the config loaded and validated, the device and method class found.

    Refused on a rank > 0 of a process group (only rank 0 writes a run directory), and, unless ``resume``, on
    an ``--out`` that already holds a run (:class:`~dpcl.errors.ExistingRunError`, before anything is written).
    """
    prefer_sleeping_threads()  # before torch is imported: idle OpenMP threads sleep (dpcl.runner.threads)
    key = _check_arguments(seed, reproducible_noise, sign_key)
    config_file = Path(config_path)
    config = load_config(config_file, data_stream_keys=STREAM_KEYS)
    out = check_run_directory(out_dir)
    if not isinstance(resume, bool):
        raise InvalidParameterError(f"--resume is a switch (true/false), got {resume!r}.")
    if not resume:
        _refuse_existing_run(out)
    options = run_options(config)
    resolved = resolve_device(device, config.method)
    refuse_on_other_ranks()  # only rank 0 writes the ledger, checkpoints and certificates
    return LoadedRun(
        config=config, config_file=config_file, out=out, seed=seed, private=bool(options["private"]),
        reproducible=bool(reproducible_noise or options["reproducible_noise"]), device=resolved,
        method_name=config.method["name"], method_class=method_class(config.method["name"]), sign_key=key,
        quiet=quiet, stop_after_task=stop_after_task, resume=resume,
    )


def _refuse_existing_run(out: Path) -> None:
    """``--out`` must not hold a run unless ``--resume`` asks to continue it (a rerun would charge it again)."""
    found = existing_run_files(out, run_state=True)
    if found:
        raise ExistingRunError(
            f"--out {str(out)!r} already holds a run: {'; '.join(found)}. Nothing was changed. Continue that run "
            "with `dpcl run CONFIG --out DIR --resume` (after a crash, or to finish it), or give a new --out."
        )


def prepare_stream(run: LoadedRun) -> PreparedStream:
    """Stage ``stream``: build the stream, filter every task by its public label set, check declared sizes
    (``[stream] task_sizes``) and declared disjointness."""
    if run.config.stream.get("encoder") is not None:  # the encoder runs now, on torch
        use_usable_cores()
    stream = build_run_stream(run.config, seed=run.seed, device=run.device, quiet=run.quiet)
    sets = label_sets(run.config, len(stream))
    tasks, reports = prepare_tasks(stream, sets, bool(getattr(run.method_class, "needs_texts", False)))
    prepared = PreparedStream(stream=stream, label_sets=sets, tasks=tasks, filter_reports=reports)
    declared = run.config.stream.get("task_sizes")
    if declared is not None and list(declared) != prepared.sizes:
        raise ConfigError(
            f"[stream] task_sizes = {list(declared)} but the stream has {prepared.sizes} examples per task after "
            "label filtering; remove task_sizes or correct it (the audit would plan other task sizes than the run "
            "trains)."
        )
    if run.config.settings.disjoint_units:
        stream.check_disjoint_units()
    return prepared


def audit_run(run: LoadedRun, prepared: PreparedStream) -> Any:
    """Stage ``audit``: ``dpcl audit`` on the filtered task sizes; a refused config raises
    :class:`~dpcl.errors.PrivacyViolationError` (exit 3) before anything is written or trained."""
    report = audit_config(run.config, prepared.sizes, filter_reports=prepared.filter_reports)
    if not report.sound:
        raise PrivacyViolationError(
            "dpcl audit refuses this config, so it is not trained: " + " | ".join(report.violations)
        )
    return report



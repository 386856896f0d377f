"""What a training config costs: parameters, peak memory, optimiser steps and examples, and whether it fits.

``dpcl audit`` reports this beside the privacy guarantee (the ``cost`` section,
also in ``--json``), and refuses (exit 2) a config whose estimated peak memory
exceeds what the chosen device has free; ``dpcl run`` makes the same check
before it builds the method, so a run that cannot fit is refused before
anything is allocated (:func:`check_fits`).

Parameters are counted without allocating: the torch models are built on the
``meta`` device (shapes only, no storage), the rest from the shapes the
methods allocate. The memory estimate adds up, per release, what training
holds at its peak:

* ``model``: every parameter of the method (all members of a PEFT ensemble after
  the last task), float32 (float64 for L2DP-ML and the cosine class sums);
* ``gradients`` and ``optimizer_state``: one gradient and Adam's two moments per
  trainable parameter;
* ``per_example_gradients`` (DP-SGD): opacus keeps one gradient per example of
  the Poisson batch, ``batch x trainable`` floats. The batch is the expected
  size ``q n`` plus four standard deviations of the binomial batch size (a
  larger batch occurs with probability below 4e-5 per step);
* ``activations``: the layer outputs of one batch that backpropagation keeps
  (the adapter models; for transformers, hidden states of every layer);
* ``data``: the release's training data as a torch tensor on the device;
* ``episodic_memory``: A-GEM's stored examples of earlier tasks (curator state, on the device);
* ``work_arrays``: method-specific temporaries (L2DP-ML's per-batch coefficient
  matrices, the cosine classifier's float64 copy of the features).

The estimate excludes what the process holds before training (the Python
interpreter, torch's own libraries, the loaded data set): the device's free
memory is measured after those (:func:`memory_headroom`). ``docs/audit.md``
states how the estimate compared with measured peaks.

This module is in the runner layer: it imports torch (lazily, only to count
parameters on the meta device). Without torch the audit says the cost is
unavailable and why (:func:`training_cost` returns a :class:`CostUnavailable`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from dpcl.errors import ConfigError
from dpcl.guarantees.label_space import output_label_sets

# what the device has free, and where the input dimension comes from; re-exported where they were always imported
from dpcl.runner.memory_headroom import MemoryHeadroom, human_bytes, memory_headroom
from dpcl.runner.model_size import stream_input_dim

__all__ = [
    "CostUnavailable",
    "MemoryHeadroom",
    "TrainingCost",
    "check_fits",
    "estimate_training_cost",
    "memory_headroom",
    "stream_input_dim",
    "training_cost",
]

FLOAT32, FLOAT64, INT64 = 4, 8, 8
#: Batch x trainable arrays opacus holds at once in a DP-SGD step: the grad samples the backward hooks compute,
#: the per-step accumulation buffer they are copied into, and the clipped product summed over the batch.
OPACUS_COPIES = 3
#: Standard deviations of the Poisson batch size above its mean that the per-example gradients are sized for.
BATCH_SIGMAS = 4.0


@dataclass(frozen=True)
class TrainingCost:
    """The estimated cost of training a config (see the module docstring for what each memory part holds)."""

    method: str
    device: str
    input_dim: int
    trainable_parameters: int
    total_parameters: int
    memory_bytes: Mapping[str, int]
    optimizer_steps: int
    examples_processed: int
    #: the ``[method]`` (or ``[stream]``) key that drives the largest memory part: what to change to fit
    largest_key: str
    notes: tuple[str, ...] = ()

    @property
    def peak_memory_bytes(self) -> int:
        return int(sum(self.memory_bytes.values()))

    def to_dict(self) -> dict[str, Any]:
        return {
            "available": True,
            "method": self.method,
            "device": self.device,
            "input_dim": self.input_dim,
            "trainable_parameters": self.trainable_parameters,
            "total_parameters": self.total_parameters,
            "peak_memory_bytes": self.peak_memory_bytes,
            "memory_bytes": dict(self.memory_bytes),
            "optimizer_steps": self.optimizer_steps,
            "examples_processed": self.examples_processed,
            "largest_key": self.largest_key,
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class CostUnavailable:
    """Why no estimate could be made (torch missing, a stream without data...): the audit reports it, never fails."""

    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"available": False, "reason": self.reason}


# -- the estimate ---------------------------------------------------------------------------------------------------
def _n_outputs(config: Any, n_tasks: int) -> int:
    """How many labels the trained head has: the task labels (label space from the data), else the public sets."""
    settings = config.settings
    if settings.label_space == "data":
        groups = config.stream.get("tasks") or []
        return max(1, len({int(o) for g in groups for o in g}))
    sets = output_label_sets(settings.label_space, settings.prior_labels, n_tasks)
    return max(1, len({int(o) for s in sets for o in s}))


def estimate_training_cost(config: Any, sizes: Sequence[int], input_dim: int, device: str = "cpu") -> TrainingCost:
    """The cost of training ``config`` on tasks of ``sizes`` examples with ``input_dim`` features (torch needed)."""
    path = cost_estimator_path(config)
    if not path:
        raise ConfigError(f"method {name_of(config)!r} has no training-cost estimate (its spec names no "
                          "cost_estimator)")
    module, _, function = path.partition(":")
    estimator = getattr(importlib.import_module(module), function)
    sizes = [int(n) for n in sizes]
    return estimator(config, sizes, int(input_dim), _n_outputs(config, len(sizes)), device)


def name_of(config: Any) -> str:
    return str(config.method["name"])


def cost_estimator_path(config: Any) -> str:
    """The ``"module:function"`` estimating the cost of ``config``'s method (its spec's ``cost_estimator``), or
    ``""`` when the spec names none (:class:`dpcl.guarantees.method_schema.MethodSpec`)."""
    return str(getattr(config.spec, "cost_estimator", "") or "")


def training_cost(config: Any, sizes: Sequence[int], *, input_dim: int | None = None,
                  device: str | None = None) -> "TrainingCost | CostUnavailable":
    """:func:`estimate_training_cost`, or :class:`CostUnavailable` saying why none can be made (never raises for
    a missing torch, a plugin method or a stream whose feature dimension is unknown)."""
    device = device or str(config.method.get("device") or "cpu")
    if not cost_estimator_path(config):  # checked first: the audit of a method without one never imports torch
        return CostUnavailable(f"method {name_of(config)!r} has no training-cost estimate (its spec names no "
                               "cost_estimator)")
    if input_dim is None:
        input_dim, why = stream_input_dim(config)
        if input_dim is None:
            return CostUnavailable(why)
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        return CostUnavailable(f"torch is not installed ({exc}); install the training extra to see the cost")
    try:
        return estimate_training_cost(config, sizes, input_dim, device)
    except ConfigError as exc:
        return CostUnavailable(str(exc))
    except (ImportError, OSError, ValueError) as exc:
        return CostUnavailable(f"the {config.method['name']} model could not be built on the meta device: {exc}")


class MemoryLimitError(ConfigError):
    """A config whose estimated training memory exceeds what the device has free (exit 2, naming the key)."""


def check_fits(cost: "TrainingCost | CostUnavailable", headroom: MemoryHeadroom) -> None:
    """Refuse (:class:`MemoryLimitError`, exit 2) a cost whose peak memory exceeds the headroom."""
    if not isinstance(cost, TrainingCost) or cost.peak_memory_bytes <= headroom.bytes:
        return
    parts = ", ".join(f"{k} {human_bytes(v)}" for k, v in sorted(cost.memory_bytes.items(), key=lambda kv: -kv[1])
                      if v)
    raise MemoryLimitError(
        f"training this config needs about {human_bytes(cost.peak_memory_bytes)} on {headroom.device} ({parts}; "
        f"{cost.trainable_parameters:,} trainable of {cost.total_parameters:,} parameters) but only "
        f"{human_bytes(headroom.bytes)} is free ({headroom.binding}); "
        f"{cost.largest_key if cost.largest_key.startswith('raise ') else 'lower ' + cost.largest_key} "
        "(or use a device with more memory)."
    )


def audit_cost(config: Any, sizes: Sequence[int], *, input_dim: int | None = None,
               device: str | None = None) -> dict[str, Any]:
    """The ``cost`` section of ``dpcl audit`` (and of ``dpcl run``'s check): the estimate, the device's free memory,
    and whether it fits. Raises :class:`MemoryLimitError` (exit 2) when it does not fit."""
    device = device or str(config.method.get("device") or "cpu")
    cost = training_cost(config, sizes, input_dim=input_dim, device=device)
    out = cost.to_dict()
    if not isinstance(cost, TrainingCost):
        return out
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            out["fits"] = None
            out["headroom"] = f"not checked: {device} is not available on this machine"
            return out
    headroom = memory_headroom(device)
    out["headroom"] = headroom.to_dict()
    check_fits(cost, headroom)
    out["fits"] = True
    return out


def cost_rows(section: Mapping[str, Any]) -> dict[str, str]:
    """The cost section as rows of ``dpcl audit``'s table."""
    if not section.get("available"):
        return {"cost": f"unavailable: {section.get('reason', 'unknown')}"}
    parts = ", ".join(f"{k} {human_bytes(v)}" for k, v in sorted(section["memory_bytes"].items(),
                                                                    key=lambda kv: -kv[1]) if v)
    headroom = section.get("headroom")
    free = (f"{human_bytes(headroom['free_bytes'])} free on {headroom['device']} ({headroom['binding']})"
            if isinstance(headroom, Mapping) else str(headroom))
    return {
        "cost parameters": f"{section['trainable_parameters']:,} trainable of {section['total_parameters']:,} "
                           f"(input dimension {section['input_dim']})",
        "cost peak memory": f"about {human_bytes(section['peak_memory_bytes'])} on {section['device']} ({parts}); "
                            f"{free}",
        "cost training": f"{section['optimizer_steps']:,} optimiser steps, {section['examples_processed']:,} "
                         "examples processed (expected)",
    }


def check_run_cost(config: Any, sizes: Sequence[int], input_dim: int, device: str) -> dict[str, Any]:
    """``dpcl run``'s check before the method is built: the cost on the loaded stream's real input dimension and
    the run's device; :class:`MemoryLimitError` (exit 2) when it cannot fit, before anything is allocated."""
    return audit_cost(config, sizes, input_dim=input_dim, device=device)

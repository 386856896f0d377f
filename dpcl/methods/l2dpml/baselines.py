"""The A-GEM baselines of L2DP-ML's experiments (Lai et al., Sec. 6): non-private A-GEM (Chaudhry et al. 2019) on
an MLP with the same hidden sizes, and DP-SGD A-GEM ("NaiveGaussian") on the one DP-SGD step engine
(:mod:`dpcl.methods.dpsgd_engine`, the A-GEM projection a hook on the released gradients)."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch
from torch import nn

from dpcl.errors import InvalidParameterError
from dpcl.methods.base import ContinualMethod, MethodSetup, ProgressCallback, TrainingData, TrainingTask
from dpcl.methods.dpsgd_engine import DpSgdEngine, ProjectGradient, backward_quietly, flat_grad
from dpcl.methods.gem import agem_project

__all__ = ["AGEMClassifier", "DPSGDAGEMClassifier"]

_DTYPE = torch.float64


# ---------------------------------------------------------------------------
# baselines: A-GEM and DP-SGD A-GEM ("NaiveGaussian")
# ---------------------------------------------------------------------------
class _MLP(nn.Module):
    def __init__(self, d: int, hidden: list[int], k: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for fan_in, fan_out in zip([d] + hidden[:-1], hidden):
            layers += [nn.Linear(fan_in, fan_out), nn.Tanh()]
        layers.append(nn.Linear(hidden[-1] if hidden else d, k))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class AGEMClassifier(ContinualMethod):
    """Non-private A-GEM (Chaudhry et al. 2019) on an MLP with the same hidden sizes; the paper's upper baseline.

    ``setup.method`` keys: ``hidden_sizes``, ``batch_size``, ``epochs``,
    ``learning_rate``, ``memory_per_task`` (raw examples kept per task).
    """

    name = "agem"

    def __init__(self, setup: MethodSetup) -> None:
        super().__init__(setup)
        m = dict(setup.method)
        self.device = torch.device(setup.device)
        torch.manual_seed(int(setup.seed))  # initialised on the CPU, then moved: the same weights on every device
        self.model = _MLP(int(setup.input_dim), [int(v) for v in m.get("hidden_sizes", [16, 16])],
                          len(self.label_space)).double().to(self.device)
        self.batch_size = int(m.get("batch_size", 64))
        self.epochs = int(m.get("epochs", 5))
        self.learning_rate = float(m.get("learning_rate", 0.1))
        self.memory_per_task = int(m.get("memory_per_task", 64))
        self.memory_batch_size = int(m.get("memory_batch_size", self.batch_size))
        self.mem_x = torch.zeros(0, int(setup.input_dim), dtype=_DTYPE, device=self.device)
        self.mem_y = torch.zeros(0, dtype=torch.long, device=self.device)

    def scores(self, features: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return self.model(torch.as_tensor(np.asarray(features, dtype=np.float64), device=self.device)).cpu().numpy()

    def _tensors(self, data: TrainingData) -> tuple[torch.Tensor, torch.Tensor]:
        """A task's features (float64) and label positions on this method's device."""
        x = torch.as_tensor(np.asarray(data.features, dtype=np.float64), device=self.device)
        y = torch.as_tensor(self.label_positions(data.labels), dtype=torch.long, device=self.device)
        return x, y

    def _keep_in_memory(self, x: torch.Tensor, y: torch.Tensor, rng: np.random.Generator) -> None:
        n = len(y)
        keep = rng.choice(n, size=min(self.memory_per_task, n), replace=False) if n else np.zeros(0, np.int64)
        keep_t = torch.as_tensor(keep, dtype=torch.long, device=self.device)
        self.mem_x = torch.cat([self.mem_x, x[keep_t]])
        self.mem_y = torch.cat([self.mem_y, y[keep_t]])

    def _flat_grad(self) -> torch.Tensor:
        return torch.cat([p.grad.reshape(-1) for p in self.model.parameters()])

    def _set_grad(self, flat: torch.Tensor) -> None:
        offset = 0
        for p in self.model.parameters():
            p.grad = flat[offset:offset + p.numel()].view_as(p).clone()
            offset += p.numel()

    def _gradient(self, x: torch.Tensor, y: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
        self.model.zero_grad()
        nn.functional.cross_entropy(self.model(x), y).backward()
        return self._flat_grad()

    def _batches(self, n: int, rng: np.random.Generator) -> list[np.ndarray]:
        return [idx for _ in range(self.epochs) for idx in np.array_split(rng.permutation(n), max(1, n // self.batch_size))]

    def _require_memory(self) -> None:
        if self.mem_x is None:
            raise InvalidParameterError(
                f"this {self.name} model was restored from its release only: continuing the stream needs its "
                "episodic memory; call load_curator_state_dict with the state curator_state_dict returned."
            )

    def learn_task(self, task: TrainingTask, progress: ProgressCallback | None = None) -> None:
        self._require_memory()
        rng = np.random.default_rng([int(self.setup.seed), task.index])
        x, y = self._tensors(task.data)
        opt = torch.optim.SGD(self.model.parameters(), lr=self.learning_rate)
        for idx in self._batches(len(task.data), rng) if len(task.data) else []:
            idx = torch.as_tensor(idx, dtype=torch.long, device=self.device)
            g = self._gradient(x[idx], y[idx], rng)
            if len(self.mem_y):
                m = rng.choice(len(self.mem_y), size=min(self.memory_batch_size, len(self.mem_y)), replace=False)
                m = torch.as_tensor(m, dtype=torch.long, device=self.device)
                g = agem_project(g, self._gradient(self.mem_x[m], self.mem_y[m], rng))
            self._set_grad(g)
            opt.step()
        if progress:
            progress(1)
        self._keep_in_memory(x, y, rng)

    def state_dict(self) -> dict[str, Any]:
        """The release (CPU tensors): the model only (the replay memory holds raw training examples: curator state)."""
        return {**self._base_state(), "model": {k: v.detach().cpu() for k, v in self.model.state_dict().items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the model; continuing the stream also needs :meth:`load_curator_state_dict` (the memory)."""
        self._load_base_state(state)
        self.model.load_state_dict(state["model"])
        self.mem_x, self.mem_y = None, None  # until load_curator_state_dict

    def curator_state_dict(self) -> dict[str, Any]:
        """The episodic memory: raw training examples and their labels (no DP guarantee covers them)."""
        if self.mem_x is None:
            raise InvalidParameterError(
                f"this {self.name} model has no memory: load_curator_state_dict was not called."
            )
        return {"mem_x": self.mem_x.cpu().clone(), "mem_y": self.mem_y.cpu().clone()}

    def load_curator_state_dict(self, state: Mapping[str, Any]) -> None:
        self.mem_x = state["mem_x"].to(self.device, copy=True)
        self.mem_y = state["mem_y"].to(self.device, copy=True)


class DPSGDAGEMClassifier(AGEMClassifier):
    """DP-SGD A-GEM ("NaiveGaussian", Lai et al. Sec. 3/6): opacus clips and noises both gradients.

    Every step Poisson-samples the task (rate ``batch_size / n``) and the memory
    (rate ``memory_batch_size / |M|``); opacus computes per-example gradients,
    clips them to ``clip_norm`` and adds ``N(0, (noise_multiplier clip_norm)^2)``
    to each sum; the A-GEM projection is post-processing. ``plan.noise`` gives
    ``noise_multiplier``; :meth:`schedule` gives the rates and step counts the
    accounting (:func:`dpcl.guarantees.lifelong.dpsgd_agem_epsilons`) needs.
    """

    name = "dpsgd_agem"

    def __init__(self, setup: MethodSetup) -> None:
        super().__init__(setup)
        from opacus import GradSampleModule

        self.clip_norm = float(setup.method.get("clip_norm", 1.0))
        self.model = GradSampleModule(self.model, loss_reduction="sum")

    def steps(self, n: int) -> int:
        """DP-SGD steps of a task with ``n`` examples: ``epochs * max(1, n // batch_size)``."""
        return self.epochs * max(1, n // self.batch_size)

    def schedule(self, task_sizes: list[int]) -> dict[str, list[float]]:
        """Sample rates and steps of every task and of its memory reads (for the accounting)."""
        memory = np.cumsum([0] + [min(self.memory_per_task, n) for n in task_sizes[:-1]])
        return {
            "task_sample_rates": [min(1.0, self.batch_size / n) for n in task_sizes],
            "task_steps": [self.steps(n) for n in task_sizes],
            "memory_sample_rates": [min(1.0, self.memory_batch_size / m) if m else 1.0 for m in memory],
        }

    def _backward(self, x: torch.Tensor, y: torch.Tensor):
        """The summed cross-entropy's backward pass on a sample (per-example gradients for opacus)."""
        return lambda idx: backward_quietly(nn.functional.cross_entropy(self.model(x[idx]), y[idx], reduction="sum"))

    def learn_task(self, task: TrainingTask, progress: ProgressCallback | None = None) -> None:
        from opacus.optimizers import DPOptimizer

        self._require_memory()
        rng = np.random.default_rng([int(self.setup.seed), task.index])
        # Poisson masks + DP-SGD noise, on the model's device (opacus draws the noise where the gradients are)
        gen = self.noise_generator(task.index, device=self.device)
        x, y = self._tensors(task.data)
        n = len(task.data)
        sgd = torch.optim.SGD(self.model.parameters(), lr=self.learning_rate)
        opt = DPOptimizer(sgd, noise_multiplier=float(task.plan.noise["noise_multiplier"]), max_grad_norm=self.clip_norm,
                          expected_batch_size=self.batch_size, loss_reduction="sum", generator=gen)
        q = min(1.0, self.batch_size / n) if n else 0.0
        m = len(self.mem_y)
        q_mem = min(1.0, self.memory_batch_size / m) if m else 0.0
        steps = self.steps(n) if n else 0
        task_masks = torch.rand(steps, n, generator=gen, device=self.device) < q
        mem_masks = torch.rand(steps, m, generator=gen, device=self.device) < q_mem
        memory_backward = self._backward(self.mem_x, self.mem_y)

        def project(gradient: torch.Tensor, step: int, engine: DpSgdEngine) -> torch.Tensor:
            """g = noisy task sum / (q n), projected against the memory's noisy sum / (q_mem m)."""
            g = gradient / (q * n)
            if not m:
                return g
            batch = torch.nonzero(mem_masks[step], as_tuple=False).squeeze(1)
            engine.release(batch, memory_backward, int(batch.numel()))
            return agem_project(g, flat_grad(engine.params) / (q_mem * m))

        def sample(step: int) -> tuple[torch.Tensor, int]:
            batch = torch.nonzero(task_masks[step], as_tuple=False).squeeze(1)
            return batch, int(batch.numel())

        task_backward = self._backward(x, y)
        engine = DpSgdEngine(list(self.model.parameters()), opt, True, sample, lambda step, idx: task_backward(idx),
                             [ProjectGradient(project)], set_to_none=False)
        engine.run(steps)
        if progress:
            progress(steps)
        self._keep_in_memory(x, y, rng)

"""Noise generators of a Certifier: seeded from OS entropy (or a caller's reproducible seed), recorded per task
in the ledger, and stated in the certificates.

Noise (who owns it). The DP noise must be unpredictable to anyone who sees the release, yet almost every
loop calls ``torch.manual_seed`` for its initialisation, and a generator it seeds also fixes the noise drawn
from it. :meth:`Certifier.noise_generator` (torch) and :meth:`Certifier.numpy_noise_generator` give a task a
generator seeded from OS entropy (:mod:`secrets`), independent of every seed in the process, and record it in
the ledger; the opacus integration installs them in the DP optimizer and its Poisson sampler. Certificates then
state the noise source because dpcl set it. ``reproducible_seed`` is the explicit exception (research runs): the
source is recorded as a seed known to the caller, and the certificate says that the guarantee holds only
against someone who does not know it.
"""

from __future__ import annotations

import secrets
from typing import Any, Iterable

import numpy as np

from dpcl.errors import InvalidParameterError
from dpcl.certification.arguments import _task_index, check_reproducible_seed
from dpcl.certification.assumptions import NOISE_OS_ENTROPY, NOISE_REPRODUCIBLE


class NoiseSources:
    """The noise generators of :class:`~dpcl.certifier.Certifier` (a mixin)."""

    def _noise_seed(self, t: int, reproducible_seed: Any) -> int:
        """A fresh 64-bit seed from OS entropy (or ``reproducible_seed``), recorded as task ``t``'s noise source."""
        check_reproducible_seed(reproducible_seed)
        if reproducible_seed is None:
            seed, source = secrets.randbits(64), NOISE_OS_ENTROPY
        else:
            seed, source = int(reproducible_seed), NOISE_REPRODUCIBLE
        sources = self._state().setdefault("noise_sources", {})
        if sources.get(str(t)) not in (None, source):  # one task, two sources: the weaker one is stated
            source = NOISE_REPRODUCIBLE
        sources[str(t)] = source
        if self.private:
            self.ledger.save()
        return seed

    def noise_generator(self, task: int, *, device: Any = "cpu", reproducible_seed: int | None = None) -> Any:
        """A ``torch.Generator`` on ``device`` for the DP noise (and sampling) of ``task``, seeded from OS entropy.

        Independent of ``torch.manual_seed``: draw the noise with it (``torch.normal(..., generator=g)``; opacus:
        :func:`dpcl.integrations.opacus.attach` installs one) and the certificates of ``task`` and later
        releases state that dpcl seeded its noise from OS entropy. ``reproducible_seed`` (research only) seeds it
        with that seed instead, and the certificates say that the guarantee holds only against someone who does
        not know the seed. Imports torch.
        """
        t = _task_index(task, self.n_tasks)
        import torch

        try:
            generator = torch.Generator(device=device)
        except (RuntimeError, TypeError) as exc:
            raise InvalidParameterError(f"device {device!r} cannot hold a torch.Generator ({exc}).") from None
        generator.manual_seed(self._noise_seed(t, reproducible_seed))
        return generator

    def numpy_noise_generator(self, task: int, *, reproducible_seed: int | None = None) -> np.random.Generator:
        """A numpy ``Generator`` for the DP noise of ``task``, seeded from OS entropy (see :meth:`noise_generator`)."""
        t = _task_index(task, self.n_tasks)
        return np.random.default_rng(self._noise_seed(t, reproducible_seed))

    def noise_sources(self) -> dict[int, str]:
        """The noise source dpcl recorded for each task (``"os_entropy"`` or ``"reproducible_seed"``)."""
        return {int(t): str(v) for t, v in self._state().get("noise_sources", {}).items()}

    def _noise_assumptions(self, charged_tasks: Iterable[int]) -> list[str]:
        """What the certificate states of the noise of ``charged_tasks``: from dpcl's record, not from the caller."""
        sources = self.noise_sources()
        groups: dict[str | None, list[int]] = {}
        for t in sorted(set(charged_tasks)):
            groups.setdefault(sources.get(t), []).append(t)

        def names(tasks: list[int]) -> str:
            return ("task " if len(tasks) == 1 else "tasks ") + ", ".join(str(t + 1) for t in tasks)

        out = []
        if NOISE_OS_ENTROPY in groups:
            out.append(
                f"The DP noise (and, with opacus, the Poisson sampling) of {names(groups[NOISE_OS_ENTROPY])} was drawn "
                "from generators dpcl seeded from OS entropy for that task, independent of torch.manual_seed and of "
                "every other seed of the training process."
            )
        if NOISE_REPRODUCIBLE in groups:
            out.append(
                f"The DP noise of {names(groups[NOISE_REPRODUCIBLE])} was drawn from generators seeded with a seed the "
                "caller chose (reproducible_seed): the guarantee holds only against someone who does not know that "
                "seed."
            )
        if None in groups and len(groups) > 1:
            out.append(
                f"dpcl did not draw the noise of {names(groups[None])}: where it came from is stated by the caller's "
                "assumptions."
            )
        return out

"""What a Certifier hands back: certified and committed releases, charged DP-SGD plans, and the error of a step
that no plan covers."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpcl.errors import PrivacyViolationError
from dpcl.guarantees.ledger import StreamGuarantee

#: Relative slack when a recorded DP-SGD step is compared with the planned one (float round trips).
_STEP_RTOL = 1e-9


class UnchargedStepError(PrivacyViolationError):
    """A training step is not covered by the charged plan (more steps, less noise or a higher sample rate)."""


@dataclass
class PlannedSteps:
    """One charged DP-SGD schedule of a task: ``charged`` steps at (``noise_multiplier``, ``sample_rate``)."""

    noise_multiplier: float
    sample_rate: float
    charged: int
    recorded: int = 0

    def covers(self, noise_multiplier: float, sample_rate: float) -> bool:
        """True when a step at these settings is at most as revealing as a planned one.

        The step's dominating pair is (N(0, 1), (1 - q) N(0, 1) + q N(1/z, 1)). Its likelihood ratio
        is increasing in x for every q, so optimal tests are thresholds t and the trade-off curve is
        beta(t) = Phi(t) - q (Phi(t) - Phi(t - 1/z)) at alpha = 1 - Phi(t): pointwise non-increasing in q
        and non-decreasing in z. A step with more noise or a lower sample rate is therefore at least as
        private (in f-DP order, Dong, Roth & Su 2022), and composition preserves that order, so charging
        the planned step covers it.
        """
        return (
            noise_multiplier >= self.noise_multiplier * (1.0 - _STEP_RTOL)
            and sample_rate <= self.sample_rate * (1.0 + _STEP_RTOL)
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "noise_multiplier": self.noise_multiplier,
            "sample_rate": self.sample_rate,
            "charged_steps": self.charged,
            "recorded_steps": self.recorded,
        }


@dataclass(frozen=True)
class CertifiedRelease:
    """What :meth:`Certifier.release` wrote: the checkpoint, its certificate and the checkpoint's guarantee.

    ``private`` is False for a checkpoint that is not covered by the charged events: then ``guarantee``,
    ``epsilon`` and ``delta`` are None and ``reasons`` says why (as its certificate does).
    """

    task_index: int
    checkpoint: Path
    certificate: Path
    checkpoint_sha256: str
    private: bool
    guarantee: StreamGuarantee | None
    reasons: tuple[str, ...] = ()
    #: Public-key fingerprint of the Ed25519 key that signed the certificate (``sign_key``), else None.
    signed_by: str | None = None

    @property
    def epsilon(self) -> float | None:
        return None if self.guarantee is None else self.guarantee.epsilon

    @property
    def delta(self) -> float | None:
        return None if self.guarantee is None else self.guarantee.delta


@dataclass(frozen=True)
class CommittedRelease:
    """The hashes a ledger committed for one release (:meth:`Certifier.committed`), to finish it after a crash."""

    task_index: int
    checkpoint_sha256: str | None
    curator_sha256: str | None


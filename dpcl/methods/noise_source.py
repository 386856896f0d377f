"""Where the privacy-relevant randomness of a run comes from: OS entropy unless the run opts in to reproducibility.

A differential-privacy guarantee holds only against an adversary who cannot
predict the mechanism's noise. ``--seed`` is written into run states,
checkpoints and certificates, so noise drawn from a generator seeded by it
could be regenerated and subtracted by anyone who reads a certificate, and the
release would be no more private than the noise-free one. Therefore every
draw the privacy analysis treats as secret -- Gaussian noise (DP-SGD, the
cosine classifier's class sums, PeCL token noise), Laplace noise (L2DP-ML
coefficients) and the Poisson subsampling masks of DP-SGD (privacy
amplification by sampling assumes the sample is hidden) -- comes from a
generator built here:

* by default it is seeded from the operating system's entropy
  (:func:`secrets.randbits`, i.e. ``os.urandom``), freshly for every task, and
  the seed is never stored (not in checkpoints, run states or certificates);
* with ``reproducible_noise`` (``[run] reproducible_noise = true`` or
  ``dpcl run --reproducible-noise``) it is derived from the run's seed, the task
  index and a stream tag, so a run can be repeated bit for bit; every
  certificate of such a run then states :data:`REPRODUCIBLE_NOISE_ASSUMPTION`.

Everything else (initialisation, shuffles, data splits, memory selection) keeps
following ``--seed``. Floating-point attacks on the sampling of noise (Mironov
2012, "On significance of the least significant bits for differential
privacy") are out of scope: :data:`FLOATING_POINT_ASSUMPTION` states it.

Why no library: numpy's and torch's generators are what the mechanisms draw
from (opacus takes a ``torch.Generator``); this module only decides how they are
seeded, which no library decides for us.
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any

import numpy as np

from dpcl.accounting.events import PoissonSampledGaussianEvent
from dpcl.errors import InvalidParameterError

if TYPE_CHECKING:  # pragma: no cover - torch is imported lazily so this module stays torch-free at import
    import torch

#: Mixed into every reproducible noise seed so noise never shares a stream with the initialisation seeded by ``--seed``.
NOISE_DOMAIN_TAG = 0x6E6F697365  # "noise"

OS_ENTROPY_ASSUMPTION = (
    "The noise and the Poisson subsampling of every release were drawn from generators seeded with fresh operating-"
    "system entropy that is recorded nowhere; the recorded seed controls only initialisation, shuffling and data "
    "splits, never the privacy noise."
)
REPRODUCIBLE_NOISE_ASSUMPTION = (
    "This run drew its privacy noise and Poisson subsampling from the recorded seed (reproducible_noise = true): "
    "the noise is reproducible from that seed, so the release is differentially private only against an adversary "
    "who does not know the seed."
)
#: The same statements for runs whose events draw no Poisson sample (cosine, L2DP-ML, PeCL's per-token noise).
OS_ENTROPY_NO_SAMPLING_ASSUMPTION = (
    "The noise of every release was drawn from generators seeded with fresh operating-system entropy that is "
    "recorded nowhere; the recorded seed controls only initialisation, shuffling and data splits, never the privacy "
    "noise."
)
REPRODUCIBLE_NOISE_NO_SAMPLING_ASSUMPTION = (
    "This run drew its privacy noise from the recorded seed (reproducible_noise = true): the noise is reproducible "
    "from that seed, so the release is differentially private only against an adversary who does not know the seed."
)
FLOATING_POINT_ASSUMPTION = (
    "The noise samplers are treated as exact real-valued Gaussian/Laplace samplers; attacks on their floating-point "
    "implementation (Mironov 2012) are out of scope."
)


def noise_assumptions(reproducible: bool, *, subsampled: bool = True) -> tuple[str, ...]:
    """The assumption sentences every certificate of a run with this noise source states; ``subsampled`` False
    for runs whose events draw no Poisson sample (then no subsampling is claimed)."""
    if subsampled:
        source = REPRODUCIBLE_NOISE_ASSUMPTION if reproducible else OS_ENTROPY_ASSUMPTION
    else:
        source = REPRODUCIBLE_NOISE_NO_SAMPLING_ASSUMPTION if reproducible else OS_ENTROPY_NO_SAMPLING_ASSUMPTION
    return (source, FLOATING_POINT_ASSUMPTION)


def poisson_subsampled(events: Any) -> bool:
    """True when any of ``events`` (dpcl.accounting.events, repeated or composed) is a Poisson-subsampled step."""
    return any(isinstance(leaf, PoissonSampledGaussianEvent) for event in events for leaf, _ in event.leaves())


def _check(seed: Any, keys: tuple[Any, ...]) -> None:
    for name, value in (("seed", seed),) + tuple((f"key {i}", k) for i, k in enumerate(keys)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < 0:
            raise InvalidParameterError(f"noise source {name} must be an integer >= 0, got {value!r}.")


def noise_seed(seed: int, reproducible: bool, *keys: int) -> int:
    """A 64-bit seed for one privacy-relevant generator.

    ``reproducible`` False: 64 fresh bits of OS entropy (the arguments only
    validate). True: a deterministic function of ``(seed, keys)`` in a domain
    separate from ``--seed``'s own streams (numpy ``SeedSequence`` hashing).
    """
    _check(seed, keys)
    if not reproducible:
        return secrets.randbits(64)
    sequence = np.random.SeedSequence([int(seed), NOISE_DOMAIN_TAG, *(int(k) for k in keys)])
    return int(sequence.generate_state(1, dtype=np.uint64)[0])


def noise_rng(seed: int, reproducible: bool, *keys: int) -> np.random.Generator:
    """A numpy generator for privacy noise (OS entropy, 128 bits, unless ``reproducible``)."""
    _check(seed, keys)
    if not reproducible:
        return np.random.default_rng(secrets.randbits(128))
    return np.random.default_rng([int(seed), NOISE_DOMAIN_TAG, *(int(k) for k in keys)])


def noise_torch_generator(seed: int, reproducible: bool, *keys: int, device: "str | torch.device" = "cpu") -> "torch.Generator":
    """A ``torch.Generator`` on ``device`` for privacy noise and Poisson masks (see :func:`noise_seed`)."""
    import torch

    return torch.Generator(device=device).manual_seed(noise_seed(seed, reproducible, *keys))

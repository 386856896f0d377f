"""opacus integration: ``PrivacyEngine(accountant="dpcl")`` records into a :class:`dpcl.Certifier`.

Importing this module (``import dpcl.integrations.opacus``) does two things to opacus (>= 1.6), both
through opacus' own extension points or thin wrappers, never by re-implementing opacus:

1. It registers :class:`DpclAccountant` with opacus' accountant registry
   (:func:`opacus.accountants.register_accountant`) under the mechanism name ``"dpcl"``, so
   ``PrivacyEngine(accountant="dpcl")`` uses it. It implements opacus'
   :class:`~opacus.accountants.accountant.IAccountant`: ``step``, ``get_epsilon``, ``__len__``,
   ``mechanism`` and the state dict. Its ``history`` is opacus' compressed format (one
   ``(noise_multiplier, sample_rate, steps)`` entry per run of equal consecutive steps), so memory
   does not grow with the number of steps; ``get_epsilon`` is dpcl's tightest sound accountant
   (:func:`dpcl.accounting.accountants.compute_epsilon`, ``auto`` by default) on those steps as
   :class:`~dpcl.accounting.events.RepeatedEvent` of
   :class:`~dpcl.accounting.events.PoissonSampledGaussianEvent`.
2. It wraps opacus' ``get_noise_multiplier`` (as ``opacus.privacy_engine`` and
   ``opacus.accountants.utils`` see it) so that for the ``"dpcl"`` mechanism,
   ``make_private_with_epsilon`` calibrates with :func:`dpcl.accounting.dpsgd.dpsgd_noise_multiplier`
   (the smallest noise multiplier whose ``auto`` epsilon meets the target); every other mechanism
   goes to opacus' own function unchanged. The number of steps is ``epochs / sample_rate`` as in
   opacus, rounded *up* when it is not an integer (opacus truncates, which can calibrate for one step
   fewer than an epoch-based loop takes).

Crash-safety rule (charge, then train). :func:`attach` (or :meth:`DpclAccountant.attach`) charges
the planned schedule -- the optimizer's noise multiplier, the loader's sample rate and the number of
steps (``epochs * len(data_loader)``, or ``steps``) -- to a Certifier task *before* the first step,
so the ledger on disk already holds the whole budget if the process dies. Each step opacus reports
is then checked against that charge in opacus' step hook, which runs after the noise is added and
before the optimizer updates the weights: a step beyond the charged count, with less noise or a
higher sample rate raises :class:`~dpcl.certifier.UnchargedStepError` and the weights are not
updated. :meth:`dpcl.Certifier.release` reports recorded vs charged steps; its certificate accounts
the whole charge (conservative when training stopped early). A task interrupted by a crash is
retrained and charged again (the interrupted attempt may have leaked).

Noise rule (dpcl owns it). opacus draws its noise and Poisson sampling from torch's default generator unless
given one, so a ``torch.manual_seed`` for the initialisation would fix them. :func:`attach` installs
generators seeded from OS entropy (:meth:`dpcl.Certifier.noise_generator`) in the optimizer and the sampler,
and the certificates state it; ``reproducible_seed`` is the explicit, stated exception.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import opacus.accountants.utils as _opacus_utils
import opacus.privacy_engine as _opacus_privacy_engine
from opacus.accountants import IAccountant, create_accountant, register_accountant
from opacus.data_loader import DPDataLoader

from dpcl.accounting.accountants import compute_epsilon
from dpcl.accounting.dpsgd import dpsgd_noise_multiplier
from dpcl.accounting.events import Adjacency, PoissonSampledGaussianEvent, PrivacyEvent, RepeatedEvent
from dpcl.accounting.validation import check_count
from dpcl.certifier import CertifierTask, UnchargedStepError, check_reproducible_seed
from dpcl.errors import InvalidParameterError

__all__ = ["MECHANISM", "DpclAccountant", "attach", "planned_steps"]

#: opacus mechanism name of :class:`DpclAccountant`: ``PrivacyEngine(accountant="dpcl")``.
MECHANISM = "dpcl"


class DpclAccountant(IAccountant):
    """opacus accountant that computes epsilon with dpcl and records steps into a Certifier task.

    Created by opacus (``PrivacyEngine(accountant="dpcl")``) without a task; :meth:`attach` binds it
    to a :class:`~dpcl.certifier.CertifierTask` and charges the planned schedule. Unattached, it is a
    plain accountant (opacus' calibration uses it that way).
    """

    def __init__(self, *, accountant: str = "auto") -> None:
        #: opacus' compressed history: [(noise_multiplier, sample_rate, steps), ...]
        self.history: list[tuple[float, float, int]] = []
        self.accountant = accountant
        self.task: CertifierTask | None = None
        self._unattached_steps = 0

    @classmethod
    def mechanism(cls) -> str:
        return MECHANISM

    # -- opacus interface ------------------------------------------------------------------------
    def step(self, *, noise_multiplier: float, sample_rate: float) -> None:
        """Record one DP-SGD step; attached, it is checked against the charged plan first (see module doc)."""
        z, q = float(noise_multiplier), float(sample_rate)
        if self.task is not None:
            self.task.record_dpsgd_steps(noise_multiplier=z, sample_rate=q, count=1)
        else:
            self._unattached_steps += 1
        if self.history and self.history[-1][0] == z and self.history[-1][1] == q:
            self.history[-1] = (z, q, self.history[-1][2] + 1)
        else:
            self.history.append((z, q, 1))

    def __len__(self) -> int:
        return int(sum(n for _z, _q, n in self.history))

    def events(self) -> list[PrivacyEvent]:
        """The recorded steps as dpcl events (one :class:`RepeatedEvent` per history entry)."""
        adjacency = self.task.adjacency if self.task is not None else Adjacency.ADD_REMOVE
        unit = self.task.unit if self.task is not None else "example"
        return [
            RepeatedEvent(
                PoissonSampledGaussianEvent(noise_multiplier=z, sample_rate=q, adjacency=adjacency, unit=unit),
                int(n),
            )
            for z, q, n in self.history
        ]

    def get_epsilon(self, delta: float, accountant: str | None = None, **_: Any) -> float:
        """Epsilon of the recorded steps at ``delta`` (dpcl ``auto`` unless ``accountant`` names another)."""
        if not self.history:
            return 0.0
        return float(compute_epsilon(self.events(), delta, accountant or self.accountant).epsilon)

    # -- Certifier binding ------------------------------------------------------------------------
    def attach(
        self,
        task: CertifierTask,
        *,
        optimizer: Any,
        data_loader: Any,
        epochs: int | None = None,
        steps: int | None = None,
        unit_ids: Any = None,
        reproducible_seed: int | None = None,
    ):
        """Charge the planned schedule of this training to ``task``, give it dpcl's noise, then record its steps.

        ``optimizer`` and ``data_loader`` are the ones ``make_private`` (or ``make_private_with_epsilon``)
        returned; give ``epochs`` (steps = ``epochs * len(data_loader)``) or ``steps``. Returns the
        ledger charge. Steps taken by this accountant before any attach were charged nowhere: then
        :class:`~dpcl.certifier.UnchargedStepError` is raised.

        dpcl owns the noise: the optimizer's noise generator and the loader's Poisson sampler get generators
        seeded from OS entropy (:meth:`dpcl.Certifier.noise_generator`), replacing any generator given to
        ``make_private`` and independent of ``torch.manual_seed``; the certificates state it. An engine in
        opacus' ``secure_mode`` keeps its cryptographic generator (state it in your assumptions). ``reproducible_seed``
        (research only) seeds both from that seed instead, and the certificates say so.
        """
        if not isinstance(task, CertifierTask):
            raise InvalidParameterError(
                f"task must be a Certifier task (certifier.task(index)), got {type(task).__name__}."
            )
        if self._unattached_steps:
            raise UnchargedStepError(
                f"{self._unattached_steps} DP-SGD step(s) were taken before the accountant was attached to a "
                "Certifier task, so no ledger holds their budget; attach before training."
            )
        z, q, n = planned_steps(optimizer=optimizer, data_loader=data_loader, epochs=epochs, steps=steps)
        device = _noise_device(optimizer)
        sampler = _poisson_sampler(data_loader)
        check_reproducible_seed(reproducible_seed)
        charge = task.plan_dpsgd(noise_multiplier=z, sample_rate=q, steps=n, unit_ids=unit_ids)
        if not getattr(optimizer, "secure_mode", False):
            sampling_seed = None if reproducible_seed is None else (int(reproducible_seed) + 1) % 2**64
            optimizer.generator = task.certifier.noise_generator(
                task.index, device=device, reproducible_seed=reproducible_seed)
            sampler.generator = task.certifier.noise_generator(
                task.index, device="cpu", reproducible_seed=sampling_seed)
        self.task = task
        return charge


def _noise_device(optimizer: Any) -> Any:
    """The device of the optimizer's parameters: opacus draws each parameter's noise there, with its generator."""
    devices = {p.device for group in optimizer.param_groups for p in group["params"]}
    if len(devices) != 1:
        raise InvalidParameterError(
            f"the optimizer's parameters lie on {len(devices)} devices ({', '.join(sorted(map(str, devices)))}): "
            "opacus draws all noise with one generator, which lives on one device; keep the model on one device."
        )
    return devices.pop()


def _poisson_sampler(data_loader: Any) -> Any:
    """The Poisson sampler of opacus' DPDataLoader, whose generator draws which examples each step uses."""
    sampler = getattr(data_loader, "batch_sampler", None)
    if not hasattr(sampler, "generator"):
        raise InvalidParameterError(
            f"the data loader's batch sampler ({type(sampler).__name__}) has no generator to draw the Poisson "
            "sampling with; use the DPDataLoader that make_private returned."
        )
    return sampler


def planned_steps(*, optimizer: Any, data_loader: Any, epochs: int | None = None, steps: int | None = None):
    """(noise multiplier, sample rate, steps) of a training with opacus' ``optimizer`` and ``data_loader``.

    The sample rate is ``1 / len(data_loader)``, exactly what opacus' ``make_private`` reports to the
    accountant at every step (with no gradient accumulation). ``data_loader`` must be opacus' Poisson-sampling
    :class:`~opacus.data_loader.DPDataLoader`: the charged events are Poisson-subsampled Gaussian steps.
    """
    if (epochs is None) == (steps is None):
        raise InvalidParameterError("give exactly one of epochs (steps = epochs * len(data_loader)) or steps.")
    z = getattr(optimizer, "noise_multiplier", None)
    if z is None:
        raise InvalidParameterError(
            "optimizer must be the DPOptimizer that PrivacyEngine.make_private returned (it has no noise_multiplier)."
        )
    if not isinstance(data_loader, DPDataLoader):
        raise InvalidParameterError(
            "data_loader must be the Poisson-sampling DPDataLoader that make_private returned (with "
            "poisson_sampling=True, opacus' default): dpcl accounts Poisson-subsampled Gaussian steps, which "
            f"a {type(data_loader).__name__} (fixed-size or shuffled batches) does not implement."
        )
    batches = len(data_loader)
    if batches < 1:
        raise InvalidParameterError("data_loader has no batch; nothing to plan.")
    n = check_count("epochs", epochs) * batches if steps is None else check_count("steps", steps)
    return float(z), 1.0 / batches, int(n)


def attach(privacy_engine: Any, task: CertifierTask, **plan: Any):
    """``privacy_engine.accountant.attach(task, **plan)`` for a ``PrivacyEngine(accountant="dpcl")``."""
    accountant = getattr(privacy_engine, "accountant", None)
    if not isinstance(accountant, DpclAccountant):
        raise InvalidParameterError(
            "the privacy engine does not use the dpcl accountant: create it with "
            "PrivacyEngine(accountant=\"dpcl\") after `import dpcl.integrations.opacus`."
        )
    return accountant.attach(task, **plan)


# -- registration with opacus ---------------------------------------------------------------------------
def _steps_for(epochs: float, sample_rate: float) -> int:
    exact = epochs / sample_rate
    nearest = round(exact)
    return int(nearest) if abs(exact - nearest) <= 1e-9 * max(exact, 1.0) else int(math.ceil(exact))


#: (target epsilon, delta, sample rate, steps) -> calibrated noise multiplier (a pure function of the key).
_CALIBRATIONS: dict[tuple[float, float, float, int], float] = {}


def _calibrating(original: Callable[..., float]) -> Callable[..., float]:
    """opacus' ``get_noise_multiplier``, with the ``"dpcl"`` mechanism calibrated by dpcl."""
    if getattr(original, "_dpcl_wrapped", False):
        return original

    @functools.wraps(original)
    def get_noise_multiplier(
        *,
        target_epsilon: float,
        target_delta: float,
        sample_rate: float,
        epochs: float | None = None,
        steps: int | None = None,
        accountant: str = "rdp",
        epsilon_tolerance: float = 0.01,
        **kwargs: Any,
    ) -> float:
        if accountant != MECHANISM:
            return original(
                target_epsilon=target_epsilon, target_delta=target_delta, sample_rate=sample_rate, epochs=epochs,
                steps=steps, accountant=accountant, epsilon_tolerance=epsilon_tolerance, **kwargs,
            )
        if (steps is None) == (epochs is None):
            raise ValueError("get_noise_multiplier takes as input EITHER a number of steps or a number of epochs")
        n = _steps_for(epochs, sample_rate) if steps is None else int(steps)
        key = (float(target_epsilon), float(target_delta), float(sample_rate), n)
        if key not in _CALIBRATIONS:  # tasks of equal size share one calibration
            calibration = dpsgd_noise_multiplier(target_epsilon, target_delta, sample_rate, n, accountant="auto")
            _CALIBRATIONS[key] = float(calibration.noise_multiplier)
        return _CALIBRATIONS[key]

    get_noise_multiplier._dpcl_wrapped = True  # type: ignore[attr-defined]
    return get_noise_multiplier


def _register() -> None:
    try:
        register_accountant(MECHANISM, DpclAccountant)
    except ValueError:  # already registered: by this module (imported again, or reloaded) or by someone else
        existing = type(create_accountant(MECHANISM))
        if existing.__module__ != __name__:
            raise InvalidParameterError(
                f"opacus already has an accountant named {MECHANISM!r} ({existing.__module__}."
                f"{existing.__qualname__}); dpcl's cannot be registered under that name."
            ) from None
        register_accountant(MECHANISM, DpclAccountant, force=True)
    _opacus_privacy_engine.get_noise_multiplier = _calibrating(_opacus_privacy_engine.get_noise_multiplier)
    _opacus_utils.get_noise_multiplier = _calibrating(_opacus_utils.get_noise_multiplier)


_register()

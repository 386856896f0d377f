"""Privacy plans of the methods of Tobaben et al.: Cosine Classifier, PEFT Ensemble, Naive, Non-CL.

Each ``*_SPEC`` is a :class:`~dpcl.guarantees.method_schema.MethodSpec`: it lists
the ``[method]`` keys the method accepts and turns a task's size into a
:class:`~dpcl.guarantees.method_schema.TaskPlan` (the noise the method must use
and the privacy events that noise causes). ``dpcl audit`` and ``dpcl run`` call
the same plan.

Event structure of each method (derived from the paper's algorithms):

* **Cosine Classifier** (Alg. 1, eq. 8): per task, the matrix of per-class sums of
  l2-normalised features for the public labels O_t, plus N(0, sigma^2 I). Adding
  or removing one example moves exactly one class row by a vector of norm <= 1:
  l2 sensitivity 1 under add/remove. Replacing one example removes a unit vector
  from one row and adds one to another (or the same) row: norm <= sqrt(2) for
  different classes and ||u - v|| <= 2 for the same class, so sensitivity 2 under
  replace-one. One Gaussian event per task; sigma from the analytic calibration
  :func:`dpcl.accounting.gaussian.gaussian_sigma` (Balle & Wang 2018, Thm 8) for
  the per-task (epsilon, delta). The paper writes N(0, sigma I); sigma here is
  the standard deviation. An empty task still releases noise-only sums.
* **PEFT Ensemble** (Alg. 2): per task, a fresh adapter + head (``variant =
  "adapter"``) or fresh FiLM parameters of the encoder's layer norms + head
  (``variant = "film"``, :func:`peft_variant`) trained with DP-SGD (Alg. A1) on D_t only. The head predicts every
  public label of the stream (``head = "label_space"``, S_prior^const as in the paper's experiments) or the task's
  own public labels (``head = "task"``); either set is public and fixed before training, so it changes neither the
  data DP-SGD reads (D_t) nor the clipped per-example sensitivity. Poisson sampling rate q = batch_size / n_t,
  T = epochs * ceil(n_t / batch_size) steps, noise multiplier calibrated so that
  the T-fold subsampled Gaussian meets the per-task epsilon
  (:func:`dpcl.accounting.dpsgd.dpsgd_noise_multiplier`). An empty task
  releases the (data-independent) initialisation.
* **Naive** (Alg. A2): one model trained further with DP-SGD on each task in
  turn. The model entering task t is a post-processing of the releases of tasks
  < t, so D_t is read only by task t's DP-SGD: the same per-task event as PEFT
  Ensemble, charged to task t alone. Across tasks its guarantee is therefore the
  same as PEFT Ensemble's (parallel: the worst task; sequential: their
  composition) -- the carried-over weights add no privacy cost.
* **Non-CL** (Alg. A3): at every release t a fresh model is trained with DP-SGD
  on the union D_1 u ... u D_t, so ``n_examples`` is the size of that union and
  the release is charged to every task 1..t (``reuses_past_tasks``). A unit of
  D_1 is read by all T releases: with disjoint units the stream's guarantee is
  the composition of every release's DP-SGD run (the ledger groups the charges
  per task); with shared units the union can hold one unit several times and a
  per-example accountant does not apply, so the ledger refuses it.

* **DP-SGD A-GEM** (Chaudhry et al. 2019, A-GEM, eq. 11, with DP-SGD as in Lai et al., Sec. 6
  "NaiveGaussian"): one model fine-tuned as Naive; after task t a uniform sample of
  ``memory_per_task`` of its examples (indices drawn with public randomness) joins an
  episodic memory. At every step of task t >= 1 the update direction is the
  A-GEM projection of the step's DP-SGD gradient (Poisson sample of D_t at rate
  q_t = batch_size / n_t) against a reference gradient: a Poisson sample of the
  memory at rate q_mem (``memory_sample_rate``, default q_t), clipped to the same
  C and noised with the same sigma. The tasks hold disjoint units, so an
  example is in at most one of the two sampled sets: per step every unit takes
  one subsampled Gaussian at rate max(q_t, q_mem) (its own set's rate is no
  larger), and the projection is post-processing. One DP-SGD event of T_t steps
  at that rate per task, calibrated to the per-task epsilon. A memory unit of
  task k is read again by every release t > k, so the tasks are not independent
  releases: the spec refuses parallel composition (``across_tasks`` must be
  ``"sequential"``), and the stream's epsilon composes every task's steps.

Task sizes enter the plan through q and T; like every DP-SGD accountant
(opacus included) the plan treats them as public (:data:`TASK_SIZE_ASSUMPTION`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from dpcl.accounting.dpsgd import dpsgd_events, dpsgd_noise_multiplier
from dpcl.accounting.events import Adjacency, GaussianEvent
from dpcl.accounting.gaussian import gaussian_epsilon, gaussian_sigma
from dpcl.errors import ConfigError, InvalidParameterError, UnsupportedEventError
from dpcl.guarantees.label_space import EMPTY_TASK_RELEASE_KEY
from dpcl.guarantees.public_encoder import (
    PUBLIC_ENCODER_ASSUMPTION,
    encoder_modality,
    packaged_encoder,
    public_encoder_assumption,
)
from dpcl.guarantees.method_schema import (
    REQUIRED,
    TORCH_DEVICE_FORMS,
    MethodKey,
    ReleaseCoverage,
    TaskPlan,
    method_value,
    nonnegative,
    nonnegative_int,
    one_of,
    positive,
    positive_int,
    torch_device,
)
from dpcl.guarantees.settings import PrivacySettings, privacy_settings

__all__ = [
    "COSINE",
    "PEFT_ENSEMBLE",
    "NAIVE",
    "NON_CL",
    "AGEM",
    "AGemSpec",
    "CosineSpec",
    "DpSgdSpec",
    "PeftEnsembleSpec",
    "PEFT_VARIANTS",
    "PEFT_HEADS",
    "peft_variant",
    "cosine_sensitivity",
    "dpsgd_schedule",
    "TASK_SIZE_ASSUMPTION",
]

TASK_SIZE_ASSUMPTION = (
    "Task sizes after label filtering are treated as public: they set the DP-SGD sampling rate "
    "q = batch_size / n_t and the number of steps, as in standard DP-SGD accounting."
)
COSINE_SENSITIVITY_ASSUMPTION = (
    "Each example adds its l2-normalised feature vector to exactly one class sum "
    "(l2 sensitivity 1 under add/remove, 2 under replace-one)."
)
DPSGD_ASSUMPTION = (
    "DP-SGD uses Poisson sampling at the planned rate, per-example clipping to max_grad_norm and Gaussian "
    "noise of standard deviation noise_multiplier * max_grad_norm on every step, including empty batches."
)
NAIVE_ASSUMPTION = (
    "Naive fine-tuning starts task t from the previous release, a post-processing of earlier releases; "
    "task t's data is read only by task t's DP-SGD run."
)
#: Why a cosine checkpoint is covered by its charged Gaussian releases.
COSINE_RELEASE = ReleaseCoverage.post_processing(
    "The checkpoint holds the noisy per-class sums of l2-normalised features (and the prototypes normalised from "
    "them): a post-processing of the charged Gaussian releases, with the public feature map (the raw inputs, or a "
    "public encoder where the config names one), the public output labels and the configuration."
)
#: Why a checkpoint trained by DP-SGD is covered by its charged DP-SGD runs.
DPSGD_RELEASE = ReleaseCoverage.post_processing(
    "Every parameter in the checkpoint that saw private data was updated only by the charged DP-SGD steps (per-example "
    "clipped gradients plus Gaussian noise), starting from a data-independent initialisation or an earlier release: "
    "a post-processing of the charged DP-SGD runs."
)
#: An empty task's DP-SGD release: nothing is read, the initialisation (or the previous release) is released.
EMPTY_DPSGD_RELEASE = ReleaseCoverage.post_processing(
    "The task is empty after label filtering: the checkpoint is the data-independent initialisation or a "
    "post-processing of earlier releases; no private data of this task is read."
)

NON_CL_ASSUMPTION = (
    "Non-CL retrains on the union of all tasks seen so far at every release; every release is charged to "
    "every task it read."
)


# -- key checks -------------------------------------------------------------------------------------------








DEVICE_KEY = MethodKey("device", str, "cpu", "torch device for training: " + TORCH_DEVICE_FORMS, torch_device)

DPSGD_KEYS: tuple[MethodKey, ...] = (
    MethodKey("epochs", int, REQUIRED, "passes over each task's data; steps = epochs * ceil(n / batch_size)",
              positive_int),
    MethodKey("batch_size", int, REQUIRED, "expected batch size; Poisson sampling rate q = batch_size / n",
              positive_int),
    MethodKey("max_grad_norm", float, REQUIRED, "per-example gradient clipping norm C of DP-SGD",
              positive),
    MethodKey("adapter_dim", int, 64, "bottleneck width of the residual adapter (0: train the head only)",
              nonnegative_int),
    MethodKey("learning_rate", float, 1e-3, "optimiser learning rate", positive),
    DEVICE_KEY,
)

#: ``[method] variant`` of PEFT Ensemble: what each task's member trains.
PEFT_VARIANTS = ("auto", "adapter", "film")
#: What each PEFT Ensemble member's head predicts (``[method] head``).
PEFT_HEADS = ("label_space", "task")

PEFT_KEYS: tuple[MethodKey, ...] = DPSGD_KEYS + (
    MethodKey("aggregation", str, "argmax", "ensemble prediction rule: 'argmax' (eq. 10), 'median' (eq. A41) "
              "or 'entropy'", one_of("argmax", "median", "entropy")),
    MethodKey("variant", str, "auto", "what each member trains: 'film' (the scale and shift of the [stream] encoder's "
              "layer norms plus a head, as in the paper; needs an image or text encoder), 'adapter' (a residual "
              "adapter and head on precomputed features) or 'auto' (film when [stream] encoder is given, else "
              "adapter)", one_of(*PEFT_VARIANTS)),
    MethodKey("head", str, "label_space", "labels of each member's head: 'label_space' (every public label of the "
              "stream, as S_prior^const in the paper's experiments; the labels a task lacks are the member's "
              "negatives) or 'task' (the task's own public labels O_t only, Sec. 6.3)", one_of(*PEFT_HEADS)),
    MethodKey("normalize_features", bool, False, "adapter variant: l2-normalise each feature vector before the "
              "member, as the cosine classifier does (a fixed per-example map; no privacy cost). Helps the head-only "
              "members (adapter_dim = 0) of the bundled configs; with a per-member adapter it slows learning"),
    MethodKey("center_features", bool, False, "adapter variant: subtract each feature vector's own mean over its "
              "coordinates (before normalize_features), a fixed per-example map; no privacy cost"),
    MethodKey("weight_decay", float, 0.0, "L2 penalty of Adam on the member's parameters, added after clipping and "
              "noise (post-processing; no privacy cost)", nonnegative),
)

AGEM_KEYS: tuple[MethodKey, ...] = DPSGD_KEYS + (
    MethodKey("memory_per_task", int, 256, "examples of each task kept in the episodic memory after it is trained "
              "(a uniform sample, drawn with the public seed)", positive_int),
    MethodKey("memory_sample_rate", float, None, "Poisson sampling rate of the memory's reference batch at each step "
              "(default: the task's rate batch_size / n_t); the accounting charges max(task rate, memory rate) "
              "per step", positive),
    MethodKey("optimizer", str, "sgd", "'sgd' (A-GEM's projected SGD step, Chaudhry et al. 2019) or 'adam' (its "
              "per-coordinate scaling turns the projected direction; post-processing either way)", one_of("sgd", "adam")),
)
AGEM_ASSUMPTION = (
    "DP-SGD A-GEM keeps examples of earlier tasks in an episodic memory and reads them again at every later "
    "release, so every task's DP-SGD steps are composed for every unit (sequential composition over tasks). "
    "Tasks hold disjoint units, so at each step an example is in at most one of the two Poisson samples (the task's "
    "and the memory's); the A-GEM projection of the two noisy gradients is post-processing."
)

#: DP-SGD keys a cosine config may carry (e.g. when switching methods); the cosine classifier does not
#: train by gradient descent, so they do not change its plan, and the plan's notes say so.
COSINE_UNUSED_KEYS = ("epochs", "batch_size", "max_grad_norm")

COSINE_KEYS: tuple[MethodKey, ...] = (
    DEVICE_KEY,
    MethodKey("epochs", int, None, "accepted but unused: the cosine classifier makes one noisy sum per task",
              positive_int),
    MethodKey("batch_size", int, None, "accepted but unused by the cosine classifier", positive_int),
    MethodKey("max_grad_norm", float, None, "accepted but unused: features are l2-normalised instead",
              positive),
)


# -- helpers ----------------------------------------------------------------------------------------------
def cosine_sensitivity(adjacency: "Adjacency | str") -> float:
    """l2 sensitivity of the per-class sums of unit-norm features (1 add/remove, 2 replace-one)."""
    return 1.0 if Adjacency.parse(adjacency) is Adjacency.ADD_REMOVE else 2.0


def _privacy(privacy: "PrivacySettings | Mapping[str, Any]") -> tuple[float, float, Adjacency, str]:
    settings = privacy_settings(privacy)
    for name, value in (("epsilon", settings.epsilon), ("delta", settings.delta)):
        if value is None:
            raise ConfigError(f"[privacy] {name} is required.")
    return settings.epsilon, settings.delta, Adjacency.parse(settings.adjacency), settings.accountant


def _check_size(n_examples: Any) -> int:
    if isinstance(n_examples, bool) or not isinstance(n_examples, int) or n_examples < 0:
        raise InvalidParameterError(f"n_examples must be an integer >= 0, got {n_examples!r}.")
    return n_examples


def dpsgd_schedule(n_examples: int, batch_size: int, epochs: int, task_index: int) -> tuple[float, int]:
    """Sampling rate q = batch_size / n and steps T = epochs * ceil(n / batch_size) of one task."""
    if batch_size > n_examples:
        raise ConfigError(
            f"[method] batch_size = {batch_size} exceeds the size of task {task_index} "
            f"({n_examples} examples after label filtering): the Poisson sampling rate batch_size / n must be "
            f"<= 1. Use batch_size <= {n_examples}."
        )
    return batch_size / n_examples, epochs * math.ceil(n_examples / batch_size)


def _calibrate_dpsgd(eps: float, delta: float, q: float, steps: int, accountant: str, adjacency: str):
    """DP-SGD calibration; tasks of equal size share one calibration through
    :data:`dpcl.accounting.dpsgd.CALIBRATION_MEMO` (keyed on every input, under every accountant)."""
    return dpsgd_noise_multiplier(eps, delta, q, steps, accountant=accountant, adjacency=adjacency)


def calibration_accountant_for(accountant: str, adjacency: Adjacency) -> str:
    """Accountant used to calibrate DP-SGD noise: the configured one (``auto``: the tightest sound bound of
    :func:`dpcl.accounting.accountants.compute_epsilon`, which under replace-one is PLD, the only accountant
    with a sound replace-one analysis of Poisson subsampling)."""
    return accountant


def _accountant_advice(accountant: str, adjacency: Adjacency) -> str:
    """What to change when the configured accountant cannot calibrate a task's DP-SGD run.

    Never suggests the accountant that just failed: under replace-one only PLD applies (so
    'pld'/'auto'); under add/remove 'auto' tries every sound accountant and keeps the tightest.
    """
    if accountant == "auto" or (accountant == "pld" and adjacency is Adjacency.REPLACE_ONE):
        return "Change the budget (epsilon, delta) or the schedule (epochs, batch_size)."
    if adjacency is Adjacency.REPLACE_ONE:
        return "Set [privacy] accountant = 'pld' or 'auto'."
    return (
        "Set [privacy] accountant = 'auto' (it uses the tightest accountant that applies), "
        "or change the budget (epsilon, delta) or the schedule (epochs, batch_size)."
    )


def dpsgd_noise_record(
    calibration: Any, q: float, steps: int, max_grad_norm: float, *, empty_task_release: str
) -> dict[str, Any]:
    """A calibrated DP-SGD task's ``noise`` record in its plan (what training reads and the certificate states);
    ``empty_task_release`` is what an empty task of this method releases instead (Prop. F.1)."""
    return {
        "noise_multiplier": float(calibration.noise_multiplier),
        "sample_rate": q,
        "steps": steps,
        "max_grad_norm": max_grad_norm,
        "task_epsilon": float(calibration.epsilon),
        "calibration_accountant": calibration.accountant,
        EMPTY_TASK_RELEASE_KEY: empty_task_release,
    }


def calibrated_dpsgd_task(
    n: int, batch_size: int, epochs: int, task_index: int, eps: float, delta: float, adjacency: Adjacency,
    accountant: str,
) -> tuple[float, int, Any, Any]:
    """One task's DP-SGD run, calibrated to (eps, delta): sampling rate q, steps, the calibration and its event.

    An accountant that cannot account the run raises :class:`ConfigError` naming the task and what to change.
    """
    q, steps = dpsgd_schedule(n, batch_size, epochs, task_index)
    try:
        calibration = _calibrate_dpsgd(eps, delta, q, steps, calibration_accountant_for(accountant, adjacency),
                                       adjacency.value)
    except UnsupportedEventError as exc:
        raise ConfigError(
            f"[privacy] accountant = {accountant!r} cannot account task {task_index}'s DP-SGD run "
            f"(q={q:.6g}, {steps} steps, {adjacency.value!r} adjacency, epsilon={eps:g}, delta={delta:g}): {exc} "
            + _accountant_advice(accountant, adjacency)
        ) from None
    event = dpsgd_events(calibration.noise_multiplier, q, steps, adjacency=adjacency.value, unit="example")
    return q, steps, calibration, event


# -- specs ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CosineSpec:
    """DP Cosine Classifier (Tobaben et al., Alg. 1): one Gaussian mechanism per task."""

    name: str = "cosine"
    keys: tuple[MethodKey, ...] = COSINE_KEYS
    reuses_past_tasks: bool = False

    def plan_task(
        self, method: Mapping[str, Any], privacy: "PrivacySettings | Mapping[str, Any]", n_examples: int, task_index: int
    ) -> TaskPlan:
        _check_size(n_examples)
        eps, delta, adjacency, _ = _privacy(privacy)
        sensitivity = cosine_sensitivity(adjacency)
        sigma = float(gaussian_sigma(eps, delta, sensitivity))
        achieved = float(gaussian_epsilon(sigma, delta, sensitivity))
        event = GaussianEvent(sigma=sigma, sensitivity=sensitivity, adjacency=adjacency, unit="example")
        return TaskPlan(
            events=(event,),
            noise={
                "sigma": sigma,
                "sensitivity": sensitivity,
                "task_epsilon": achieved,
                EMPTY_TASK_RELEASE_KEY: "noise-only class sums",
            },
            assumptions=(public_encoder_assumption(method.get("encoder"), raw_features=bool(method.get("raw_features"))),
                         COSINE_SENSITIVITY_ASSUMPTION),
            release=COSINE_RELEASE,
            notes=(
                f"task {task_index}: Gaussian noise sigma={sigma:.6g} on the per-class feature sums "
                f"(sensitivity {sensitivity:g}, {adjacency.value}) gives epsilon={achieved:.6g} at delta={delta:.3g} "
                "(analytic Gaussian, Balle & Wang 2018).",
                *(
                    (f"[method] {', '.join(unused)} do not affect the cosine classifier (no gradient training).",)
                    if (unused := [k for k in COSINE_UNUSED_KEYS if method.get(k) is not None]) and task_index == 0
                    else ()
                ),
            ),
        )


@dataclass(frozen=True)
class DpSgdSpec:
    """A method that trains with DP-SGD on each release's data (PEFT Ensemble, Naive, Non-CL)."""

    name: str
    keys: tuple[MethodKey, ...]
    reuses_past_tasks: bool
    assumption: str

    def plan_task(
        self, method: Mapping[str, Any], privacy: "PrivacySettings | Mapping[str, Any]", n_examples: int, task_index: int
    ) -> TaskPlan:
        n = _check_size(n_examples)
        eps, delta, adjacency, accountant = _privacy(privacy)
        epochs = int(method_value(method, self.keys, "epochs", self.name))
        batch_size = int(method_value(method, self.keys, "batch_size", self.name))
        max_grad_norm = float(method_value(method, self.keys, "max_grad_norm", self.name))
        encoder = public_encoder_assumption(method.get("encoder"), raw_features=bool(method.get("raw_features")))
        assumptions = (encoder, DPSGD_ASSUMPTION, TASK_SIZE_ASSUMPTION,
                       self.assumption)
        if n == 0:
            return TaskPlan(
                events=(),
                noise={EMPTY_TASK_RELEASE_KEY: "initialisation", "steps": 0, "max_grad_norm": max_grad_norm},
                assumptions=assumptions,
                notes=(f"task {task_index} is empty after label filtering: the data-independent initialisation "
                       "is released (Prop. F.1) and nothing is charged.",),
                release=EMPTY_DPSGD_RELEASE,
            )
        q, steps, calibration, event = calibrated_dpsgd_task(
            n, batch_size, epochs, task_index, eps, delta, adjacency, accountant
        )
        return TaskPlan(
            events=(event,),
            noise=dpsgd_noise_record(calibration, q, steps, max_grad_norm, empty_task_release="initialisation"),
            assumptions=assumptions,
            release=DPSGD_RELEASE,
            notes=(
                f"task {task_index}: DP-SGD on {n} examples, q={q:.6g}, {steps} steps, noise multiplier "
                f"{calibration.noise_multiplier:.6g} -> epsilon={calibration.epsilon:.6g} at delta={delta:.3g} "
                f"({calibration.accountant}).",
            ),
        )


@dataclass(frozen=True)
class AGemSpec(DpSgdSpec):
    """DP-SGD A-GEM's plan: per task one DP-SGD event of ``T_t`` steps at rate ``max(q_t, q_mem)``, calibrated to
    the per-task epsilon; parallel composition over tasks is refused (memory units are read by later tasks)."""

    def memory_rate(self, method: Mapping[str, Any], q_task: float) -> float:
        """The memory's Poisson rate ``q_mem`` (``memory_sample_rate``, default the task's rate ``q_task``)."""
        rate = method.get("memory_sample_rate")
        if rate is None:
            return q_task
        rate = float(rate)
        if not 0 < rate <= 1:
            raise ConfigError(f"[method] memory_sample_rate must lie in (0, 1], got {rate!r}.")
        return rate

    def plan_task(
        self, method: Mapping[str, Any], privacy: "PrivacySettings | Mapping[str, Any]", n_examples: int,
        task_index: int,
    ) -> TaskPlan:
        import dataclasses

        across = privacy_settings(privacy).across_tasks
        if across != "sequential":
            raise ConfigError(
                f"[method] name = 'agem' reads the examples of its episodic memory again at every later task, so a "
                f"unit of task k is used by every release from k on and the tasks are not independent releases: "
                f"parallel composition over tasks (Tobaben et al., Thm 4.4) would understate epsilon. Set [privacy] "
                f"across_tasks = 'sequential' (got {across!r}); keep [stream] disjoint_units = true, which the "
                "per-step accounting needs (an example in at most one of the task's and the memory's samples)."
            )
        plan = super().plan_task(method, privacy, n_examples, task_index)
        if not plan.events:  # an empty task: nothing trained, nothing charged
            return plan
        eps, delta, adjacency, accountant = _privacy(privacy)
        q_task, steps = float(plan.noise["sample_rate"]), int(plan.noise["steps"])
        q_mem = self.memory_rate(method, q_task)
        if task_index == 0 or q_mem <= q_task:  # no memory yet, or the memory is read at most at the task's rate
            q_acc, calibration, event = q_task, None, plan.events[0]
        else:
            q_acc = q_mem
            try:
                calibration = _calibrate_dpsgd(eps, delta, q_acc, steps,
                                               calibration_accountant_for(accountant, adjacency), adjacency.value)
            except UnsupportedEventError as exc:
                raise ConfigError(
                    f"[privacy] accountant = {accountant!r} cannot account task {task_index}'s DP-SGD A-GEM run "
                    f"(rate {q_acc:.6g}, {steps} steps): {exc} " + _accountant_advice(accountant, adjacency)
                ) from None
            event = dpsgd_events(calibration.noise_multiplier, q_acc, steps, adjacency=adjacency.value, unit="example")
        noise = dict(plan.noise)
        if calibration is not None:
            noise.update(noise_multiplier=float(calibration.noise_multiplier), task_epsilon=float(calibration.epsilon),
                         calibration_accountant=calibration.accountant)
        noise.update(memory_sample_rate=q_mem if task_index > 0 else 0.0, accounted_sample_rate=q_acc)
        return dataclasses.replace(
            plan,
            events=(event,),
            noise=noise,
            notes=(
                *plan.notes,
                f"task {task_index}: DP-SGD A-GEM reference batches from the episodic memory at rate "
                f"{q_mem if task_index else 0.0:.6g}; every step is accounted at rate {q_acc:.6g} "
                f"(noise multiplier {noise['noise_multiplier']:.6g}).",
            ),
        )


def peft_variant(method: Mapping[str, Any]) -> str:
    """The PEFT Ensemble variant a validated ``[method]`` section (with the injected ``encoder``) trains.

    ``film``: per task, the scale and shift of every layer norm of the ``[stream] encoder`` plus a head
    (Tobaben et al., Sec. 5 / App. H: FiLM parameters of a frozen ViT; the same for a text encoder);
    needs an encoder (image or text).
    ``adapter``: a residual adapter and head on precomputed features (the encoder's, or raw pixels).
    ``auto`` resolves to ``film`` when the stream names an encoder, else ``adapter``. Both run the same
    DP-SGD plan: the variant never changes the events or the epsilon.
    """
    requested = str(method.get("variant", "auto") or "auto")
    if requested not in PEFT_VARIANTS:
        raise ConfigError(f"[method] variant must be one of {', '.join(map(repr, PEFT_VARIANTS))}; got {requested!r}.")
    encoder = method.get("encoder")
    if encoder is not None:
        encoder_modality(encoder)  # a model directory dpcl can load (image or text), else ConfigError
    packaged = encoder is not None and packaged_encoder(encoder) is not None
    if requested == "auto":  # a packaged encoder is not a Hugging Face model: FiLM cannot train inside it
        return "film" if encoder is not None and not packaged else "adapter"
    if requested == "film" and packaged:
        raise ConfigError(
            f"[method] variant = 'film' trains the layer norms of a Hugging Face encoder; {encoder!r} is a packaged "
            "encoder, whose features PEFT Ensemble uses with variant = 'adapter' (or 'auto')."
        )
    if requested == "film" and encoder is None:
        raise ConfigError(
            "[method] variant = 'film' trains the layer norms of a pre-trained encoder: set [stream] encoder "
            "to a local Hugging Face model directory (an image model with its image processor, or a text encoder "
            "with its tokenizer), or use variant = 'adapter'."
        )
    return requested


@dataclass(frozen=True)
class PeftEnsembleSpec(DpSgdSpec):
    """PEFT Ensemble's DP-SGD plan (the same events and calibration as :class:`DpSgdSpec`), recording the
    variant (:func:`peft_variant`) in the plan's noise (``peft_variant``) and notes."""

    def plan_task(
        self, method: Mapping[str, Any], privacy: "PrivacySettings | Mapping[str, Any]", n_examples: int, task_index: int
    ) -> TaskPlan:
        import dataclasses

        variant = peft_variant(method)
        plan = super().plan_task(method, privacy, n_examples, task_index)
        what = (
            "per task, the scale and shift of every layer norm of the frozen pre-trained encoder plus a zero-initialised "
            "head, with per-example gradients from opacus (LayerNorm and Linear grad samplers)"
            if variant == "film"
            else "per task, a residual adapter (none when adapter_dim = 0) and a zero-initialised head on "
            "precomputed (frozen) features"
        )
        head = str(method_value(method, PEFT_KEYS, "head", "peft_ensemble"))
        labels = (
            "every public label of the stream (the labels the task lacks are its negatives)"
            if head == "label_space"
            else "the task's own public labels"
        )
        return dataclasses.replace(
            plan,
            noise={**plan.noise, "peft_variant": variant},
            notes=(
                *plan.notes,
                f"PEFT Ensemble variant {variant!r}: DP-SGD trains {what}; the head predicts {labels} (public, "
                "fixed before training: the same data, clipping and noise whatever its size).",
            ),
        )


#: ``[method] name = "cosine"``
COSINE = CosineSpec()
#: ``[method] name = "peft_ensemble"``
PEFT_ENSEMBLE = PeftEnsembleSpec(
    "peft_ensemble",
    PEFT_KEYS,
    False,
    "PEFT Ensemble trains a fresh member per task (an adapter, or the encoder's FiLM parameters, and a head) "
    "on that task's data only (Tobaben et al., Alg. 2).",
)
#: ``[method] name = "naive"``
NAIVE = DpSgdSpec("naive", DPSGD_KEYS, False, NAIVE_ASSUMPTION)
#: ``[method] name = "non_cl"``
NON_CL = DpSgdSpec("non_cl", DPSGD_KEYS, True, NON_CL_ASSUMPTION)
#: ``[method] name = "agem"``
AGEM = AGemSpec("agem", AGEM_KEYS, False, AGEM_ASSUMPTION)

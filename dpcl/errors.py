"""Typed errors raised by dpcl.

Every error carries a message that says what to change. The CLI maps them to
exit codes: :class:`InvalidParameterError` (and its subclasses) and :class:`WorkLimitError` -> 2,
:class:`PrivacyViolationError` (and its subclasses) -> 3.
"""

from __future__ import annotations


class DpclError(Exception):
    """Base class of every error dpcl raises on purpose."""

    exit_code: int = 2


class InvalidParameterError(DpclError, ValueError):
    """A parameter is outside the range where the requested number is defined.

    The message names the parameter, the value received and what is allowed.
    """

    exit_code = 2


class UnsupportedEventError(InvalidParameterError):
    """An accountant cannot soundly handle this event (e.g. PRV on a Laplace event)."""


class WorkLimitError(DpclError):
    """An input would need more processor time or memory than dpcl spends on one question (issue 18: an answer
    within 60 s and 2 GB, or this refusal); the message names the parameter and says what to change. Not a
    ``ValueError``: no accountant's fallback for a floating-point failure may take it for one."""

    exit_code = 2


class ConfigError(InvalidParameterError):
    """A configuration file is malformed: missing or unknown key, wrong type or range."""


class ExistingRunError(InvalidParameterError):
    """A run directory already holds a run (ledger, certificates, run state) and resuming was not asked for."""


class MethodPluginError(ConfigError):
    """An installed method plugin is invalid or conflicts with a built-in or another plugin (``dpcl.methods``)."""


class MalformedCertificateError(InvalidParameterError):
    """A certificate file cannot be parsed or lacks required fields."""


class LedgerCorruptError(DpclError):
    """A persisted ledger file is truncated, corrupt or inconsistent; it is never silently replaced."""

    exit_code = 2


class PrivacyViolationError(DpclError):
    """A configuration or action would break the stated privacy guarantee."""

    exit_code = 3


class BudgetExceededError(PrivacyViolationError):
    """A privacy filter refused an event because the budget would be exceeded."""


class LabelSpaceViolationError(PrivacyViolationError):
    """The label-space setting leaks private information (Tobaben et al., Prop. 4.6 / F.1)."""


class DisjointnessViolationError(PrivacyViolationError):
    """Tasks declared to hold disjoint privacy units share a unit."""


class VerificationError(PrivacyViolationError):
    """A certificate does not verify (stated epsilon, events or checkpoint hash disagree)."""


class UndeclaredReleaseError(PrivacyViolationError):
    """A plan does not declare whether its released checkpoint is covered (``TaskPlan.release is None``):
    such a release can be trained but never certified."""


class MissingDependencyError(DpclError):
    """An optional dependency or data source is missing; the message gives the install command."""

    exit_code = 2


class IncompleteInstallError(MissingDependencyError):
    """dpcl's own package metadata is missing (a source tree used without ``pip install -e .``): its built-in
    methods are registered there, through the ``dpcl.methods`` entry points."""


class DistributedRunError(DpclError):
    """A data-parallel run lost a process or its ranks disagree; what was certified stays, a rerun with --resume resumes."""

    exit_code = 2

"""DP continual-learning semantics: task ledger, label-space policy, per-token
budgets, Lifelong-DP bounds, method privacy plans, certificates. Never imports torch.

The names below are the layer's public surface (what a user or a method plugin imports): ``from
dpcl.guarantees import TaskPlan, verify_certificate``. Each is loaded from its module on first use, so
importing one name does not import the whole layer (``dpcl verify`` and the CLI start-up stay light). The
modules (``dpcl.guarantees.ledger``, ``.certificates``, ...) hold more, for dpcl's own use.
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> the module of dpcl.guarantees that defines it
_EXPORTS: dict[str, str] = {
    # how a method declares its keys and its privacy plan (the plugin surface)
    "EMPTY_TASK_RELEASE_KEY": "label_space",
    "METHOD_SPECS": "method_schema",
    "MethodKey": "method_schema",
    "MethodSpec": "method_schema",
    "REQUIRED": "method_schema",
    "ReleaseCoverage": "method_schema",
    "ScopedPlan": "method_schema",
    "TaskPlan": "method_schema",
    "get_method_spec": "method_schema",
    "method_value": "method_schema",
    "nonnegative": "method_schema",
    "nonnegative_int": "method_schema",
    "one_of": "method_schema",
    "open_unit_interval": "method_schema",
    "positive": "method_schema",
    "positive_int": "method_schema",
    "unit_interval": "method_schema",
    # the privacy settings, the config and its audit
    "PrivacySettings": "settings",
    "privacy_settings": "settings",
    "TrainingConfig": "config",
    "load_config": "config",
    "parse_config": "config",
    # the ledger and the label-space policy
    "Charge": "ledger",
    "GroupGuarantee": "ledger",
    "ReleaseRecord": "ledger",
    "StreamGuarantee": "ledger",
    "TaskLedger": "ledger",
    "FilterReport": "label_space",
    "LabelSpacePolicy": "label_space",
    "LifelongBound": "lifelong",
    "lifelong_bound": "lifelong",
    # certificates: the typed model; write, read, verify, sign, cross-check
    "Certificate": "certificate_model",
    "Guarantee": "certificate_model",
    "ScopedGuarantee": "certificate_model",
    "CompositionGroup": "certificate_model",
    "MIGRATIONS": "certificate_model",
    "json_field": "certificate_model",
    "CERTIFICATE_FORMAT": "certificates",
    "CERTIFICATE_VERSION": "certificates",
    "NonPrivateReleaseError": "certificates",
    "VerificationCheck": "certificates",
    "VerificationReport": "certificates",
    "content_sha256": "certificates",
    "read_certificate": "certificates",
    "verify_certificate": "certificates",
    "write_certificate": "certificates",
    "CrossCheckReport": "cross_check",
    "cross_check_certificate": "cross_check",
    "KeyFileError": "ed25519",
    "KeyPair": "ed25519",
    "generate_key_pair": "ed25519",
    "load_private_key": "ed25519",
    "load_public_key": "ed25519",
    "public_key_fingerprint": "ed25519",
    "sign_certificate": "signing",
    "sign_certificates": "signing",
    "write_report": "report",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Load a public name from its module on first use (PEP 562) and keep it here."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dpcl.guarantees' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"dpcl.guarantees.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

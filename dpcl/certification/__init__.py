"""The parts of :class:`dpcl.certifier.Certifier`, one concept each.

:mod:`~dpcl.certification.arguments` validates what a Certifier is opened with;
:mod:`~dpcl.certification.records` holds what it hands back (releases, DP-SGD plans);
:mod:`~dpcl.certification.assumptions` the sentences it states in every certificate;
:mod:`~dpcl.certification.scoped` its scoped statements; :mod:`~dpcl.certification.dpsgd_plans` the DP-SGD
schedules it checks steps against; :mod:`~dpcl.certification.noise` the noise generators it seeds and records;
:mod:`~dpcl.certification.releases` commits, certificates and releases; :mod:`~dpcl.certification.audit_report`
what ``dpcl audit`` (:mod:`dpcl.audit_config`, a dry run of the Certifier) reports. Import the public names from
:mod:`dpcl.certifier` (or ``dpcl``) and :mod:`dpcl.audit_config`.
"""

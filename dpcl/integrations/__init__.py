"""Integrations of :class:`dpcl.Certifier` with training libraries.

Each integration lives in its own module and is imported explicitly, so that
``import dpcl`` never pulls in a training framework:

* :mod:`dpcl.integrations.opacus` -- an opacus accountant (``PrivacyEngine(accountant="dpcl")``)
  that records every DP-SGD step into a Certifier task and computes epsilon with dpcl.
"""

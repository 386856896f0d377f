"""dpcl: checkable differential privacy for continual learning.

Layers (docs/architecture.md): ``dpcl._io`` (files that must not be lost),
``dpcl.accounting`` (mechanisms and numbers), ``dpcl.guarantees`` (task-wise DP
semantics, certificates), ``dpcl.audit`` (empirical lower bounds),
``dpcl.certifier``, ``dpcl.data``, ``dpcl.methods`` (torch), ``dpcl.runner``,
``dpcl.cli``. The first four never import torch (but ``dpcl.audit``'s two audits of a
torch training step).
"""

from dpcl._version import __version__

__all__ = ["Certifier", "ReleaseCoverage", "__version__"]


def __getattr__(name: str):
    """``from dpcl import Certifier, ReleaseCoverage``, imported on first use (``import dpcl`` stays light)."""
    if name == "Certifier":
        # lazy import: keeps `import dpcl` (and so CLI start-up) light
        from dpcl.certifier import Certifier

        return Certifier
    if name == "ReleaseCoverage":
        # lazy import: keeps `import dpcl` (and so CLI start-up) light
        from dpcl.guarantees.method_schema import ReleaseCoverage

        return ReleaseCoverage
    raise AttributeError(f"module 'dpcl' has no attribute {name!r}")

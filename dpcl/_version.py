"""The package version, in a leaf module: pyproject.toml reads it (``[tool.setuptools.dynamic]``), ``dpcl``
re-exports it, and lower layers (certificates, the report) import it from here instead of from ``dpcl``."""

__version__ = "0.1.0"

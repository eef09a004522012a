"""The package's version: the one place it is written (pyproject.toml reads it from here when building)."""

#: This package's version (PEP 440).
__version__ = "1.0.0.dev0"

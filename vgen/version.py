"""vgen's version (the one pyproject.toml declares), importable from any layer."""
__version__ = "0.1.0"

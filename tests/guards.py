"""Shared skip guards: tests that need the shipped zoo weights say so in one way."""
import pytest

import vgen


def needs_zoo(*names: str):
    """Skip unless every named zoo pipeline (default: the three shipped generators) is installed."""
    names = names or ("photos-gpt", "photos-nar", "photos-var")
    missing = [n for n in names if n not in vgen.list_models()]
    return pytest.mark.skipif(bool(missing), reason=f"zoo weights not installed: {', '.join(missing)}")

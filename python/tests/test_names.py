"""Every name the package uses is defined: pyflakes over kvferry/.

The GPU paths (kvferry.gpu_check, kvferry.gpu_model) need torch and transformers, which CI does
not have, so a name left undefined there would surface only on a GPU machine (it did once: the
WRITE check's requests all failed on 'profiled'). pyflakes reads the code without running it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "kvferry"


def _pyflakes():
    try:
        from pyflakes import api, messages, reporter  # Debian: python3-pyflakes
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("pyflakes is missing; .ci/run installs python3-pyflakes")
        pytest.skip("pyflakes is not installed (Debian: python3-pyflakes)")
    return api, messages, reporter


def test_no_name_is_used_undefined():
    api, messages, reporter = _pyflakes()
    found = []

    class Collect(reporter.Reporter):
        def __init__(self):
            super().__init__(None, None)

        def flake(self, message):
            if isinstance(message, (messages.UndefinedName, messages.UndefinedLocal,
                                    messages.UndefinedExport)):
                found.append(str(message))

        def syntaxError(self, filename, msg, lineno, offset, text):
            found.append(f"{filename}:{lineno}: {msg}")

        def unexpectedError(self, filename, msg):
            found.append(f"{filename}: {msg}")

    files = sorted(PACKAGE.rglob("*.py"))
    assert files, f"no Python files under {PACKAGE}"
    for f in files:
        api.checkPath(str(f), Collect())
    assert found == []

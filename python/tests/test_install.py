"""The package installs offline into a venv that sees Debian's python3-* packages."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_pip_installs_the_package_offline_without_build_isolation(tmp_path):
    if subprocess.run([sys.executable, "-c", "import ensurepip"], capture_output=True).returncode != 0:
        pytest.skip("python3-venv (ensurepip) is not installed")
    src = tmp_path / "src"
    shutil.copytree(PYTHON_DIR, src, ignore=shutil.ignore_patterns("tests", "build", "*.egg-info", "__pycache__"))
    venv = tmp_path / "venv"
    # What a user's shell has: no PYTHONPATH pointing at this checkout (the test runner sets one).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "--no-index", "--no-build-isolation", str(src)],
                         capture_output=True, text=True)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    check = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import kvferry.port, kvferry.vllm, kvferry.reference, kvferry.demo, kvferry;"
                            "print(kvferry.port.__file__)"], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert check.returncode == 0, check.stderr
    assert str(venv) in check.stdout
    ref = subprocess.run([str(venv / "bin" / "kvferry-reference"), "--help"], capture_output=True, text=True,
                         env=env)
    assert ref.returncode == 0 and "--no-connector" in ref.stdout

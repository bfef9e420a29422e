"""scripts/gpu-model.sh's watch over its JVMs and its check, without a GPU: the script itself, with
stand-ins for the Java runtime (processes that sleep, or exit as a node that cannot bind its port
does) and for kvferry.gpu_check (a process that starts a child, as the check starts its engines,
and stops it in a finally). What is checked: the exit status, and that nothing is left running."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-model.sh"

# Distinct sleep lengths, so leftovers of this test are found and of nothing else.
JVM_SLEEP = "3017"
ENGINE_SLEEP = "3019"

STAND_IN_CHECK = f'''
import os, signal, subprocess, sys, time
def main(argv):
    signal.signal(signal.SIGTERM, lambda s, f: sys.exit(128 + s))
    engine = subprocess.Popen(["sleep", "{ENGINE_SLEEP}"])
    try:
        time.sleep(float(os.environ["CHECK_S"]))
        return 0
    finally:
        engine.terminate()
        print("check: engines stopped", flush=True)
'''


def _leftovers() -> list[str]:
    out = subprocess.run(["pgrep", "-af", f"sleep ({JVM_SLEEP}|{ENGINE_SLEEP})"],
                         capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line.strip()]


@pytest.fixture
def bundle(tmp_path: Path) -> Iterator[Path]:
    if shutil.which("setsid") is None or shutil.which("pgrep") is None:
        pytest.skip("needs setsid and pgrep (util-linux, procps)")
    text = SCRIPT.read_text()
    # No torch or transformers here: the version line goes; the JVMs become stand-ins.
    version_line = next(line for line in text.splitlines() if "import torch, transformers" in line)
    text = text.replace(version_line + "\n", "")
    marker = "kvferry() {\n"
    assert marker in text, "gpu-model.sh's kvferry() function moved: update this test"
    text = text.replace(marker, marker
                        + '  if [ "$1" = node ] && [ "$3" = "${DIE_ROLE:-none}" ]; then\n'
                        + '    echo "Bind failed: address already in use"; sleep 1; return 1\n'
                        + '  fi\n', 1)
    (tmp_path / "gpu-model.sh").write_text(text)
    # The script's own launch line runs this stand-in for java: a process of its own, as the JVM
    # is, so a node the script only thinks it stopped is found as a leftover.
    java = tmp_path / "java"
    java.write_text(f"#!/usr/bin/env bash\nexec sleep {JVM_SLEEP}\n")
    java.chmod(0o755)
    (tmp_path / "gpu-env.sh").write_text(f"JAVA={java}\nCP=unused\nCUDA_PROPS=()\n")
    pkg = tmp_path / "python" / "kvferry"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "gpu_check.py").write_text(STAND_IN_CHECK)
    yield tmp_path
    # A failed case may leave its stand-ins running; they must not fail the next case.
    subprocess.run(["pkill", "-f", f"sleep ({JVM_SLEEP}|{ENGINE_SLEEP})$"], capture_output=True)


def _run(bundle: Path, check_s: float, timeout_s: float | None = None, die: str | None = None):
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "DIE_ROLE")}
    env["CHECK_S"] = str(check_s)
    env["KVFERRY_PORT_BASE"] = "29000"
    if die:
        env["DIE_ROLE"] = die
    cmd = ["bash", str(bundle / "gpu-model.sh"), "0", "0"]
    if timeout_s is not None:
        cmd = ["timeout", str(timeout_s)] + cmd
    start = time.monotonic()
    # From the bundle: python3 -c puts the working directory first on its path.
    proc = subprocess.run(cmd, env=env, cwd=bundle, capture_output=True, text=True, timeout=120)
    return proc, time.monotonic() - start


def _no_leftovers() -> list[str]:
    deadline = time.monotonic() + 5
    while _leftovers() and time.monotonic() < deadline:
        time.sleep(0.1)
    return _leftovers()


def test_a_check_that_ends_gives_its_status_and_leaves_nothing(bundle: Path):
    proc, _ = _run(bundle, check_s=1)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "check: engines stopped" in proc.stdout
    assert _no_leftovers() == []


def test_a_node_that_exits_stops_the_check_at_once_with_exit_3(bundle: Path):
    proc, took = _run(bundle, check_s=60, die="decode")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "the decode JVM exited during the check" in proc.stderr
    assert "Bind failed" in proc.stderr  # its log's tail
    assert "check: engines stopped" in proc.stdout  # SIGTERM ran the check's finally
    assert took < 30, f"took {took:.1f} s: the check waited instead of being stopped"
    assert _no_leftovers() == []


def test_a_timeout_on_the_script_leaves_no_check_or_engine_behind(bundle: Path):
    # timeout signals the script's process group; the check runs in its own session.
    proc, took = _run(bundle, check_s=60, timeout_s=3)
    assert proc.returncode == 124, proc.stdout + proc.stderr
    assert took < 30, f"took {took:.1f} s"
    assert _no_leftovers() == []

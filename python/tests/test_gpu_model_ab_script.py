"""scripts/gpu-model-ab.sh's MPS variant, without a GPU: the script itself with a stand-in for
gpu-model.sh (it records what a run saw) and for nvidia-cuda-mps-control (a daemon marker in its
pipe folder). What is checked: the daemon runs during that variant's run and only then, its
clients are pointed at it, it is quit afterwards, and its log and temporary folders are handled."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-model-ab.sh"

STAND_IN_RUN = """#!/usr/bin/env bash
# Records the MPS pipe folder this run was given and whether a daemon was up in it.
pipe=${CUDA_MPS_PIPE_DIRECTORY:-}
up=no; [ -n "$pipe" ] && [ -f "$pipe/daemon" ] && up=yes
echo "run pipe=${pipe:-none} daemon=$up args=$*" >> "$RECORD"
echo "TTFT write n=1024: stand-in"
"""

STAND_IN_CONTROL = """#!/usr/bin/env bash
# nvidia-cuda-mps-control: -d starts the daemon (a process named as one, with the caller's
# environment, its pid in the pipe folder); on stdin, get_server_list, get_client_list and quit.
: "${CUDA_MPS_PIPE_DIRECTORY:?}" "${CUDA_MPS_LOG_DIRECTORY:?}"
if [ "${1:-}" = -d ]; then
  (exec -a nvidia-cuda-mps-control-daemon sleep 3029) > /dev/null 2>&1 < /dev/null &
  echo $! > "$CUDA_MPS_PIPE_DIRECTORY/daemon"; echo "started" > "$CUDA_MPS_LOG_DIRECTORY/control.log"
  echo "control -d" >> "$RECORD"; exit 0
fi
read -r cmd
echo "control $cmd" >> "$RECORD"
case $cmd in
  get_server_list) echo 4242 ;;
  get_client_list*) echo $$ ;;
  quit) [ "${QUIT_HANGS:-0}" = 1 ] && exec sleep 3023
        kill "$(cat "$CUDA_MPS_PIPE_DIRECTORY/daemon")"; rm -f "$CUDA_MPS_PIPE_DIRECTORY/daemon" ;;
esac
"""


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def scripts(tmp_path: Path) -> Iterator[Path]:
    if shutil.which("pgrep") is None:
        pytest.skip("needs pgrep (procps)")
    here = tmp_path / "scripts"
    here.mkdir()
    shutil.copy(SCRIPT, here / "gpu-model-ab.sh")
    _executable(here / "gpu-model.sh", STAND_IN_RUN)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _executable(bin_dir / "nvidia-cuda-mps-control", STAND_IN_CONTROL)
    yield here
    # A failed case may leave its stand-ins running; they must not fail the next case.
    subprocess.run(["pkill", "-f", "(sleep|daemon) 30(23|29)$"], capture_output=True)


def _ab(scripts: Path, *variants: str, stop_after_s: int | None = None,
        **env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """One round of the variants; ``stop_after_s``: an outer timeout stops the script then."""
    record = scripts.parent / "record.txt"
    record.touch()
    before = set(Path("/tmp").glob("kvferry-mps.*"))
    run_env = dict(os.environ, OUT=str(scripts.parent / "out" / "ab"), RECORD=str(record),
                   PATH=f"{scripts.parent / 'bin'}:{os.environ['PATH']}", **env)
    outer = [] if stop_after_s is None else ["timeout", str(stop_after_s)]
    done = subprocess.run([*outer, "bash", str(scripts / "gpu-model-ab.sh"), "1", "0", "0", *variants,
                           "--", "--prompts", "0"], env=run_env, capture_output=True, text=True,
                          timeout=120)
    assert set(Path("/tmp").glob("kvferry-mps.*")) == before, "an MPS folder was left in /tmp"
    return done, record.read_text().splitlines()


def test_only_the_mps_variant_runs_under_a_daemon_that_is_quit_after_it(scripts: Path):
    done, record = _ab(scripts, "plain=", "mps=%KVFERRY_MPS=1")
    assert done.returncode == 0, done.stderr
    runs = [line for line in record if line.startswith("run ")]
    assert runs[0].startswith("run pipe=none daemon=no"), record
    assert "daemon=yes" in runs[1] and "/tmp/kvferry-mps." in runs[1], record
    controls = [line for line in record if line.startswith("control")]
    assert controls == ["control -d", "control get_server_list", "control get_client_list 4242",
                        "control quit"], record
    assert record.index("control -d") < record.index(runs[1]) < record.index("control quit")
    out = scripts.parent / "out" / "ab"
    assert (out / "mps-1" / "mps-control.log").read_text() == "started\n"
    console = (out / "mps-1" / "console.txt").read_text()
    assert "MPS servers during the run: 4242" in console
    assert "MPS server 4242's clients after the run: " in console
    assert not (out / "plain-1" / "mps-control.log").exists()


def _pids(pattern: str) -> list[str]:
    return subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()


def test_a_daemon_that_does_not_quit_is_killed_and_no_other(scripts: Path, tmp_path: Path):
    # Another MPS daemon of the same user (its own pipe folder) must outlive the run.
    other = subprocess.Popen(["bash", "-c", "exec -a nvidia-cuda-mps-control-daemon sleep 3031"],
                             env=dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(tmp_path / "other")))
    try:
        done, record = _ab(scripts, "mps=%KVFERRY_MPS=1", QUIT_HANGS="1", MPS_QUIT_S="2")
        assert done.returncode == 0, done.stderr
        assert "did not quit in 2 s; killed" in done.stdout
        assert _pids("sleep 3023") == [], "the hung control is still running"
        assert _pids("nvidia-cuda-mps-control-daemon 3029") == [], "the run's daemon is still running"
        assert other.poll() is None, "another daemon of the user was killed"
    finally:
        other.kill()
        other.wait()


def test_a_daemon_is_quit_when_the_script_is_stopped_during_its_run(scripts: Path):
    # The run's stand-in waits long enough for the test to stop the script (an outer timeout).
    (scripts / "gpu-model.sh").write_text(STAND_IN_RUN.replace('echo "TTFT', 'sleep 8; echo "TTFT'))
    done, record = _ab(scripts, "mps=%KVFERRY_MPS=1", stop_after_s=3)
    assert done.returncode == 124
    assert "control quit" in record, record
    assert _pids("nvidia-cuda-mps-control-daemon 3029") == []


def test_without_the_mps_control_program_the_variant_is_refused_before_any_run(scripts: Path):
    if shutil.which("nvidia-cuda-mps-control"):
        pytest.skip("this host has the real nvidia-cuda-mps-control on PATH")
    (scripts.parent / "bin" / "nvidia-cuda-mps-control").unlink()
    done, record = _ab(scripts, "mps=%KVFERRY_MPS=1")
    assert done.returncode == 2
    assert "KVFERRY_MPS=1 in mps, but no nvidia-cuda-mps-control on PATH" in done.stderr
    assert record == [], record

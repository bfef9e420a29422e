"""Real kvferry nodes (JVMs from the jar) and reference engines (Python processes) for the
end-to-end tests. The jar comes from env KVFERRY_JAR, default ../cli/target/kvferry.jar."""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JAR = os.environ.get("KVFERRY_JAR") or os.path.join(PYTHON_DIR, "..", "cli", "target", "kvferry.jar")
JAVA = shutil.which("java")


def skip_reason() -> str | None:
    if not os.path.exists(JAR):
        return (f"kvferry jar not found at {os.path.abspath(JAR)}: build it (./mvnw -B -q package -pl cli -am "
                "-DskipTests) or set KVFERRY_JAR")
    if JAVA is None:
        return "java is not on PATH"
    return None


needs_node = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")


# Ports free_port() has handed out in this process (as dev.kvferry.node.FreePorts does for the
# JVMs). A port is free again once its probe socket closes, so the kernel may hand it out twice
# before the first process binds it: a router's HTTP port once came back as a node's cluster port,
# and the router failed to bind (docs/results/2026-12-03-router-plain-futures-ab.txt).
_handed_out: set[int] = set()
_handed_out_lock = threading.Lock()


def free_port() -> int:
    """A loopback port free now and not handed out before by this process."""
    with _handed_out_lock:
        for _ in range(100):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            if port not in _handed_out:
                _handed_out.add(port)
                return port
    raise OSError("no fresh loopback port after 100 attempts")


# The tests' JVMs start fast: C1 only and the serial collector. A JVM started ``in_service`` runs
# with the JVM's defaults instead, as `kvferry node` and `kvferry router` start them (benchmarks).
FAST_START_FLAGS = ("-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")


def jvm_threads_started(pid: int) -> int | None:
    """Threads a JVM has started since it began (jcmd's java.threads.started); None without jcmd."""
    try:
        out = subprocess.run(["jcmd", str(pid), "PerfCounter.print"], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"^java\.threads\.started=(\d+)", out, re.M)
    return int(m.group(1)) if m else None


class JvmProcess:
    """One JVM from the jar (``args`` after ``-jar JAR``), its stdout and stderr appended to ``log``;
    ``start()`` again after ``stop()`` or ``kill9()`` restarts it with the same command.
    ``jvm_options`` go before ``-jar``; ``in_service`` drops the fast-start flags."""

    def __init__(self, log: str, args: list[str], config: dict[str, str] | None = None, *,
                 jvm_options: list[str] | None = None, in_service: bool = False):
        self.log = log
        props = [f"-D{k}={v}" for k, v in (config or {}).items()]  # config overrides (system properties)
        flags = [] if in_service else list(FAST_START_FLAGS)
        self.cmd = [JAVA or "java", "-Xmx384m", *flags, *(jvm_options or []), *props, "-jar", JAR, *args]
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def kill9(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill9()

    def tail(self, n: int = 40) -> str:
        try:
            with open(self.log, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except FileNotFoundError:
            return ""


def _accepts(family: int, address: object) -> bool:
    s = socket.socket(family)
    s.settimeout(2)
    try:
        s.connect(address)
        return True
    except OSError:
        return False
    finally:
        s.close()


class Node(JvmProcess):
    """One `kvferry node --engine port` JVM."""

    def __init__(self, workdir: str, role: str, *, engine_id: str, modes: str = "write,read", tp: int = 1,
                 seed_port: int | None = None, port: int | None = None, socket_path: str | None = None,
                 config: dict[str, str] | None = None, in_service: bool = False,
                 extra_args: list[str] | None = None):
        self.role = role
        self.port = port or free_port()
        self.socket = socket_path or os.path.join(workdir, f"{role}-{engine_id}.sock")
        seeds = f"127.0.0.1:{seed_port or self.port}"
        management_port = free_port()
        self.management_port = management_port
        self.management_url = f"http://127.0.0.1:{management_port}"
        super().__init__(os.path.join(workdir, f"node-{role}-{engine_id}-{time.monotonic_ns()}.log"),
                         ["node", "--role", role, "--engine-id", engine_id, "--mode", modes, "--engine", "port",
                          "--engine-socket", self.socket, "--tp-size", str(tp), "--port", str(self.port),
                          "--management-port", str(management_port), "--seed-nodes", seeds,
                          *(extra_args or [])],
                         config, in_service=in_service)

    def wait_ready(self, timeout_s: float = 120) -> None:
        """Until the node takes connections on its engine socket and on its management port: the
        two open independently, and a test that reads a metric right away needs the second."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"node {self.role} exited with {self.proc.returncode}:\n{self.tail()}")
            if _accepts(socket.AF_UNIX, self.socket) and _accepts(socket.AF_INET, ("127.0.0.1", self.management_port)):
                return
            time.sleep(0.2)
        raise RuntimeError(f"node {self.role} did not open {self.socket} and management port "
                           f"{self.management_port} in {timeout_s} s:\n{self.tail()}")


class Engine:
    """One reference engine process; ``url`` once it printed its ready line."""

    def __init__(self, workdir: str, name: str, *args: str, ready_timeout_s: float = 120):
        self.name = name
        self.log = os.path.join(workdir, f"engine-{name}-{time.monotonic_ns()}.log")
        env = dict(os.environ, PYTHONPATH=PYTHON_DIR, PYTHONDONTWRITEBYTECODE="1")
        self.cmd = [sys.executable, "-m", "kvferry.reference", "--http-port", "0", "--log-level", "INFO", *args]
        self._out = open(self.log, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=self._out, text=True, env=env)
        self.url: str | None = None
        ready = threading.Event()

        def read() -> None:
            for line in self.proc.stdout:  # type: ignore[union-attr]
                self._out.write(line)
                self._out.flush()
                if line.startswith("kvferry-reference ready "):
                    self.url = line.split()[-1]
                    ready.set()

        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + ready_timeout_s
        while not ready.wait(0.2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"engine {name} not ready (exit {self.proc.returncode}):\n{self.tail()}")

    def stats(self) -> dict[str, Any]:
        return get(self.url, "/kvferry/stats")

    def kill9(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)
        # A killed engine cannot remove its cache files; the test does (they are its pid's).
        for f in glob.glob(f"/dev/shm/kvferry-ref-*-{self.proc.pid}-*-rank*"):
            os.unlink(f)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill9()
        self._out.close()

    def tail(self, n: int = 40) -> str:
        try:
            with open(self.log, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except (FileNotFoundError, ValueError):
            return ""


def get(url: str, path: str) -> dict:
    with urllib.request.urlopen(url + path, timeout=30) as r:
        return json.loads(r.read())


def metric(url: str, name: str) -> float:
    """One series of a JVM's `/metrics` (Prometheus text format): a name, labels included if any."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"no {name} in {url}/metrics")


def complete(url: str, prompt: list[int], max_tokens: int, params: dict | None = None,
             request_id: str | None = None, timeout: float = 120) -> dict:
    body: dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens}
    if params is not None:
        body["kv_transfer_params"] = params
    headers = {"Content-Type": "application/json"}
    if request_id:
        headers["X-Request-Id"] = request_id
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise AssertionError(f"HTTP {e.code} from {url}: {e.read().decode()[:500]}") from None


def settle(engine: Engine, timeout_s: float = 60) -> dict:
    """Waits until the engine has nothing in flight and every block free; returns its stats."""
    deadline = time.monotonic() + timeout_s
    s = engine.stats()
    while time.monotonic() < deadline:
        s = engine.stats()
        if (s["free_blocks"] == s["num_blocks"] and not s["running"] and not s["waiting"]
                and not s["delayed_free"]):
            return s
        time.sleep(0.1)
    return s


def workdir() -> str:
    return tempfile.mkdtemp(prefix="kvferry-pytest-")

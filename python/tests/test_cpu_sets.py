"""scripts/cpu_sets.py: whole physical cores per engine from the kernel's CPU topology (a
stand-in sysfs), so no set shares a core's threads with another."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "cpu_sets.py"


def _sysfs(tmp: Path, siblings: dict[int, str], online: str | None = None) -> Path:
    for cpu, sib in siblings.items():
        topo = tmp / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        if sib:
            (topo / "thread_siblings_list").write_text(sib + "\n")
    if online is not None:
        (tmp / "online").write_text(online + "\n")
    return tmp


def _run(sysfs: Path, *args: str, allowed: str = "0-63") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--sysfs", str(sysfs), "--allowed", allowed, *args],
                          capture_output=True, text=True, timeout=30)


def test_threads_numbered_apart_stay_with_their_core(tmp_path: Path):
    # Eight cores, two threads each, a core's threads i and i + 8 (as many x86 hosts number them).
    sysfs = _sysfs(tmp_path, {c: f"{c % 8},{c % 8 + 8}" for c in range(16)})
    out = _run(sysfs)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "0-1,8-9:2-3,10-11:4-7,12-15"
    assert _run(sysfs, "--describe").stdout.strip() == (
        "8 physical cores, 16 CPUs: 0,8 1,9 2,10 3,11 4,12 5,13 6,14 7,15")


def test_adjacent_siblings_and_the_core_counts_asked(tmp_path: Path):
    sysfs = _sysfs(tmp_path, {c: f"{c - c % 2}-{c - c % 2 + 1}" for c in range(8)})
    assert _run(sysfs, "--p-cores", "1", "--d-cores", "2").stdout.strip() == "0-1:2-5:6-7"


def test_offline_cpus_and_missing_topology_files(tmp_path: Path):
    # cpu3 offline; cpu4 has no topology file (a core of its own).
    sysfs = _sysfs(tmp_path, {0: "0", 1: "1", 2: "2", 3: "3", 4: ""}, online="0-2,4")
    assert _run(sysfs, "--p-cores", "1", "--d-cores", "1").stdout.strip() == "0:1:2,4"


def test_too_few_cores_is_refused_with_the_count(tmp_path: Path):
    sysfs = _sysfs(tmp_path, {0: "0,1", 1: "0,1", 2: "2,3", 3: "2,3"})
    out = _run(sysfs)
    assert out.returncode == 2
    assert "2 physical cores here; 2 for P, 2 for D and at least one for the JVMs need 5" in out.stderr
    assert out.stdout == ""


def test_only_cores_whose_every_thread_this_process_may_use(tmp_path: Path):
    # A cpuset of 0-5 and 8-9: cores 4 and 5 have their second threads (12, 13) outside it.
    sysfs = _sysfs(tmp_path, {c: f"{c % 8},{c % 8 + 8}" for c in range(16)})
    out = _run(sysfs, "--p-cores", "1", "--d-cores", "1", allowed="0-5,8-9")
    assert out.returncode == 2  # cores 0 and 1 only: one for each engine, none for the JVMs
    assert "2 physical cores here" in out.stderr
    out = _run(sysfs, "--p-cores", "1", "--d-cores", "1", allowed="0-2,8-10")
    assert out.stdout.strip() == "0,8:1,9:2,10"


def test_the_default_is_this_process_s_own_affinity():
    out = subprocess.run([sys.executable, str(SCRIPT), "--describe"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert "physical cores" in out.stdout

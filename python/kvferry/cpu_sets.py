"""CPU sets of whole physical cores for P's engine, D's engine and the JVMs (router and nodes),
as scripts/gpu-model-ab.sh's +P_CPUS:D_CPUS:NODE_CPUS takes them.

usage: scripts/cpu_sets.py (or python3 -m kvferry.cpu_sets) [--p-cores N] [--d-cores N] [--sysfs DIR] [--allowed LIST] [--describe]

Each engine gets N physical cores with every hardware thread of them; the JVMs get the cores
left. So no thread of one set shares a core with another set's (a CPU list such as 0-3 need not
be whole cores where the machine numbers a core's two threads apart, e.g. 0 and 8). The cores
are taken in order of their first CPU, P's first. Only CPUs this process may run on count (its
affinity, which a container's cpuset narrows; --allowed instead, for a --sysfs tree that is not
this machine's); a core with a thread outside them is left out, as taskset could not give it
whole. --describe prints the machine's cores instead."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def parse_list(text: str) -> list[int]:
    """A kernel CPU list ("0-3,8,10-11"), as taskset and gpu_check's --pin-cpus take it, as its
    CPUs."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def format_list(cpus: list[int]) -> str:
    """CPUs as a compact kernel CPU list, runs joined with '-'."""
    out: list[str] = []
    cpus = sorted(set(cpus))
    i = 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(out)


def cores(sysfs: Path, allowed: set[int] | None = None) -> list[list[int]]:
    """The online physical cores whose every thread is in ``allowed`` (None: all), each as its
    hardware threads, ordered by their first CPU."""
    online_file = sysfs / "online"
    online = set(parse_list(online_file.read_text())) if online_file.exists() else None
    seen: dict[tuple[int, ...], None] = {}
    for d in sorted(sysfs.glob("cpu[0-9]*"), key=lambda p: int(p.name[3:])):
        cpu = int(d.name[3:])
        if online is not None and cpu not in online:
            continue
        siblings = d / "topology" / "thread_siblings_list"
        threads = parse_list(siblings.read_text()) if siblings.exists() else [cpu]
        if online is not None:
            threads = [t for t in threads if t in online]
        if allowed is not None and not set(threads) <= allowed:
            continue
        seen.setdefault(tuple(sorted(threads)), None)
    return sorted((list(c) for c in seen), key=lambda c: c[0])


def split(all_cores: list[list[int]], p_cores: int, d_cores: int) -> tuple[list[int], list[int], list[int]]:
    if p_cores < 1 or d_cores < 1:
        raise ValueError("each engine needs at least one core")
    need = p_cores + d_cores + 1
    if len(all_cores) < need:
        raise ValueError(f"{len(all_cores)} physical cores here; {p_cores} for P, {d_cores} for D "
                         f"and at least one for the JVMs need {need}")
    flat = lambda cs: [t for c in cs for t in c]  # noqa: E731
    return (flat(all_cores[:p_cores]), flat(all_cores[p_cores:p_cores + d_cores]),
            flat(all_cores[p_cores + d_cores:]))


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--p-cores", type=int, default=2)
    ap.add_argument("--d-cores", type=int, default=2)
    ap.add_argument("--sysfs", type=Path, default=Path("/sys/devices/system/cpu"))
    ap.add_argument("--allowed", default=None, help="CPU list to choose from (default: this process's affinity)")
    ap.add_argument("--describe", action="store_true")
    a = ap.parse_args(argv)
    if a.allowed is not None:
        allowed: set[int] | None = set(parse_list(a.allowed))
    elif hasattr(os, "sched_getaffinity"):
        allowed = set(os.sched_getaffinity(0))
    else:
        allowed = None
    found = cores(a.sysfs, allowed)
    if not found:
        print(f"no CPUs under {a.sysfs}", file=sys.stderr)
        return 2
    if a.describe:
        print(f"{len(found)} physical cores, {sum(map(len, found))} CPUs: "
              + " ".join(format_list(c) for c in found))
        return 0
    try:
        p, d, rest = split(found, a.p_cores, a.d_cores)
    except ValueError as e:
        print(f"cpu_sets: {e}", file=sys.stderr)
        return 2
    print(f"{format_list(p)}:{format_list(d)}:{format_list(rest)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

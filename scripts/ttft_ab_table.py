#!/usr/bin/env python3
"""The paired TTFT estimates of a scripts/gpu-model-ab.sh call as one markdown table.

usage: scripts/ttft_ab_table.py AB.tgz|AB_DIR [MORE...] [--mode write|read]

Each run's console.txt (AB_DIR/<variant>-<round>/console.txt, or the same inside the call's
.tgz) holds gpu_check's lines "TTFT <mode> n=<len> paired, <what>: <median> ms [95% CI lo, hi]".
One row per run, in the order the runs ran; a cell is "median [lo, hi]" in ms as printed, "-"
where the run was cut before that row."""

from __future__ import annotations

import argparse
import re
import sys
import tarfile
from pathlib import Path

COLUMNS = [
    ("P's prefill, added", "P's prefill, added"),
    ("KV in place after P's prefill", "KV in place after P's prefill"),
    ("D's first token, added", "D's first token, added"),
    ("added (matched)", "added, without = P's prefill in P's process + first token in D's"),
    ("added (against D's process)", "added, without = D's process"),
]
LINE = re.compile(r"^\s*TTFT (?P<mode>\w+) n=(?P<n>\d+) paired, (?P<what>.+?): "
                  r"(?P<median>-?[\d.]+) ms \[95% CI (?P<lo>-?[\d.]+), (?P<hi>-?[\d.]+)\]")


def consoles(source: Path) -> list[tuple[str, str]]:
    """(run name, console text) per run, by each console's last write (in a call's archive, the
    order the A/B ran them; a checked-out folder's times are all alike, and then by name)."""
    runs: list[tuple[float, str, str]] = []
    if source.is_dir():
        for f in source.glob("*/console.txt"):
            runs.append((f.stat().st_mtime, f.parent.name, f.read_text(errors="replace")))
    else:
        with tarfile.open(source) as tar:
            for m in tar.getmembers():
                parts = Path(m.name).parts
                if len(parts) == 3 and parts[2] == "console.txt":
                    f = tar.extractfile(m)
                    if f is not None:
                        runs.append((m.mtime, parts[1], f.read().decode(errors="replace")))
    return [(name, text) for _, name, text in sorted(runs)]


def estimates(text: str, mode: str) -> dict[tuple[int, str], str]:
    found: dict[tuple[int, str], str] = {}
    for line in text.splitlines():
        m = LINE.match(line)
        if m and m["mode"] == mode:
            found.setdefault((int(m["n"]), m["what"]), f"{m['median']} [{m['lo']}, {m['hi']}]")
    return found


def table(sources: list[Path], mode: str) -> str:
    runs = [(src, run, estimates(text, mode)) for src in sources for run, text in consoles(src)]
    if not runs:
        raise SystemExit(f"no run consoles in {', '.join(map(str, sources))}")
    lengths = sorted({n for _, _, e in runs for n, _ in e})
    head = ["run"] + [f"{label}, {n:,}" for label, _ in COLUMNS for n in lengths]
    out = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for src, run, e in runs:
        where = f"{src.name}: " if len(sources) > 1 else ""
        cells = [e.get((n, what), "-") for _, what in COLUMNS for n in lengths]
        out.append("| " + " | ".join([where + run] + cells) + " |")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sources", nargs="+", type=Path)
    ap.add_argument("--mode", default="write", choices=["write", "read"])
    a = ap.parse_args(argv)
    missing = [str(s) for s in a.sources if not s.exists()]
    if missing:
        ap.error(f"no such file or folder: {', '.join(missing)}")
    print(table(a.sources, a.mode))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env python3
"""Markdown table of one committed `kvferry bench --json` run, for README.md and docs.

usage: scripts/bench_table.py RESULTS_FILE [--update DOC.md ...]

RESULTS_FILE is a file under docs/results/: header lines starting with '#' (date, commit,
machine, command), then the bench's raw stdout, whose last line is {"rows": [...]}. Without
--update the table is printed; with it, the text between
<!-- bench-table RESULTS_FILE --> and <!-- /bench-table --> in each DOC is replaced, so the
published figures are exactly the file's (rounded as the bench's own table rounds them).
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def figure(v: float | None) -> str:
    if v is None:
        return "-"
    a = abs(v)
    if a >= 100:
        return f"{v:,.1f}"
    if a >= 1:
        return f"{v:.3f}"
    return f"{v:.4f}"


def ratio(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.0f}x" if v >= 100 else f"{v:.2f}x"


def verdict(row: dict) -> str:
    if row.get("failed"):
        return "**FAILED**"
    if row["goal"] is None or row["ratio"] is None:
        return ""
    return "met" if row["ratio"] >= row["goal"] else "**missed**"


def rows_of(results: Path) -> list[dict]:
    lines = [l for l in results.read_text().splitlines() if l.startswith('{"rows"')]
    if not lines:
        sys.exit(f"{results}: no {{\"rows\": ...}} line (was the bench run with --json?)")
    return json.loads(lines[-1])["rows"]


def table(results: Path) -> str:
    out = [
        "| row | unit | kvferry | peer | ratio (higher is better for kvferry) | goal | |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows_of(results):
        goal = "-" if r["goal"] is None else ">= " + ratio(r["goal"])
        out.append(
            f"| {r['name']} | {r['unit']} | {figure(r['kvferry'])} | {figure(r['peer'])} "
            f"| {ratio(r['ratio'])} | {goal} | {verdict(r)} |"
        )
    return "\n".join(out) + "\n"


def update(doc: Path, results: Path) -> None:
    text = doc.read_text()
    pattern = re.compile(
        r"(<!-- bench-table " + re.escape(str(results)) + r" -->\n)(.*?)(<!-- /bench-table -->)",
        re.S,
    )
    if not pattern.search(text):
        sys.exit(f"{doc}: no <!-- bench-table {results} --> ... <!-- /bench-table --> block")
    doc.write_text(pattern.sub(lambda m: m.group(1) + table(results) + m.group(3), text))


def main(argv: list[str]) -> None:
    if not argv or argv[0].startswith("-"):
        sys.exit(__doc__)
    results = Path(argv[0])
    if len(argv) > 1:
        if argv[1] != "--update" or len(argv) < 3:
            sys.exit(__doc__)
        for doc in argv[2:]:
            update(Path(doc), results)
    else:
        sys.stdout.write(table(results))


if __name__ == "__main__":
    main(sys.argv[1:])

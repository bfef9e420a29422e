"""scripts/ttft_ab_table.py: the paired TTFT lines of an A/B call's runs as one table, runs in
the order they ran, a run cut before a row shown as '-'."""

from __future__ import annotations

import importlib.util
import io
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("ttft_ab_table", ROOT / "scripts" / "ttft_ab_table.py")
assert spec is not None and spec.loader is not None
ttft_ab_table = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ttft_ab_table)

FULL = """TTFT write n=1024: disaggregated 24.78 ms, without 20.34 ms, added 4.44 ms
  TTFT write n=1024 paired, added, without = D's process: 4.118 ms [95% CI 2.473, 6.516], n=20; goal <= 1.022 ms: NOT met
  TTFT write n=1024 paired, P's prefill, added: 1.269 ms [95% CI 0.924, 1.493], n=20
  TTFT write n=4096 paired, P's prefill, added: -0.5 ms [95% CI -1.0, 0.25], n=20
  TTFT read n=1024 paired, P's prefill, added: 9.999 ms [95% CI 9.0, 11.0], n=20
  paired, added, without = D's process: 4.118 ms [95% CI 2.473, 6.516], n=20; goal <= 1.022 ms: NOT met
"""
CUT = "  TTFT write n=1024 paired, P's prefill, added: 0.308 ms [95% CI 0.058, 0.767], n=20\n"


def _archive(path: Path, runs: list[tuple[str, str, int]]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, text, mtime in runs:
            data = text.encode()
            info = tarfile.TarInfo(f"ab/{name}/console.txt")
            info.size, info.mtime = len(data), mtime
            tar.addfile(info, io.BytesIO(data))
    return path


def test_rows_follow_the_run_order_and_cut_rows_show_a_dash(tmp_path: Path):
    # b-1 ran first: by name it would come second.
    tgz = _archive(tmp_path / "ab.tgz", [("a-1", CUT, 200), ("b-1", FULL, 100)])
    lines = ttft_ab_table.table([tgz], "write").splitlines()
    assert lines[0].startswith("| run | P's prefill, added, 1,024 | P's prefill, added, 4,096 |")
    assert lines[2].startswith("| b-1 | 1.269 [0.924, 1.493] | -0.5 [-1.0, 0.25] |")
    assert lines[3].startswith("| a-1 | 0.308 [0.058, 0.767] | - |")
    assert "4.118 [2.473, 6.516]" in lines[2]  # against D's process, from its first line only
    assert "9.999" not in "\n".join(lines)     # another mode's row


def test_a_folder_reads_like_its_archive(tmp_path: Path):
    for name, text in (("x-1", FULL), ("y-1", CUT)):
        (tmp_path / "ab" / name).mkdir(parents=True)
        (tmp_path / "ab" / name / "console.txt").write_text(text)
    assert "| x-1 | 1.269" in ttft_ab_table.table([tmp_path / "ab"], "write")


def test_a_missing_source_is_named_and_nothing_printed(tmp_path: Path):
    import subprocess
    import sys
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "ttft_ab_table.py"), str(tmp_path / "nope.tgz")],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert "no such file or folder: " + str(tmp_path / "nope.tgz") in out.stderr
    assert out.stdout == ""

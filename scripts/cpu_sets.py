#!/usr/bin/env python3
"""scripts/cpu_sets.py: kvferry.cpu_sets from this checkout (whole-core CPU sets for P, D and the
JVMs; see that module)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
from kvferry.cpu_sets import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

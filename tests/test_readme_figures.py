"""README.md's headline table is the one scripts/readme-figures generates from its result file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_headline_matches_its_result_file() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "readme-figures"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr

"""scripts/shape finds import circles (also inside functions), long modules and long
functions, and passes a package without them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _shape(src: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "shape"), str(src), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_a_circle_through_a_function_import_is_found(tmp_path):
    src = _package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from pkg import b\n",
            "b.py": "def f():\n    from pkg.a import x\n",
        },
    )
    done = _shape(src)
    assert done.returncode == 1 and "pkg.a -> pkg.b" in done.stdout


def test_long_modules_and_functions_are_found(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(10))
    src = _package(tmp_path, {"__init__.py": "", "long.py": "def f():\n" + body})
    done = _shape(src, "--max-function", "5", "--max-lines", "8")
    assert done.returncode == 1
    assert "long.py (11 lines)" in done.stdout and "f (11 lines)" in done.stdout


def test_the_package_has_none():
    done = _shape(ROOT / "src")
    assert done.returncode == 0, done.stdout

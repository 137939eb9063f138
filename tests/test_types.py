"""House rule: the type hints hold; mypy checks them as pyproject.toml's [tool.mypy] says."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_mypy_finds_nothing() -> None:
    pytest.importorskip("mypy", reason="mypy is in the `test` extra")
    out = subprocess.run([sys.executable, "-m", "mypy"], cwd=REPO, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]

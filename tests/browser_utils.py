"""Headless Chromium for the live view's page tests (skipped where none is installed; .ci/run installs it)."""

from __future__ import annotations

import shutil
import subprocess
from typing import Optional


def chromium() -> Optional[str]:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def browser(*args: str) -> str:
    """Run headless Chromium with `args` (e.g. --dump-dom URL); its stdout. Bounded: 120 s."""
    cmd = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--no-first-run", "--disable-extensions", "--virtual-time-budget=4000", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout

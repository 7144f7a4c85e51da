"""The README as a newcomer meets it: its first block is the two commands CI runs, and every other code block
runs as written against a real server (the default one, the embedded model) and succeeds."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from server_utils import shared_server

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"^```(\w+)\n(.*?)^```", README, flags=re.S | re.M)
DEFAULT_ADDR = "127.0.0.1:30000"


def _runnable() -> list[tuple[str, str]]:
    return BLOCKS[1:]


def test_the_readme_opens_with_the_two_commands_ci_runs():
    lang, first = BLOCKS[0]
    assert README.index("```") < 40, "the two commands come first"
    assert lang == "bash"
    commands = [ln for ln in first.splitlines() if ln and not ln.startswith("#")]
    assert commands == ["bash scripts/setup.sh && .venv/bin/python -m radixlang_runtime.launch_server",
                        "bash scripts/test.sh"]
    assert "exec bash scripts/test.sh" in (ROOT / ".ci/run").read_text()
    assert "bash scripts/setup.sh" in (ROOT / "scripts/test.sh").read_text()


def test_the_readme_stays_a_front_door():
    assert len(README.splitlines()) <= 200
    assert len(_runnable()) >= 3


@pytest.mark.parametrize("index", range(len(BLOCKS) - 1))
def test_every_block_runs_against_a_real_server(index):
    lang, code = _runnable()[index]
    srv = shared_server()
    addr = srv.url.removeprefix("http://")
    assert DEFAULT_ADDR in code, "every example names the default address"
    code = code.replace(DEFAULT_ADDR, addr)
    if lang == "python":
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    else:
        assert lang == "bash", lang
        res = subprocess.run(["bash", "-euo", "pipefail", "-c", code], capture_output=True, text=True,
                             timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    out = res.stdout.strip()
    assert out, "the block prints its result"
    if lang == "bash":
        for line in out.splitlines():
            body = json.loads(line)
            assert body["text"], body
            assert body["meta_info"]["completion_tokens"] > 0

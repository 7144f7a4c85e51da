"""Every example in examples/ runs on the embedded model and asserts its own output shape: in process
on the session Engine (fast), and one of them as its one-command form in a subprocess."""

from __future__ import annotations

import importlib
import io
import os
import subprocess
import sys

import pytest

from radixlang.backend.engine import EngineBackend

pytestmark = pytest.mark.slow
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, "examples")
NAMES = ["react_agent", "few_shot_batch", "parallel_tips", "classify", "stream_chat", "json_extract", "dsl_tool_agent"]


@pytest.fixture(scope="module")
def backend(engine_fp32):
    return EngineBackend(engine=engine_fp32)


def load(name: str):
    if EXAMPLES not in sys.path:
        sys.path.insert(0, EXAMPLES)
    return importlib.import_module(name)


@pytest.mark.parametrize("name", NAMES)
def test_example_runs(backend, name, capsys):
    mod = load(name)
    if name == "stream_chat":
        buf = io.StringIO()
        st = mod.main(backend, out=buf)
        assert buf.getvalue().strip() == st["answer"].strip()
        return
    mod.main(backend)
    assert capsys.readouterr().out.strip()


def test_an_example_is_one_command():
    out = subprocess.run([sys.executable, os.path.join(EXAMPLES, "classify.py")], capture_output=True, text=True,
                         timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [ln for ln in out.stdout.splitlines() if ln.strip()]
    assert len(lines) == 4 and all(ln.split()[0] in ("positive", "negative") for ln in lines), out.stdout

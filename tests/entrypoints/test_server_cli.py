"""launch_server's command line as a new user meets it: --help documents every flag in its group with its
default and choices; another engine's flag is refused in one line naming what to use here; Ctrl+C while the
model loads exits without a traceback."""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import sys
import time

import pytest

from radixlang_runtime.server_args import ServerArgs
from radixlang_runtime.server_cli import build_parser, sections
from radixlang_runtime.server_flags_help import CHOICES, FOREIGN_FLAGS, HELP

LAUNCH = [sys.executable, "-m", "radixlang_runtime.launch_server"]
FIELDS = [f.name for f in dataclasses.fields(ServerArgs)]


def test_every_flag_has_a_help_line_and_a_group():
    assert sorted(HELP) == sorted(FIELDS), "HELP and ServerArgs disagree"
    grouped = [name for _, names in sections() for name in names]
    assert sorted(grouped) == sorted(FIELDS), "a field outside the dataclass's sections"
    titles = [title for title, _ in sections()]
    assert titles[:3] == ["model", "http", "parallelism"], titles
    assert set(CHOICES) <= set(FIELDS)


def test_help_names_defaults_and_choices(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--page-size N" in out and "--dtype {auto,float32,bfloat16,float16}" in out
    assert "the HTTP port (default: 30000)" in out
    assert "hierarchical KV cache:" in out and "speculative decoding:" in out
    for name in FIELDS:
        assert "--" + name.replace("_", "-") in out, name


def test_foreign_flags_are_not_ours():
    ours = {"--" + n.replace("_", "-") for n in FIELDS}
    assert not ours & set(FOREIGN_FLAGS)


@pytest.mark.parametrize("argv,expected", [
    (["--max-model-len", "4096"], "--max-model-len is not supported by radixlang: use --context-length"),
    (["--tensor-parallel-size=2"], "--tensor-parallel-size is not supported by radixlang: use --tp-size"),
    (["--no-such-flag"], "unrecognized argument(s): --no-such-flag"),
    (["--dtype", "int3"], "dtype must be one of auto, float32, bfloat16, float16; got 'int3'"),
])
def test_a_mistake_is_one_line_naming_it(argv, expected):
    res = subprocess.run([*LAUNCH, *argv], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 2, res.stderr
    assert expected in lines[0]
    assert "usage:" not in res.stderr


def test_ctrl_c_while_the_model_loads_exits_without_a_traceback(tmp_path):
    log = tmp_path / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([*LAUNCH, "--port", "0", "--frontend-port", "-1"], stdout=out,
                                stderr=subprocess.STDOUT,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while "scheduler" not in log.read_text() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert proc.poll() is None, log.read_text()[-2000:]
    proc.send_signal(signal.SIGINT)
    assert proc.wait(60) == 130
    text = log.read_text()
    assert "Traceback" not in text, text[-3000:]
    assert "interrupted while starting" in text

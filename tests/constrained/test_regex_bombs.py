"""User-supplied patterns never stall the scheduler.

Unit: stop_regex runs in RE2 (linear time): hostile patterns scan a full 256-token window fast; what RE2
refuses (backreferences, look-around) and the per-request limits answer ValueError naming the field;
no fallback to Python's backtracking `re`; on ordinary patterns the stops are those of the Python `re`
scan this replaced (a hypothesis test against it); an unsatisfiable `regex` says so in plain words.
No assertion here reads a wall clock (a loaded 2-core CI machine stretches any of them): a scan's bound is the
CPU time this process spends in it (a SIGVTALRM cap, the same for any load; a test shows the cap stops Python's
backtracking scan), and the end-to-end tests wait for their answers with a bound and assert what came back.
End to end (one real server): a stop_regex bomb completes normally while a greedy request sent once it is
decoding gets the text it gets alone; regex / json_schema bombs fail alone with a 400 whose message is the
grammar pre-check's (constrained/automaton_size.py: removed, the compile child's caps would answer with
another message). The DSL passes stop_regex through to the runtime's checks.
"""

from __future__ import annotations

import json
import re
import signal
import threading
from contextlib import contextmanager

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import radixlang as sgl
from radixlang.errors import BackendError
from radixlang_runtime.protocol import stop_regex as stop_regex_mod
from radixlang_runtime.protocol.sampling_params import SamplingParams
from radixlang_runtime.scheduler.request import Req
from radixlang_runtime.scheduler.stop_check import STOP_REGEX_WINDOW, _newest_text, _stop_regex, check_finished
from radixlang_runtime.constrained.automaton_size import MAX_STATES
from radixlang_runtime.protocol.limits import MAX_STOP_STRINGS
from radixlang_runtime.protocol.stop_regex import (MAX_STOP_CHARS, MAX_STOP_REGEX, STOP_REGEX_MAX_PROGRAM,
                                                   compile_stop_regex)
from server_utils import FP32_FLAGS, shared_server

# Python's `re` backtracks exponentially on these (the first is the tester's: it stalled every request);
# a few more are slow for RE2's DFA (big counted repetitions) or for a finditer scan (every char a match).
HOSTILE = [r"([\s\S]*)*\x00", r"(a|aa)*c", r"(x+x+)+y", r"(.*){50}\x00", r"(\w+\s?)*\x00", r"a(.*b)?\x00",
           r"[\s\S]{560}\x00", r"(?:a|a[\s\S]*)\x00", r"(?s).{0,200}\x00", r"x*?\x00", r"\p{L}+\x00"]


def detokenizer(tokens: list[str]):
    return lambda ids: "".join(tokens[i] for i in ids)


def windows() -> dict[str, list[str]]:
    """Full windows (more than STOP_REGEX_WINDOW tokens) of texts that drive the hostile patterns."""
    n = STOP_REGEX_WINDOW + 20
    return {"long tokens": ["#" * 80] * n, "a's": ["a" * 16] * n, "a's then b": ["a" * 16] * (n - 1) + ["b"],
            "words": [" hello", " world", " 12", "\n"] * (n // 4), "multi-byte": ["é漢😀" * 5] * n}


class CpuCapExceeded(Exception):
    pass


CPU_CAP_S = 5.0  # CPU seconds for one pattern over every window (RE2 takes a few ms; the `re` scan never ended)


@contextmanager
def cpu_cap(seconds: float):
    """Raise CpuCapExceeded in this (the main) thread once the process has spent `seconds` of user CPU time
    inside the block (ITIMER_VIRTUAL): a bound other processes' load does not move. Python's `re` checks for
    signals while it backtracks, so the cap ends a runaway scan."""
    def fire(signum, frame):
        raise CpuCapExceeded(f"more than {seconds} s of CPU time")

    old = signal.signal(signal.SIGVTALRM, fire)
    signal.setitimer(signal.ITIMER_VIRTUAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        signal.signal(signal.SIGVTALRM, old)


@pytest.mark.parametrize("pattern", HOSTILE)
def test_hostile_stop_regex_scans_a_full_window_within_a_cpu_cap(pattern):
    patterns = [compile_stop_regex(pattern)]
    with cpu_cap(CPU_CAP_S):
        for tokens in windows().values():
            # no \x00 anywhere (and no 'c' / 'y' where those patterns need them)
            assert _stop_regex(list(range(len(tokens))), patterns, detokenizer(tokens)) is None
    tokens = windows()["a's"] + ["x\x00"]  # the bomb still stops where its match ends
    hit = _stop_regex(list(range(len(tokens))), [compile_stop_regex(r"([\s\S]*)*\x00")], detokenizer(tokens))
    assert hit is not None and hit[0].endswith("x\x00") and hit[1] == len(hit[0])


@pytest.mark.parametrize("pattern,message", [
    (r"(a)\1", r"stop_regex '\(a\)\\\\1' is not supported: backreferences and lookaround are not in the "
               r"runtime's regex dialect \(RE2 / Rust regex syntax\)"),
    (r"(?=a)b", "is not supported: backreferences and lookaround"),
    (r"(?<!a)b", "is not supported: backreferences and lookaround"),
    (r"(?P<n>a)(?P=n)", "is not supported: backreferences and lookaround"),
    (r"(x", r"stop_regex '\(x' is not a valid regular expression in the runtime's regex dialect"),
    (r"a{1001}", "invalid repetition size"),
    (r"\Qa.b", r"\\Q is not in the runtime's regex dialect"),
    ("a" * (MAX_STOP_CHARS + 1), f"is too long: {MAX_STOP_CHARS + 1:,} characters"),
])
def test_patterns_re2_refuses_answer_value_error_naming_stop_regex(pattern, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams.from_dict({"stop_regex": pattern})


def test_per_request_limits_name_the_limit():
    with pytest.raises(ValueError, match=f"stop: at most {MAX_STOP_STRINGS} stop strings, got 17"):
        SamplingParams.from_dict({"stop": [f"s{i}" for i in range(MAX_STOP_STRINGS + 1)]})
    with pytest.raises(ValueError, match=f"at most {MAX_STOP_CHARS:,} characters"):
        SamplingParams.from_dict({"stop": "x" * (MAX_STOP_CHARS + 1)})
    with pytest.raises(ValueError, match=f"stop_regex: at most {MAX_STOP_REGEX} patterns, got 17"):
        SamplingParams.from_dict({"stop_regex": [f"p{i}" for i in range(MAX_STOP_REGEX + 1)]})
    big = r"(?i)\pL{3}"  # Unicode letter classes are large programs
    assert 2 * compile_stop_regex(big).program_size > STOP_REGEX_MAX_PROGRAM >= compile_stop_regex(big).program_size
    SamplingParams.from_dict({"stop_regex": big})
    with pytest.raises(ValueError, match=f"RE2 instructions together \\(limit {STOP_REGEX_MAX_PROGRAM:,}\\)"):
        SamplingParams.from_dict({"stop_regex": [big, big + "x"]})
    at_limits = SamplingParams.from_dict({"stop": ["x" * MAX_STOP_CHARS] * MAX_STOP_STRINGS,
                                          "stop_regex": [r"\d+"] * MAX_STOP_REGEX})
    assert len(at_limits.stop_patterns) == MAX_STOP_REGEX


def test_no_fallback_to_a_backtracking_engine(monkeypatch):
    assert type(compile_stop_regex("a+").rx).__module__.split(".")[0] == "re2"
    re.compile(r"(a)\1")  # Python's re takes it; a fallback would too
    with pytest.raises(ValueError, match="not supported"):
        compile_stop_regex(r"(b)\1")
    monkeypatch.setattr(stop_regex_mod.re2, "compile", lambda p, options=None: re.compile(p))
    with pytest.raises(RuntimeError, match="not an RE2 program"):
        stop_regex_mod._compile("fallback")


def old_python_re_scan(out: list[int], patterns: list[str], detokenize) -> tuple[str, int] | None:
    """The stop_regex check the runtime replaced (Python `re`, kept as the reference)."""
    tail, newest_from = _newest_text(out, STOP_REGEX_WINDOW, detokenize)
    newest_from = newest_from or 0
    best = None
    for pattern in patterns:
        for m in re.compile(pattern).finditer(tail):
            if m.end() > newest_from and m.end() > m.start():
                if best is None or m.start() < best.start():
                    best = m
                break
    return None if best is None else (best.group(0), len(tail) - best.start())


def first_stop_step(tokens: list[str], check, patterns, min_new: int):
    """Decode `tokens` one at a time: (step, hit) of the first stop, or None."""
    detok = detokenizer(tokens)
    for n in range(max(min_new, 1), len(tokens) + 1):
        hit = check(list(range(n)), patterns, detok)
        if hit is not None:
            return n, hit
    return None


def test_the_cpu_cap_stops_the_backtracking_scan_it_guards_against():
    """The bound above can fail: the scan the runtime replaced (Python's `re`) runs into the cap."""
    tokens = windows()["a's"]
    with pytest.raises(CpuCapExceeded):
        with cpu_cap(0.5):
            old_python_re_scan(list(range(len(tokens))), [r"([\s\S]*)*\x00"], detokenizer(tokens))


_ATOMS = st.sampled_from(["a", "b", "ab", "[ab]", "[^a]", r"\d", "c", "x", " ", r"\s", ".", "é", r"\n"])
_NEEDED = st.tuples(_ATOMS, st.sampled_from(["", "+", "{1,3}", "+?", "{2}"])).map("".join)
_ANY = st.tuples(_ATOMS, st.sampled_from(["", "+", "?", "*", "*?", "{1,3}"])).map("".join)
# ordinary patterns: a sequence with at least one atom that must match (Python's re and RE2 differ on
# how a pattern that prefers the empty match retries; those are not ordinary stop patterns)
_SEQ = st.tuples(st.lists(_ANY, max_size=2), _NEEDED, st.lists(_ANY, max_size=2)).map(
    lambda t: "".join(t[0]) + t[1] + "".join(t[2]))
_PATTERN = st.one_of(_SEQ, st.tuples(_SEQ, _SEQ).map("|".join))


@settings(max_examples=300, deadline=None)
@given(patterns=st.lists(_PATTERN, min_size=1, max_size=2),
       tokens=st.lists(st.text("ab c1xé\n", min_size=1, max_size=3), min_size=1, max_size=12),
       min_new=st.sampled_from([0, 3]))
def test_stops_are_the_python_re_scans_on_ordinary_patterns(patterns, tokens, min_new):
    compiled = [compile_stop_regex(p) for p in patterns]
    assert first_stop_step(tokens, _stop_regex, compiled, min_new) == \
        first_stop_step(tokens, old_python_re_scan, patterns, min_new)


def test_check_finished_stops_at_the_match_and_skips_the_min_new_tokens_part():
    tokens = ["x1", "2", " y", "3", "4"]
    sp = SamplingParams.from_dict({"stop_regex": r"\d+", "min_new_tokens": 3})
    req = Req(rid="r", input_ids=[0], sampling=sp)
    for i in range(len(tokens)):
        req.output_ids.append(i)
        check_finished(req, (), 1 << 20, detokenizer(tokens))
        if req.finished_reason is not None:
            break
    # "12" lies in the first 3 tokens (no stop); "3" ends in the 4th token
    assert req.finished_reason == {"type": "stop", "matched": "3"} and len(req.output_ids) == 4
    assert req.stop_from_end == 1


def test_unsatisfiable_regex_says_so_in_plain_words():
    from test_constrained_helpers import vocab

    from radixlang_runtime.constrained.grammar import compile_grammar
    from radixlang_runtime.constrained.spec import GrammarSpec

    v = vocab()
    for regex, detail in [(r"ab\x{80000}",
                           "some text it allows can only go on with the bytes .*xf2.*, which no token spells"),
                          (r"a[^\s\S]", "part of it matches no character at all"),
                          (f"ab\\x{{{ord(v.sentinel):X}}}", f"U\\+{ord(v.sentinel):X} .* is a character no token")]:
        with pytest.raises(ValueError, match="cannot be matched by this model's tokens: " + detail) as e:
            compile_grammar(GrammarSpec.from_regex(regex), v)
        assert "encoding issue" not in str(e.value) and "state" not in str(e.value)
    assert compile_grammar(GrammarSpec.from_regex(r"\\x\{40000\}"), v) is not None  # an escaped backslash


# ----------------------------------------------------------------------------------------- end to end
PROMPT = "The capital of France is"
GREEDY = {"temperature": 0, "max_new_tokens": 12}  # the normal request
BOUND_S = 300  # every wait on an answer (a loaded 2-core CI machine is slow; a stalled scheduler never answers)


@pytest.fixture(scope="module")
def server():
    return shared_server(*FP32_FLAGS)  # requests only: one server for these flags, shared by the modules that use them


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=BOUND_S) as c:
        yield c


@pytest.fixture(scope="module")
def alone(client) -> str:
    """The normal request's text when it runs alone."""
    r = client.post("/generate", json={"text": PROMPT, "sampling_params": GREEDY})
    assert r.status_code == 200, r.text
    return r.json()["text"]


def send(client, body, out: dict, key: str, started: threading.Event | None = None) -> threading.Thread:
    """POST /generate on a thread; out[key] = (status, the final result). With `started`, the request streams
    and `started` is set once its first token has come back (it is in a decode batch)."""
    def go():
        if started is None:
            r = client.post("/generate", json=body)
            out[key] = (r.status_code, r.json())
            return
        with client.stream("POST", "/generate", json={**body, "stream": True}) as r:
            last = None
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    last = json.loads(line[len("data: "):])
                    started.set()
            out[key] = (r.status_code, last)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def finish_all(threads: list[threading.Thread], out: dict, keys) -> None:
    for t in threads:
        t.join(BOUND_S)
    assert set(keys) <= set(out), f"no answer within {BOUND_S} s: {set(keys) - set(out)}"


def test_stop_regex_bomb_completes_and_others_are_unaffected(client, alone):
    plain = client.post("/generate", json={"text": "Once upon a time", "sampling_params": {
        "temperature": 0, "max_new_tokens": 48}}).json()
    assert "\x00" not in plain["text"]  # so the bomb can never match: it must run to its length
    bomb = {"text": "Once upon a time", "sampling_params": {
        "temperature": 0, "max_new_tokens": 48, "stop_regex": ["([\\s\\S]*)*\\x00", "(a|aa)*c\\x00"]}}
    out: dict = {}
    decoding = threading.Event()
    threads = [send(client, bomb, out, "bomb", started=decoding)]
    # the bomb's stop check has run on its first token (the old one stalled the scheduler there for good)
    assert decoding.wait(BOUND_S), f"the bomb sent no token within {BOUND_S} s"
    threads.append(send(client, {"text": PROMPT, "sampling_params": GREEDY}, out, "normal"))
    finish_all(threads, out, ("bomb", "normal"))
    assert out["normal"][0] == 200 and out["normal"][1]["text"] == alone
    status, body = out["bomb"]
    assert status == 200 and body["text"] == plain["text"]
    assert body["meta_info"]["finish_reason"] == plain["meta_info"]["finish_reason"]


def test_grammar_bombs_fail_alone_by_the_pre_check(client, alone):
    """automaton_size.py refuses both before outlines-core starts, with a 400 naming its bound (without it, the
    compile child would build the whole DFA until its time or memory cap answered, with another message)."""
    bombs = {
        "regex": {"text": "x", "sampling_params": {"max_new_tokens": 8, "regex": ".*a.{20}"}},  # 2^21 DFA states
        "schema": {"text": "x", "sampling_params": {
            "max_new_tokens": 8, "json_schema": json.dumps({"type": "string", "maxLength": 100000})}},
    }
    bounds = {"regex": f"grammar too large: regex '.*a.{{20}}' needs more than {MAX_STATES:,} automaton states "
                       f"(limit {MAX_STATES:,})",
              "schema": f"grammar too large: json_schema needs more than {MAX_STATES:,} automaton states "
                        f"(limit {MAX_STATES:,})"}
    out: dict = {}
    threads = [send(client, body, out, key) for key, body in bombs.items()]
    threads.append(send(client, {"text": PROMPT, "sampling_params": GREEDY}, out, "normal"))
    finish_all(threads, out, [*bombs, "normal"])
    assert out["normal"][0] == 200 and out["normal"][1]["text"] == alone
    for key in bombs:
        status, body = out[key]
        assert status == 400 and bounds[key] in body["error"]["message"], (key, body)


def nested_arrays(depth: int) -> dict:
    node: dict = {"type": "string"}
    for _ in range(depth):
        node = {"type": "array", "items": node}
    return node


@pytest.mark.parametrize("sp,message", [
    ({"regex": "\\x{80000}"}, "cannot be matched by this model's tokens"),
    ({"regex": "a{1000}{1000}"}, "grammar too large"),
    ({"json_schema": json.dumps(nested_arrays(200))}, "nested deeper than"),
    ({"stop_regex": "(a)\\1"}, "stop_regex '(a)\\\\1' is not supported: backreferences and lookaround"),
    ({"stop_regex": ["\\d"] * (MAX_STOP_REGEX + 1)}, f"at most {MAX_STOP_REGEX} patterns"),
])
def test_bad_patterns_answer_400_naming_the_problem(client, sp, message):
    r = client.post("/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 4, **sp}})
    assert r.status_code == 400 and message in r.json()["error"]["message"], r.text


def test_the_dsl_passes_stop_regex_to_the_runtime(server, client):
    sgl.gen("a", stop_regex=r"\p{Lu}")  # RE2 / Rust syntax; Python's re refuses it: the DSL must not check
    sgl.gen("a", stop_regex=r"(a)\1")  # the runtime refuses this one, with its message
    story = {"temperature": 0, "max_new_tokens": 24}
    plain = client.post("/generate", json={"text": "Once upon a time", "sampling_params": story}).json()["text"]
    first_capital = re.search(r"[A-Z]", plain)
    assert first_capital is not None and first_capital.start() > 0, plain

    @sgl.function
    def upto_capital(s, pattern):
        s += "Once upon a time" + sgl.gen("out", max_tokens=story["max_new_tokens"], temperature=0,
                                          stop_regex=pattern)

    backend = sgl.RuntimeEndpoint(server.url)
    assert upto_capital.run(pattern=r"\p{Lu}", backend=backend)["out"] == plain[: first_capital.start()]
    err = upto_capital.run(pattern=r"(a)\1", backend=backend).error()
    assert isinstance(err, BackendError) and err.status == 400, err
    assert "stop_regex '(a)\\\\1' is not supported" in str(err), err

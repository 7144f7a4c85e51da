"""The compile worker and cache: submit never blocks, results and errors come back on the handle,
one compile per grammar, LRU + disk cache, bounded queue, and hostile grammars end in a clear error
within the limits with the worker process killed (never the test process)."""

from __future__ import annotations

import json
import os
import time

import pytest
from test_constrained_helpers import EOS, PERSON, encode, schema_grammar, vocab

from radixlang_runtime.constrained.cache import GrammarCacheConfig, GrammarCompiler
from radixlang_runtime.constrained.spec import JSON_OBJECT_SCHEMA, GrammarSpec
from radixlang_runtime.constrained.state import GrammarState
from radixlang_runtime.constrained.worker import CompileWorker, WorkerLimits, vocab_message

SLOW_REGEX = r"[a-z]{1,12}(,[a-z]{1,12}){0,12}"  # a few hundred ms: long enough to observe "pending"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module")
def compiler():
    c = GrammarCompiler(vocab(), GrammarCacheConfig(num_workers=2, timeout_s=60))
    c.start()
    yield c
    c.close()
    assert not any(w.pid for w in c.workers)


def test_submit_does_not_block_and_caches(compiler):
    spec = GrammarSpec.from_regex(SLOW_REGEX)
    t0 = time.perf_counter()
    h = compiler.submit(spec)
    assert h.poll() == "pending"  # answered before the compile (another process) could finish
    submit_s = time.perf_counter() - t0
    assert h.wait(60) == "ready", h.error
    g = h.grammar
    assert g.accepts(encode("ab,cd")) is not None and g.compile_seconds > 0
    h2 = compiler.submit(spec)
    assert h2.poll() == "ready" and h2.cached and h2.grammar is g
    print(f"\n[compile] {SLOW_REGEX}: submit {submit_s * 1e3:.2f} ms, compile {g.compile_seconds:.2f} s in the "
          f"worker, ready after {time.perf_counter() - t0:.2f} s; cached submit is immediate")


def test_one_compile_per_grammar_in_flight(compiler):
    spec = GrammarSpec.from_regex(SLOW_REGEX.replace("12", "11"))
    misses = compiler.stats["misses"]
    h1, h2 = compiler.submit(spec), compiler.submit(spec)
    assert h1 is h2 and compiler.stats["misses"] == misses + 1
    assert h1.wait(60) == "ready"


def test_worker_grammar_equals_in_process(compiler):
    h = compiler.submit(GrammarSpec.from_json_schema(PERSON))
    assert h.wait(60) == "ready", h.error
    remote, local = h.grammar, schema_grammar(PERSON)
    text = json.dumps({"name": "Ann", "age": 31, "role": "user", "address": {"city": "Oslo", "zip": "01234"},
                       "active": True})
    sr, sl = GrammarState(remote, [EOS]), GrammarState(local, [EOS])
    for t in encode(text):
        assert (sr.allowed().ids == sl.allowed().ids).all()
        assert sr.advance(t) and sl.advance(t)
    assert sr.must_finish and sl.must_finish


def test_errors_come_back_on_the_handle_and_are_cached(compiler):
    spec = GrammarSpec.from_regex("[z-a]")  # passes the Python-side scan; the compiler refuses it
    h = compiler.submit(spec)
    assert h.wait(60) == "error"
    assert "invalid regex: bad character range z-a" in h.error
    again = compiler.submit(spec)
    assert again.poll() == "error" and again.error == h.error


def test_hostile_grammars_are_refused_before_compiling():
    with pytest.raises(ValueError, match="grammar too large"):
        GrammarSpec.from_regex("a{1000}{1000}")
    node: dict = {"type": "string"}
    for _ in range(200):
        node = {"type": "array", "items": node}
    with pytest.raises(ValueError, match="nested deeper"):
        GrammarSpec.from_json_schema(node)
    with pytest.raises(ValueError, match="'minimum' is supported on"):
        GrammarSpec.from_json_schema({"type": "number", "minimum": 1})


def test_ten_thousand_enum_values_finish_within_the_limit(compiler):
    spec = GrammarSpec.from_json_schema({"enum": [f"value_{i}" for i in range(10_000)]})
    h = compiler.submit(spec)
    # the worker's own time limit answers by timeout_s; the wait's bound only stops a hang (a loaded machine's slack)
    status = h.wait(compiler.config.timeout_s * 3)
    assert status in ("ready", "error")
    if status == "ready":
        gs = GrammarState(h.grammar, [EOS])
        assert gs.advance_all(encode('"value_9876"')) and gs.must_finish
    else:
        assert "grammar too large" in h.error


def test_time_limit_kills_the_worker():
    w = CompileWorker(vocab_message(vocab()), WorkerLimits(timeout_s=0.5, memory_bytes=2 << 30))
    try:
        w.start()
        pid = w.pid
        res = w.compile("json_schema", JSON_OBJECT_SCHEMA)  # several seconds of work
        # the cap's own message (no wall clock read here: a loaded machine stretches any)
        assert not res.ok and res.error == "grammar too large: compile exceeded 0.5 s"
        assert w.pid is None and not _alive(pid)
        ok = w.compile("regex", "[0-9]{3}")  # a fresh process takes the next job
        assert ok.ok and w.pid is not None and w.pid != pid
    finally:
        w.kill()


def test_memory_cap_kills_the_worker():
    w = CompileWorker(vocab_message(vocab()), WorkerLimits(timeout_s=60, memory_bytes=200 << 20))
    try:
        w.start()
        pid = w.pid
        res = w.compile("regex", r"[a-z]{1,40}(,[a-z]{1,40}){0,40}")  # ~100 MB index, more while building
        assert not res.ok and "grammar too large: compile exceeded" in res.error and "GiB of memory" in res.error
        assert not _alive(pid)
        assert w.compile("regex", "[0-9]{3}").ok
    finally:
        w.kill()


def test_disk_cache_survives_a_restart(tmp_path):
    cfg = GrammarCacheConfig(num_workers=1, timeout_s=60, disk_dir=str(tmp_path))
    spec = GrammarSpec.from_json_schema(PERSON)
    a = GrammarCompiler(vocab(), cfg)
    try:
        assert a.submit(spec).wait(60) == "ready" and a.stats["compiled"] == 1
    finally:
        a.close()
    files = list(tmp_path.rglob("*.idx"))
    assert len(files) == 1 and files[0].parent.name == vocab().tokenizer_id
    b = GrammarCompiler(vocab(), cfg)
    try:
        h = b.submit(spec)
        assert h.wait(60) == "ready" and b.stats["from_disk"] == 1 and b.stats["compiled"] == 0
        assert GrammarState(h.grammar, [EOS]).advance_all(encode('{"name": "A'))
        files[0].write_bytes(b"garbage")  # a corrupt entry is recompiled, not trusted
        b.clear()
        assert b.submit(spec).wait(60) == "ready" and b.stats["compiled"] == 1
    finally:
        b.close()


def test_queue_is_bounded_and_close_resolves_everything():
    c = GrammarCompiler(vocab(), GrammarCacheConfig(num_workers=1, max_queued=1, timeout_s=60))
    try:
        handles = [c.submit(GrammarSpec.from_regex(SLOW_REGEX.replace("12", str(k)))) for k in range(5, 10)]
        full = [h for h in handles if h.poll() == "error"]
        assert len(full) >= 2 and all("grammar queue full" in h.error for h in full)
    finally:
        c.close()
    assert all(h.poll() in ("ready", "error") for h in handles)
    assert not any(w.pid for w in c.workers)
    late = c.submit(GrammarSpec.from_regex("[0-9]"))
    assert late.poll() == "error" and "closed" in late.error

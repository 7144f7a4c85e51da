"""Errors never hang: an error injected at any point ends the program state with an exception within
seconds; `s[v]` for a variable that will never come raises at once (fake backend, no model)."""

from __future__ import annotations

import threading
import time

import pytest

import radixlang as sgl
from radixlang.backend.fake import FakeBackend
from radixlang.errors import BackendError, ProgramError


def refuse_when(pred, status=400, message="refused"):
    return lambda body: (status, message) if pred(body) else None


def is_prefill(body):
    sp = body.get("sampling_params")
    return isinstance(sp, dict) and sp.get("max_new_tokens") == 0


@sgl.function
def two_gens(s):
    s += "Q:" + sgl.gen("a", max_tokens=4)
    s += " R:" + sgl.gen("b", max_tokens=4)
    s += " done"


def test_a_refused_request_ends_the_state_and_skips_the_rest():
    fake = FakeBackend(fail=refuse_when(lambda b: b["text"] == "Q:"))
    t0 = time.monotonic()
    st = two_gens.run(backend=fake)
    with pytest.raises(ProgramError, match="will never be set") as e:
        st["b"]
    assert isinstance(e.value.__cause__, BackendError) and e.value.__cause__.status == 400
    assert isinstance(st.error(), BackendError) and "refused" in str(st.error())
    assert st.text() == "Q:"  # what exists
    assert len(fake.requests) == 1  # later items skipped
    assert "failed" in repr(st)  # repr never waits
    assert time.monotonic() - t0 < 5


def test_a_failure_inside_the_body_read_raises_in_the_body():
    fake = FakeBackend(fail=refuse_when(lambda b: True, 503, "runtime gone"))

    @sgl.function
    def reads(s):
        s += "x" + sgl.gen("a")
        s += s["a"]

    with pytest.raises(ProgramError, match="runtime gone"):
        reads.run(backend=fake)


def test_a_variable_that_will_never_come_raises_at_once():
    # The gen is held until the program has returned: run() waiting for it would end in the held
    # request's failure (after 30 s), not in " o".
    gen_may_answer = threading.Event()
    fake = FakeBackend(fail=lambda body: None if gen_may_answer.wait(30) else (500, "held past the bound"))

    @sgl.function
    def prog(s):
        s += "x" + sgl.gen("a", max_tokens=2)
        with pytest.raises(KeyError):
            s["never"]
        s += "y"

    st = prog.run(backend=fake)  # returns while the gen is still held: it did not wait for it
    assert "never" not in st
    gen_may_answer.set()
    assert st["a"] == " o"
    with pytest.raises(KeyError):
        st["never"]


def test_a_body_exception_is_raised_from_run_and_ends_the_state():
    fake = FakeBackend()

    @sgl.function
    def boom(s):
        s += "x" + sgl.gen("a", max_tokens=2)
        raise RuntimeError("body failed")

    with pytest.raises(RuntimeError, match="body failed"):
        boom.run(backend=fake)


def test_a_body_exception_while_streaming_is_kept():
    fake = FakeBackend()

    @sgl.function
    def boom(s):
        s += "x" + sgl.gen("a", max_tokens=2)
        raise RuntimeError("body failed")

    st = boom.run(backend=fake, stream=True)
    t0 = time.monotonic()
    assert "".join(st.text_iter()) in ("", "x", "x o")
    assert isinstance(st.error(), RuntimeError)
    assert time.monotonic() - t0 < 5


class DropMidStream(FakeBackend):
    def _call_stream(self, body):
        for i, event in enumerate(super()._call_stream(body)):
            if i == 2:
                raise BackendError("lost the connection mid-stream")
            yield event


def test_a_connection_dropped_mid_stream_ends_the_state():
    fake = DropMidStream(reply=lambda p, sp: " abcdef")

    @sgl.function
    def prog(s):
        s += "x" + sgl.gen("a")

    st = prog.run(backend=fake, stream=True)
    chunks = list(st.text_iter("a"))
    assert "".join(chunks) == " a"
    assert isinstance(st.error(), BackendError)
    with pytest.raises(ProgramError):
        st["a"]


def test_a_failed_fork_child_fails_the_parent():
    fake = FakeBackend(fail=refuse_when(lambda b: b.get("text", "").endswith("child 1:")))

    @sgl.function
    def prog(s):
        s += "A long enough shared prompt. "
        forks = s.fork(3)
        forks += lambda i: f"child {i}:" + sgl.gen("out", max_tokens=3)
        forks.join()
        s += "after" + sgl.gen("final", max_tokens=3)

    st = prog.run(backend=fake)
    assert isinstance(st.error(), BackendError)
    with pytest.raises(ProgramError):
        st["final"]
    assert not any(b.get("text", "").endswith("after") for b in fake.requests)


def test_a_failed_select_scoring_request_ends_the_state():
    fake = FakeBackend(fail=refuse_when(lambda b: isinstance(b.get("text"), list)))

    @sgl.function
    def prog(s):
        s += "Pick:" + sgl.select("c", ["a", "b"])

    st = prog.run(backend=fake)
    with pytest.raises(ProgramError):
        st["c"]


def test_run_batch_keeps_order_and_isolates_a_failure():
    fake = FakeBackend(fail=refuse_when(lambda b: "#2" in b.get("text", "") and not is_prefill(b)))

    @sgl.function
    def prog(s, i):
        s += f"item #{i}:" + sgl.gen("a", max_tokens=2)

    states = prog.run_batch([{"i": i} for i in range(5)], num_threads=3, backend=fake)
    assert [st.text().split(":")[0] for st in states] == [f"item #{i}" for i in range(5)]
    assert [st.error() is None for st in states] == [True, True, False, True, True]


def test_none_and_unknown_objects_are_refused():
    fake = FakeBackend()

    @sgl.function
    def prog(s):
        s += None

    with pytest.raises(ValueError):
        prog.run(backend=fake)

    @sgl.function
    def prog2(s):
        s += 42

    with pytest.raises(TypeError):
        prog2.run(backend=fake)


def test_images_name_the_text_only_model():
    fake = FakeBackend()

    @sgl.function
    def prog(s):
        s += sgl.user(sgl.image("cat.png") + "What is this?")

    st = prog.run(backend=fake)
    assert "text-only model" in str(st.error()) and "fake-model" in str(st.error())


def test_no_backend_is_a_clear_error():
    sgl.set_default_backend(None)
    with pytest.raises(ValueError, match="no backend"):
        two_gens.run()


def test_a_stuck_backend_hits_the_wait_bound(monkeypatch):
    monkeypatch.setattr(sgl.global_config, "wait_timeout", 0.3)
    fake = FakeBackend(delay=2.0)
    st = two_gens.run(backend=fake)
    with pytest.raises(TimeoutError):
        st["a"]

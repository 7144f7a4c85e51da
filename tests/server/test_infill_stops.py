"""llama.cpp's /infill limits on the route's side (server/infill_stops.py): n_indent's cut, the held-back
indentation while streaming, t_max_predict_ms after a newline, t_max_prompt_ms at the first token, a stop
string's trim, and the timings from the route's clock, the runtime's queue time left out of the prompt's."""

from __future__ import annotations

import pytest

from radixlang_runtime.server.infill_stops import InfillStops, indent_cut, undecided_from


@pytest.mark.parametrize("text, n, cut", [
    ("x = 1\n  y", 4, 8),  # two spaces under four: cut at "y", the newline and indentation stay
    ("x = 1\n    y", 4, None),  # indented enough
    ("x = 1\n\t\t\t\ty", 4, None),  # tabs count as one each, as llama.cpp
    ("x = 1\n  ", 4, None),  # indentation only so far: undecided
    ("x = 1\n\n    y", 4, None),  # a blank line is never cut
    ("x\n    a\nb", 4, 8),  # the first short line after a newline
    ("y", 4, None),  # the first line continues the cursor's: never checked
    ("x = 1\ny", 0, None),  # off
])
def test_indent_cut(text, n, cut):
    assert indent_cut(text, n) == cut


def test_undecided_indentation_is_held_back():
    assert undecided_from("a\n   ", 4) == 2
    assert undecided_from("a\n   b", 4) == 6
    assert undecided_from("a   ", 4) == 4  # the first line is decided
    assert undecided_from("a\n   ", 0) == 5


def test_a_dedented_line_ends_the_answer_and_streams_only_what_stays():
    s = InfillStops(n_indent=4, started=0.0)
    assert s.feed("    x = 1", 1, 0.1) is False
    assert s.ready(False) == "    x = 1"
    assert s.feed("\n  ", 1, 0.2) is False
    assert s.ready(False) == "\n"  # the indentation may still be cut
    assert s.feed("  y\n", 1, 0.3) is False
    assert s.ready(False) == "    y\n"
    assert s.feed("z = 2", 1, 0.4) is True
    assert s.text == "    x = 1\n    y\n" and s.stopped
    assert s.ready(True) == ""


def test_t_max_predict_ms_waits_for_a_newline():
    s = InfillStops(t_max_predict_ms=100, started=0.0)
    assert s.feed("a", 1, 1.0) is False
    assert s.feed("b", 1, 2.0) is False  # long past the limit, but no newline yet
    assert s.feed("\n", 1, 2.05) is True
    assert s.text == "ab\n"
    s = InfillStops(t_max_predict_ms=100, started=0.0)
    assert s.feed("a\n", 1, 1.0) is False
    assert s.feed("b", 1, 1.05) is False  # within the limit
    assert s.feed("c", 1, 1.2) is True


def test_t_max_prompt_ms_at_the_first_token():
    s = InfillStops(t_max_prompt_ms=50, started=10.0)
    assert s.feed("a", 1, 10.06) is True
    assert s.text == "" and s.ready(True) == ""
    s = InfillStops(t_max_prompt_ms=50, started=10.0)
    assert s.feed("a", 1, 10.04) is False
    assert s.feed("b", 1, 99.0) is False  # only the first token is timed


def test_a_stop_strings_trim():
    s = InfillStops(started=0.0)
    s.feed("abcd", 2, 0.1)
    assert s.ready(False) == "abcd"
    s.feed("", 0, 0.2, trim=2)
    assert s.text == "ab"
    s.feed("e", 1, 0.3)
    assert s.ready(True) == "e"


def test_timings():
    s = InfillStops(started=1.0)
    s.feed("a", 1, 1.5)
    s.feed("b", 3, 2.5)
    t = s.timings(prompt_tokens=30, cached_tokens=10, predicted=4)
    assert t["prompt_n"] == 20 and t["prompt_ms"] == pytest.approx(500)
    assert t["prompt_per_token_ms"] == pytest.approx(25) and t["prompt_per_second"] == pytest.approx(40)
    assert t["predicted_n"] == 4 and t["predicted_ms"] == pytest.approx(1000)
    assert t["predicted_per_token_ms"] == pytest.approx(250) and t["predicted_per_second"] == pytest.approx(4)
    empty = InfillStops(started=1.0).timings(5, 5, 0)
    assert empty["prompt_n"] == 0 and empty["prompt_per_second"] == 0.0 and empty["predicted_ms"] == 0.0


def test_the_queue_time_is_not_the_prompts():
    """prompt_ms runs from the prefill's start (the hand-off plus the runtime's queue time) to the first token, and
    t_max_prompt_ms times the same span: a request that queued long but prefilled fast is within it."""
    s = InfillStops(t_max_prompt_ms=50, started=10.0)
    assert s.feed("a", 1, 12.03, queue_time=2.0) is False  # 2.03 s after the hand-off, 2 s of it queued
    s.feed("b", 1, 12.53, queue_time=2.0)
    t = s.timings(prompt_tokens=13, cached_tokens=10, predicted=2)
    assert t["prompt_ms"] == pytest.approx(30) and t["prompt_per_token_ms"] == pytest.approx(10)
    assert t["predicted_ms"] == pytest.approx(500)  # from the first token: the queue is before it
    s = InfillStops(t_max_prompt_ms=50, started=10.0)
    assert s.feed("a", 1, 12.06, queue_time=2.0) is True  # 60 ms past the queue
    assert s.timings(13, 10, 1)["prompt_ms"] == pytest.approx(60)
    late = InfillStops(started=10.0)
    late.feed("", 0, 11.0, queue_time=0.5)  # no token yet: nothing is timed
    late.feed("a", 1, 11.2, queue_time=0.5)
    assert late.timings(3, 0, 1)["prompt_ms"] == pytest.approx(700)

"""SGLang's frontend test programs (radixlang/test_programs.py) against the scripted fake backend:
answers checked, plus the exact requests some of them send. Fast: no model."""

from __future__ import annotations

import re

import pytest

import radixlang as sgl
from radixlang import test_programs as tp
from radixlang.backend.fake import FakeBackend

RULES = [  # (regex the prompt must end with, reply); first match wins
    (r"capital of the United States\?\nA:$", " Washington, D.C.\nQ: more"),
    (r"capital of Japan\?\nA:$", " Tokyo\n"), (r"United Kingdom\?\nA:$", " London\n"),
    (r"city of China\?\nA:$", " Beijing\n"),
    (r"hours in a day is $", "24\n"), (r"days in a year is $", "365 days"),
    (r'"name": $', '"Paris"'), (r'"population": $', "2140000 people"), (r'"area": $', "105\n"),
    (r'"latitude": $', "48.85\n"), (r'"country": $', '"France"'), (r'"timezone": $', '"CET"'),
    (r"this question is$", " a teacher. More"), (r"would answer that $", "it is Paris. Yes"),
    (r"calculate\($", "257*983) = 1"),
    (r"Thought 1:$", " I need to search for the creator of Linux.\n"), (r"Action 1: Search \[$", "Linus Torvalds]"),
    (r"Observation 1:$", " Linus lives in the United States.\n"), (r"Thought 2:$", " The answer is the United States."),
    (r"Finish \[$", "United States]"),
    (r"\n\d\.$", " Plan.\n"), (r"Tip \d:$", " Expand this tip.\n\nmore"), (r"In summary,$", " write well."),
    (r"Julian\?\nASSISTANT:$", " Noah is the father of Julian."),
    (r"DNS servers\?\nA: $", "8.8.8.8"), (r"full names is $", '"Domain Name System"\n'),
    (r"DNS invented\?\nA: $", "1983\n"), (r"value of pi\?\nA: $", "3.14\n"), (r"sky blue\?\nA: $", "True"),
    (r"<\|im_start\|>assistant\n$", " Hello there, this is a long enough reply.<|im_end|>"),
]
WANT = [(r"Statement: The capital of Germany is Berlin\.\nAnswer:", "True"),
        (r"Statement: The capital of Canada is Tokyo\.\nAnswer:", "False"),
        (r"Statement: Purple is a better color than green\.\nAnswer:", "Unknown"),
        (r"Action 1: ", "Search"), (r"Action 2: ", "Finish")]


def oracle_reply(prompt: str, sp: dict) -> str:
    for pattern, reply in RULES:
        if re.search(pattern, prompt):
            return reply
    return " ok"


def oracle_logprob(context: list, token: int) -> float:
    """High when the text written after a select point is a prefix of the wanted choice."""
    text = "".join(map(chr, context)) + chr(token)
    for pattern, want in WANT:
        m = None
        for m in re.finditer(pattern, text):
            pass
        if m is not None and len(text) - m.end() <= len(want) and m.end() > len(text) - len(want) - 1:
            return -0.1 if want.startswith(text[m.end():]) else -3.0
    return -1.0


@pytest.fixture
def fake():
    backend = FakeBackend(reply=oracle_reply, logprob=oracle_logprob)
    sgl.set_default_backend(backend)
    yield backend
    sgl.set_default_backend(None)


@pytest.mark.parametrize("program", tp.ALL, ids=lambda f: f.__name__)
def test_program_on_fake(fake, program):
    program(check_answer=True)


def test_few_shot_requests_and_precache(fake):
    tp.test_few_shot_qa(check_answer=True)
    bodies = fake.requests
    assert bodies[0]["text"] == tp.FEW_SHOT + "Q: What is the capital of the United States?\nA:"
    sp = bodies[0]["sampling_params"]
    assert sp["stop"] == ["\n", "<|im_end|>"] and sp["temperature"] == 0 and sp["max_new_tokens"] == 12
    # run_batch: the traced constant prefix is pre-filled once (the runtime offers no pin here), then 3 programs
    assert bodies[1] == {"text": tp.FEW_SHOT + "Q: ", "sampling_params": {"max_new_tokens": 0}}
    assert ("pin_prefix", {"text": tp.FEW_SHOT + "Q: "}) in fake.controls
    assert sorted(b["text"] for b in bodies[2:]) == sorted(
        tp.FEW_SHOT + f"Q: {q}\nA:" for q in ["What is the capital of Japan?",
                                               "What is the capital of the United Kingdom?",
                                               "What is the capital city of China?"])
    assert all(b["sampling_params"]["temperature"] == 0 for b in bodies[2:])  # gen's own value wins over run_batch's


def test_fork_commits_the_prompt_once(fake):
    tp.test_parallel_decoding(check_answer=True, fork_size=3)
    texts = [b["text"] for b in fake.requests]
    prefills = [b for b in fake.requests if b["sampling_params"] == {"max_new_tokens": 0}]
    assert len(prefills) == 1 and prefills[0]["text"].endswith("3. Plan.\n")
    i = texts.index(prefills[0]["text"])
    children = texts[i + 1: i + 4]
    expand = "Now, I expand tip {k} into a detailed paragraph:\nTip {k}:"
    assert sorted(children) == sorted(prefills[0]["text"] + expand.format(k=k) for k in (1, 2, 3))


def test_concate_and_append_joins_client_side_without_a_round_trip(fake):
    ret = tp.test_parallel_encoding(check_answer=True)  # the forks' texts are in the parent, in order
    assert [m for m, _ in fake.controls if m == "concate_and_append"] == []  # the server did nothing with it
    last = fake.requests[-1]["text"]
    assert ret.text().startswith(last) and "Statement 2: Oliver is the father of Carlos.\nNow, please" in last


def test_dtype_becomes_a_regex_with_number_stops(fake):
    tp.test_dtype_gen(check_answer=True)
    sps = [b["sampling_params"] for b in fake.requests]
    assert sps[0]["regex"] == tp.REGEX_STR and sps[0]["stop"] == ["\n", "<|im_end|>"]
    assert sps[1]["regex"] == tp.REGEX_INT and sps[1]["stop"] == [" ", "\n", "<|im_end|>"]
    assert sps[2]["regex"] == tp.REGEX_FLOAT and sps[3]["regex"] == r"(True|False)"


def test_stream_requests_are_streams(fake):
    tp.test_stream_logprobs(check_answer=True)
    body = fake.requests[-1]
    assert body["stream"] is True and body["return_logprob"] is True
    assert body["text"].startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n")

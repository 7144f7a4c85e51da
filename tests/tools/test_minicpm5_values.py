"""MiniCPM's parameter values (XML text: entities, CDATA) and the checks a call passes against its tool's schema
before it is sent, as SGLang's minicpm5 parser reads them."""

from __future__ import annotations

import json

from radixlang_runtime.tool_parsers import CallArgs, CallStart, collect, get_parser


def calls_of(result) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in result.calls]


def test_minicpm5_reads_values_and_checks_calls_as_sglang_does():
    """MiniCPM: a string-typed value is its text (entities read, CDATA as written, whitespace around dropped),
    others JSON, else a Python literal, else text; a call naming a parameter its schema lacks or leaving out a
    required one stays text, and a stream sends nothing of it."""
    schema = {"type": "object", "required": ["s"], "properties": {
        "s": {"type": "string"}, "o": {"type": "object"}, "t": {"type": ["string", "null"]}, "n": {}}}
    text = ('<function name="f"><param name="s"> 12 &lt;b&gt; &#x41;&#66; &bogus; </param><param name="o">'
            "{'k': (1, 2), 'v': None}</param><param name=\"t\">null</param><param name=\"n\">\n"
            "<![CDATA[ x &amp; <y> ]]>\n</param></function>")
    got = get_parser("minicpm5").parse(text, schemas={"f": schema})
    assert calls_of(got) == [("f", {"s": "12 <b> AB &bogus;", "o": {"k": [1, 2], "v": None}, "t": None,
                                    "n": "x &amp; <y>"})]
    for bad in ('<function name="f"><param name="n">1</param></function>',  # the required one left out
                '<function name="f"><param name="s">a</param><param name="z">1</param></function>'):  # unknown
        assert get_parser("minicpm5").parse(bad, schemas={"f": schema}).calls == []
        p = get_parser("minicpm5")(None, schemas={"f": schema})
        events = [e for ch in bad for e in p.feed(ch)] + p.finish()
        assert not [e for e in events if isinstance(e, (CallStart, CallArgs))]
        assert collect(events).content == bad
    assert calls_of(get_parser("minicpm5").parse('<function name="g"><param name="z">1</param></function>',
                                                 schemas={"f": schema})) == [("g", {"z": 1})]  # no schema: any

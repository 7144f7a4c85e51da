"""Recorded outputs of the tool-call formats (written exactly as the models emit them: their chat templates' markup
and SGLang's / vLLM's recorded samples), the malformed ones that must stay text, and the stream functions the format
tests share (tests/tools/test_tool_formats.py)."""

from __future__ import annotations

import json
import random

from radixlang_runtime.tool_parsers import get_parser

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                            "metric": {"type": "boolean"}, "lat": {"type": "number"},
                                            "hours": {"type": "array", "items": {"type": "integer"}},
                                            "zip": {"type": "string"}, "unit": {"type": ["string", "null"]}}}
WRITE = {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}}
SCHEMAS = {"get_weather": WEATHER, "write_file": WRITE, "now": {"type": "object", "properties": {}}}

MM_CALL = '<invoke name="get_weather">\n<parameter name="city">{}</parameter>\n</invoke>\n'
DSML = "｜DSML｜"
STEP_CALL = ("<｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name=\"{}\">\n{}</steptml:invoke>"
             "<｜tool_call_end｜>")
NS = "]<]minimax[>["  # MiniMax-M3's namespace token, before every tag
Q = '<|"|>'  # Gemma 4's string delimiter token
E = "<escape>"  # FunctionGemma's
K3_CALL = "<|open|>call tool=\"{}\" index=\"{}\"<|sep|>{}<|close|>call<|sep|>"
K3_ARG = "<|open|>argument key=\"{}\" type=\"{}\"<|sep|>{}<|close|>argument<|sep|>"
DS_CALL = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{}\n```<｜tool▁call▁end｜>"
# (format, output, expected content, expected [(name, arguments)])
CASES = [
    ("qwen3_coder", "I'll check the weather for you.\n<tool_call>\n<function=get_weather>\n<parameter=city>\n"
                    "San Francisco\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n"
                    "</parameter>\n<parameter=lat>\n37.77\n</parameter>\n<parameter=hours>\n[9, 12]\n</parameter>\n"
                    "<parameter=zip>\n94103\n</parameter>\n<parameter=unit>\nnull\n</parameter>\n</function>\n"
                    "</tool_call>", "I'll check the weather for you.",
     [("get_weather", {"city": "San Francisco", "days": 3, "metric": True, "lat": 37.77, "hours": [9, 12],
                       "zip": "94103", "unit": None})]),
    ("qwen3_coder", "<tool_call>\n<function=write_file>\n<parameter=path>\nsrc/a.py\n</parameter>\n"
                    "<parameter=content>\ndef f():\n    return \"<tool>\"\n\n</parameter>\n</function>\n</tool_call>\n"
                    "<tool_call>\n<function=now>\n</function>\n</tool_call>", "",
     [("write_file", {"path": "src/a.py", "content": "def f():\n    return \"<tool>\"\n"}), ("now", {})]),
    ("qwen3_coder", "Plain <tool> text with <function=x> in it.", "Plain <tool> text with <function=x> in it.", []),
    ("glm45", "Let me look that up.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>"
              "\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n<arg_key>hours</arg_key>\n<arg_value>[8, 20]"
              "</arg_value>\n</tool_call>", "Let me look that up.",
     [("get_weather", {"city": "Beijing", "days": 2, "hours": [8, 20]})]),
    ("glm45", "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n</tool_call>\n"
              "<tool_call>now\n</tool_call>", "", [("get_weather", {"city": "Oslo"}), ("now", {})]),
    # stopped on <|observation|>: the closing tag is not in the text
    ("glm45", "<tool_call>get_weather\n<arg_key>zip</arg_key>\n<arg_value>0150</arg_value>\n", "",
     [("get_weather", {"zip": "0150"})]),
    ("deepseekv3", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
                   "{\"city\": \"Tokyo\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>"
                   "get_weather\n```json\n{\"city\": \"Paris\", \"days\": 2}\n```<｜tool▁call▁end｜>"
                   "<｜tool▁calls▁end｜>", "",
     [("get_weather", {"city": "Tokyo"}), ("get_weather", {"city": "Paris", "days": 2})]),
    ("deepseekv3", "Checking.\n\n<｜tool▁calls▁begin｜>" + DS_CALL + "<｜tool▁calls▁end｜>", "Checking.",
     [("get_weather", {})]),
    ("deepseekv31", "I'll call it.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
                    "{\"city\": \"Hangzhou\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>now<｜tool▁sep｜>{}"
                    "<｜tool▁call▁end｜><｜tool▁calls▁end｜>", "I'll call it.",
     [("get_weather", {"city": "Hangzhou"}), ("now", {})]),
    ("kimi_k2", "Let me check both.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
                "<|tool_call_argument_begin|>{\"city\": \"Beijing\"}<|tool_call_end|><|tool_call_begin|>"
                "functions.get_weather:1<|tool_call_argument_begin|>{\"city\": \"Shanghai\", \"metric\": true}"
                "<|tool_call_end|><|tool_calls_section_end|>", "Let me check both.",
     [("get_weather", {"city": "Beijing"}), ("get_weather", {"city": "Shanghai", "metric": True})]),
    ("gpt-oss", "<|channel|>analysis<|message|>User asks weather in Tokyo. Use get_weather.<|end|>"
                "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
                "{\"city\":\"Tokyo\"}<|call|>", "", [("get_weather", {"city": "Tokyo"})]),
    # the recipient in the role header; stopped on <|call|> (not in the text)
    ("gpt-oss", "<|channel|>analysis<|message|>Need the time.<|end|><|start|>assistant to=functions.now"
                "<|channel|>commentary json<|message|>{}", "", [("now", {})]),
    # the output's first message addressed in its role header (the prompt ends with `<|start|>assistant`)
    ("gpt-oss", " to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{\"city\":\"Oslo\"}"
                "<|call|>", "", [("get_weather", {"city": "Oslo"})]),
    ("gpt-oss", "<|channel|>analysis<|message|>User greets. Reply.<|end|><|start|>assistant<|channel|>final"
                "<|message|>Hello! How can I help?<|return|>", "Hello! How can I help?", []),
    ("seed_oss", "Reading it.\n<seed:tool_call>\n<function=write_file>\n<parameter=path>src/a.py</parameter>\n"
                 "<parameter=content>\ndef f():\n    return 1\n\n</parameter>\n</function>\n</seed:tool_call>\n"
                 "<seed:tool_call>\n<function=get_weather>\n<parameter=days>3</parameter>\n<parameter=zip>0150"
                 "</parameter>\n<parameter=hours>[1, 2]</parameter>\n</function>\n</seed:tool_call>", "Reading it.",
     [("write_file", {"path": "src/a.py", "content": "def f():\n    return 1\n"}),
      ("get_weather", {"days": 3, "zip": "0150", "hours": [1, 2]})]),
    ("seed_oss", "<seed:tool_call>\n<function=now>\n</function>\n</seed:tool_call>", "", [("now", {})]),
    # GLM-4.7: the tags back to back, calls too
    ("glm47", "Let me look that up.<tool_call>get_weather<arg_key>city</arg_key><arg_value>北京</arg_value>"
              "<arg_key>days</arg_key><arg_value>2</arg_value><arg_key>metric</arg_key><arg_value>false</arg_value>"
              "</tool_call><tool_call>now</tool_call>", "Let me look that up.",
     [("get_weather", {"city": "北京", "days": 2, "metric": False}), ("now", {})]),
    ("glm47", "<tool_call>get_weather<arg_key>unit</arg_key><arg_value>null</arg_value>", "",
     [("get_weather", {"unit": None})]),  # stopped on <|observation|>
    ("minimax-m2", "I'll check both cities.\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n"
                   "<parameter name=\"city\">San Francisco</parameter>\n<parameter name=\"days\">3</parameter>\n"
                   "<parameter name=\"metric\">true</parameter>\n<parameter name=\"lat\">37.5</parameter>\n"
                   "<parameter name=\"hours\">[9, 12]</parameter>\n<parameter name=\"zip\">94103</parameter>\n"
                   "</invoke>\n" + MM_CALL.format("Tokyo") + "</minimax:tool_call>", "I'll check both cities.",
     [("get_weather", {"city": "San Francisco", "days": 3, "metric": True, "lat": 37.5, "hours": [9, 12],
                       "zip": "94103"}), ("get_weather", {"city": "Tokyo"})]),
    ("minimax-m2", "<minimax:tool_call>\n<invoke name=\"write_file\">\n<parameter name=\"path\">a.html</parameter>\n"
                   "<parameter name=\"content\">\n<p>\"hi\"</p>\n\n</parameter>\n</invoke>\n<invoke name=\"now\">\n"
                   "</invoke>\n</minimax:tool_call>", "",
     [("write_file", {"path": "a.html", "content": "<p>\"hi\"</p>"}), ("now", {})]),
    ("minimax-m2", 'Plain <invoke name="x"> text.', 'Plain <invoke name="x"> text.', []),
    ("deepseekv32", f"Let me check.\n\n<{DSML}function_calls>\n<{DSML}invoke name=\"get_weather\">\n"
                    f"<{DSML}parameter name=\"city\" string=\"true\">Hangzhou</{DSML}parameter>\n"
                    f"<{DSML}parameter name=\"days\" string=\"false\">2</{DSML}parameter>\n"
                    f"<{DSML}parameter name=\"zip\" string=\"true\">0150</{DSML}parameter>\n"
                    f"<{DSML}parameter name=\"hours\" string=\"false\">[8, 20]</{DSML}parameter>\n"
                    f"</{DSML}invoke>\n<{DSML}invoke name=\"now\">\n</{DSML}invoke>\n</{DSML}function_calls>",
     "Let me check.", [("get_weather", {"city": "Hangzhou", "days": 2, "zip": "0150", "hours": [8, 20]}), ("now", {})]),
    ("step3", "Checking.<｜tool_calls_begin｜>\n" + STEP_CALL.format(
        "get_weather", "<steptml:parameter name=\"city\"> New York </steptml:parameter>\n<steptml:parameter "
        "name=\"days\">3</steptml:parameter>\n<steptml:parameter name=\"hours\">[7]</steptml:parameter>\n")
     + "\n" + STEP_CALL.format("now", "") + "\n<｜tool_calls_end｜>", "Checking.",
     [("get_weather", {"city": "New York", "days": 3, "hours": [7]}), ("now", {})]),
    # untagged: the invoke blocks without their wrapper, text before and after them
    ("deepseekv32", f"Let me check.\n\n<{DSML}invoke name=\"get_weather\">\n"
                    f"<{DSML}parameter name=\"city\" string=\"true\">Oslo</{DSML}parameter>\n</{DSML}invoke>\n"
                    f"<{DSML}invoke name=\"now\">\n</{DSML}invoke>\nDone.", "Let me check.Done.",
     [("get_weather", {"city": "Oslo"}), ("now", {})]),
    # untagged calls end at the first text that is not a call (here the start of one, cut off)
    ("deepseekv32", f"<{DSML}invoke name=\"now\">\n</{DSML}invoke>\n<{DSML}inv", f"<{DSML}inv", [("now", {})]),
    # DeepSeek V4: V3.2's calls in <｜DSML｜tool_calls>; a call with no arguments closes itself
    ("deepseekv4", f"On it.\n\n<{DSML}tool_calls>\n<{DSML}invoke name=\"get_weather\">\n"
                   f"<{DSML}parameter name=\"city\" string=\"true\">Lima</{DSML}parameter>\n"
                   f"<{DSML}parameter name=\"hours\" string=\"false\">[6]</{DSML}parameter>\n</{DSML}invoke>\n"
                   f"<{DSML}invoke name=\"now\"/>\n</{DSML}tool_calls>", "On it.",
     [("get_weather", {"city": "Lima", "hours": [6]}), ("now", {})]),
    ("deepseekv4", f"<{DSML}invoke name=\"now\"/>\n<{DSML}invoke name=\"get_weather\">\n{{\"days\": 1}}\n"
                   f"</{DSML}invoke>", "", [("now", {}), ("get_weather", {"days": 1})]),
    # MiniMax-M3: a parameter is a tag named by its key; arrays as <item> tags, objects as nested tags
    ("minimax-m3", f"Checking both.\n{NS}<tool_call>\n{NS}<invoke name=\"get_weather\">{NS}<city>San Francisco"
                   f"{NS}</city>{NS}<days>3{NS}</days>{NS}<metric>yes{NS}</metric>{NS}<lat>37.50{NS}</lat>{NS}<hours>"
                   f"{NS}<item>9{NS}</item>{NS}<item>12{NS}</item>{NS}</hours>{NS}<zip>94103{NS}</zip>{NS}<unit>"
                   f"NULL{NS}</unit>{NS}</invoke>\n{NS}<invoke name=\"now\">{NS}</invoke>\n{NS}</tool_call>",
     "Checking both.", [("get_weather", {"city": "San Francisco", "days": 3, "metric": True, "lat": 37.5,
                                         "hours": [9, 12], "zip": "94103", "unit": None}), ("now", {})]),
    # whitespace between the namespace token and a tag; stopped before the group's close tag
    ("minimax-m3", f"{NS}\n<tool_call>\n{NS} <invoke name=\"write_file\">\n{NS}<path>a.py{NS}</path>\n"
                   f"{NS}<content>x = \"<b>\"\n{NS}</content>\n{NS}</invoke>", "",
     [("write_file", {"path": "a.py", "content": "x = \"<b>\"\n"})]),
    ("minimax-m3", 'Plain ]<]minimax <invoke name="now"> text.', 'Plain ]<]minimax <invoke name="now"> text.', []),
    # LFM2: a Python list of calls in its special tokens, a JSON list, or one call without the list
    ("lfm2", "Checking.<|tool_call_start|>[get_weather(city=\"Paris\", days=2, hours=[9, 12]), now()]"
             "<|tool_call_end|>Done.", "Checking.Done.",
     [("get_weather", {"city": "Paris", "days": 2, "hours": [9, 12]}), ("now", {})]),
    ("lfm2", "<|tool_call_start|>[{\"name\": \"get_weather\", \"arguments\": {\"metric\": true}}, {\"name\": \"now\", "
             "\"arguments\": {}}]<|tool_call_end|>", "", [("get_weather", {"metric": True}), ("now", {})]),
    ("lfm2", "<|tool_call_start|>now()", "", [("now", {})]),  # stopped on <|tool_call_end|>
    # Gemma 4: one call per token pair, bare keys, strings between <|"|> tokens, nested objects and arrays
    ("gemma4", f"Checking.<|tool_call>call:get_weather{{city:{Q}Paris, {{FR}}{Q},days:2,hours:[9,12],metric:true,"
               f"unit:null}}<tool_call|><|tool_call>call:now{{}}<tool_call|>Done.", "Checking.Done.",
     [("get_weather", {"city": "Paris, {FR}", "days": 2, "hours": [9, 12], "metric": True, "unit": None}),
      ("now", {})]),
    ("gemma4", f"<|tool_call>call:write_file{{path:{Q}a.py{Q},content:{Q}x = {{\"k\": [1]}}\n{Q}}}", "",
     [("write_file", {"path": "a.py", "content": "x = {\"k\": [1]}\n"})]),  # stopped on <tool_call|>
    ("gemma4", "Plain call:now{} and <|tool text.", "Plain call:now{} and <|tool text.", []),
    # FunctionGemma: Gemma 4's calls in its own tokens, strings between <escape> tokens
    ("functiongemma", f"Checking.<start_function_call>call:get_weather{{city:{E}Paris, {{FR}}{E},days:2,hours:[9,12],"
                      f"metric:true}}<end_function_call><start_function_call>call:now{{}}<end_function_call>Done.",
     "Checking.Done.", [("get_weather", {"city": "Paris, {FR}", "days": 2, "hours": [9, 12], "metric": True}),
                        ("now", {})]),
    ("functiongemma", f"<start_function_call>call:write_file{{path:{E}a.py{E},content:{E}x = {{\"k\": [1]}}\n{E}}}",
     "", [("write_file", {"path": "a.py", "content": "x = {\"k\": [1]}\n"})]),  # stopped on <end_function_call>
    ("functiongemma", "Plain call:now{} and <start_function text.", "Plain call:now{} and <start_function text.", []),
    # MiMo writes Qwen3-Coder's calls (its `mimo` name is an alias), values with no newlines around them
    # dots: MiniMax-M2's invokes in its own group, values stripped and typed by the schema; groups back to back,
    # a group's body may be one JSON call object; the close tag may be cut off
    ("dots", "I'll check both.\n<dots_function_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">"
             "San Francisco</parameter>\n<parameter name=\"days\">3</parameter>\n<parameter name=\"metric\">true"
             "</parameter>\n<parameter name=\"lat\">37.0</parameter>\n<parameter name=\"hours\">[9, 12]</parameter>\n"
             "<parameter name=\"zip\">\n 94103 \n</parameter>\n<parameter name=\"unit\">NULL</parameter>\n</invoke>\n"
             "<invoke name=\"now\">\n</invoke>\n</dots_function_call>", "I'll check both.",
     [("get_weather", {"city": "San Francisco", "days": 3, "metric": True, "lat": 37, "hours": [9, 12],
                       "zip": "94103", "unit": None}), ("now", {})]),
    ("dots", "<dots_function_call>\n<invoke name=\"write_file\">\n<parameter name=\"path\">a.py</parameter>\n"
             "<parameter name=\"content\">print(\"<dots>\")\n</parameter>\n</invoke>\n</dots_function_call>\n"
             "<dots_function_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n", "",
     [("write_file", {"path": "a.py", "content": "print(\"<dots>\")"}), ("get_weather", {"city": "Oslo"})]),
    ("dots", "Plain <invoke name=\"now\"> and <dots_function text.",
     "Plain <invoke name=\"now\"> and <dots_function text.", []),
    # MiniCPM: a <function> element a call, back to back; quotes either way, CDATA as written, XML entities read
    ("minicpm5", "Let me check.<function name=\"get_weather\"><param name=\"city\">北京</param><param name=\"days\">"
                 "2</param><param name=\"hours\">[8, 20]</param></function><function name=\"now\"></function>",
     "Let me check.", [("get_weather", {"city": "北京", "days": 2, "hours": [8, 20]}), ("now", {})]),
    ("minicpm5", "<function name='write_file'>\n<param name=\"path\">a &amp; b.py</param>\n<param name='content'>"
                 "<![CDATA[if a < b:\n    pass &amp;]]></param>\n</function>", "",
     [("write_file", {"path": "a & b.py", "content": "if a < b:\n    pass &amp;"})]),
    ("minicpm5", "Plain <function=now> and <functions> and <function text.",
     "Plain <function=now> and <functions> and <function text.", []),
    ("mimo", "<tool_call>\n<function=get_weather>\n<parameter=city>Paris</parameter>\n<parameter=days>2</parameter>\n"
             "</function>\n</tool_call>", "", [("get_weather", {"city": "Paris", "days": 2})]),
    # Kimi K3: the reply in its response channel, the calls in the tools channel (values typed by their tag)
    ("kimi_k3", "<|open|>response<|sep|>Checking both.<|close|>response<|sep|><|open|>tools<|sep|>"
                + K3_CALL.format("get_weather", 1, K3_ARG.format("city", "string", "\nSan Francisco ")
                                 + K3_ARG.format("days", "integer", "3") + K3_ARG.format("hours", "array", "[9, 12]")
                                 + K3_ARG.format("zip", "string", "007"))
                + K3_CALL.format("now", 2, "") + "<|close|>tools<|sep|>", "Checking both.",
     [("get_weather", {"city": "\nSan Francisco ", "days": 3, "hours": [9, 12], "zip": "007"}), ("now", {})]),
    ("kimi_k3", "Done<|close|>response<|sep|><|open|>tools<|sep|>"  # the response opener in the prompt
                + K3_CALL.format("write_file", 1, K3_ARG.format("path", "string", "a &amp; b.py")
                                 + K3_ARG.format("content", "string", "x = {\"k\": 1}\n")), "Done",
     [("write_file", {"path": "a &amp; b.py", "content": "x = {\"k\": 1}\n"})]),  # stopped on the tools close
    ("kimi_k3", "Plain <|open|>call text.", "Plain <|open|>call text.", []),
    # a call's arguments as one JSON object (SGLang reads this form too; forced calls write it)
    ("deepseekv32", f"<{DSML}function_calls>\n<{DSML}invoke name=\"get_weather\">\n"
                    "{\"city\": \"Paris\", \"days\": 2}\n" f"</{DSML}invoke>\n</{DSML}function_calls>", "",
     [("get_weather", {"city": "Paris", "days": 2})]),
]
MALFORMED = [  # parse() leaves each whole as text (a stream agrees: the break shows before a call commits)
    ("dots", "<dots_function_call>\n<invoke name=\"rm_rf\">\n</invoke>\n</dots_function_call>"),
    ("dots", "<dots_function_call>\n{\"name\": \"get_weather\", \"arguments\": \"city=Oslo\"}\n</dots_function_call>"),
    ("dots", "<dots_function_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Oslo</invoke>\n"
             "</dots_function_call>"),  # the value not closed
    ("minicpm5", "<function name=\"get_weather\"><param name=\"town\">Oslo</param></function>"),  # not in the schema
    ("minicpm5", "<function name=\"get_weather\"><param name=\"city\">A</param><param name=\"city\">B</param>"
                 "</function>"),  # twice
    ("minicpm5", "<function name=\"get_weather\"><param name=\"city\">Oslo</param>"),  # cut off
    ("minicpm5", "<function><param name=\"city\">Oslo</param></function>"),  # no name
    ("minicpm5", "<function name=\"rm_rf\"></function>"),
    ("qwen3_coder", "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</function>\n</tool_call>"),
    ("qwen3_coder", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>"),
    ("qwen3_coder", "<tool_call>\n<function=unknown_fn>\n</function>\n</tool_call>"),
    ("glm45", "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</tool_call>"),
    ("deepseekv3", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```python\n"
                   "print(1)\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
    ("deepseekv31", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>[1]<｜tool▁call▁end｜>"
                    "<｜tool▁calls▁end｜>"),
    ("kimi_k2", "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather"
                "<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>"),
    ("gpt-oss", "<|channel|>commentary to=browser.search <|constrain|>json<|message|>{\"q\": \"x\"}<|call|>"),
    ("seed_oss", "<seed:tool_call>\n<function=unknown_fn>\n</function>\n</seed:tool_call>"),
    ("seed_oss", "<seed:tool_call>\n<function=get_weather>\n<parameter=city>Oslo\n</function>\n</seed:tool_call>"),
    ("glm47", "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</tool_call>"),
    ("minimax-m2", "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Paris</invoke>\n"
                   "</minimax:tool_call>"),
    ("minimax-m2", "<minimax:tool_call>\n<invoke name=\"rm_rf\">\n</invoke>\n</minimax:tool_call>"),
    ("minimax-m2", "<minimax:tool_call>\n</minimax:tool_call>"),
    ("step3", "<｜tool_calls_begin｜>\n<｜tool_call_begin｜>code<｜tool_sep｜><steptml:invoke name=\"now\">\n"
              "</steptml:invoke><｜tool_call_end｜>\n<｜tool_calls_end｜>"),  # only `function` calls
    ("step3", "<｜tool_calls_begin｜>\n" + STEP_CALL.format("get_weather", "<steptml:parameter name=\"city\">Oslo")
     + "\n<｜tool_calls_end｜>"),
    ("deepseekv32", f"<{DSML}function_calls>\n<{DSML}invoke name=\"get_weather\">\n<{DSML}parameter name=\"city\">"
                    f"Paris</{DSML}parameter>\n</{DSML}invoke>\n</{DSML}function_calls>"),  # no string="..."
    ("deepseekv32", f"<{DSML}invoke name=\"get_weather\">\n<{DSML}parameter name=\"city\" string=\"true\">Oslo"
                    f"</{DSML}invoke>"),  # untagged, the parameter unclosed
    ("deepseekv4", f"<{DSML}invoke name=\"rm_rf\"/>"),
    ("minimax-m3", f"{NS}<tool_call>\n{NS}<invoke name=\"get_weather\">{NS}<city>Oslo{NS}</town>{NS}</invoke>\n"
                   f"{NS}</tool_call>"),  # mismatched close tag
    ("minimax-m3", f"{NS}<tool_call>\n{NS}<invoke name=\"rm_rf\">{NS}</invoke>\n{NS}</tool_call>"),
    ("lfm2", "<|tool_call_start|>[rm_rf(path=\"/\")]<|tool_call_end|>"),
    ("gemma4", "<|tool_call>call:rm_rf{path:<|\"|>/<|\"|>}<tool_call|>"),
    ("kimi_k3", "<|open|>tools<|sep|>" + K3_CALL.format("rm_rf", 1, "") + "<|close|>tools<|sep|>"),
    ("kimi_k3", "<|open|>tools<|sep|>" + K3_CALL.format("get_weather", 1, "<|open|>argument type=\"string\"<|sep|>x"
                                                      "<|close|>argument<|sep|>") + "<|close|>tools<|sep|>"),  # no key
    ("gemma4", "<|tool_call>call:get_weather{hours:[1,2}<tool_call|>"),  # unbalanced
    ("gemma4", "<|tool_call>get_weather{city:<|\"|>Oslo<|\"|>}<tool_call|>"),  # no call:
    ("functiongemma", "<start_function_call>call:rm_rf{path:<escape>/<escape>}<end_function_call>"),
    ("functiongemma", "<start_function_call>get_weather{city:<escape>Oslo<escape>}<end_function_call>"),  # no call:
    ("functiongemma", "<start_function_call>call:get_weather{city:<escape>Oslo}<end_function_call>"),  # unclosed
    ("lfm2", "<|tool_call_start|>[get_weather(city=Paris)]<|tool_call_end|>"),  # not a literal
    ("minimax-m3", f"{NS}<tool_call>\n{NS}<invoke name=\"get_weather\">{NS}<hours>7{NS}<item>1{NS}</item>"
                   f"{NS}</hours>{NS}</invoke>\n{NS}</tool_call>"),  # text beside nested tags
]
TOOL_NAMES = {"get_weather", "write_file", "now"}


def calls_of(result) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in result.calls]


def stream(fmt: str, text: str, cuts: list[int], tool_names=TOOL_NAMES, schemas=SCHEMAS) -> list:
    """A parser's events for `text` fed in the pieces `cuts` makes, then finished."""
    p = get_parser(fmt)(tool_names, schemas=schemas)
    events, prev = [], 0
    for c in [*cuts, len(text)]:
        events += p.feed(text[prev:c])
        prev = c
    return events + p.finish()


def chunkings(text: str, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    out = [list(range(1, len(text))), []] + [[k] for k in range(1, len(text))]  # every split in two
    for _ in range(8):
        out.append(sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(2, 16)))))
    return out

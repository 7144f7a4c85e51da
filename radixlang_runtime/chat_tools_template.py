"""The chat template a request with tools renders with when the model's own cannot show tools (no torch, no
server imports: the DSL renders it too, radixlang/tools.py)."""

from __future__ import annotations

from typing import Optional

# SmolLM2's tool format (HuggingFaceTB's SmolLM2-1.7B-Instruct model card, Ollama's smollm2 template; the
# function-calling data is Argilla's Synth-APIGen): the tools as JSON inside <tools></tools> in the system
# turn, calls as a JSON list in one <tool_call>[...]</tool_call>, results back as <tool_response> in a user
# turn. The system wording here is ours. Parsed by tool_parsers/hermes.py (list form).
CHATML_TOOLS_TEMPLATE = (  # newlines written as '\n' in expressions: HF renders with trim_blocks / lstrip_blocks
    "{%- set sys = messages[0]['content'] if messages and messages[0]['role'] == 'system' else none -%}"
    "{%- if tools -%}"
    "{{ '<|im_start|>system\\nYou can call functions. You are given a question and a list of functions; decide "
    "which of them, if any, answer it, and call them with arguments taken from the question.\\n"
    "The functions you can call:\\n<tools>' + (tools | tojson) + '</tools>\\n"
    "To call functions, answer only with a JSON list of calls in this format and no other text:\\n"
    "<tool_call>[\\n{\\\"name\\\": \\\"function_name\\\", \\\"arguments\\\": {\\\"argument_name\\\": "
    "\\\"value\\\"}}\\n]</tool_call>\\nIf no function fits, answer normally.' }}"
    "{%- if sys %}{{ '\\n\\n' + sys }}{% endif %}{{ '<|im_end|>\\n' }}"
    "{%- elif sys is not none -%}{{ '<|im_start|>system\\n' + sys + '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'user' -%}{{ '<|im_start|>user\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{%- elif m['role'] == 'system' and not loop.first -%}"
    "{{ '<|im_start|>system\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{%- elif m['role'] == 'assistant' -%}{{ '<|im_start|>assistant\\n' + m['content'] }}"
    "{%- if m['tool_calls'] %}{{ '<tool_call>[\\n' }}"
    "{%- for c in m['tool_calls'] %}{{ '{\\\"name\\\": ' + (c['function']['name'] | tojson) + ', \\\"arguments\\\": ' "
    "+ (c['function']['arguments'] | tojson) + '}' + ('' if loop.last else ',\\n') }}{% endfor %}"
    "{{ '\\n]</tool_call>' }}{% endif %}{{ '<|im_end|>\\n' }}"
    "{%- elif m['role'] == 'tool' -%}"
    "{{ '<|im_start|>user\\n<tool_response>\\n' + m['content'] + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif -%}"
)


def template_with_tools(active: str) -> Optional[str]:
    """The template that renders tools: the active one when it does, CHATML_TOOLS_TEMPLATE for a ChatML
    one that does not, else None."""
    if "tools" in active and "tool_call" in active:
        return active
    return CHATML_TOOLS_TEMPLATE if "<|im_start|>" in active else None

"""PromptEncoder: the one place prompt text becomes token ids (the Engine, every HTTP route, the ZeroMQ
frontend, so the DSL too). Torch-free.

Raw text gets the special tokens the model's tokenizer adds by default (HF `tokenizer(text)`: BOS where
its `add_bos_token` / post-processor says so, e.g. Llama 3, Gemma, Mistral, GGUFs with
`tokenizer.ggml.add_bos_token`; none where not, e.g. SmolLM2), special-token text in it parsed as
control tokens. A text that already starts with the BOS (a chat template that writes `{{ bos_token }}`,
rendered by the DSL or a client) gets no second one.

Chat prompts (server/chat_render.py) come with the character spans of the messages' contents: inside
them special-token text is plain text (split_special_tokens), so a user cannot write `<|im_start|>system`
as turn markers; the template's own markers stay control tokens. Without spans (no content holds
special-token text) the rendered text is encoded whole, exactly as `apply_chat_template(tokenize=True)`
does. Chat gets the tokenizer's BOS prefix (when its template did not write one) but never its EOS suffix:
the prompt ends in the assistant's turn, where the model writes next.
"""

from __future__ import annotations

import re
from typing import Any, Optional, Sequence

Span = tuple[int, int]  # [start, end) character offsets of one message's content in the rendered text


def _added_ids(tokenizer: Any) -> Optional[tuple[list[int], list[int]]]:
    """(prefix, suffix): the ids the tokenizer adds around a text by default (its BOS / EOS); None when
    they cannot be told apart from the text's own ids (raw text then goes to tokenizer.encode as is)."""
    plain = tokenizer.encode("a", add_special_tokens=False)
    full = tokenizer.encode("a")
    for i in range(len(full) - len(plain) + 1):
        if full[i:i + len(plain)] == plain:
            return full[:i], full[i + len(plain):]
    return None


class PromptEncoder:
    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        added = _added_ids(tokenizer)
        self._whole = added is None
        self.prefix_ids, self.suffix_ids = added or ([], [])
        decoder = getattr(tokenizer, "added_tokens_decoder", {})
        specials = sorted({t.content for t in decoder.values() if t.special and t.content}, key=len, reverse=True)
        self._special = re.compile("|".join(map(re.escape, specials))) if specials else None

    def special_text_in(self, text: str) -> Optional[str]:
        """The first special token's text found in `text` (None: there is none)."""
        m = self._special.search(text) if self._special is not None else None
        return m.group(0) if m else None

    def encode(self, text: str) -> list[int]:
        """Raw text -> ids with the tokenizer's default special tokens (no second BOS)."""
        if self._whole:
            return self.tokenizer.encode(text)
        return self._with_prefix(self._plain(text)) + self.suffix_ids

    def encode_chat(self, text: str, content_spans: Optional[Sequence[Span]] = None) -> list[int]:
        """A rendered chat prompt -> ids: the template's markers as control tokens, the content spans'
        special-token text as plain text; the tokenizer's BOS unless the template wrote it."""
        return self._with_prefix(self._chat_body(text, content_spans))

    def encode_rendered(self, text: str, content_spans: Optional[Sequence[Span]], add_special_tokens: bool
                        ) -> list[int]:
        """A rendered chat prompt as vLLM's pooling chat requests tokenize it (HF `tokenizer(text,
        add_special_tokens=...)`): the text alone, or with the tokenizer's added tokens (BOS / EOS) around it even
        where the template wrote its own; content spans as in encode_chat."""
        if not add_special_tokens:
            return self._chat_body(text, content_spans)
        if self._whole and not content_spans:
            return self.tokenizer.encode(text)
        return self.prefix_ids + self._chat_body(text, content_spans) + self.suffix_ids

    def _chat_body(self, text: str, content_spans: Optional[Sequence[Span]]) -> list[int]:
        if not content_spans:
            return self._plain(text)
        ids, pos = [], 0
        for start, end in content_spans:
            ids += self._plain(text[pos:start])
            ids += self.tokenizer.encode(text[start:end], add_special_tokens=False, split_special_tokens=True)
            pos = end
        return ids + self._plain(text[pos:])

    def encode_plain(self, text: str) -> list[int]:
        """Text -> ids without special tokens (sampling_params bad_words, as vLLM tokenizes them)."""
        return self.tokenizer.encode(text, add_special_tokens=False)

    def encode_literal(self, text: str) -> list[int]:
        """Text -> ids without special tokens, its special-token text as text (fill-in-the-middle's prefix and
        suffix: fim_templates.py)."""
        return self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True) if text else []

    def _plain(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False) if text else []

    def _with_prefix(self, body: list[int]) -> list[int]:
        p = self.prefix_ids
        return body if not p or body[:len(p)] == p else p + body

"""Incremental detokenization (token ids -> text) and stop-string trimming, torch-free.

Used by the server's detokenizer process and by the in-process Engine: one copy of the rules.
Incremental decoding (as vLLM / SGLang): per request keep the ids, the text so far and two offsets.
Each update decodes ids[surr:read] (text already emitted) and ids[surr:] (with the new tokens); the
difference is the new text. A result ending in U+FFFD is an incomplete UTF-8 character: it waits for
the next token (offsets unchanged) unless the request finished. Cost per update is O(new tokens +
a short context), not O(output length). A request's state is dropped at its finish (or `forget`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from radixlang_runtime import faults
from radixlang_runtime.messages import BatchStrOut, BatchTokenIDOut
from radixlang_runtime.sampling_params import trim_at_stop

logger = logging.getLogger(__name__)
CONTEXT_TOKENS = 5  # tokens of left context re-decoded with the new ones (word boundaries, spaces)


@dataclass
class DecodeState:
    ids: list[int] = field(default_factory=list)
    text: str = ""
    surr: int = 0  # ids[surr:read] is the context already emitted as text
    read: int = 0


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.states: dict[str, DecodeState] = {}

    def _decode(self, ids: list[int], skip: bool, spaces: bool) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip, spaces_between_special_tokens=spaces)

    def update(self, msg: BatchTokenIDOut) -> tuple[BatchStrOut, dict[str, str]]:
        """Decode every entry of msg. Returns the progress of the entries that decoded and, for those
        that raised, {rid: error message}: a failing request never takes its neighbours down."""
        out = BatchStrOut([], [], [], [], [], [], [], [], [], [])
        failed: dict[str, str] = {}
        for i, rid in enumerate(msg.rids):
            try:
                new, is_full = self._text(msg, i)
            except Exception as e:  # noqa: BLE001 - contained to this request
                self.states.pop(rid, None)
                failed[rid] = f"internal error in detokenization: {type(e).__name__}: {e}"
                continue
            out.rids.append(rid)
            out.texts.append(new)
            out.text_is_full.append(is_full)
            out.new_ids.append(msg.new_ids[i])
            out.finished_reasons.append(msg.finished_reasons[i])
            out.prompt_tokens.append(msg.prompt_tokens[i])
            out.completion_tokens.append(msg.completion_tokens[i])
            out.cached_tokens.append(msg.cached_tokens[i])
            out.num_retractions.append(msg.num_retractions[i])
            out.queue_times.append(msg.queue_times[i])
            if msg.forced_tokens:
                out.forced_tokens.append(msg.forced_tokens[i])
                out.forward_passes.append(msg.forward_passes[i])
            if msg.spec_draft_tokens:
                out.spec_draft_tokens.append(msg.spec_draft_tokens[i])
                out.spec_accepted_tokens.append(msg.spec_accepted_tokens[i])
            if msg.input_logprobs:
                out.input_logprobs.append(msg.input_logprobs[i])
                out.input_top_logprobs.append(msg.input_top_logprobs[i])
                out.output_logprobs.append(msg.output_logprobs[i])
                out.output_top_logprobs.append(msg.output_top_logprobs[i])
        return out, failed

    def _text(self, msg: BatchTokenIDOut, i: int) -> tuple[str, bool]:
        """Entry i's new text (or, when is_full, its whole final text with the stop string trimmed)."""
        rid = msg.rids[i]
        faults.maybe_raise("detokenize", [rid])
        st = self.states.setdefault(rid, DecodeState())
        st.ids.extend(msg.new_ids[i])
        skip, spaces = msg.skip_special_tokens[i], msg.spaces_between_special_tokens[i]
        fin = msg.finished_reasons[i]
        emitted = self._decode(st.ids[st.surr : st.read], skip, spaces)
        full = self._decode(st.ids[st.surr :], skip, spaces)
        new = ""
        if fin is not None or not full.endswith("\ufffd"):
            new = full[len(emitted) :] if full.startswith(emitted) else self._resync(st, skip, spaces)
            st.surr = max(len(st.ids) - CONTEXT_TOKENS, st.read) if fin is None else len(st.ids)
            st.read = len(st.ids)
        st.text += new
        if fin is not None:
            del self.states[rid]
            from_end = msg.stop_from_end[i] if msg.stop_from_end else 0
            trimmed = trim_at_stop(st.text, fin, msg.no_stop_trim[i], from_end)
            if trimmed is not None:
                return trimmed, True
        return new, False

    def _resync(self, st: DecodeState, skip: bool, spaces: bool) -> str:
        """Decoding with the new tokens changed earlier text (rare, tokenizer clean-up rules): fall
        back to decoding everything and emit what extends the text so far."""
        whole = self._decode(st.ids, skip, spaces)
        return whole[len(st.text) :] if whole.startswith(st.text) else ""

    def forget(self, rid: str) -> None:
        """Drop a request's state (it ended without a finish message: error or abandoned)."""
        self.states.pop(rid, None)

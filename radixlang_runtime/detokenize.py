"""Incremental detokenization (token ids -> text) and stop-string trimming, torch-free.

Used by the server's detokenizer process and by the in-process Engine: one copy of the rules.
Incremental decoding (as vLLM / SGLang): per request keep the ids, the text so far and two offsets.
Each update decodes ids[surr:read] (text already emitted) and ids[surr:] (with the new tokens); the
difference is the new text. A result ending in U+FFFD is an incomplete UTF-8 character: it waits for
the next token (offsets unchanged) unless the request finished. Cost per update is O(new tokens +
a short context), not O(output length). A request's state is dropped at its finish (or `forget`).
Its constants (skip_special_tokens, ...) arrive once, in its first record (ReqTokenOut.consts), and are kept
in its state. Text goes out as deltas (ReqStrOut); a stop string cut at the finish is a `trim` of text
already sent, never the whole text again; the stop token that finished a request (EOS, stop_token_ids) is
left out of the text unless no_stop_trim (sampling_params.stop_token).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from radixlang_runtime.utils import faults
from radixlang_runtime.protocol.messages import BatchStrOut, BatchTokenIDOut, ReqConsts, ReqStrOut, ReqTokenOut
from radixlang_runtime.protocol.sampling_params import stop_token, trim_at_stop

logger = logging.getLogger(__name__)
CONTEXT_TOKENS = 5  # tokens of left context re-decoded with the new ones (word boundaries, spaces)


@dataclass
class DecodeState:
    consts: ReqConsts
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
        """Decode every record of msg. Returns the progress of the records that decoded and, for those
        that raised, {rid: error message}: a failing request never takes its neighbours down."""
        out = BatchStrOut()
        failed: dict[str, str] = {}
        for rec in msg.reqs:
            try:
                text, trim = self._text(rec)
            except Exception as e:  # noqa: BLE001 - contained to this request
                self.states.pop(rec.rid, None)
                failed[rec.rid] = f"internal error in detokenization: {type(e).__name__}: {e}"
                continue
            out.reqs.append(ReqStrOut(rid=rec.rid, text=text, progress=rec.progress, trim=trim))
        return out, failed

    def _text(self, rec: ReqTokenOut) -> tuple[str, int]:
        """The record's new text and how many characters of the text already sent its finish cuts
        (a stop string trimmed: ReqStrOut.trim)."""
        rid, fin = rec.rid, rec.progress.finished_reason
        faults.maybe_raise("detokenize", [rid])
        st = self.states.get(rid)
        if st is None:
            if rec.consts is None:
                raise ValueError(f"request {rid!r}: progress without its first record (no constants)")
            st = self.states[rid] = DecodeState(rec.consts)
        new_ids = rec.progress.new_ids
        if fin is not None and new_ids and new_ids[-1] == stop_token(fin, st.consts.no_stop_trim):
            new_ids = new_ids[:-1]  # the stop token that finished it: not part of the text
        st.ids.extend(new_ids)
        skip, spaces = st.consts.skip_special_tokens, st.consts.spaces_between_special_tokens
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
            trimmed = trim_at_stop(st.text, fin, st.consts.no_stop_trim, rec.stop_from_end)
            if trimmed is not None:  # a prefix of st.text
                sent = len(st.text) - len(new)
                return trimmed[sent:], max(0, sent - len(trimmed))
        return new, 0

    def _resync(self, st: DecodeState, skip: bool, spaces: bool) -> str:
        """Decoding with the new tokens changed earlier text (rare, tokenizer clean-up rules): fall
        back to decoding everything and emit what extends the text so far."""
        whole = self._decode(st.ids, skip, spaces)
        return whole[len(st.text) :] if whole.startswith(st.text) else ""

    def forget(self, rid: str) -> None:
        """Drop a request's state (it ended without a finish message: error or abandoned)."""
        self.states.pop(rid, None)

"""The detokenizer process: token ids -> text, incrementally, and stop-string trimming.

Incremental decoding (as vLLM / SGLang): per request keep the ids, the text so far and two offsets.
Each update decodes ids[surr:read] (text already emitted) and ids[surr:] (with the new tokens); the
difference is the new text. A result ending in U+FFFD is an incomplete UTF-8 character: it waits for
the next token (offsets unchanged) unless the request finished. Cost per update is O(new tokens +
a short context), not O(output length).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import zmq

from radixlang_runtime.messages import BatchStrOut, BatchTokenIDOut, decode, encode
from radixlang_runtime.sampling_params import trim_at_stop
from radixlang_runtime.server.ipc import IpcPaths
from radixlang_runtime.server_args import ServerArgs

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

    def update(self, msg: BatchTokenIDOut) -> BatchStrOut:
        out = BatchStrOut([], [], [], [], [], [], [], [], [], [])
        for i, rid in enumerate(msg.rids):
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
            is_full = False
            if fin is not None:
                del self.states[rid]
                trimmed = trim_at_stop(st.text, fin, msg.no_stop_trim[i])
                if trimmed is not None:
                    new, is_full = trimmed, True
            out.rids.append(rid)
            out.texts.append(new)
            out.text_is_full.append(is_full)
            out.new_ids.append(msg.new_ids[i])
            out.finished_reasons.append(fin)
            out.prompt_tokens.append(msg.prompt_tokens[i])
            out.completion_tokens.append(msg.completion_tokens[i])
            out.cached_tokens.append(msg.cached_tokens[i])
            out.num_retractions.append(msg.num_retractions[i])
            out.queue_times.append(msg.queue_times[i])
            if msg.input_logprobs:
                out.input_logprobs.append(msg.input_logprobs[i])
                out.input_top_logprobs.append(msg.input_top_logprobs[i])
                out.output_logprobs.append(msg.output_logprobs[i])
                out.output_top_logprobs.append(msg.output_top_logprobs[i])
        return out

    def _resync(self, st: DecodeState, skip: bool, spaces: bool) -> str:
        """Decoding with the new tokens changed earlier text (rare, tokenizer clean-up rules): fall
        back to decoding everything and emit what extends the text so far."""
        whole = self._decode(st.ids, skip, spaces)
        return whole[len(st.text) :] if whole.startswith(st.text) else ""


def run_detokenizer_process(args: ServerArgs, ipc: IpcPaths, model_dir: str, ready: Connection) -> None:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s detokenizer %(levelname)s %(message)s")
    try:
        from transformers import AutoTokenizer

        detok = IncrementalDetokenizer(AutoTokenizer.from_pretrained(args.tokenizer_path or model_dir))
        ctx = zmq.Context()
        recv = ctx.socket(zmq.PULL)
        recv.bind(ipc.detokenizer_in)
        send = ctx.socket(zmq.PUSH)
        send.connect(ipc.tokenizer_in)
        ready.send({"status": "ready"})
    except Exception as e:
        logger.exception("detokenizer failed to start")
        ready.send({"status": "error", "message": f"{type(e).__name__}: {e}"})
        return
    parent = os.getppid()
    while True:
        if not recv.poll(timeout=1000):
            if os.getppid() != parent:
                return
            continue
        msg = decode(recv.recv())
        if isinstance(msg, BatchTokenIDOut):
            send.send(encode(detok.update(msg)))

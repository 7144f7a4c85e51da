"""FakeBackend: a scripted model behind the native protocol, for fast exact tests.

One character is one token (token id = ord(char)), so lengths and logprob positions can be computed
by hand. Every request body is recorded (`requests`, in arrival order) after passing through the
same NativeBackend code as the real links. Behaviour is set by callables:
- `reply(prompt, sampling_params) -> str`: what the model would write (stop strings and
  max_new_tokens are applied here, like a server);
- `logprob(context_ids, token_id) -> float`: the logprob of a token after a context;
- `fail(body) -> (status, message) | None`: inject a refused / failed request.
`cached_tokens` is the longest prefix shared with an earlier prompt (a radix cache in miniature).
"""

from __future__ import annotations

import copy
import threading
import time
from typing import Any, Callable, Iterator, Optional

from radixlang.backend.native import NativeBackend
from radixlang.errors import BackendError

Reply = Callable[[str, dict], str]
Logprob = Callable[[list, int], float]


CHATML_JINJA = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                "'<|im_end|>' + '\\n'}}{% endfor %}"
                "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def default_logprob(context: list, token_id: int) -> float:
    return -1.0 - (token_id % 7) / 10.0


class FakeBackend(NativeBackend):
    def __init__(self, reply: Optional[Reply] = None, logprob: Optional[Logprob] = None,
                 fail: Optional[Callable[[dict], Any]] = None, chat_template_name: Optional[str] = None,
                 model_info: Optional[dict] = None, delay: float = 0.0):
        self.reply = reply or (lambda prompt, sp: " ok")
        self.logprob = logprob or default_logprob
        self.fail = fail
        self.delay = delay
        self.requests: list[dict] = []
        self.controls: list[tuple[str, Any]] = []
        self._seen: list[list[int]] = []
        self._lock = threading.Lock()
        self._info = model_info or {"model_path": "fake-model", "served_model_name": "fake",
                                    "chat_template": CHATML_JINJA}
        super().__init__(chat_template_name)

    # ------------------------------------------------------------------ transport
    def _call(self, body: dict) -> Any:
        prompts, is_list = self._record(body)
        out = [self._run_one(body, p, i) for i, p in enumerate(prompts) for _ in range(self._n(body, i))]
        return out if is_list or len(out) > 1 else out[0]

    @staticmethod
    def _n(body: dict, index: int) -> int:
        sp = body.get("sampling_params") or {}
        return (sp[index] if isinstance(sp, list) else sp).get("n") or 1

    def _call_stream(self, body: dict) -> Iterator[dict]:
        prompts, _ = self._record(body)
        final = self._run_one(body, prompts[0], 0)
        ids, meta = final["output_ids"], final["meta_info"]
        out_lp = meta.get("output_token_logprobs", [])
        for j in range(1, len(ids) + 1):
            m = dict(meta, completion_tokens=j, finish_reason=None if j < len(ids) else meta["finish_reason"])
            if "output_token_logprobs" in meta:
                m["output_token_logprobs"] = out_lp[j - 1: j]
                m["output_token_logprobs_length"] = j
            yield {"text": final["text"][:j], "output_ids": ids[:j], "meta_info": m}
        if not ids:
            yield final

    def _control(self, method: str, body: Optional[dict] = None) -> Any:
        with self._lock:
            self.controls.append((method, copy.deepcopy(body)))
        if method == "model_info":
            return dict(self._info)
        if method == "server_info":
            return {"version": "fake", "model_path": self._info.get("model_path")}
        if method == "flush_cache":
            with self._lock:
                self._seen.clear()
            return True
        if method == "concate_and_append":
            return {}
        raise BackendError(f"{method} is not supported by the fake backend", 404)

    # ------------------------------------------------------------------ the scripted model
    def _record(self, body: dict) -> tuple[list[list[int]], bool]:
        with self._lock:
            self.requests.append(copy.deepcopy(body))
        if self.fail is not None and (err := self.fail(body)) is not None:
            raise BackendError(f"fake backend refused the request: {err[1]}", err[0])
        if self.delay:
            time.sleep(self.delay)
        if "text" in body:
            texts = body["text"]
            is_list = isinstance(texts, list)
            return [[ord(c) for c in t] for t in (texts if is_list else [texts])], is_list
        ids = body["input_ids"]
        is_list = bool(ids) and isinstance(ids[0], list)
        return (ids if is_list else [ids]), is_list

    def _cached_len(self, ids: list[int]) -> int:
        with self._lock:
            best = 0
            for seen in self._seen:
                n = 0
                while n < min(len(seen), len(ids)) and seen[n] == ids[n]:
                    n += 1
                best = max(best, n)
            self._seen.append(list(ids))
        return best

    def _run_one(self, body: dict, ids: list[int], index: int) -> dict:
        sp = body.get("sampling_params") or {}
        if isinstance(sp, list):
            sp = sp[index]
        max_new = sp.get("max_new_tokens", 128)
        prompt = "".join(map(chr, ids))
        text = self.reply(prompt, sp) if max_new else ""
        stops = sp.get("stop") or []
        hits = [(text.find(s), s) for s in ([stops] if isinstance(stops, str) else stops) if s in text]
        cut, matched = min(hits) if hits else (len(text), 0)  # no stop string: the reply ends with EOS
        if cut > max_new:
            text, finish = text[:max_new], {"type": "length", "length": max_new}
        else:
            text, finish = text[:cut], {"type": "stop", "matched": matched}
        out_ids = [ord(c) for c in text]
        meta: dict = {"id": f"fake-{len(self.requests)}-{index}", "finish_reason": finish, "prompt_tokens": len(ids),
                      "completion_tokens": len(out_ids), "cached_tokens": self._cached_len(ids), "e2e_latency": 0.0}
        if body.get("return_logprob"):
            meta.update(self._logprobs(body, ids, out_ids, index))
        return {"text": text, "output_ids": out_ids, "meta_info": meta}

    def _logprobs(self, body: dict, ids: list[int], out_ids: list[int], index: int) -> dict:
        start = body.get("logprob_start_len")
        start = start[index] if isinstance(start, list) else start
        start = 0 if start in (None, -1) else start
        if start >= len(ids):
            raise BackendError(f"logprob_start_len ({start}) must be below the prompt length ({len(ids)})", 400)
        txt = (lambda t: chr(t)) if body.get("return_text_in_logprobs") else (lambda t: None)
        entries = [[self.logprob(ids[:i], ids[i]), ids[i], txt(ids[i])] for i in range(start + 1, len(ids))]
        if start == 0:
            entries = [[None, ids[0], txt(ids[0])]] + entries
        full = ids + out_ids
        outs = [[self.logprob(full[:len(ids) + j], t), t, txt(t)] for j, t in enumerate(out_ids)]
        return {"input_token_logprobs": entries, "output_token_logprobs": outs}

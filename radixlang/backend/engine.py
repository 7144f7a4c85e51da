"""EngineBackend: `radixlang.Engine(**server_args)`, the in-process runtime as a backend (no server).

The native request bodies map onto `radixlang_runtime.Engine.generate`'s arguments; the engine
raises ValueError for a refused request (→ BackendError 400). Every call runs on a helper thread
and is waited for with a bound (`timeout`): past it TimeoutError is raised (a stream's engine
request is aborted when its helper sees the next chunk). Streams give per-chunk logprob deltas whether
the engine returns deltas or cumulative lists.
Any other attribute (`generate`, `get_stats`, `tokenizer`, ...) is the engine's own, so SGLang's
`sgl.Engine(...).generate(prompts, sampling_params)` also works.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Iterator, Optional

from radixlang.backend.native import NativeBackend
from radixlang.errors import BackendError, missing_extra
from radixlang.global_config import global_config

_DELTA_KEYS = ("output_token_logprobs", "output_top_logprobs")
_END = object()


class EngineBackend(NativeBackend):
    def __init__(self, model_path: Optional[str] = None, chat_template_name: Optional[str] = None,
                 timeout: Optional[float] = None, engine: Any = None, **server_args: Any):
        if engine is None:
            try:
                from radixlang_runtime.entrypoints.engine import Engine
            except ImportError as e:
                raise missing_extra(getattr(e, "name", None) or "torch", "runtime") from e
            engine = Engine(model_path, **server_args)
        self.engine = engine
        self.timeout = timeout or global_config.request_timeout
        super().__init__(chat_template_name)

    def __getattr__(self, name: str) -> Any:
        if name == "engine":
            raise AttributeError(name)
        return getattr(self.engine, name)

    # ------------------------------------------------------------------ transport
    def _kwargs(self, body: dict) -> dict:
        return dict(prompt=body.get("text"), input_ids=body.get("input_ids"),
                    sampling_params=body.get("sampling_params"), return_logprob=bool(body.get("return_logprob")),
                    logprob_start_len=body.get("logprob_start_len"), top_logprobs_num=body.get("top_logprobs_num") or 0,
                    return_text_in_logprobs=bool(body.get("return_text_in_logprobs")), rid=body.get("rid"),
                    cache_salt=body.get("cache_salt"), image_data=body.get("image_data"))

    def _call(self, body: dict) -> Any:
        pump = _Pump(lambda: iter([self.engine.generate(**self._kwargs(body))]), self.timeout)
        return next(iter(pump))

    def _call_stream(self, body: dict) -> Iterator[dict]:
        sent = 0
        for out in _Pump(lambda: self.engine.generate(stream=True, **self._kwargs(body)), self.timeout):
            meta = dict(out["meta_info"])
            if "output_token_logprobs" in meta and "output_token_logprobs_length" not in meta:
                n = len(meta["output_token_logprobs"])  # cumulative lists: cut the delta
                for k in _DELTA_KEYS:
                    if k in meta:
                        meta[k] = meta[k][sent:]
                meta["output_token_logprobs_length"] = sent = n
            yield {**out, "meta_info": meta}

    def _control(self, method: str, body: Optional[dict] = None) -> Any:
        e = self.engine
        if method == "model_info":
            return {"model_path": getattr(e, "model_dir", None),
                    "served_model_name": getattr(e, "served_model_name", None),
                    "chat_template": getattr(getattr(e, "tokenizer", None), "chat_template", None),
                    "is_generation": True, "image_token": getattr(e, "image_token", None)}
        if method == "server_info":
            args = e.server_args.to_dict() if hasattr(e, "server_args") else {}
            return {**args, "stats": e.get_stats(), "link": "in-process"}
        if method == "flush_cache":
            return e.flush_cache()
        if method == "concate_and_append":
            return {}
        if method == "pin_prefix" and hasattr(e, "pin_prefix"):
            return next(iter(_Pump(lambda: iter([e.pin_prefix(**body)]), self.timeout)))
        if method == "unpin_prefix" and hasattr(e, "unpin_prefix"):
            return {"pin_id": body["pin_id"], "success": e.unpin_prefix(body["pin_id"])}
        raise BackendError(f"{method} is not supported by the in-process engine", 404)

    def shutdown(self) -> None:
        self.engine.shutdown()

    def __enter__(self) -> "EngineBackend":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


class _Pump:
    """Runs a blocking iterator on a helper thread; each item is waited for at most `timeout` s.
    Engine errors come back as BackendError: ValueError (a refused request) with status 400."""

    def __init__(self, make: Callable[[], Iterator[Any]], timeout: float):
        self._q: queue.Queue = queue.Queue()
        self._timeout = timeout
        self._stop = threading.Event()
        threading.Thread(target=self._run, args=(make,), daemon=True, name="radixlang-engine-call").start()

    def _run(self, make: Callable[[], Iterator[Any]]) -> None:
        it = None
        try:
            it = make()
            for item in it:
                self._q.put(item)
                if self._stop.is_set():
                    break
            self._q.put(_END)
        except ValueError as e:
            self._q.put(BackendError(f"the engine refused the request: {e}", 400))
        except Exception as e:
            self._q.put(BackendError(f"the engine failed: {e!r}", 500))
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()  # an engine stream left early aborts its request

    def __iter__(self) -> Iterator[Any]:
        try:
            while True:
                try:
                    item = self._q.get(timeout=self._timeout)
                except queue.Empty:
                    raise TimeoutError(f"the engine gave no result within {self._timeout:.0f} s") from None
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self._stop.set()

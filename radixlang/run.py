"""Running programs: one (`run_program`) or many (`run_program_batch`).

Invariants:
- `run()` returns when the body returns (generation may still be pending); with stream=True it
  returns at once and the body runs on its own thread; a body exception ends the state (the
  exception is raised from `run()`, or kept as `error()` when streaming);
- `run_batch` returns states in input order, each complete (synced); with more than one item it first
  traces the body for its constant prefix and, when longer than `precache_min_chars`, prefills it
  and pins it in the radix cache for the batch (the prefill alone when the runtime has no pin); the
  pin is released at the end (the server also drops it when a ZeroMQ client goes away, or at its ttl);
- an item's exception is raised from `run_batch` once the items already running end; queued ones
  are cancelled (so are they when a generator_style consumer stops early).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator, Optional

from radixlang.errors import missing_extra
from radixlang.global_config import global_config
from radixlang.interpreter import StreamExecutor
from radixlang.ir import SglSamplingParams
from radixlang.program_state import ProgramState


def resolve_backend(backend: Any) -> Any:
    backend = backend or global_config.default_backend
    if backend is None:
        raise ValueError("no backend: pass backend=... or call set_default_backend(...) first")
    return getattr(backend, "endpoint", None) or backend


def _run_body(state: ProgramState, program: Any, args: tuple, kwargs: dict, sync: bool, keep_error: bool) -> None:
    exe = state.stream_executor
    try:
        state.ret_value = program.func(state, *args, **kwargs)
    except BaseException as e:
        exe.fail(e)
        if not keep_error:
            raise
    finally:
        exe.end()
    if sync:
        exe.sync()
    if global_config.verbosity >= 2:
        print(exe.text_)


def run_program(program: Any, backend: Any, args: tuple, kwargs: dict, default_params: SglSamplingParams,
                stream: bool = False, sync: bool = False) -> ProgramState:
    backend = resolve_backend(backend)
    kwargs = {**kwargs, **program.bind_arguments}
    state = ProgramState(StreamExecutor(backend, kwargs, default_params, stream=stream))
    if stream:
        threading.Thread(target=_run_body, args=(state, program, args, kwargs, sync, True), daemon=True,
                         name="radixlang-program").start()
    else:
        _run_body(state, program, args, kwargs, sync, False)
    return state


def precache_prefix(program: Any, backend: Any) -> Optional[Any]:
    """Trace, then pin (or prefill) the constant prefix; returns the pin handle (None: nothing to release)."""
    from radixlang.tracer import extract_prefix_by_tracing

    prefix = extract_prefix_by_tracing(program, backend)
    if len(prefix) > global_config.precache_min_chars:
        return backend.pin_prefix(prefix)
    return None


def _progress(total: int, enabled: bool) -> Any:
    if not enabled:
        return None
    try:
        import tqdm
    except ImportError as e:
        raise missing_extra("tqdm", "frontend") from e
    return tqdm.tqdm(total=total)


def run_program_batch(program: Any, backend: Any, batch_kwargs: list, default_params: SglSamplingParams,
                      num_threads: Any = "auto", progress_bar: bool = False, generator_style: bool = False) -> Any:
    backend = resolve_backend(backend)
    if num_threads == "auto":
        num_threads = max(16, (os.cpu_count() or 1) * 8)
    num_threads = max(1, min(int(num_threads), len(batch_kwargs)))
    gen = _batch(program, backend, batch_kwargs, default_params, num_threads, progress_bar)
    return gen if generator_style else list(gen)


def _batch(program: Any, backend: Any, batch_kwargs: list, default_params: SglSamplingParams, num_threads: int,
           progress_bar: bool) -> Iterator[ProgramState]:
    pbar = _progress(len(batch_kwargs), progress_bar)
    pin = None
    try:
        if global_config.enable_precache_with_tracing and len(batch_kwargs) > 1:
            pin = precache_prefix(program, backend)

        def one(kwargs: dict) -> ProgramState:
            st = run_program(program, backend, (), kwargs, default_params, stream=False, sync=True)
            if pbar is not None:
                pbar.update(1)
            return st

        pool = ThreadPoolExecutor(num_threads, thread_name_prefix="radixlang-batch")
        try:
            window = max(num_threads * 4, 64)  # bounded look-ahead: results stream out in input order
            futures: list = []
            it = iter(batch_kwargs)
            for kwargs in it:
                futures.append(pool.submit(one, kwargs))
                if len(futures) >= window:
                    break
            while futures:
                st = futures.pop(0).result(timeout=global_config.wait_timeout)
                nxt = next(it, None)
                if nxt is not None:
                    futures.append(pool.submit(one, nxt))
                yield st
        finally:  # an item's exception (or a consumer that left): queued items never start
            pool.shutdown(wait=True, cancel_futures=True)
    finally:
        if pin is not None:
            backend.unpin_prefix(pin)
        if pbar is not None:
            pbar.close()

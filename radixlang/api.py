"""The public functions of the language (SGLang's names and signatures).

`gen` parameters default to None so that the program-level defaults given to `run()` /
`run_batch()` apply; `gen(choices=...)` is a `select`; `dtype` becomes a regex at request time;
a user `regex` is compiled with Python's `re` first and `json_schema` may be a dict.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, List, Optional, Union

from radixlang.choices import ChoicesSamplingMethod, token_length_normalized
from radixlang.global_config import global_config
from radixlang.tools import ToolRequest
from radixlang.ir import (SglExpr, SglExprList, SglGen, SglImage, SglRoleBegin, SglRoleEnd, SglSamplingParams,
                          SglSelect, SglSeparateReasoning, SglVideo, check_regex, schema_string)

_RUN_DEFAULTS = dict(max_new_tokens=128, n=1, stop=None, stop_token_ids=None, stop_regex=None, temperature=1.0,
                     top_p=1.0, top_k=-1, min_p=0.0, frequency_penalty=0.0, presence_penalty=0.0, ignore_eos=False,
                     return_logprob=None, logprob_start_len=None, top_logprobs_num=None, return_text_in_logprobs=None)


def _defaults(params: dict) -> SglSamplingParams:
    return SglSamplingParams(**{k: params[k] for k in _RUN_DEFAULTS}).clone()


class SglFunction:
    def __init__(self, func: Callable, num_api_spec_tokens: Optional[int] = None,
                 bind_arguments: Optional[dict] = None):
        if num_api_spec_tokens is not None:  # a flag that is accepted does what it says, or is refused
            raise NotImplementedError(
                f"function(num_api_spec_tokens={num_api_spec_tokens!r}): SGLang's API speculative execution (for "
                "OpenAI-style backends) is not implemented in radixlang; drop the argument (None is accepted)")
        self.func = func
        self.num_api_spec_tokens = num_api_spec_tokens
        self.bind_arguments = bind_arguments or {}
        spec = inspect.getfullargspec(func)
        if not spec.args or spec.args[0] != "s":
            raise ValueError(f"the first argument of {func.__name__} must be 's' (the program state)")
        self.arg_names = spec.args[1:]
        self.arg_defaults = spec.defaults or ()

    def bind(self, **kwargs: Any) -> "SglFunction":
        unknown = set(kwargs) - set(self.arg_names)
        if unknown:
            raise TypeError(f"{self.func.__name__} has no argument(s) {sorted(unknown)}")
        return SglFunction(self.func, self.num_api_spec_tokens, {**self.bind_arguments, **kwargs})

    def run(self, *args: Any, stream: bool = False, backend: Any = None, use_thread: bool = True, **kwargs: Any) -> Any:
        from radixlang.run import run_program
        from radixlang.tracer import check_not_tracing

        check_not_tracing()
        params = {k: kwargs.pop(k, v) for k, v in _RUN_DEFAULTS.items()}
        return run_program(self, backend, args, kwargs, _defaults(params), stream=stream)

    def run_batch(self, batch_kwargs: Any, *, backend: Any = None, num_threads: Union[str, int] = "auto",
                  progress_bar: bool = False, generator_style: bool = False, **params: Any) -> Any:
        from radixlang.run import run_program_batch

        unknown = set(params) - set(_RUN_DEFAULTS)
        if unknown:
            raise TypeError(f"run_batch got unknown argument(s) {sorted(unknown)}")
        if not isinstance(batch_kwargs, (list, tuple)):
            raise TypeError("run_batch takes a list of kwargs dicts (or of argument tuples)")
        if not batch_kwargs:
            return []
        if not isinstance(batch_kwargs[0], dict):
            lo, hi = len(self.arg_names) - len(self.arg_defaults), len(self.arg_names)
            if not all(isinstance(a, (list, tuple)) and lo <= len(a) <= hi for a in batch_kwargs):
                raise TypeError(f"each argument tuple must have {lo}..{hi} values for {self.func.__name__}")
            batch_kwargs = [dict(zip(self.arg_names, a)) for a in batch_kwargs]
        merged = {**_RUN_DEFAULTS, **params}
        return run_program_batch(self, backend, list(batch_kwargs), _defaults(merged), num_threads, progress_bar,
                                 generator_style)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.run(*args, **kwargs)


def function(func: Optional[Callable] = None, num_api_spec_tokens: Optional[int] = None) -> Any:
    if func is not None:
        return SglFunction(func, num_api_spec_tokens)
    return lambda f: SglFunction(f, num_api_spec_tokens)


def Runtime(*args: Any, **kwargs: Any) -> Any:
    from radixlang.backend.runtime_endpoint import Runtime as _Runtime

    return _Runtime(*args, **kwargs)


def Engine(*args: Any, **kwargs: Any) -> Any:
    from radixlang.backend.engine import EngineBackend

    return EngineBackend(*args, **kwargs)


def RuntimeEndpoint(*args: Any, **kwargs: Any) -> Any:
    from radixlang.backend.runtime_endpoint import RuntimeEndpoint as _RuntimeEndpoint

    return _RuntimeEndpoint(*args, **kwargs)


def set_default_backend(backend: Any) -> None:
    global_config.default_backend = backend


def flush_cache(backend: Any = None) -> Any:
    backend = backend or global_config.default_backend
    return None if backend is None else (getattr(backend, "endpoint", None) or backend).flush_cache()


def get_server_info(backend: Any = None) -> Any:
    backend = backend or global_config.default_backend
    return None if backend is None else (getattr(backend, "endpoint", None) or backend).get_server_info()


def gen(name: Optional[str] = None, max_tokens: Optional[int] = None, min_tokens: Optional[int] = None,
        n: Optional[int] = None, stop: Optional[Union[str, List[str]]] = None,
        stop_token_ids: Optional[List[int]] = None,
        stop_regex: Optional[Union[str, List[str]]] = None, temperature: Optional[float] = None,
        top_p: Optional[float] = None, top_k: Optional[int] = None, min_p: Optional[float] = None,
        frequency_penalty: Optional[float] = None, presence_penalty: Optional[float] = None,
        ignore_eos: Optional[bool] = None, return_logprob: Optional[bool] = None,
        logprob_start_len: Optional[int] = None,
        top_logprobs_num: Optional[int] = None, return_text_in_logprobs: Optional[bool] = None, dtype: Any = None,
        choices: Optional[List[str]] = None, choices_method: Optional[ChoicesSamplingMethod] = None,
        regex: Optional[str] = None, json_schema: Any = None, ebnf: Optional[str] = None,
        tools: Optional[List[Any]] = None, tool_choice: Any = None) -> SglExpr:
    """SGLang's gen; `ebnf` (after SGLang's parameters) constrains the output to a GBNF-style EBNF grammar
    (root rule `root`), compiled by the server's --grammar-backend xgrammar / llguidance. `tools` (Python
    functions with type hints) and `tool_choice` ("auto", "required", {"name": ...}): radixlang/tools.py."""
    if choices:
        return SglSelect(name, choices, 0.0 if temperature is None else temperature,
                         choices_method or token_length_normalized)
    if ebnf is not None and not isinstance(ebnf, str):
        raise TypeError(f"ebnf must be a grammar string; got {type(ebnf).__name__}")
    check_regex(regex)  # stop_regex is checked by the runtime (RE2 syntax, limits), which answers 400
    if tool_choice is not None and tools is None:
        raise ValueError("tool_choice needs tools=[...]")
    tool_request = ToolRequest.make(tools, tool_choice) if tools is not None else None
    if tool_request is not None and (regex is not None or json_schema is not None or ebnf is not None):
        raise ValueError("gen(tools=...) cannot be combined with regex, json_schema or ebnf")
    return SglGen(name, SglSamplingParams(
        max_new_tokens=max_tokens, min_new_tokens=min_tokens, n=n, stop=stop, stop_token_ids=stop_token_ids,
        stop_regex=stop_regex, temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
        frequency_penalty=frequency_penalty, presence_penalty=presence_penalty, ignore_eos=ignore_eos,
        return_logprob=return_logprob, logprob_start_len=logprob_start_len, top_logprobs_num=top_logprobs_num,
        return_text_in_logprobs=return_text_in_logprobs, json_schema=schema_string(json_schema), dtype=dtype,
        regex=regex, ebnf=ebnf), tool_request)


def gen_int(name: Optional[str] = None, **kwargs: Any) -> SglExpr:
    return gen(name, dtype=int, **kwargs)


def gen_string(name: Optional[str] = None, **kwargs: Any) -> SglExpr:
    return gen(name, dtype=str, **kwargs)


def select(name: Optional[str] = None, choices: Optional[List[str]] = None, temperature: float = 0.0,
           choices_method: ChoicesSamplingMethod = token_length_normalized) -> SglExpr:
    if choices is None:
        raise ValueError("select needs choices=[...]")
    return SglSelect(name, choices, temperature, choices_method)


def image(expr: Any) -> SglExpr:
    return SglImage(expr)


def video(path: str, num_frames: int) -> SglExpr:
    return SglVideo(path, num_frames)


def _role(name: str, expr: Any = None) -> SglExprList:
    middle = [] if expr is None else [expr if isinstance(expr, SglExpr) else str(expr)]
    return SglExprList([SglRoleBegin(name), *middle, SglRoleEnd(name)])


def system(expr: Any = None) -> SglExprList:
    return _role("system", expr)


def user(expr: Any = None) -> SglExprList:
    return _role("user", expr)


def assistant(expr: Any = None) -> SglExprList:
    return _role("assistant", expr)


def system_begin() -> SglExpr:
    return SglRoleBegin("system")


def system_end() -> SglExpr:
    return SglRoleEnd("system")


def user_begin() -> SglExpr:
    return SglRoleBegin("user")


def user_end() -> SglExpr:
    return SglRoleEnd("user")


def assistant_begin() -> SglExpr:
    return SglRoleBegin("assistant")


def assistant_end() -> SglExpr:
    return SglRoleEnd("assistant")


def separate_reasoning(expr: Optional[SglExpr] = None, model_type: Optional[str] = None) -> SglExpr:
    """SGLang's sgl.separate_reasoning: runs `expr`, then splits each named gen / select in it into the answer
    (its variable, and the program's text) and `{name}_reasoning_content` (the `<think>` part), with the
    runtime's reasoning parser `model_type` (deepseek-r1, qwen3)."""
    if expr is None:
        raise ValueError("separate_reasoning needs an expression, e.g. sgl.gen(\"answer\")")
    return SglExprList([expr, SglSeparateReasoning(model_type, expr)])

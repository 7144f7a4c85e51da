"""llama.cpp's /infill fields beyond the prompt and the shared sampling names: the route's limits (n_indent,
t_max_prompt_ms, t_max_predict_ms: infill_stops.py applies them), response_fields, samplers and
penalty_last_n, each checked under its own name and honoured or refused (400 naming it), never ignored.

- response_fields: a list of paths; the answer holds only those, each under its path as the key, a path
  "a/b" reaching into the object "a" (llama.cpp's json_get_nested_values); a path that names nothing is left out.
- samplers: llama.cpp's sampler chain, a list of stage names. The server's sampler runs its stages in one
  order, temperature then top_k, top_p and min_p on the same sorted distribution (model/executor/sampler.py),
  so a list is taken when it names only those stages, in that order; a stage it leaves out runs neutral (top_k
  off, top_p 1, min_p 0, temperature 1, as llama.cpp's chain without it), and setting the left-out stage's
  field with another value is refused. "infill" (llama.cpp's infill sampler) may close the list, after top_k:
  it sets SamplingParams.infill (model/executor/infill_sampling.py), which runs over top_k's candidates (top_k up
  to SamplingParams' INFILL_MAX_TOP_K, else 400 naming top_k). Every other stage is refused.
- penalty_last_n: 0 turns the penalties off (refused with a penalty set to another value); -1, the whole
  context, is the repeat penalty's scope here (prompt and output) but not the presence and frequency penalties'
  (the output only), so it is taken only while those are unset or 0. Other windows are refused.
"""

from __future__ import annotations

from typing import Any, Optional

from radixlang_runtime.protocol.limits import FieldError, need_int, need_str, show

LIMIT_FIELDS = ("n_indent", "t_max_prompt_ms", "t_max_predict_ms")
LLAMA_FIELDS = {*LIMIT_FIELDS, "response_fields", "samplers", "penalty_last_n"}
SERVER_ORDER = ("temperature", "top_k", "top_p", "min_p")  # the stages the server's sampler runs, in its order
NEUTRAL = {"temperature": 1.0, "top_k": -1, "top_p": 1.0, "min_p": 0.0}
INFILL = "infill"  # llama.cpp's infill sampler: last in the list, after the server's stages
_MAX_PATHS = 64


def limits(body: dict) -> dict[str, int]:
    """n_indent (0: off), t_max_prompt_ms and t_max_predict_ms (0 or below: off, as llama.cpp) -> ints."""
    out = {}
    for name in LIMIT_FIELDS:
        v = body.get(name)
        out[name] = 0 if v is None else max(need_int(v, name), 0)
    return out


def response_fields(value: Any) -> Optional[tuple[str, ...]]:
    """The paths asked (None: the whole answer, also for an empty list as llama.cpp)."""
    if value is None:
        return None
    if not isinstance(value, list) or len(value) > _MAX_PATHS:
        raise FieldError("response_fields", f"response_fields must be a list of at most {_MAX_PATHS} paths, got "
                                            f"{show(value)}")
    paths = tuple(need_str(p, "response_fields", 200) for p in value)
    return paths or None


def pick(answer: dict, paths: Optional[tuple[str, ...]]) -> dict:
    """The answer cut to `paths` (each its value under the path as the key; a path naming nothing is left out)."""
    if paths is None:
        return answer
    out = {}
    for path in paths:
        cur: Any = answer
        for key in path.split("/"):
            if not isinstance(cur, dict) or key not in cur:
                break
            cur = cur[key]
        else:
            out[path] = cur
    return out


def apply_samplers(value: Any, body: dict, sampling: dict) -> None:
    """samplers -> the left-out stages set neutral in `sampling` (in place); FieldError for a list the server's
    sampler cannot run as asked."""
    if value is None:
        return
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise FieldError("samplers", f"samplers must be a list of stage names, got {show(value)}")
    infill = bool(value) and value[-1] == INFILL
    stages = value[:-1] if infill else value
    if INFILL in stages:
        raise FieldError("samplers", f"samplers {show(value)}: {INFILL} runs last, after the server's stages")
    if bad := [s for s in stages if s not in SERVER_ORDER]:
        raise FieldError("samplers", f"samplers stage {show(bad[0], 40)} is not run by this server; it runs "
                                     f"{', '.join(SERVER_ORDER)} in that order, then {INFILL}")
    if len(set(stages)) != len(stages) or sorted(stages, key=SERVER_ORDER.index) != stages:
        raise FieldError("samplers", f"samplers {show(value)} must name each stage once in the server's order: "
                                     f"{', '.join(SERVER_ORDER)}, then {INFILL}")
    if infill:
        if "top_k" not in stages:
            raise FieldError("samplers", f"samplers {show(value)}: {INFILL} runs over top_k's candidates, so it needs "
                                         "top_k before it")
        sampling["infill"] = True
    for stage in SERVER_ORDER:
        if stage in stages:
            continue
        if body.get(stage) is not None and body[stage] != NEUTRAL[stage]:
            raise FieldError("samplers", f"samplers leaves out {stage} but {stage} is set to {show(body[stage])}")
        sampling[stage] = NEUTRAL[stage]


def apply_penalty_last_n(value: Any, body: dict, sampling: dict) -> None:
    """penalty_last_n 0 (penalties off) or -1 (the whole context) -> `sampling` (in place), else FieldError."""
    if value is None:
        return
    n = need_int(value, "penalty_last_n")
    if n not in (0, -1):
        raise FieldError("penalty_last_n", f"penalty_last_n must be 0 (penalties off) or -1 (the whole context), "
                                           f"got {show(value)}")
    off = {"repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
    scope = off if n == 0 else {k: v for k, v in off.items() if k != "repeat_penalty"}
    if set_ := [k for k in scope if body.get(k) is not None and body[k] != off[k]]:
        why = ("turns the penalties off" if n == 0 else
               "(the whole context) is the repeat penalty's scope; this penalty sees the output only")
        raise FieldError("penalty_last_n", f"penalty_last_n {n} {why}, but {set_[0]} is {show(body[set_[0]])}")
    if n == 0:  # over a model default too
        sampling.update(repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0)

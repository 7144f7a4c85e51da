"""radixlang: a language for LM programs, source-compatible with SGLang's frontend
(`import radixlang as sgl` runs SGLang programs unchanged).

Imports no torch: backends that need the runtime (Engine) import it when constructed.
Layout: ir.py (expressions), interpreter.py (a state's executor), program_state.py (ProgramState,
forks), run.py (run / run_batch), tracer.py (constant prefix), chat_template.py, choices.py,
api.py (public functions), backend/ (base, native protocol, http, zmq, engine, fake, runtime_endpoint).
"""

from radixlang.api import (Engine, Runtime, RuntimeEndpoint, SglFunction, assistant, assistant_begin, assistant_end,
                           flush_cache, function, gen, gen_int, gen_string, get_server_info, image, select,
                           separate_reasoning, set_default_backend, system, system_begin, system_end, user, user_begin,
                           user_end, video)
from radixlang.backend.base import BaseBackend
from radixlang.choices import (greedy_token_selection, token_length_normalized,
                               unconditional_likelihood_normalized)
from radixlang.errors import BackendError, ProgramError
from radixlang.global_config import global_config
from radixlang.program_state import ProgramState, ProgramStateGroup
from radixlang.tools import ToolCall

__version__ = "0.1.0"

__all__ = [
    "Engine", "Runtime", "RuntimeEndpoint", "SglFunction", "assistant", "assistant_begin", "assistant_end",
    "flush_cache", "function", "gen", "gen_int", "gen_string", "get_server_info", "image", "select",
    "separate_reasoning", "set_default_backend", "system", "system_begin", "system_end", "user", "user_begin",
    "user_end", "video",
    "BaseBackend", "greedy_token_selection", "token_length_normalized", "unconditional_likelihood_normalized",
    "BackendError", "ProgramError", "global_config", "ProgramState", "ProgramStateGroup",
    "ToolCall",
]

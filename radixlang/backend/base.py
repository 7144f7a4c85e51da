"""BaseBackend: the contract between the interpreter and a model (one per kind of link).

The interpreter calls only these methods, from program worker threads (so an implementation must
be thread-safe). Every call returns or raises within the backend's request timeout.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Iterator, List, Optional, Sequence

from radixlang.chat_template import ChatTemplate, get_chat_template
from radixlang.choices import ChoicesDecision, ChoicesSamplingMethod
from radixlang.ir import SglSamplingParams


class BaseBackend(ABC):
    support_concate_and_append = False

    def __init__(self) -> None:
        self.chat_template: ChatTemplate = get_chat_template("default")

    def get_chat_template(self) -> ChatTemplate:
        return self.chat_template

    def get_model_name(self) -> str:
        return type(self).__name__

    def image_token(self) -> Optional[str]:
        """The text of the model's image placeholder (sgl.image writes it), or None: the model takes no images."""
        return None

    @abstractmethod
    def generate(self, text: str, params: SglSamplingParams, images: Sequence[str] = ()) -> tuple[Any, dict]:
        """Continue `text`. Returns (completion text, or a list of them when n > 1; meta_info).

        Args:
            text: the program's whole text so far (the prompt).
            params: resolved sampling parameters (run defaults + gen overrides + template stops).
            images: the images of its placeholders, in order (radixlang/images.py: what image_data takes)."""

    @abstractmethod
    def generate_stream(self, text: str, params: SglSamplingParams,
                        images: Sequence[str] = ()) -> Iterator[tuple[str, dict]]:
        """Yields (text delta, meta_info) per chunk; logprob lists in meta_info are per-chunk deltas,
        `completion_tokens` / `output_token_logprobs_length` cumulative (PROTOCOL.md streaming)."""

    @abstractmethod
    def select(self, text: str, choices: List[str], temperature: float,
               choices_method: ChoicesSamplingMethod, images: Sequence[str] = ()) -> ChoicesDecision:
        """Score every choice as a continuation of `text`; the decision is one of `choices`."""

    def cache_prefix(self, prefix: str, images: Sequence[str] = ()) -> None:
        """Prefill `prefix` (no generation) so that later requests find it in the radix cache."""

    def pin_prefix(self, prefix: str) -> Optional[Any]:
        """Prefill and keep `prefix` in the cache until `unpin_prefix(handle)`; backends without a pin
        fall back to a plain prefill and return None."""
        self.cache_prefix(prefix)
        return None

    def unpin_prefix(self, handle: Any) -> None:
        pass

    def concatenate_and_append(self, src_rids: List[str], dst_rid: str) -> None:
        pass

    def flush_cache(self) -> Any:
        return None

    def get_server_info(self) -> Optional[dict]:
        return None

    def shutdown(self) -> None:
        pass

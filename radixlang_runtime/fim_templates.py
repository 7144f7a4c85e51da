"""Fill-in-the-middle (FIM) templates: how a code model's prompt lays out the text before the cursor (the
prefix), the text after it (the suffix) and the marker after which the model writes the middle.

/v1/completions with a non-empty `suffix` builds its prompt from token ids: the BOS the tokenizer adds to a
normal prompt, then the template's layout with each marker as its own id (never by tokenizing text that holds
the markers, which a user's code could spoof), the prefix and the suffix tokenized as plain text (no special
tokens; special-token text in them stays text). A marker that is an added but non-special token would still
be parsed out of plain text by the tokenizer: a prefix or suffix holding its text is refused (400 naming the
field) rather than run with a marker the user wrote.

The template is --completion-template NAME (SGLang's names) or, unset, told once at start from the tokenizer:
the template whose markers are all single added tokens of its vocabulary. A tokenizer with the markers of
several templates gets none (the flag picks).

llama.cpp's /infill (server/infill_api.py) lays out other files sent as context (`input_extra`) before the
template in the repo-level layout those models were trained on, as llama.cpp's format_infill writes it: the
family's repo-name token (`<|repo_name|>`, `<repo_name>`) and a project-name line where the tokenizer holds that
token, then per chunk the file separator (Qwen2.5-Coder's `<|file_sep|>`, StarCoder2's `<file_sep>`), its file
name and a newline, then its text, then the separator and the current file's name line (llama.cpp's placeholders
"myproject\n" and "filename\n": infill_api.py writes them). A tokenizer without the separator gets each chunk
after llama.cpp's text separator instead, and no current-file line. BOS stays first. Torch-free.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from radixlang_runtime.protocol.limits import FieldError

logger = logging.getLogger(__name__)

PREFIX, SUFFIX = "{prefix}", "{suffix}"  # the layout's two text slots; every other entry is a marker token


@dataclass(frozen=True)
class FimTemplate:
    name: str
    layout: tuple[str, ...]  # markers and the two slots in prompt order; the model writes after the last
    file_sep: Optional[str] = None  # the family's repo-level file separator token (None: it has none)
    repo_name: Optional[str] = None  # the family's repo-level repository-name token (None: it has none)

    @property
    def markers(self) -> tuple[str, ...]:
        return tuple(p for p in self.layout if p not in (PREFIX, SUFFIX))

    @property
    def psm(self) -> bool:
        """Prefix-suffix-middle order (False: the suffix comes first, SPM)."""
        return self.layout.index(PREFIX) < self.layout.index(SUFFIX)


FIM_TEMPLATES: dict[str, FimTemplate] = {t.name: t for t in (
    # StarCoder / StarCoder2 / SmolLM / SantaCoder
    FimTemplate("star_coder", ("<fim_prefix>", PREFIX, "<fim_suffix>", SUFFIX, "<fim_middle>"), "<file_sep>",
                "<repo_name>"),
    # Qwen2.5-Coder / Qwen3-Coder
    FimTemplate("qwen_coder", ("<|fim_prefix|>", PREFIX, "<|fim_suffix|>", SUFFIX, "<|fim_middle|>"),
                "<|file_sep|>", "<|repo_name|>"),
    # DeepSeek-Coder (v1 and V2): begin, the prefix, the hole, the suffix, end
    FimTemplate("deepseek_coder", ("<｜fim▁begin｜>", PREFIX, "<｜fim▁hole｜>", SUFFIX, "<｜fim▁end｜>")),
)}


def check_completion_template_arg(name: Optional[str]) -> None:
    """--completion-template: a known name (ValueError naming the known ones)."""
    if name is not None and name not in FIM_TEMPLATES:
        raise ValueError(f"completion_template {name!r}: known are {', '.join(sorted(FIM_TEMPLATES))}")


@dataclass(frozen=True)
class FimPrompt:
    """A template resolved against the served tokenizer: each marker's id, and the file separator's and the
    repository name's (None: the family or the tokenizer has none)."""

    template: FimTemplate
    marker_ids: Mapping[str, int]
    file_sep_id: Optional[int] = None
    repo_name_id: Optional[int] = None

    def check_text(self, field: str, ids: Sequence[int], with_sep: bool = False) -> None:
        """A FieldError naming `field` when a text's ids hold a marker id (an added non-special marker the
        tokenizer parsed out of it), or the file separator's or the repository name's with_sep."""
        marks = dict(self.marker_ids)
        if with_sep:
            marks.update({self.template.file_sep: self.file_sep_id, self.template.repo_name: self.repo_name_id})
        found = next((m for m, i in marks.items() if i is not None and i in ids), None)
        if found is not None:
            raise FieldError(field, f"{field} holds the fill-in-the-middle marker {found!r}, a token of this "
                                    "model's tokenizer that its text cannot be told apart from")

    def extra_ids(self, chunks: Sequence[tuple[Sequence[int], Sequence[int]]], repo: Sequence[int] = (),
                  current: Sequence[int] = (), snippet: Sequence[int] = (), field: str = "input_extra") -> list[int]:
        """llama.cpp's format_infill layout of the context files (each (its name and a newline, its text) as
        plain-text ids): the repository-name token and `repo` (the project's name line) where the tokenizer has
        that token; per chunk the file separator, its name and its text, or, where the tokenizer has no
        separator, `snippet` (llama.cpp's text separator) and its text; then the separator and `current` (the
        current file's name line) where it has one. A marker in a chunk is a FieldError naming `field`."""
        out: list[int] = [] if self.repo_name_id is None else [self.repo_name_id, *repo]
        for name, text in chunks:
            self.check_text(field, name, True)
            self.check_text(field, text, True)
            out += [self.file_sep_id, *name, *text] if self.file_sep_id is not None else [*snippet, *text]
        return out if self.file_sep_id is None else out + [self.file_sep_id, *current]

    def prompt_ids(self, prefix: Sequence[int], suffix: Sequence[int], bos: Sequence[int] = (),
                   names: tuple[str, str] = ("prompt", "suffix"), extra: Sequence[int] = ()) -> list[int]:
        """bos + extra (extra_ids' layout) + the layout with the prefix's and the suffix's plain-text ids in
        their slots. A marker id in either text is a FieldError naming its field (names: the prefix's and the
        suffix's fields); with extra, the file separator's too."""
        for field, part in zip(names, (prefix, suffix)):
            self.check_text(field, part, bool(extra))
        out = [*bos, *extra]
        for piece in self.template.layout:
            out += prefix if piece == PREFIX else suffix if piece == SUFFIX else [self.marker_ids[piece]]
        return out

    def encoded(self, enc: Any, prefix: str, suffix: str, bos: bool = True,
                names: tuple[str, str] = ("prompt", "suffix")) -> list[int]:
        """prompt_ids of two texts, tokenized plain by a PromptEncoder; bos: the BOS its normal prompt starts
        with."""
        return self.prompt_ids(enc.encode_literal(prefix), enc.encode_literal(suffix),
                               enc.prefix_ids if bos else (), names)


def marker_id(tokenizer: Any, text: str) -> Optional[int]:
    """The id of `text` when it is one added token of the tokenizer (special or not), else None."""
    return tokenizer.get_added_vocab().get(text)


def _resolved(tokenizer: Any, template: FimTemplate) -> Optional[FimPrompt]:
    ids = {m: marker_id(tokenizer, m) for m in template.markers}
    if any(i is None for i in ids.values()):
        return None
    def token(text: Optional[str]) -> Optional[int]:
        return marker_id(tokenizer, text) if text else None

    return FimPrompt(template, ids, token(template.file_sep), token(template.repo_name))


def detect_fim(tokenizer: Any) -> tuple[Optional[FimPrompt], tuple[str, ...]]:
    """(the template whose markers are all added tokens of the tokenizer or None, every template that matched):
    none when no template or several match."""
    found = [p for p in (_resolved(tokenizer, t) for t in FIM_TEMPLATES.values()) if p is not None]
    return (found[0] if len(found) == 1 else None), tuple(p.template.name for p in found)


def completion_fim(name: Optional[str], tokenizer: Any) -> Optional[FimPrompt]:
    """The server's FIM prompt: --completion-template's (ValueError naming a marker the tokenizer lacks), else
    the detected one; logged once."""
    if name is not None:
        template = FIM_TEMPLATES[name]
        missing = [m for m in template.markers if marker_id(tokenizer, m) is None]
        if missing:
            raise ValueError(f"completion_template {name}: the tokenizer has no single token {missing[0]!r} "
                             f"(its markers are {', '.join(template.markers)})")
        logger.info("/v1/completions suffix: completion template %s (--completion-template)", name)
        return _resolved(tokenizer, template)
    fim, matched = detect_fim(tokenizer)
    if fim is not None:
        logger.info("/v1/completions suffix: completion template %s (told from the tokenizer's tokens)",
                    fim.template.name)
    elif matched:
        logger.warning("/v1/completions suffix: the tokenizer holds the markers of several completion templates "
                       "(%s); pass --completion-template to pick one", ", ".join(matched))
    return fim


def no_fim_message(tokenizer: Any) -> str:
    """Why a suffix is refused on this server."""
    _, matched = detect_fim(tokenizer)
    if matched:
        return (f"suffix needs one fill-in-the-middle template: this model's tokenizer holds the tokens of several "
                f"({', '.join(matched)}); start the server with --completion-template NAME to pick one")
    return ("suffix needs fill-in-the-middle tokens and this model's tokenizer has none (the prefix, suffix and "
            f"middle markers of {', '.join(FIM_TEMPLATES)} as single tokens): serve a fill-in-the-middle model, "
            "its template told from its tokens or named by --completion-template NAME")

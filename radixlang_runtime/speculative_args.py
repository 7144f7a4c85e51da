"""ServerArgs' speculative decoding settings (SGLang's names; docs/SPECULATIVE.md): NGRAM (prompt lookup),
STANDALONE (a draft model) or NEXTN (the checkpoint's own multi-token-prediction layer; SGLang's EAGLE without a
draft path, which is how it serves DeepSeek V3's). A flag without its algorithm, or of another one, is refused by
name. Torch-free."""

from __future__ import annotations

from typing import Any

NGRAM_FIELDS = ("speculative_num_draft_tokens", "speculative_ngram_min_match_window_size",
                "speculative_ngram_max_match_window_size", "speculative_disable_by_batch_size")
STANDALONE_FIELDS = ("speculative_draft_model_path", "speculative_num_steps", "speculative_draft_model_quantization")
NEXTN_FIELDS = ("speculative_eagle_topk",)
ALGORITHMS = ("NGRAM", "STANDALONE", "NEXTN")


def check_speculative_args(args: Any) -> None:
    algo = args.speculative_algorithm
    if algo is None:
        given = [n for n in NGRAM_FIELDS + STANDALONE_FIELDS + NEXTN_FIELDS if getattr(args, n) is not None]
        if given:
            raise ValueError(f"{', '.join(given)} set without speculative_algorithm (NGRAM, STANDALONE or NEXTN): "
                             "refused, not ignored")
        return
    if algo == "EAGLE":  # SGLang's name: with no draft path (or the target's own) it reads the MTP layer
        path = args.speculative_draft_model_path
        if path is not None and path != args.model_path:
            raise ValueError(f"speculative_algorithm EAGLE with speculative_draft_model_path {path!r}: separate "
                             "EAGLE draft heads are not implemented; without a draft path EAGLE runs the "
                             "checkpoint's own multi-token-prediction layer (NEXTN)")
        args.speculative_algorithm = algo = "NEXTN"
        args.speculative_draft_model_path = None
    if algo not in ALGORITHMS:
        raise ValueError(f"speculative_algorithm {algo!r} is not implemented; NGRAM (prompt lookup, no draft model), "
                         "STANDALONE (a draft model) and NEXTN / EAGLE (the checkpoint's multi-token-prediction "
                         "layer) are")
    if algo == "NGRAM":
        _check_ngram(args)
        return
    ngram = [n for n in NGRAM_FIELDS[1:3] if getattr(args, n) is not None]
    if ngram:
        raise ValueError(f"{', '.join(ngram)} set with speculative_algorithm {algo} (NGRAM's flags): refused")
    if args.tp_size > 1:
        raise ValueError(f"speculative_algorithm {algo} with tp_size > 1 is not implemented")
    if args.enable_hierarchical_cache:
        raise ValueError(f"speculative_algorithm {algo} with enable_hierarchical_cache is not implemented "
                         "(K/V loaded from a tier has no draft K/V)")
    if algo == "STANDALONE":
        _check_standalone(args)
    else:
        _check_nextn(args)
    steps, _, cap = args.speculative_chain_settings()
    if not 1 <= steps <= 16:
        raise ValueError(f"speculative_num_steps must be in [1, 16]; got {steps}")
    n = args.speculative_num_draft_tokens
    if n is not None and n != steps + 1:
        raise ValueError(f"speculative_num_draft_tokens must be speculative_num_steps + 1 = {steps + 1} with "
                         f"{algo} (one draft chain: the verified token + num_steps drafts); got {n}")
    if cap < 0:
        raise ValueError(f"speculative_disable_by_batch_size must be >= 0 (0: no limit); got {cap}")


def _check_ngram(args: Any) -> None:
    given = [n for n in STANDALONE_FIELDS + NEXTN_FIELDS if getattr(args, n) is not None]
    if given:
        raise ValueError(f"{', '.join(given)} set with speculative_algorithm NGRAM (other algorithms' flags): "
                         "refused")
    k, lo, hi, cap = args.speculative_ngram_settings()
    if not 1 <= k <= 64:
        raise ValueError(f"speculative_num_draft_tokens must be in [1, 64]; got {k}")
    if not 1 <= lo <= hi <= 32:
        raise ValueError("need 1 <= speculative_ngram_min_match_window_size <= "
                         f"speculative_ngram_max_match_window_size <= 32; got {lo}, {hi}")
    if cap < 0:
        raise ValueError(f"speculative_disable_by_batch_size must be >= 0 (0: no limit); got {cap}")


def _check_standalone(args: Any) -> None:
    if not args.speculative_draft_model_path:
        raise ValueError("speculative_algorithm STANDALONE needs speculative_draft_model_path")
    if args.speculative_eagle_topk is not None:
        raise ValueError("speculative_eagle_topk set with speculative_algorithm STANDALONE (a draft chain): refused")
    if args.speculative_draft_model_quantization not in (None, "int8", "gguf"):
        raise ValueError("speculative_draft_model_quantization must be int8 or gguf; got "
                         f"{args.speculative_draft_model_quantization!r}")


def _check_nextn(args: Any) -> None:
    for name in ("speculative_draft_model_path", "speculative_draft_model_quantization"):
        if getattr(args, name) is not None:
            raise ValueError(f"{name} set with speculative_algorithm NEXTN: the draft is the checkpoint's own "
                             "multi-token-prediction layer, on the target's weights")
    topk = args.speculative_eagle_topk
    if topk is not None and topk != 1:
        raise ValueError(f"speculative_eagle_topk {topk}: only 1 is implemented (one draft chain, no tree)")

"""Constrained decoding: grammars (regex / JSON schema) compiled with outlines-core into token indexes.

One concept a module (torch-free unless marked):
  spec.py          GrammarSpec: what a request asks for (regex / json_schema / json_object / DSL dtypes); check()
  regex_check.py   Python-side regex checks (look-around, backrefs, anchors, balance, expansion size)
  schema.py        JSON schema checks (unsupported keywords named) + schema -> regex with fixed separators
  vocab.py         TokenVocab: raw bytes of every token id, built once per tokenizer (+ the end sentinel)
  compile_index.py one compile: spec text -> regex -> outlines-core Index of `(?:R)S` (no numpy, no torch)
  grammar.py       CompiledGrammar: an outlines Index + per-state caches (allowed ids, finality, forced)
  lru.py           LRU bounded by entries and total size
  framing.py       length-prefixed msgpack frames on a pipe
  worker_child.py  the compile process: rlimit'd, reads jobs, answers pickled indexes (no torch)
  worker.py        CompileWorker: one child process, a job at a time, killed past its time limit
  cache.py         GrammarCompiler: submit(spec) -> GrammarHandle (poll), LRU (+ disk) cache, worker threads
  state.py         GrammarState: a request's (grammar, state); advance / final / must_finish
  mask.py          (torch) one batched allowed-token mask [B, logits_width] per step; apply to logits rows
  jump_forward.py  forced bytes from the index, forced tokens with hold-back

Importing this package imports nothing heavy: the compile child imports only the torch-free modules.
"""

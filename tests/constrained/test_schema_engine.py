"""200 random JSON schemas with hostile property names (quotes, backslashes, control characters, regex
metacharacters, non-ASCII; tests/constrained/test_random_schemas.py's generator, bounded mode) through the Engine, one
Engine per grammar backend, all 200 requests in one batch: every output ends (finish "stop"), parses with
json.loads and validates with jsonschema (formats checked).

The model is a tiny random Llama over a byte-level vocabulary (tiny_checkpoints.build_tiny_bytes): random
weights still have to write grammar-valid output, and 200 compiles per backend stay cheap. The real
model's path (its 49K-token vocabulary) is covered per request by the server tests."""

from __future__ import annotations

import json

import jsonschema
import pytest
from test_random_schemas import BACKENDS, FORMAT_CHECKER, SchemaGen

from tiny_checkpoints import build_tiny_bytes

pytestmark = pytest.mark.slow  # three Engines, 600 compiles, a batch of 200 for up to 700 steps each
N_SCHEMAS = 200
MAX_NEW = 700  # bounded schemas: the longest possible output is shorter
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, bos_token_id=0, eos_token_id=2, tie_word_embeddings=True,
            initializer_range=0.3, max_position_embeddings=1024)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_bytes")
    build_tiny_bytes(path, TINY)
    return str(path)


def schemas() -> list[dict]:
    gen, out = SchemaGen(seed=4321, bounded=True), []
    while len(out) < N_SCHEMAS:
        schema, bad = gen.schema()
        if bad is None:
            out.append(schema)
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_random_schemas_through_the_engine(checkpoint, backend):
    from radixlang_runtime import Engine

    batch = schemas()
    sps = [{"json_schema": json.dumps(s), "max_new_tokens": MAX_NEW, "temperature": 0} for s in batch]
    with Engine(checkpoint, dtype="float32", grammar_backend=backend, max_total_tokens=N_SCHEMAS * (MAX_NEW + 16),
                max_running_requests=N_SCHEMAS, debug_check_integrity=True) as eng:
        outs = eng.generate(["JSON:"] * N_SCHEMAS, sampling_params=sps)
        eng.check_integrity()
    for i, (schema, out) in enumerate(zip(batch, outs)):
        finish = out["meta_info"]["finish_reason"]
        assert finish["type"] == "stop", (backend, i, finish, out["text"][-80:])
        try:
            jsonschema.validate(json.loads(out["text"]), schema, format_checker=FORMAT_CHECKER)
        except (ValueError, jsonschema.ValidationError) as e:
            raise AssertionError(f"schema {i} ({backend}): {json.dumps(schema)}\noutput {out['text']!r}\n{e}") from None

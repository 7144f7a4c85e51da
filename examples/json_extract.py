"""JSON extraction with constrained decoding (`json_schema`): the model fills a typed record; the
output always parses and matches the schema (jump-forward fills the keys and separators)."""

from __future__ import annotations

import json

from _common import run_example, sgl

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer"},
                                           "city": {"type": "string", "maxLength": 24}},
          "required": ["name", "age", "city"], "additionalProperties": False}


@sgl.function
def extract(s, text):
    s += sgl.user("Extract name, age and city as JSON from: " + text)
    s += sgl.assistant(sgl.gen("record", json_schema=SCHEMA, max_tokens=64))


def main(backend):
    st = extract.run(text="Maria, 34, moved to Lisbon last year.", backend=backend, temperature=0)
    if st.error() is not None:
        raise st.error()
    record = json.loads(st["record"])
    assert set(SCHEMA["required"]) <= set(record) and isinstance(record["age"], int), record
    print(record)
    return record


if __name__ == "__main__":
    run_example(main, __doc__)

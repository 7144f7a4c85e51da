#!/usr/bin/env bash
# Writes o200k_base.tiktoken, the vocabulary openai-harmony's o200k_harmony encoding builds on, into DIR (default
# ${TMPDIR:-/tmp}/radixlang-harmony-vocab) from the js-tiktoken npm package's ranks, and prints DIR. The file is
# tiktoken's own byte for byte (its sha256 is checked). openai-harmony reads it through TIKTOKEN_ENCODINGS_BASE=DIR
# instead of downloading it; tests/tools/test_harmony_recorded.py then renders and parses with openai-harmony
# (skipped without it). Needs node and npm.
set -euo pipefail
dir=${1:-${TMPDIR:-/tmp}/radixlang-harmony-vocab}
want=446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d  # tiktoken's expected hash of the file
mkdir -p "$dir"
if [ "$(sha256sum "$dir/o200k_base.tiktoken" 2>/dev/null | cut -d' ' -f1)" != "$want" ]; then
    npm install --prefix "$dir/npm" --no-audit --no-fund --silent js-tiktoken@1.0.21 >&2
    (cd "$dir/npm" && node --input-type=module -e '
import ranks from "js-tiktoken/ranks/o200k_base";
import fs from "fs";
const rows = [];
for (const line of ranks.bpe_ranks.split("\n").filter(Boolean)) {  // "! FIRST_RANK TOKEN_BASE64 ..."
  const [, first, ...tokens] = line.split(" ");
  tokens.forEach((t, i) => rows.push([Number(first) + i, t]));
}
rows.sort((a, b) => a[0] - b[0]);
fs.writeFileSync("../o200k_base.tiktoken.part", rows.map(([r, t]) => `${t} ${r}\n`).join(""));
')
    [ "$(sha256sum "$dir/o200k_base.tiktoken.part" | cut -d' ' -f1)" = "$want" ] \
        || { echo "o200k_base.tiktoken from js-tiktoken does not match tiktoken's hash" >&2; exit 1; }
    mv "$dir/o200k_base.tiktoken.part" "$dir/o200k_base.tiktoken"
fi
echo "$dir"

"""Time to the first token of an image request, on CPU: a random LLaVA-1.5-shaped checkpoint (random_checkpoint.
build_llava: a CLIP ViT-L/14 tower at 336 pixels, 576 positions an image, beside a SmolLM2-135M-shaped text model),
bf16, one request at a time, max_new_tokens 1:

  new image     an image the server has not seen: the tower, the projector and the prefill of ~590 positions
  same image    the same request again: its positions come from the prefix cache (keyed by the pixels)
  other image   the same text with another image: only the text before the image is cached
  text only     a prompt of the same length without an image, never seen: the prefill alone
  transformers  LlavaForConditionalGeneration.generate on the same image (processor included), the peer

Each system runs in its own child process with --threads torch threads; each round uses fresh images; reported:
medians over --rounds of milliseconds per request, and the first greedy token of each system (equal on the same
image and weights, within bf16).

    python benchmarks/bench_images.py                  # 3 rounds, 2 threads
"""

from __future__ import annotations

import argparse
import base64
import io
import os
import random
import statistics
import time

from bench_common import in_child
from random_checkpoint import build_llava

TEXT = "<image>\nDescribe the picture in one word."


def png(seed: int) -> bytes:
    import numpy as np
    from PIL import Image

    buf = io.BytesIO()
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def ours(model: str, seeds: list[int], threads: int, q) -> None:
    import torch

    from radixlang_runtime import Engine

    torch.set_num_threads(threads)
    eng = Engine(model, dtype="bfloat16", max_total_tokens=16384)
    sp = {"temperature": 0, "max_new_tokens": 1}
    b64 = lambda k: base64.b64encode(png(k)).decode()  # noqa: E731
    eng.generate(TEXT, sp, image_data=b64(999))  # warm-up: the kernels, the tower
    out: dict[str, list[float]] = {"new image": [], "same image": [], "other image": [], "text only": []}
    first = []
    for k in seeds:
        rng = random.Random(k)
        filler = [rng.randrange(100, 49000) for _ in range(len(eng.tokenizer(TEXT)["input_ids"]) + 575)]
        for name, call in (("new image", lambda: eng.generate(TEXT, sp, image_data=b64(k))),
                           ("same image", lambda: eng.generate(TEXT, sp, image_data=b64(k))),
                           ("other image", lambda: eng.generate(TEXT, sp, image_data=b64(k + 1000))),
                           ("text only", lambda: eng.generate(input_ids=filler, sampling_params=sp))):
            t0 = time.perf_counter()
            res = call()
            out[name].append(1000 * (time.perf_counter() - t0))
            if name == "new image":
                first.append(res["output_ids"][0])
    eng.shutdown()
    q.put({"ms": out, "first": first})


def peer(model: str, seeds: list[int], threads: int, q) -> None:
    import torch
    from PIL import Image
    from transformers import AutoTokenizer, CLIPImageProcessor, LlavaForConditionalGeneration

    torch.set_num_threads(threads)
    m = LlavaForConditionalGeneration.from_pretrained(model, dtype=torch.bfloat16).eval()
    tok = AutoTokenizer.from_pretrained(model)
    proc = CLIPImageProcessor.from_pretrained(model)
    ids = tok(TEXT, add_special_tokens=False)["input_ids"]
    k_img = ids.index(m.config.image_token_index)
    ids = ids[:k_img] + [m.config.image_token_index] * 576 + ids[k_img + 1:]

    def once(seed: int) -> int:
        pixels = torch.from_numpy(proc(images=Image.open(io.BytesIO(png(seed))).convert("RGB"),
                                       return_tensors="np")["pixel_values"])
        with torch.no_grad():
            out = m.generate(torch.tensor([ids]), pixel_values=pixels.to(torch.bfloat16), max_new_tokens=1,
                             do_sample=False, attention_mask=torch.ones(1, len(ids), dtype=torch.long))
        return int(out[0, -1])

    once(999)
    ms, first = [], []
    for k in seeds:
        t0 = time.perf_counter()
        first.append(once(k))
        ms.append(1000 * (time.perf_counter() - t0))
    q.put({"ms": {"transformers": ms}, "first": first})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--random-dir", default="/tmp/radixlang-random")
    a = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    model = build_llava(os.path.join(a.random_dir, "llava_clip_l"))
    seeds = list(range(1, a.rounds + 1))
    mine = in_child(ours, model, seeds, a.threads)
    theirs = in_child(peer, model, seeds, a.threads)
    print(f"{model}: bf16, {a.threads} thread(s), one request at a time, max_new_tokens 1, medians of {a.rounds}")
    base = statistics.median(theirs["ms"]["transformers"])
    for name, xs in {**mine["ms"], **theirs["ms"]}.items():
        med = statistics.median(xs)
        print(f"  {name:>12}: {med:8.1f} ms   {base / med:5.2f}x transformers' speed")
    print(f"  first tokens: ours {mine['first']}, transformers {theirs['first']}")


if __name__ == "__main__":
    main()

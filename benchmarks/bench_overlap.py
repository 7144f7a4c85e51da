"""The overlap schedule's effect on CPU: bench_offline's W1 / W2 shapes (smaller by default) on two Engines in two
child processes, one with --enable-overlap-schedule and one without, run A/B interleaved (each pair in turn
starts with the other mode), medians of output tokens/s. Prints the load average before and after.

    python benchmarks/bench_overlap.py                     # W1 16 x 128 -> 64, W2 1 x 32 -> 128, 5 pairs
    python benchmarks/bench_overlap.py --full --pairs 3    # bench_offline's W1 64 x 256 -> 128, W2 32 -> 256
    python benchmarks/bench_overlap.py --small             # W1 8 x 64 -> 32, W2 1 x 32 -> 64
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import statistics
import time


def workloads(full: bool, small: bool) -> dict[str, dict]:
    rng = random.Random(0)
    n1, l1, o1, o2 = (64, 256, 128, 256) if full else (8, 64, 32, 64) if small else (16, 128, 64, 128)
    return {"W1": {"ids": [[rng.randrange(100, 49000) for _ in range(l1)] for _ in range(n1)], "new": o1},
            "W2": {"ids": [[rng.randrange(100, 49000) for _ in range(32)]], "new": o2}}


def child(conn, engine_args: dict, wls: dict) -> None:
    from radixlang_runtime import Engine

    eng = Engine(**engine_args)
    eng.generate(input_ids=wls["W2"]["ids"][0], sampling_params={"max_new_tokens": 8, "temperature": 0})
    conn.send(("ready", str(eng.runner.dtype)))
    outputs: dict = {}
    while True:
        name = conn.recv()
        if name is None:
            break
        wl = wls[name]
        assert eng.flush_cache()
        t = time.perf_counter()
        outs = eng.generate(input_ids=wl["ids"], sampling_params={"max_new_tokens": wl["new"], "temperature": 0,
                                                                  "ignore_eos": True})
        dt = time.perf_counter() - t
        ids = [o["output_ids"] for o in outs]
        same = outputs.setdefault(name, ids) == ids
        conn.send((sum(len(x) for x in ids) / dt, ids if same else None))
    stats = eng.get_stats()["overlap_schedule"]
    eng.shutdown()
    conn.send(stats)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--full", action="store_true", help="bench_offline's full W1 / W2")
    ap.add_argument("--small", action="store_true", help="W1 8 x 64 -> 32, W2 1 x 32 -> 64 (a loaded machine)")
    ap.add_argument("--dtype", default="auto")
    a = ap.parse_args()
    wls = workloads(a.full, a.small)
    ctx = mp.get_context("spawn")
    base = {"dtype": a.dtype, "max_total_tokens": 32768}  # a fixed pool: two processes share the memory
    modes = {"off": base, "on": {**base, "enable_overlap_schedule": True}}
    conns, procs = {}, []
    for mode, args in modes.items():  # one after the other: the second starts once the first is ready
        parent, kid = ctx.Pipe()
        p = ctx.Process(target=child, args=(kid, args, wls), daemon=True)
        p.start()
        procs.append(p)
        conns[mode] = parent
        if not parent.poll(600):
            raise RuntimeError(f"the {mode} engine did not start within 600 s")
        print(mode, parent.recv(), flush=True)
    print("loadavg before:", open("/proc/loadavg").read().strip())
    rates: dict = {(m, w): [] for m in modes for w in wls}
    ids: dict = {}
    for i in range(a.pairs):
        order = list(modes) if i % 2 == 0 else list(modes)[::-1]
        for w in wls:
            for m in order:
                conns[m].send(w)
                rate, out = conns[m].recv()
                rates[(m, w)].append(rate)
                assert out is not None, f"{m} {w}: outputs changed between runs"
                assert ids.setdefault(w, out) == out, f"{w}: outputs differ between the modes"
    print("loadavg after:", open("/proc/loadavg").read().strip())
    for c in conns.values():
        c.send(None)
    stats = {m: c.recv() for m, c in conns.items()}
    for p in procs:
        p.join(60)
    print(f"{'workload':<8} {'off tok/s':>10} {'on tok/s':>10} {'on/off':>7}   runs (off | on)")
    for w in wls:
        off, on = statistics.median(rates[("off", w)]), statistics.median(rates[("on", w)])
        print(f"{w:<8} {off:>10.1f} {on:>10.1f} {on / off:>7.3f}   "
              f"{' '.join(f'{r:.0f}' for r in rates[('off', w)])} | {' '.join(f'{r:.0f}' for r in rates[('on', w)])}")
    print("overlap stats (on):", stats["on"], "outputs identical across modes: yes")


if __name__ == "__main__":
    main()

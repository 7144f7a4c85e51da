"""One set of real PD servers shared by the PD end-to-end files (test_pd_disagg, test_pd_e2e, test_pd_faults):
a prefill, two decodes and a co-located server, each its own launch_server process group, all on one tiny
float32 checkpoint made by transformers (tiny_checkpoints.py) with the same flags. Starting them is most of
those files' time on 2 cores, so they start once, side by side, for the first file that asks, and stop after
the last file of the run that uses them (or at the end of the session, whichever comes first).

A test may kill a server (the fault tests do): `ensure()` restarts whatever is dead before the next file
uses the set (a restarted prefill keeps the bootstrap port), so the files pass in any order or alone.
Every server inherits RADIXLANG_FAULT_INJECT="forward:slow-:stall=STALL_S": a request whose rid starts
"slow-" stalls its first forward pass that long (only test_pd_faults sends such rids: a kill then lands
mid-transfer); every other request is untouched.
"""

from __future__ import annotations

import functools
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Optional

import httpx
import pytest

from radixlang_runtime.utils.faults import ENV
from server_utils import ServerProcess, free_port
from tiny_checkpoints import build_tiny

START_S = 900.0  # bound on one start: several side by side on a loaded 2-core machine can take minutes
STALL_S = 12  # the "slow-" requests' stall: far above a kill's latency under load
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True,
            initializer_range=0.3, max_position_embeddings=4096)
COMMON = ("--dtype", "float32", "--max-total-tokens", "8192", "--debug-check-integrity",
          "--chunked-prefill-size", "64", "--frontend-port", "-1")
# heartbeat generous for load; the transfer timeout far above every client bound (test_pd_faults: an answer
# after a kill proves the heartbeat, not the transfer timeout, caught the dead peer)
PD_FLAGS = ("--disaggregation-heartbeat-timeout", "5", "--disaggregation-transfer-timeout", "600")
# the bootstrap link's secret on every PD member; decode 0 also takes K/V only from the prefill (the allow-list),
# decode 1 from whoever holds the secret (tests/disagg/test_pd_hostile.py tries both against strangers)
SECRET = "pd-test-secret"
FIXTURE = "pd_cluster"  # the module-scoped fixture name every user file defines (see `shared`)


@dataclass
class Cluster:
    model_dir: str
    model: Any  # transformers' model on the same weights (float32, eval): the greedy reference
    boot: int  # the prefill's bootstrap port (kept across restarts)
    prefill: Optional[ServerProcess] = None
    decodes: list[Optional[ServerProcess]] = field(default_factory=lambda: [None, None])
    colo: Optional[ServerProcess] = None
    started: list[ServerProcess] = field(default_factory=list)  # every process ever started (all stopped)

    def _start(self, *flags: str) -> ServerProcess:
        s = ServerProcess("--model-path", self.model_dir, *COMMON, *flags, new_session=True, timeout=START_S)
        self.started.append(s)
        return s

    def start_prefill(self) -> ServerProcess:
        return self._start("--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(self.boot),
                           "--disaggregation-secret", SECRET, *PD_FLAGS)

    def start_decode(self, i: int) -> ServerProcess:
        peers = ("--disaggregation-prefill-peers", f"127.0.0.1:{self.boot}") if i == 0 else ()
        return self._start("--disaggregation-mode", "decode", "--disaggregation-secret", SECRET, *peers, *PD_FLAGS)

    def ensure(self, decodes: bool = True) -> None:
        """Restart every member that is not running (decodes=False: all but the decodes), side by side."""
        todo = {}
        if not alive(self.prefill):
            todo["prefill"] = self.start_prefill
        for i, d in enumerate(self.decodes):
            if decodes and not alive(d):
                todo[i] = functools.partial(self.start_decode, i)
        if not alive(self.colo):
            todo["colo"] = self._start
        if not todo:
            return
        os.environ[ENV] = f"forward:slow-:stall={STALL_S}"  # inherited at spawn (nobody else spawns meanwhile)
        try:
            with ThreadPoolExecutor(len(todo)) as ex:
                futures = {k: ex.submit(f) for k, f in todo.items()}
        finally:
            os.environ.pop(ENV, None)
        errors = [f.exception() for f in futures.values() if f.exception() is not None]
        if errors:
            raise errors[0]
        for k, f in futures.items():
            if k == "prefill":
                self.prefill = f.result()
            elif k == "colo":
                self.colo = f.result()
            else:
                self.decodes[k] = f.result()

    def restart_prefill(self) -> ServerProcess:
        """A new prefill on the same bootstrap port (the old one must be dead); a dead decode stays dead."""
        assert not alive(self.prefill)
        self.ensure(decodes=False)
        return self.prefill

    def live_decodes(self) -> list[ServerProcess]:
        return [d for d in self.decodes if alive(d)]

    def stop(self) -> list[str]:
        """Stop every process started; the tails of those that did not exit cleanly (0, or 143: uvicorn
        re-raises SIGTERM after its graceful shutdown; a killed one is left out)."""
        running = [s for s in self.started if s.proc.poll() is None]
        with ThreadPoolExecutor(max(1, len(running))) as ex:  # side by side (each stop() is bounded)
            codes = list(ex.map(lambda s: s.stop(), running))
        return [f"{s.url} exited {code}:\n{s.tail()}" for s, code in zip(running, codes) if code not in (0, 143)]


def alive(s: Optional[ServerProcess]) -> bool:
    return s is not None and s.proc.poll() is None


def pids_of(srv: ServerProcess) -> list[int]:
    """Every process of the server (its /server_info lists them)."""
    return list(httpx.get(srv.url + "/server_info", timeout=120).json()["pids"].values())


def kill(srv: ServerProcess, pids: list[int], bound: float = 120.0) -> None:
    """SIGKILL the server's process group; every process of it must be gone within `bound` (no orphans)."""
    os.killpg(srv.proc.pid, signal.SIGKILL)
    srv.proc.wait(bound)
    deadline = time.time() + bound
    for pid in pids:
        while _running(pid):
            assert time.time() < deadline, f"process {pid} of the killed server {srv.url} is still running"
            time.sleep(0.1)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


_cluster: Optional[Cluster] = None


def shared(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """Body of each user file's module-scoped fixture named FIXTURE
    (`yield from pd_servers.shared(request, tmp_path_factory)`): the running set, (re)started as needed;
    stopped after the last module of this run that uses it."""
    global _cluster
    if _cluster is None:
        d = tmp_path_factory.mktemp("tiny_llama_pd")
        c = Cluster(str(d), build_tiny(d, "LlamaConfig", TINY, {}), free_port())
        _cluster = c
        request.config.add_cleanup(_stop_at_exit)  # a run cut short (-x, ^C) still stops them
    _cluster.ensure()
    yield _cluster
    users = [item.module for item in request.session.items if FIXTURE in getattr(item, "fixturenames", ())]
    if users and users[-1] is request.module:
        bad = _release()
        assert not bad, "\n".join(bad)


def _release() -> list[str]:
    global _cluster
    c, _cluster = _cluster, None
    return c.stop() if c is not None else []


def _stop_at_exit() -> None:
    _release()

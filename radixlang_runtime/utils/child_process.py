"""bind_to_parent: what every child process of ours does first (torch-free, stdlib only: the grammar
compile child imports it too). Its lifetime becomes its parent's business:

- it dies with its parent, even a SIGKILLed one;
- it leaves its parent's process group, so a signal sent to the group (Ctrl+C in a terminal, `timeout`,
  `kill -TERM -PGID`) reaches only the parent, which drains its requests and then stops its children
  itself (launch_server.py). A child killed by the group signal would end the requests in flight at once.

Callers: the server's schedulers (one per DP replica), its detokenizer, the TP rank processes
(model/executor/tp_worker.py) and the grammar compile children (constrained/worker_child.py). A child of a child
(a compile child of a scheduler) follows its own parent, so a whole tree goes down with its root.
multiprocessing's resource tracker is not started by us: it exits by itself when the last holder of its
pipe (the server process and its spawned children) is gone.

Linux: prctl(PR_SET_PDEATHSIG, SIGKILL), then a check that the parent is still the expected one (it may
have died before the prctl call; the child was then re-parented and no signal will come). Elsewhere: a
daemon thread that polls the parent pid every POLL_S seconds and ends the process (os._exit) when it changes.

Invariant (Linux): PR_SET_PDEATHSIG fires when the parent *thread* that created the child exits, not
only the parent process. Children are therefore started from a thread that lives as long as they
should: the launcher's main thread (launch_server.py, run_node), or a grammar compile thread, which
outlives its CompileWorker's child (GrammarCompiler.close kills the child first). A caller that starts
children from a shorter-lived thread passes parent_thread_lives=False and gets the pid poll instead.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import time
from typing import Optional

from radixlang_kernels.libc import set_parent_death_signal

POLL_S = 0.5


def parent_pid_of_this_process() -> Optional[int]:
    """The pid of the process that started this one through multiprocessing (recorded by the parent
    when it created the Process object, so not subject to the re-parenting race), else None."""
    parent = multiprocessing.parent_process()
    return parent.pid if parent is not None else None


def bind_to_parent(expected_ppid: Optional[int] = None, parent_thread_lives: bool = True) -> None:
    """Leave the parent's process group and end this process (SIGKILL) when its parent exits.
    expected_ppid: the parent's pid as the parent saw it (default: multiprocessing's record of it); a
    parent already gone ends this process now."""
    if expected_ppid is None:
        expected_ppid = parent_pid_of_this_process()
    if expected_ppid is None:  # not started by one of ours: nothing to follow
        return
    if hasattr(os, "setpgid"):
        os.setpgid(0, 0)
    if sys.platform.startswith("linux") and parent_thread_lives:
        if set_parent_death_signal(signal.SIGKILL):
            if os.getppid() != expected_ppid:  # the parent died before prctl: no signal will come
                os.kill(os.getpid(), signal.SIGKILL)
            return
    _poll_parent(expected_ppid)


def _poll_parent(expected_ppid: int) -> None:
    if os.getppid() != expected_ppid:
        os._exit(1)

    def watch() -> None:  # os._exit: the whole process, from any thread, no cleanup (as SIGKILL)
        while os.getppid() == expected_ppid:
            time.sleep(POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()

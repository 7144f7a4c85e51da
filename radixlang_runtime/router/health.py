"""HealthMonitor: every instance's /health, periodically and on demand (a leg that lost its
connection kicks a check of that instance), each call bounded by --health-check-timeout-secs.

An instance turns healthy after --health-success-threshold good checks in a row, and is verified
once its /server_info matches its role (disaggregation_mode prefill / decode / none for a worker;
a prefill without a bootstrap port on the command line takes disaggregation_bootstrap_port from
there). It turns down after --health-failure-threshold failed checks in a row, or at once when it
refuses the connection (nothing listens there); going down fails the requests still waiting on it
(Instance.mark_down), and it is re-verified when it comes back (it may be a new process).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Optional

import httpx

from radixlang_runtime.router.config import RouterArgs
from radixlang_runtime.router.instances import Group, Instance

logger = logging.getLogger(__name__)
EXPECTED_MODE = {"prefill": "prefill", "decode": "decode", "worker": None}


class HealthMonitor:
    def __init__(self, groups: list[Group], client: httpx.AsyncClient, args: RouterArgs):
        self.groups, self.client, self.args = groups, client, args
        self._checking: set[Instance] = set()
        self._port_from_info: set[Instance] = set()  # prefills whose bootstrap port came from /server_info
        self._tasks: set[asyncio.Task] = set()

    def instances(self) -> list[Instance]:
        return [i for g in self.groups for i in g.instances]

    async def run(self) -> None:
        """Check every instance each interval, forever (cancelled at shutdown)."""
        while True:
            await asyncio.gather(*(self.check(i) for i in self.instances()))
            await asyncio.sleep(self.args.health_check_interval_secs)

    def kick(self, inst: Instance) -> None:
        """Check inst now (a leg to it just failed), unless a check of it is under way."""
        if inst not in self._checking:
            task = asyncio.create_task(self.check(inst))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def check(self, inst: Instance) -> None:
        if inst in self._checking:
            return
        self._checking.add(inst)
        try:
            failure, refused = await self._probe(inst)
            if failure is None and not inst.verified:
                failure = await self._verify(inst)
            self._record(inst, failure, refused)
        finally:
            self._checking.discard(inst)

    async def _probe(self, inst: Instance) -> tuple[Optional[str], bool]:
        """(why /health failed or None, whether the connection was refused)."""
        t = self.args.health_check_timeout_secs
        try:
            r = await self.client.get(inst.url + "/health", timeout=t)
        except httpx.ConnectError as e:
            return f"refused the health check's connection ({e})", True
        except httpx.TimeoutException:
            return f"did not answer /health within {t} s", False
        except httpx.HTTPError as e:
            return f"failed its health check ({type(e).__name__}: {e})", False
        if r.status_code != 200:
            return f"answered /health with {r.status_code}", False
        return None, False

    async def _verify(self, inst: Instance) -> Optional[str]:
        """Read /server_info: the mode must match the role; None when verified, else why not."""
        t = self.args.health_check_timeout_secs
        try:
            r = await self.client.get(inst.url + "/server_info", timeout=t)
            info = r.json()
        except (httpx.HTTPError, ValueError) as e:
            return f"/server_info could not be read ({type(e).__name__}: {e})"
        if r.status_code != 200 or not isinstance(info, dict):
            return f"/server_info answered {r.status_code}"
        mode = info.get("disaggregation_mode")
        mode = None if mode in (None, "null") else mode
        if mode != EXPECTED_MODE[inst.role]:
            flag = {"prefill": "--prefill", "decode": "--decode", "worker": "--worker-urls"}[inst.role]
            return f"is misconfigured: its /server_info says disaggregation_mode={mode!r}, but it was given as {flag}"
        if inst.role == "prefill" and inst.bootstrap_port is None:
            port = info.get("disaggregation_bootstrap_port")
            if not isinstance(port, int) or isinstance(port, bool):
                return f"gives no disaggregation_bootstrap_port in /server_info (got {port!r}); pass it after --prefill"
            inst.bootstrap_port = port
            self._port_from_info.add(inst)
        inst.verified = True
        return None

    def _record(self, inst: Instance, failure: Optional[str], refused: bool) -> None:
        if failure is None:
            inst.fails, inst.oks = 0, inst.oks + 1
            if not inst.healthy and inst.oks >= self.args.health_success_threshold:
                inst.healthy, inst.reason = True, ""
                logger.info("%s instance %s is up", inst.role, inst.url)
            return
        inst.oks, inst.fails = 0, inst.fails + 1
        if refused or inst.fails >= self.args.health_failure_threshold or not inst.verified:
            if inst.healthy:
                logger.warning("%s instance %s is down: %s", inst.role, inst.url, failure)
            inst.mark_down(failure)
            if inst.verified and not refused:
                return
            inst.verified = False  # a process that comes back is verified again
            if inst in self._port_from_info:
                inst.bootstrap_port = None
                self._port_from_info.discard(inst)

    async def wait_ready(self, timeout: float) -> bool:
        """Check until every instance is eligible or timeout s passed; True when all are."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            await asyncio.gather(*(self.check(i) for i in self.instances()))
            if all(i.eligible for i in self.instances()) or loop.time() >= deadline:
                return all(i.eligible for i in self.instances())
            await asyncio.sleep(min(0.5, self.args.health_check_interval_secs))

"""The scheduling flags' checks (no torch): the queue's order (--schedule-policy, priority scheduling), its cap,
the running requests' bound, the overlap schedule's switches and the decode reservation's ratios. Each refusal
names the setting (ValueError); ServerArgs runs it after its own checks."""

from __future__ import annotations

from typing import Any

SCHEDULE_POLICIES = ("lpm", "fcfs", "dfs-weight")
DEFAULT_PREEMPTION_THRESHOLD = 10  # SGLang's --priority-scheduling-preemption-threshold


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def check_scheduling_args(args: Any) -> None:
    _need(args.schedule_policy in SCHEDULE_POLICIES,
          f"schedule_policy must be lpm, fcfs or dfs-weight; got {args.schedule_policy!r}")
    _need(args.max_running_requests is None or args.max_running_requests >= 1, "max_running_requests must be >= 1")
    _need(args.max_queued_requests is None or args.max_queued_requests >= 1,
          f"max_queued_requests must be >= 1; got {args.max_queued_requests}")
    _need(args.priority_scheduling_preemption_threshold >= 0,
          f"priority_scheduling_preemption_threshold must be >= 0; got {args.priority_scheduling_preemption_threshold}")
    _need(args.enable_priority_scheduling or (not args.schedule_low_priority_values_first and
                                              args.priority_scheduling_preemption_threshold
                                              == DEFAULT_PREEMPTION_THRESHOLD),
          "schedule_low_priority_values_first and priority_scheduling_preemption_threshold apply with "
          "enable_priority_scheduling only")
    _need(not (args.enable_overlap_schedule and args.disable_overlap_schedule),
          "enable_overlap_schedule and disable_overlap_schedule contradict each other: pick one")
    _need(0.0 <= args.new_token_ratio_min <= args.new_token_ratio_init <= 1.0,
          "need 0 <= new_token_ratio_min <= new_token_ratio_init <= 1")

"""The run plan: what a run runs with, decided once, and the executor built from it.

    plan = plan_run(settings, config, model, dtype, Workload(...), hardware=..., disk_bytes=...)
    executor = build_executor(plan, reader)

`plan.py` is the pure step (settings and workload in, `RunPlan` out: placement policy, batch
sizes, budgets, the augmented face's pools); `build.py` does what is not pure: it reads this
machine (its profile, free disk), builds the executor and measures the pools an offload
executor's budgets leave. Both faces take (executor, plan); none holds the `LLM` object.
"""

from flexlamps.run_plan.plan import RunPlan, Workload, plan_augmented, plan_run

__all__ = ["RunPlan", "Workload", "plan_augmented", "plan_run"]

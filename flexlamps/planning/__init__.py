"""Planning a run's placement: the planner's policy for this model and machine (`policy_choice`),
checked by a dry run of the offload executor's charges (`dry_run`), nothing loaded or allocated.

It sits between the run plan and the engine: `flexlamps.run_plan` calls it, it reads the engine's
own byte accounting (`engine.executors.charges`) and the planner (`placement`); the engine never
imports it.
"""

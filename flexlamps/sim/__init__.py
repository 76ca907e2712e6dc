"""Discrete-event simulation of augmented requests through the flexlamps scheduler (no torch):
trace loading and replay (`trace`), the event loop (`simulator`), runs by name (`run`),
summaries (`metrics`) and plots (`plots`)."""

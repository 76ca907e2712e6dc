"""This machine, measured for the planner: `probes` (each probe), `int4_probes` (the engine's 4-bit
and int8 kernels), `machine` (every probe run into a `placement.HardwareSpec`: `flexlamps
profile`), `cache` (the profile `--policy auto` uses, cached in the cache folder)."""

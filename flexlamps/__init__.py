"""flexlamps: offload-centric, throughput-first LLM inference with augmented-request scheduling."""

__version__ = "0.1.0"

# The vLLM-style API is imported lazily so `import flexlamps.sched` stays torch-free.
def __getattr__(name):
    if name in ("LLM", "SamplingParams", "RequestOutput"):
        from flexlamps import api  # lazy (torch): `import flexlamps` (the CLI, placement users) stays light

        return getattr(api, name)
    raise AttributeError(name)

"""HELM-style offline evaluation (see docs/helm.md).

scenarios -> instances (`instances`, `scenarios`, `demo_scenario`) -> prompts and requests
(`adapter_spec`, `adapters`, `run_specs`) -> the engine (`executor`, `runner`) -> stats
(`metrics`, `scoring`, `stats`) -> HELM run folders and a summary (`helm_output`, `helm_env`,
`summary`). Nothing here imports torch; the engine is reached only through the `LLM` object.
"""

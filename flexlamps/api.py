"""The Python API a vLLM user expects: `LLM(...).generate(prompts, SamplingParams(...))` and `.score`.

With no memory budget the model runs fully in memory. With `gpu_mem` (and optionally
`cpu_mem`, `offload_dir`) weights and cache are placed across gpu / cpu / disk by `policy`:
"auto" asks the planner (this machine's profile, the run's lengths), a path loads a policy
JSON, a `placement.Policy` is used as is.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from flexlamps.engine.batch.generate import RequestOutput, generate, shared_prefix_length
from flexlamps.host_allocator import keep_freed_memory
from flexlamps.engine.batch.sampling import SamplingParams
from flexlamps.engine.batch.scoring import PrefixScorer, PrefixStats, ScoreOutput, split_tokens
from flexlamps.models.loading.registry import open_checkpoint
from flexlamps.settings import RunSettings
from flexlamps.models.description import model_spec_from_hf

__all__ = ["LLM", "RunSettings", "SamplingParams", "RequestOutput", "ScoreOutput"]


def planning_lengths(prompt_ids: Sequence[list[int]]) -> tuple[int, int]:
    """(longest prompt, shared prefix) of a call's prompts, what an offloaded engine is planned
    for: generate's cache holds the longest prompt (not the mean) plus its new tokens, and a
    prefix every prompt starts with sits in a one-row cache of its own."""
    return max(map(len, prompt_ids), default=1), shared_prefix_length(prompt_ids)


class LLM:
    """A model ready to generate and score.

    model: a built-in name ("smollm2-135m"), a Hugging Face folder or a .gguf file.
    dtype: compute and weight dtype (auto, float32, bfloat16, float16); "auto" is bfloat16 with
        a quantized GGUF's blocks computed in place, else float32. In bfloat16/float16 a GGUF's
        Q4_0/Q4_1/Q4_K weights stay 4-bit in memory (`quant.int4_weight`), its Q8_0 and 5-bit
        ones int8 (`quant.int8_weight`); other block types are dequantized.
    max_batch_size: sequences decoded together (continuous batching); with offloading the
        policy's block size (gpu_batch_size x num_gpu_batches) is used instead.
    gpu_mem, cpu_mem: byte budgets ("2GiB" or an int) that turn on the offload engine.
    cache_dir: folder of the packed-weight cache (a GGUF is repacked once, later loads map the
        file); default $FLEXLAMPS_CACHE or ~/.cache/flexlamps; False turns the cache off.
    offload_dir: folder for the disk tier. policy: "auto", a policy JSON path, a Policy, or None
        (everything on the gpu tier: compression without offloading).
    """

    def __init__(self, model: str = "smollm2-135m", *, dtype: str = "auto", max_batch_size: int = 32,
                 device: str | None = None, reuse_prefix: bool = True, gpu_mem=None, cpu_mem=None,
                 offload_dir: str | None = None, policy="auto", compress_weight: bool | None = None,
                 compress_cache: bool | None = None, weight_quant: str | None = None, cache_dir=None):
        self._setup(RunSettings.parse(
            model, dtype=dtype, max_batch_size=max_batch_size, device=device, reuse_prefix=reuse_prefix,
            gpu_mem=gpu_mem, cpu_mem=cpu_mem, offload_dir=offload_dir, policy=policy,
            compress_weight=compress_weight, compress_cache=compress_cache, weight_quant=weight_quant,
            cache_dir=cache_dir))

    @classmethod
    def from_settings(cls, settings: RunSettings) -> "LLM":
        """The model as `settings` (parsed once, e.g. by the CLI) say."""
        llm = cls.__new__(cls)
        llm._setup(settings)
        return llm

    def _setup(self, settings: RunSettings) -> None:
        self.settings = settings
        self.model_name = settings.model
        self.reader = open_checkpoint(settings.model, settings.cache_dir or None)
        self.config = self.reader.config
        self.tokenizer = self.reader.tokenizer
        self.dtype = settings.resolve_dtype(self.reader)
        self.max_batch_size = settings.max_batch_size
        self.device = settings.device
        self.cache_dir = settings.cache_dir
        keep_freed_memory()
        self.reuse_prefix = settings.reuse_prefix
        # the offload executor's settings, with the tier budgets filled in; None: all in memory
        self.offload = settings.with_budgets() if settings.offloaded else None
        self.executor = None
        self.plan = None  # the planner's Plan when policy="auto"
        self.policy = None  # the offloaded engine's placement Policy once built; None: all in memory
        self.micro_batch = None
        self.planned_for = None  # (prompt_len, gen_len) the offloaded engine was planned for
        self._scorer = None
        self._stats = PrefixStats()
        if self.offload is None or not (isinstance(settings.policy, str) and settings.policy == "auto"):
            self.prepare()

    # -- setup ------------------------------------------------------------------------------
    def prepare(self, prompt_len: int = 512, gen_len: int = 32, on_profile=None, num_sequences: int = 256,
                planner_budgets: tuple[int, int] | None = None, prefix_len: int = 0) -> None:
        """Build the executor; with policy="auto", plan for these lengths (`prompt_len`: the
        longest prompt, `prefix_len`: a prefix they share, see `planning_lengths`) and at most
        `num_sequences` sequences in flight first. `planner_budgets`: the (gpu, cpu) bytes the
        planner may fill, when part of each tier is kept for something it does not plan
        (the augmented face's KV pools); the executor still runs within the whole budgets."""
        if self.executor is not None:
            return
        if self.offload is None:
            from flexlamps.engine.executors.in_memory import InMemoryExecutor
            from flexlamps.models.loading.weight_cache import load_weights
            from offload import compute_device

            device = torch.device(self.device) if self.device else compute_device()  # the GPU when there is one
            weights = load_weights(self.reader, self.dtype, int4_in_place=True, cache_dir=self.cache_dir or None,
                                   use_cache=self.cache_dir is not False)  # the executor moves them to `device`
            twins = device.type == "cpu" and _dense_twins_fit(weights)
            self.executor = InMemoryExecutor(self.config, weights, self.dtype, device, dense_twins=twins,
                                             dense_copies=self._cached_dense_copies() if twins else None)
        else:
            self.executor = self._offload_executor(prompt_len, gen_len, on_profile, num_sequences, planner_budgets,
                                                   prefix_len)
            self.planned_for = (prompt_len, gen_len)
        self._scorer = PrefixScorer(self.executor, max_batch=self.max_batch_size, micro_batch=self.micro_batch,
                                    reuse_prefix=self.reuse_prefix,
                                    stats=self._stats)

    def prepare_pools(self, *, max_context: int, block_size: int, max_num_seqs: int, max_num_batched_tokens: int,
                      swap: bool = True):
        """Build the offload executor for an augmented workload (with policy "auto" the planner
        places the weights, kept out of part of each tier for the paged pools) and size both pools
        from what the tiers' budgets leave (`engine.augmented.pools.PoolSizes`)."""
        from flexlamps.engine.augmented.pools import agents_workload, planner_budgets, pool_sizes

        if self.offload is None:
            raise ValueError("tier budgets size the pools of an offloaded model only; give gpu_mem and cpu_mem")
        kv_per_token = self.config.kv_bytes_per_token(self.dtype.itemsize)
        gpu, cpu = planner_budgets(self.offload.gpu_mem, self.offload.cpu_mem, kv_per_token, max_num_seqs, max_context)
        prompt, gen = agents_workload(max_context, max_num_seqs, max_num_batched_tokens)
        # the KV cache lives in the paged pools, not where the planner would put it: the planner is
        # asked about one sequence (its weight placement), not a cache for the batch
        self.prepare(prompt_len=prompt, gen_len=gen, num_sequences=1, planner_budgets=(gpu, cpu))
        return pool_sizes(self.executor, max_context=max_context, max_num_seqs=max_num_seqs,
                          max_num_batched_tokens=max_num_batched_tokens, block_size=block_size, swap=swap)

    def _cached_dense_copies(self):
        """The weight cache's dense copies of the 4-bit matrices (see weight_cache.dense_copies), or
        None when the cache is off or the checkpoint is not one file."""
        import functools
        from pathlib import Path

        from flexlamps.models.loading import weight_cache

        if self.cache_dir is False or not Path(self.reader.path).is_file():
            return None
        entry = weight_cache.entry_path(self.reader, self.dtype, True, self.cache_dir or None)
        return functools.partial(weight_cache.dense_copies, weight_cache.dense_path(entry))

    def _offload_executor(self, prompt_len, gen_len, on_profile, num_sequences, planner_budgets=None, prefix_len=0):
        import dataclasses
        import tempfile
        from pathlib import Path

        from flexlamps.engine.executors.offloaded import OffloadExecutor
        from flexlamps.engine.executors.policy_choice import load_policy, plan_policy
        from flexlamps.engine.routing_profile import cached_routing
        from flexlamps.hardware.cache import machine_profile

        o = self.offload
        policy = o.policy
        if isinstance(policy, str) and policy == "auto":
            scratch = Path(o.offload_dir) if o.offload_dir else Path(tempfile.gettempdir()) / "flexlamps-profile"
            shapes = model_spec_from_hf(self.reader.hf_config).layer_matrix_shapes()
            hw = machine_profile(scratch, on_profile, model_shapes=shapes)
            disk = _free_disk_bytes(o.offload_dir)
            gpu_mem, cpu_mem = planner_budgets or (o.gpu_mem, o.cpu_mem)
            self.plan = plan_policy(self.reader.hf_config, self.dtype, hw, gpu_mem=gpu_mem, cpu_mem=cpu_mem,
                                    disk_bytes=disk, prompt_len=prompt_len, gen_len=gen_len,
                                    max_block_size=max(1, num_sequences),
                                    allow_compression=bool(o.compress_weight or o.compress_cache),
                                    compress_weight=o.compress_weight, compress_cache=o.compress_cache,
                                    prefix_len=prefix_len if self.reuse_prefix else 0,
                                    routing=cached_routing(self.reader))
            policy = self.plan.policy
        elif isinstance(policy, (str, Path)):
            policy = load_policy(policy)
        elif policy is None:  # everything on the gpu tier, one micro-batch of max_batch_size
            from placement import Policy, TierSplit

            gpu = TierSplit(gpu=1, cpu=0, disk=0)
            policy = Policy(gpu_batch_size=self.max_batch_size, num_gpu_batches=1, weights=gpu, cache=gpu,
                            activations=gpu)
        if o.compress_weight is not None or o.compress_cache is not None:
            policy = dataclasses.replace(
                policy,
                compress_weight=policy.compress_weight if o.compress_weight is None else o.compress_weight,
                compress_cache=policy.compress_cache if o.compress_cache is None else o.compress_cache)
        self.policy = policy
        self.max_batch_size = policy.gpu_batch_size * policy.num_gpu_batches
        self.micro_batch = policy.gpu_batch_size
        executor = OffloadExecutor(self.reader, policy, gpu_mem=o.gpu_mem, cpu_mem=o.cpu_mem,
                                   offload_dir=o.offload_dir, dtype=self.dtype, weight_quant=o.weight_quant)
        self.policy = executor.policy  # as run: a weight backend turns compress_weight on
        return executor

    def policy_lines(self) -> list[str]:
        """What an offloaded engine runs, in words: its placement policy, the planner's prediction
        (policy "auto") and whether the offload folder was reused; [] when all is in memory."""
        if self.offload is None or self.executor is None:
            return []
        p = self.policy
        split = lambda t: f"gpu {t.gpu:.0%} / cpu {t.cpu:.0%} / disk {t.disk:.0%}"  # noqa: E731
        lines = [f"policy: block {p.gpu_batch_size} x {p.num_gpu_batches} | weights {split(p.weights)} | "
                 f"cache {split(p.cache)} | activations {split(p.activations)} | compress weight {p.compress_weight}, "
                 f"cache {p.compress_cache} | cpu attention {p.cpu_attention} | decode merged {p.merge_decode}"]
        if p.latent_pools:  # ESS's layout: each layer's gpu pool of latent records, a share of the context
            lines.append("latent pools per layer (share of the context on the gpu tier): "
                         + " ".join(f"{f:.0%}" for f in p.latent_pools))
        if self.plan is not None:
            prompt_len, gen_len = self.planned_for
            lines.append(f"predicted {self.plan.tokens_per_s:.2f} tok/s (planner, prompt {prompt_len}, gen {gen_len})")
        if getattr(self.executor, "reused_disk", False):
            lines.append("offload folder reused")
        return lines

    @property
    def stats(self) -> PrefixStats:
        """Shared-prefix counters: prefill tokens requested vs computed (generate and score)."""
        return self._stats

    def encode_prompt(self, prompt: str, chat: bool = False) -> list[int]:
        return self.tokenizer.encode_prompt(prompt, chat)

    # -- work -------------------------------------------------------------------------------
    def generate_ids(self, prompt_ids: list[list[int]], params: Sequence[SamplingParams], *,
                     on_finish: Callable[[RequestOutput], None] | None = None,
                     on_tokens: Callable[[int], None] | None = None) -> list[RequestOutput]:
        if self.executor is None:
            longest, shared = planning_lengths(prompt_ids)
            self.prepare(prompt_len=longest, gen_len=max(p.max_new_tokens for p in params),
                         num_sequences=len(prompt_ids), prefix_len=shared)
        return generate(self.executor, self.tokenizer, prompt_ids, list(params), max_batch=self.max_batch_size,
                        micro_batch=self.micro_batch, on_finish=on_finish, on_tokens=on_tokens,
                        stats=self.stats, reuse_prefix=self.reuse_prefix)

    def generate(self, prompts: Sequence[str] | str, params: SamplingParams | Sequence[SamplingParams] | None = None,
                 *, chat: bool = False, on_finish: Callable[[RequestOutput], None] | None = None,
                 on_tokens: Callable[[int], None] | None = None) -> list[RequestOutput]:
        """One `RequestOutput` per prompt, in order. `chat` wraps each prompt in the chat template."""
        if isinstance(prompts, str):
            prompts = [prompts]
        params = params or SamplingParams()
        plist = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        ids = [self.encode_prompt(p, chat) for p in prompts]
        return self.generate_ids(ids, plist, on_finish=on_finish, on_tokens=on_tokens)

    def score(self, contexts: Sequence[str], continuations: Sequence[str]) -> list[ScoreOutput]:
        """Log-likelihood of each continuation after its context (shared prefixes computed once)."""
        if len(contexts) != len(continuations):
            raise ValueError(f"{len(contexts)} contexts but {len(continuations)} continuations")
        pairs = [split_tokens(self.tokenizer, c, k) for c, k in zip(contexts, continuations)]
        if self.executor is None:
            self.prepare(prompt_len=max(len(c) + len(k) for c, k in pairs), gen_len=1)
        return self._scorer.score(pairs)

    def run_agents(self, tasks, tools=None, **options):
        """Agent tasks whose tools really run, on the augmented engine under one scheduling
        policy: see `flexlamps.agents.api.run_agents` for `tasks`, `tools` and the options."""
        from flexlamps.agents.api import run_agents

        return run_agents(self, tasks, tools, **options)

    def close(self) -> None:
        if hasattr(self.executor, "close"):
            self.executor.close()


# The in-memory executor keeps a dense copy of its 4-bit and Q8_0 weights (prefill and batches from
# 16 rows, 3 for Q8_0, run a dense GEMM instead of dequantizing per call) when the copies take at
# most this share of the memory available now; otherwise the quantized weights alone (same results,
# slower prefill).
DENSE_TWINS_MAX_SHARE = 0.25


def _dense_twins_fit(weights: dict) -> bool:
    import psutil

    from flexlamps.models.blocks.linear import can_have_dense_twin

    dense_bytes = sum(w.shape[0] * w.shape[1] * w.dtype.itemsize for w in weights.values() if can_have_dense_twin(w))
    return 0 < dense_bytes <= DENSE_TWINS_MAX_SHARE * psutil.virtual_memory().available


def _free_disk_bytes(offload_dir) -> int:
    """The disk tier the planner may use: free space where the offload executor will write, the
    folder given or, as the executor does without one, the default under the cache folder."""
    import shutil
    from pathlib import Path

    from flexlamps.cache_folder import default_offload_dir

    folder = Path(offload_dir) if offload_dir else default_offload_dir()
    folder.mkdir(parents=True, exist_ok=True)
    return shutil.disk_usage(folder).free


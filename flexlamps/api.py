"""The Python API a vLLM user expects: `LLM(...).generate(prompts, SamplingParams(...))` and `.score`.

With no memory budget the model runs fully in memory. With `gpu_mem` (and optionally
`cpu_mem`, `offload_dir`) weights and cache are placed across gpu / cpu / disk by `policy`:
"auto" asks the planner (this machine's profile, the run's lengths), a path loads a policy
JSON, a `placement.Policy` is used as is.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from flexlamps.agents.api import run_agents
from flexlamps.engine.batch.generate import ContextOverflowError, RequestOutput, generate, shared_prefix_length
from flexlamps.engine.batch.grammar import JsonGrammars
from flexlamps.engine.batch.sampling import NonFiniteLogitsError, SamplingParams
from flexlamps.engine.batch.scoring import (PrefixScorer, PrefixStats, ScoreLimits, ScoreOutput, planning_positions,
                                            split_tokens)
from flexlamps.host_allocator import keep_freed_memory
from flexlamps.models.description import model_spec
from flexlamps.models.loading.registry import open_checkpoint
from flexlamps.planning.policy_choice import load_policy
from flexlamps.run_plan import RunPlan, Workload, plan_augmented, plan_run
from flexlamps.run_plan.build import build_executor, machine_inputs, with_measured_pools
from flexlamps.settings import AugmentedSettings, RunSettings
import placement

__all__ = ["LLM", "RunSettings", "SamplingParams", "RequestOutput", "ScoreOutput", "JsonGrammars", "open_model",
           "open_checkpoint", "load_policy", "ContextOverflowError", "NonFiniteLogitsError"]


def open_model(model: str, cache_dir=None):
    """(checkpoint reader, placement.ModelSpec) of `model`, no weight read: its config, tokenizer
    and description, for a caller that checks a run before (or without) building an engine."""
    reader = open_checkpoint(model, cache_dir)
    return reader, model_spec(reader.config, name=model)


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
    def from_settings(cls, settings: RunSettings, prepare: bool = True) -> "LLM":
        """The model as `settings` (parsed once, e.g. by the CLI) say. `prepare=False`: no weights
        are read until `load` (or `prepare`, or the first `generate`), so a caller can check the
        run against the model's description first (`generate --max-rss`)."""
        llm = cls.__new__(cls)
        llm._setup(settings, prepare)
        return llm

    def _setup(self, settings: RunSettings, prepare: bool = True) -> None:
        self.settings = settings
        self.model_name = settings.model
        self.reader = open_checkpoint(settings.model, settings.cache_dir or None)
        self.config = self.reader.config
        self.model_spec = model_spec(self.config, name=settings.model)  # the planner's view, built once a run
        self.tokenizer = self.reader.tokenizer
        self.dtype = settings.resolve_dtype(self.reader)
        self.device = settings.device
        self.cache_dir = settings.cache_dir
        keep_freed_memory()
        self.reuse_prefix = settings.reuse_prefix
        # the offload executor's settings, with the tier budgets filled in; None: all in memory
        self.offload = settings.with_budgets() if settings.offloaded else None
        self.executor = None
        self.run_plan: RunPlan | None = None  # what the executor was built from
        self.pool_sizes = None  # the augmented pools measured on an offload executor (PoolSizes)
        self._scorer = None
        self._grammars = None
        self._stats = PrefixStats()
        if prepare:
            self.load()

    def load(self) -> None:
        """Build the executor where the settings fix it (in memory, or a placement given); policy
        "auto" waits for the workload it plans for (`prepare`)."""
        if self.offload is None or not (isinstance(self.settings.policy, str) and self.settings.policy == "auto"):
            self.prepare()

    # -- the plan and its executor ------------------------------------------------------------
    @property
    def policy(self):
        """The offloaded engine's placement policy once built; None: all in memory (or not built yet)."""
        return None if self.run_plan is None else self.run_plan.policy

    @property
    def plan(self):
        """The planner's answer (`placement.Plan`) when policy "auto" chose the placement, else None."""
        return None if self.run_plan is None else self.run_plan.predicted

    @property
    def max_batch_size(self) -> int:
        """Sequences decoded together: the settings', or the offloaded policy's block once planned."""
        return self.settings.max_batch_size if self.run_plan is None else self.run_plan.max_batch_size

    def prepare(self, prompt_len: int = 512, gen_len: int = 32, on_profile=None, num_sequences: int = 256,
                prefix_len: int = 0, scoring: bool = False) -> None:
        """Plan the run and build its executor; with policy="auto" the placement is planned for
        these lengths (`prompt_len`: the longest prompt, `prefix_len`: a prefix they share, see
        `planning_lengths`) and at most `num_sequences` sequences in flight; `scoring`: `score`
        runs on it (its rows return logits at every position; `prompt_len`: the positions of a
        scoring row, `engine.batch.scoring.planning_positions`)."""
        if self.executor is not None:
            return
        workload = Workload(prompt_len=prompt_len, gen_len=gen_len, num_sequences=num_sequences,
                            prefix_len=prefix_len, scoring=scoring)
        self._build(plan_run(self.offload or self.settings, self.config, self.model_spec, self.dtype, workload,
                             **self._machine(on_profile)))

    def prepare_augmented(self, augmented: AugmentedSettings, on_profile=None) -> RunPlan:
        """Plan an augmented run and build its executor: the paged pools as given (in memory) or
        what the tiers' budgets leave once the weights are placed (offloaded, measured on the
        built executor); returns the plan, whose `pools` the augmented face runs with."""
        if self.executor is None:
            self._build(plan_augmented(self.offload or self.settings, augmented, self.config, self.model_spec,
                                       self.dtype, **self._machine(on_profile)))
        elif self.run_plan.augmented != augmented:
            if self.run_plan.predicted is not None:  # "auto" placed the weights for another workload
                raise ValueError("this LLM's placement was planned for another workload; make a fresh LLM for "
                                 "the augmented run")
            plan = plan_augmented(self.offload or self.settings, augmented, self.config, self.model_spec,
                                  self.dtype)  # a placement given: the executor is the plan's
            self.run_plan = self._as_run(plan)
        if self.run_plan.pools is None:
            self.run_plan, self.pool_sizes = with_measured_pools(self.run_plan, self.executor)
        return self.run_plan

    def _machine(self, on_profile) -> dict:
        """What planning takes from this machine (`run_plan.build.machine_inputs`)."""
        if self.offload is None:
            return {}
        return machine_inputs(self.offload, self.model_spec, self.reader, on_profile)

    def _as_run(self, plan: RunPlan) -> RunPlan:
        """`plan` with the policy as the executor runs it (a weight backend turns compress_weight on)."""
        return dataclasses.replace(plan, policy=self.executor.policy) if plan.offloaded else plan

    def _build(self, plan: RunPlan) -> None:
        self.executor = build_executor(plan, self.reader)
        self.run_plan = self._as_run(plan)
        self._scorer = PrefixScorer(self.executor, max_batch=plan.max_batch_size, micro_batch=plan.micro_batch,
                                    reuse_prefix=self.reuse_prefix, stats=self._stats, limits=_score_limits(plan))

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
            prompt_len, gen_len = self.run_plan.workload.prompt_len, self.run_plan.workload.gen_len
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

    def encode_chat(self, messages: list[dict]) -> list[int]:
        """A conversation's ids through the model's chat template, ready for the assistant's turn."""
        return self.tokenizer.encode_chat(messages)

    @property
    def grammars(self) -> JsonGrammars:
        """The compiler of the JSON schemas of `SamplingParams.json_schema`, for this model."""
        if self._grammars is None:
            self._grammars = JsonGrammars(self.tokenizer, self.config.vocab_size)
        return self._grammars

    # -- work -------------------------------------------------------------------------------
    def generate_ids(self, prompt_ids: list[list[int]], params: Sequence[SamplingParams], *,
                     on_finish: Callable[[RequestOutput], None] | None = None,
                     on_tokens: Callable[[int], None] | None = None) -> list[RequestOutput]:
        """One `RequestOutput` per prompt and sample (`SamplingParams.n`), in that order."""
        if self.executor is None:
            longest, shared = planning_lengths(prompt_ids)
            self.prepare(prompt_len=longest, gen_len=max(p.max_new_tokens for p in params),
                         num_sequences=sum(p.n for p in params), prefix_len=shared)
        grammars = self.grammars if any(p.json_schema is not None for p in params) else None
        return generate(self.executor, self.tokenizer, prompt_ids, list(params), max_batch=self.max_batch_size,
                        micro_batch=self.run_plan.micro_batch, on_finish=on_finish, on_tokens=on_tokens,
                        stats=self.stats, reuse_prefix=self.reuse_prefix, grammars=grammars)

    def generate(self, prompts: Sequence[str] | str, params: SamplingParams | Sequence[SamplingParams] | None = None,
                 *, chat: bool = False, on_finish: Callable[[RequestOutput], None] | None = None,
                 on_tokens: Callable[[int], None] | None = None) -> list[RequestOutput]:
        """One `RequestOutput` per prompt and sample, in order. `chat` wraps each prompt in the chat template."""
        if isinstance(prompts, str):
            prompts = [prompts]
        ids = [self.encode_prompt(p, chat) for p in prompts]
        return self.generate_ids(ids, _per_prompt(params, len(ids)), on_finish=on_finish, on_tokens=on_tokens)

    def chat(self, conversations: Sequence[list[dict]], params: SamplingParams | Sequence[SamplingParams] | None = None,
             *, on_finish: Callable[[RequestOutput], None] | None = None,
             on_tokens: Callable[[int], None] | None = None) -> list[RequestOutput]:
        """The assistant's next turn of each conversation (a list of {"role", "content"} messages:
        system prompts, few-shot turns, the user's question), rendered by the model's own chat
        template; one `RequestOutput` per conversation and sample, in order."""
        if conversations and isinstance(conversations[0], dict):
            raise TypeError("chat takes a list of conversations, each a list of messages: wrap one in [...]")
        ids = [self.encode_chat(list(c)) for c in conversations]
        return self.generate_ids(ids, _per_prompt(params, len(ids)), on_finish=on_finish, on_tokens=on_tokens)

    def score(self, contexts: Sequence[str], continuations: Sequence[str]) -> list[ScoreOutput]:
        """Log-likelihood of each continuation after its context (shared prefixes computed once)."""
        if len(contexts) != len(continuations):
            raise ValueError(f"{len(contexts)} contexts but {len(continuations)} continuations")
        return self.score_ids([self.score_tokens(c, k) for c, k in zip(contexts, continuations)])

    def score_tokens(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """(context ids, continuation ids) of a pair as `score` splits it, as lm-eval does: trailing
        spaces of the context go to the continuation, and the pair is encoded whole."""
        return split_tokens(self.tokenizer, context, continuation)

    def score_ids(self, pairs: list[tuple[list[int], list[int]]]) -> list[ScoreOutput]:
        """`score` of (context ids, continuation ids) pairs."""
        self.prepare_scoring(pairs)
        return self._scorer.score(pairs)

    def prepare_scoring(self, pairs: list[tuple[list[int], list[int]]]) -> None:
        """Plan for the scorer's own rows (packed rows after a shared root, logits at every
        position); where no plan fits them, for rows of one pair each (the fewest positions).
        Nothing to do once the executor is built; a caller scoring a job in parts plans it here
        for all its pairs first."""
        if self.executor is not None or not pairs:
            return
        positions, root, fewest = planning_positions(pairs, self.reuse_prefix)
        try:
            self.prepare(prompt_len=positions, gen_len=1, num_sequences=len(pairs), prefix_len=root, scoring=True)
        except placement.InfeasiblePlanError:
            if positions == fewest:
                raise
            self.prepare(prompt_len=fewest, gen_len=1, num_sequences=len(pairs), prefix_len=root, scoring=True)

    def run_agents(self, tasks, tools=None, *, max_context: int = 1024, gpu_kv_mem: int | None = None,
                   cpu_swap_mem: int | None = None, block_size: int = 16, max_num_seqs: int = 16,
                   max_num_batched_tokens: int = 256, **options):
        """Agent tasks whose tools really run, on the augmented engine under one scheduling
        policy: see `flexlamps.agents.api.run_agents` for `tasks`, `tools` and the options. The
        paged pools: given in bytes, else room for 4 full contexts on each tier (an offloaded
        model: what its tier budgets leave)."""
        plan = self.prepare_augmented(AugmentedSettings.parse(
            max_context=max_context, block_size=block_size, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens, gpu_kv_mem=gpu_kv_mem, cpu_swap_mem=cpu_swap_mem))
        return run_agents(self.executor, self.tokenizer, plan, tasks, tools, **options)

    def replan(self) -> None:
        """Close the executor and forget its plan: the next call plans (policy "auto") and builds
        one for its own workload, e.g. a generation job after a scoring one."""
        self.close()
        self.executor, self.run_plan, self.pool_sizes, self._scorer = None, None, None, None

    def close(self) -> None:
        if hasattr(self.executor, "close"):
            self.executor.close()


def _per_prompt(params, num_prompts: int) -> list[SamplingParams]:
    """One SamplingParams per prompt: a list as given, one for all, or the defaults."""
    params = params or SamplingParams()
    return list(params) if isinstance(params, (list, tuple)) else [params] * num_prompts


def _score_limits(plan: RunPlan) -> ScoreLimits | None:
    """The geometry the planner's dry run checked (policy "auto"), which `score` keeps to; None: in
    memory, or a placement given (nothing was checked)."""
    if plan.predicted is None:
        return None
    w = plan.workload
    return ScoreLimits(rows=plan.max_batch_size, positions=w.prompt_len,
                       prefix=w.prefix_len if plan.settings.reuse_prefix else 0,
                       logits=w.logits_per_row)

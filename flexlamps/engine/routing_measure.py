"""Measuring a MoE model's routing (`flexlamps profile --model M --prompts FILE`): the model runs
the user's prompts with every weight in memory while a counter notes the experts each token
picks. Apart from `routing_profile` (the cached profile the planner and the executor read), as
measuring runs the engine."""

from __future__ import annotations

import torch

from flexlamps.engine.batch.generate import generate
from flexlamps.engine.batch.sampling import SamplingParams
from flexlamps.engine.executors.offloaded import OffloadExecutor
from flexlamps.models.description import model_spec
from placement import Policy, TierSplit
from placement.routing import RoutingProfile


class RoutingCounter:
    """Counts, per MoE layer, the tokens that picked each expert (`add`, from the forward's
    routing hint, `LayerWeights.routed_to`)."""

    def __init__(self, num_experts: int, experts_per_token: int):
        self.num_experts, self.experts_per_token = num_experts, experts_per_token
        self.counts: dict[int, list[int]] = {}
        self.traces: list[list[dict[int, set[int]]]] = []  # per sequence, per step: layer -> experts

    def step(self, new_sequence: bool) -> None:
        """A step begins (the first of a new sequence: its prompt): its routing is traced apart."""
        if new_sequence or not self.traces:
            self.traces.append([])
        self.traces[-1].append({})

    def add(self, layer: int, tokens: dict[int, int]) -> None:
        row = self.counts.setdefault(layer, [0] * self.num_experts)
        for expert, n in tokens.items():
            row[expert] += n
        if self.traces:
            self.traces[-1][-1].setdefault(layer, set()).update(tokens)

    def profile(self) -> RoutingProfile:
        """What was counted; every layer saw the same tokens (picks / k of them)."""
        picks = max((sum(row) for row in self.counts.values()), default=0)
        traces = [[{str(layer): sorted(experts) for layer, experts in sorted(step.items())} for step in steps]
                  for steps in self.traces]
        return RoutingProfile(self.num_experts, self.experts_per_token, picks // self.experts_per_token,
                              {str(layer): row for layer, row in sorted(self.counts.items())}, traces)


def measure_routing(reader, prompts: list[list[int]], max_new_tokens: int = 16) -> RoutingProfile:
    """Run the prompts (greedy, `max_new_tokens` each) with every weight in memory and count the
    routing of every token the model reads (the prompt's and all generated but the last), and
    trace each sequence's routing step by step (what the expert cache's hits are priced from)."""
    moe = reader.config.moe
    if moe is None:
        raise ValueError(f"{reader.config.model_type} has no routed experts: a routing profile needs a MoE model")
    on_gpu = TierSplit(gpu=1.0, cpu=0.0, disk=0.0)
    policy = Policy(gpu_batch_size=1, num_gpu_batches=1, weights=on_gpu, cache=on_gpu, activations=on_gpu)
    memory = 1 << 50  # everything in memory: the counts do not depend on the budgets
    ex = OffloadExecutor(reader, policy, model_spec=model_spec(reader.config),
                         gpu_mem=memory, cpu_mem=memory, dtype=torch.float32,
                         routing=RoutingProfile.uniform(moe.num_experts, moe.num_experts_per_token))
    counter = ex.sweep.routing_counter = RoutingCounter(moe.num_experts, moe.num_experts_per_token)
    forward_steps = ex.forward_steps

    def traced(cache, steps):  # one sequence at a time: a step at position 0 starts the next
        counter.step(new_sequence=int(steps[0].positions.min()) == 0)
        return forward_steps(cache, steps)
    ex.forward_steps = traced
    try:
        params = [SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True)] * len(prompts)
        # one prompt at a time: a padded batch would count its padding's routing too
        generate(ex, reader.tokenizer, prompts, params, max_batch=1, reuse_prefix=False)
    finally:
        ex.close()
    return counter.profile()

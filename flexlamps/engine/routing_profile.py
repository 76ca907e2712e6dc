"""A MoE model's routing measured on the user's prompts (`flexlamps profile --model M --prompts
FILE`): how many tokens picked each expert of each layer, cached beside the hardware profile
under the checkpoint's fingerprint. The offload executor reads it to place each layer's hottest
experts on the fastest tier; without one, experts are placed by index (uniform routing).
"""

from __future__ import annotations

import json
from pathlib import Path

from flexlamps.cache_folder import cache_root
from placement.routing import RoutingProfile


def routing_cache_path(fingerprint: str) -> Path:
    return cache_root() / f"routing-{fingerprint}.json"


def cached_routing(reader) -> RoutingProfile | None:
    """The routing measured for this checkpoint, when `flexlamps profile --prompts` cached one."""
    if reader.config.moe is None:
        return None
    path = routing_cache_path(reader.fingerprint())
    if not path.exists():
        return None
    try:
        return RoutingProfile.from_json(path.read_text())
    except (ValueError, TypeError) as exc:
        raise ValueError(f"the routing profile {path} is damaged ({exc}); delete it or run "
                         "`flexlamps profile --model M --prompts FILE` again") from None


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
    import torch

    from flexlamps.engine.batch.generate import generate
    from flexlamps.engine.batch.sampling import SamplingParams
    from flexlamps.engine.executors.offloaded import OffloadExecutor
    from placement import Policy, TierSplit

    moe = reader.config.moe
    if moe is None:
        raise ValueError(f"{reader.config.model_type} has no routed experts: a routing profile needs a MoE model")
    on_gpu = TierSplit(gpu=1.0, cpu=0.0, disk=0.0)
    policy = Policy(gpu_batch_size=1, num_gpu_batches=1, weights=on_gpu, cache=on_gpu, activations=on_gpu)
    memory = 1 << 50  # everything in memory: the counts do not depend on the budgets
    ex = OffloadExecutor(reader, policy, gpu_mem=memory, cpu_mem=memory, dtype=torch.float32,
                         routing=RoutingProfile.uniform(moe.num_experts, moe.num_experts_per_token))
    counter = ex.routing_counter = RoutingCounter(moe.num_experts, moe.num_experts_per_token)
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


def save_routing(reader, profile: RoutingProfile) -> Path:
    from flexlamps.io.atomic import atomic_output

    path = routing_cache_path(reader.fingerprint())
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(path) as handle:
        handle.write(json.dumps(profile.to_dict()) + "\n")
    return path

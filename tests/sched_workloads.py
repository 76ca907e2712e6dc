"""Small synthetic augmented workloads and tight scheduler configs for the sched/sim tests."""

import random

from flexlamps.sched.cost_model import CostModel
from flexlamps.sched.request import RequestSpec, Segment
from flexlamps.sched.scheduler import SchedulerConfig

KINDS = {"math": (1e-4, 20), "qa": (0.4, 30), "chatbot": (8.0, 10), "image": (4.0, 6)}


def synthetic_specs(n=60, qps=6.0, seed=0, max_calls=4):
    rng = random.Random(seed)
    t, specs = 0.0, []
    for i in range(n):
        t += rng.expovariate(qps)
        kind = rng.choice(list(KINDS))
        mean_api, ret = KINDS[kind]
        segs = [Segment(rng.randint(1, 40), kind, rng.expovariate(1 / mean_api), rng.randint(1, ret))
                for _ in range(rng.randint(0, max_calls))]
        segs.append(Segment(rng.randint(1, 40)))
        specs.append(RequestSpec(f"r{i}", rng.randint(4, 120), tuple(segs), t, client_id=kind, kind=kind))
    return specs


def small_cost():
    return CostModel.gptj6b_a100()


def tight_config(gpu_blocks=64, cpu_blocks=16, block_size=8, max_tokens=256, max_seqs=16):
    return SchedulerConfig(num_gpu_blocks=gpu_blocks, num_cpu_blocks=cpu_blocks, block_size=block_size,
                           max_num_seqs=max_seqs, max_num_batched_tokens=max_tokens)

"""A job's time projected from a sample of it (`bench_moe_job.py --sample`), one rule per side.

Every side runs its job as batches one after another, each batch a prefill of its prompts and then
one decode step a new token for all its rows, so a job of N prompts at batch B takes ceil(N / B)
times one batch: a side's cost a prompt is flat in N once N fills a batch. A sample measures one
batch's prefill and decode steps; where it decodes fewer new tokens than the job (`--peer-gen`),
its decode steps are scaled to the job's (each step of a batch costs about the same: the context
grows from the prompt's 128 to 192 tokens, and at this size the steps' expert reads, not attention,
take their time).

- llama.cpp (`llama-batched-bench -npl B`): it times its prefill (`t_pp`) and its decode steps
  (`t_tg`) apart; a batch = t_pp + gen_len / G x t_tg.
- Accelerate (one batch of B): `generate` for 1 and for G new tokens; a batch = t(1) + (gen_len - 1)
  x (t(G) - t(1)) / (G - 1).
- flexlamps: the job's plan (its block, often hundreds of sequences a sweep) is too long to run as a
  sample, so the planner prices the job's blocks, each phase divided by that phase's
  measured/predicted on the sample (its own plan, run whole): projected = prefill_job / r_prefill +
  decode_job / r_decode + the sample's time outside the sweeps scaled by prompts. It holds as far
  as the price's error is the same at the sample's block and the job's (check: two sample sizes).
"""

from __future__ import annotations

import math


def batched_job_s(job: int, batch: int, prefill_s: float, step_s: float, gen_len: int) -> float:
    """Seconds of a job of `job` prompts run `batch` at a time, one batch after another: each its
    prefill (`prefill_s`) and `gen_len` decode steps of `step_s`."""
    return math.ceil(job / batch) * (prefill_s + gen_len * step_s)


def llama_cpp_job_s(row: dict, job: int, npl: int, sample_gen: int, gen_len: int) -> float:
    """The job's seconds at `-npl npl` from llama-batched-bench's row of one batch of `sample_gen` steps."""
    return batched_job_s(job, npl, row["t_pp"], row["t_tg"] / sample_gen, gen_len)


def accelerate_job_s(runs: dict, job: int, batch: int, gen_len: int) -> float:
    """The job's seconds from `runs` {new tokens: seconds} of one batch at 1 and at G new tokens: the
    first run is the prefill and a token, the difference per token one decode step."""
    gens = sorted(runs)
    first, last = gens[0], gens[-1]
    step = (runs[last] - runs[first]) / (last - first) if last > first else 0.0
    return batched_job_s(job, batch, runs[first] - first * step, step, gen_len)


def flexlamps_job_s(res: dict, job: int, sample: int) -> float | None:
    """The job's seconds from the sample's run (`res`, bench_moe_job's worker result): the job plan's
    price per phase over the sample's measured/predicted in that phase, plus the time outside
    the sweeps per prompt. None where the sample has no price."""
    measured, sample_price, job_price = res["phases"], res.get("predicted_phases"), res.get("job_phases")
    if not sample_price or not job_price:
        return None
    total = 0.0
    for phase in ("prefill", "decode"):
        ratio = sample_price[phase]["s"] / measured[phase]["s"] if measured[phase]["s"] else 1.0
        total += job_price[phase]["s"] / ratio
    outside = res["s"] - sum(measured[p]["s"] for p in ("prefill", "decode"))
    return total + outside * job / sample

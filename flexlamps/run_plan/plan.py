"""The pure step from a run's settings and workload to its plan: the placement policy, the batch
sizes, the tier budgets and, for the augmented face, the paged pools.

Pure: it measures nothing and allocates nothing. What only the machine can say comes in as
arguments (`hardware`: its profile, `disk_bytes`: the disk tier's free space, read by
`build.machine_inputs`); the planner's check of its own answer is the executor's dry run, which
charges budgets on paper. The one file it may read is the policy JSON the settings name.
The planner's view of the model (`placement.ModelSpec`) is built here once per run, from the
run's one `ModelConfig`, and handed to the planner, the dry run and the executor.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch

from flexlamps.engine.augmented.pools import agents_workload, planner_budgets
from flexlamps.engine.augmented.run import AgentsConfig
from flexlamps.engine.caches.paged_state import paged_state_blocks
from flexlamps.models.config import ModelConfig
from flexlamps.planning.policy_choice import load_policy, plan_policy
from flexlamps.planning.target import BlockLengths, Compression, PlanTarget
from flexlamps.models.families.support import check_paged
from flexlamps.settings import AugmentedSettings, RunSettings
import placement

# the augmented face's default pools in memory: room for this many full contexts on each tier
DEFAULT_POOL_CONTEXTS = 4


@dataclass(frozen=True, kw_only=True)
class Workload:
    """What a run asks of its engine, as far as planning needs it."""
    prompt_len: int = 512  # tokens of the longest prompt (the cache holds it whole)
    gen_len: int = 32  # tokens generated per sequence at most
    num_sequences: int = 256  # sequences in flight at most
    prefix_len: int = 0  # tokens every prompt starts with (held once, in a one-row cache)
    scoring: bool = False  # rows are scored (`LLM.score`): logits at every prompt position, not the last

    @property
    def logits_per_row(self) -> int:
        """Positions of a prompt row whose logits the prefill returns: scoring's, every position
        after the shared prefix (held in its own cache)."""
        return max(1, self.prompt_len - self.prefix_len) if self.scoring else 1


@dataclass(frozen=True, kw_only=True)
class RunPlan:
    """What a run runs with; executors are built from it and both faces read it."""
    settings: RunSettings  # as parsed; the tier budgets filled in when offloaded
    model: placement.ModelSpec  # the planner's view of the run's ModelConfig, built once
    dtype: torch.dtype  # compute and weight dtype as run
    workload: Workload  # what the placement was planned for
    policy: placement.Policy | None  # the placement; None: all in memory, no budgets
    predicted: placement.Plan | None  # the planner's answer (policy "auto"), with its prediction
    max_batch_size: int  # sequences decoded together (offloaded: the policy's block)
    micro_batch: int | None  # rows per micro-batch (offloaded: the policy's gpu batch)
    planner_budgets: tuple[int, int] | None  # (gpu, cpu) bytes the planner was let fill
    augmented: AugmentedSettings | None = None  # the augmented face's settings, when planned for it
    pools: AgentsConfig | None = None  # its pools; None while an offload executor has to measure them

    @property
    def offloaded(self) -> bool:
        """Whether the offload executor runs (within the settings' tier budgets)."""
        return self.policy is not None


def plan_run(settings: RunSettings, config: ModelConfig, model: placement.ModelSpec, dtype: torch.dtype,
             workload: Workload = Workload(), *, hardware: placement.HardwareSpec | None = None,
             disk_bytes: int | None = None, routing=None, budgets: tuple[int, int] | None = None,
             in_place: dict | None = None) -> RunPlan:
    """The plan for `workload`. Offloaded settings need their budgets filled in
    (`RunSettings.with_budgets`), and policy "auto" needs `hardware` and `disk_bytes`. `model`:
    the planner's view of `config`, built once a run (`models.description.model_spec`).
    `routing`: a MoE model's measured routing profile, which "auto" prices the experts by.
    `budgets`: the (gpu, cpu) bytes the planner may fill, when part of each tier is kept for
    something it does not plan (the augmented face's pools); the executor still runs within
    the whole budgets. `in_place`: the checkpoint's blocks the executor keeps as they are
    (`PlanTarget.in_place`), which the dry run charges as the executor stores them.

    Raises:
        ValueError: a policy file that is not one; budgets not filled in; no hardware for "auto".
        placement.InfeasiblePlanError: no placement runs within the budgets.
    """
    if not settings.offloaded:
        return RunPlan(settings=settings, model=model, dtype=dtype, workload=workload, policy=None, predicted=None,
                       max_batch_size=settings.max_batch_size, micro_batch=None, planner_budgets=None)
    if settings.gpu_mem is None or settings.cpu_mem is None:
        raise ValueError("an offloaded run is planned within both tier budgets: fill them in first "
                         "(RunSettings.with_budgets)")
    machine = dict(hardware=hardware, disk_bytes=disk_bytes)
    target = PlanTarget(config=config, model=model, dtype=dtype, weight_quant=settings.weight_quant,
                        routing=routing, in_place=in_place)
    policy, predicted = _placement(settings, target, workload, machine, budgets)
    if settings.compress_weight is not None or settings.compress_cache is not None:
        policy = dataclasses.replace(
            policy, compress_weight=_given(settings.compress_weight, policy.compress_weight),
            compress_cache=_given(settings.compress_cache, policy.compress_cache))
    return RunPlan(settings=settings, model=model, dtype=dtype, workload=workload, policy=policy, predicted=predicted,
                   max_batch_size=policy.gpu_batch_size * policy.num_gpu_batches, micro_batch=policy.gpu_batch_size,
                   planner_budgets=budgets)


def plan_augmented(settings: RunSettings, augmented: AugmentedSettings, config: ModelConfig,
                   model: placement.ModelSpec, dtype: torch.dtype, *, hardware: placement.HardwareSpec | None = None,
                   disk_bytes: int | None = None, routing=None, in_place: dict | None = None) -> RunPlan:
    """The plan of an augmented run: offloaded, the planner places the weights for one sequence
    (the KV cache lives in the paged pools, not where it would put it) within budgets that keep
    room for the pools, which the built executor then measures (`build.with_measured_pools`);
    in memory, the pools as given, else room for `DEFAULT_POOL_CONTEXTS` full contexts each.

    Raises:
        ValueError: `max_context` beyond the model's context, and as `plan_run`.
        UnsupportedModelError: a model whose cache the paged pool does not hold (`families.support`).
    """
    check_paged(config.model_type)
    if augmented.max_context > config.max_position:
        raise ValueError(f"max_context {augmented.max_context} exceeds the model's context ({config.max_position}); "
                         "lower --max-context")
    prompt, gen = agents_workload(augmented.max_context, augmented.max_num_seqs, augmented.max_num_batched_tokens)
    workload = Workload(prompt_len=prompt, gen_len=gen, num_sequences=1)
    per_token = config.kv_bytes_per_token(dtype.itemsize)
    # a hybrid model's request also holds its DeltaNet state, in blocks of the same pools
    state = paged_state_blocks(config, augmented.block_size, dtype) * augmented.block_size * per_token
    budgets = None
    if settings.offloaded and settings.gpu_mem is not None and settings.cpu_mem is not None:
        budgets = planner_budgets(settings.gpu_mem, settings.cpu_mem, per_token, augmented.max_num_seqs,
                                  augmented.max_context, state_bytes=state)
    plan = plan_run(settings, config, model, dtype, workload, hardware=hardware, disk_bytes=disk_bytes,
                    routing=routing, budgets=budgets, in_place=in_place)
    pools = None
    if not plan.offloaded:
        contexts = DEFAULT_POOL_CONTEXTS
        gpu = _given(augmented.gpu_kv_mem,
                     contexts * ((augmented.max_context + augmented.block_size) * per_token + state))
        cpu = _given(augmented.cpu_swap_mem, contexts * (augmented.max_context * per_token + state))
        pools = agents_config(augmented, gpu, cpu)
    return dataclasses.replace(plan, augmented=augmented, pools=pools)


def agents_config(augmented: AugmentedSettings, gpu_kv_bytes: int, cpu_swap_bytes: int) -> AgentsConfig:
    """The augmented face's pools and scheduler shape, as its engine takes them."""
    return AgentsConfig(gpu_kv_bytes=gpu_kv_bytes, cpu_swap_bytes=cpu_swap_bytes if augmented.swap else 0,
                        block_size=augmented.block_size, max_num_seqs=augmented.max_num_seqs,
                        max_num_batched_tokens=augmented.max_num_batched_tokens,
                        noise_sigma=augmented.noise_sigma, seed=augmented.seed)


def _placement(settings: RunSettings, target: PlanTarget, workload: Workload, machine: dict,
               budgets) -> tuple[placement.Policy, placement.Plan | None]:
    """The placement policy the settings name, and the planner's answer when it chose it (`machine`:
    plan_run's hardware and disk_bytes)."""
    policy = settings.policy
    if isinstance(policy, str) and policy == "auto":
        if machine["hardware"] is None:
            raise ValueError("policy 'auto' is planned with this machine's profile: pass hardware "
                             "(flexlamps.run_plan.build.machine_inputs)")
        gpu_mem, cpu_mem = budgets or (settings.gpu_mem, settings.cpu_mem)
        compression = Compression(allow=bool(settings.compress_weight or settings.compress_cache),
                                  weight=settings.compress_weight, cache=settings.compress_cache)
        lengths = BlockLengths(prompt_len=workload.prompt_len, gen_len=workload.gen_len,
                               prefix_len=workload.prefix_len if settings.reuse_prefix else 0,
                               logits_per_row=workload.logits_per_row)
        predicted = plan_policy(target, machine["hardware"], lengths, gpu_mem=gpu_mem, cpu_mem=cpu_mem,
                                disk_bytes=machine["disk_bytes"], max_block_size=max(1, workload.num_sequences),
                                compression=compression)
        return predicted.policy, predicted
    if isinstance(policy, (str, Path)):
        return load_policy(policy), None
    if policy is None:  # everything on the gpu tier, one micro-batch of max_batch_size
        gpu = placement.TierSplit(gpu=1, cpu=0, disk=0)
        return placement.Policy(gpu_batch_size=settings.max_batch_size, num_gpu_batches=1, weights=gpu, cache=gpu,
                                activations=gpu), None
    return policy, None


def _given(value, default):
    return default if value is None else value

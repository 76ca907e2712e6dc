"""What a run plan needs from this machine, and the executor built from a plan.

`machine_inputs` reads what the pure planning step (`plan.plan_run`) takes as arguments: the
machine's profile (cached, or measured once) and the disk tier's free space. `build_executor`
loads the weights into the executor the plan says; `with_measured_pools` sizes the augmented
face's pools from what an offload executor's budgets leave once its weights are placed.
"""

from __future__ import annotations

import dataclasses
import functools
import shutil
import tempfile
from pathlib import Path

import torch

from flexlamps.cache_folder import default_offload_dir
from flexlamps.engine.augmented.pools import pool_sizes
from flexlamps.engine.executors.contract import Executor
from flexlamps.engine.executors.in_memory import InMemoryExecutor
from flexlamps.engine.executors.offloaded import OffloadExecutor
from flexlamps.engine.executors.weight_store import in_place_coded
from flexlamps.engine.routing_profile import cached_routing
from flexlamps.hardware import cache as hardware_cache
from flexlamps.models.blocks import linear
from flexlamps.models.loading import weight_cache
from flexlamps.models.loading.in_place import CodedMatrix
from flexlamps.models.loading.weight_cache import load_weights
from flexlamps.models.weight_specs import weight_specs
from flexlamps.run_plan.plan import RunPlan, agents_config
from flexlamps.settings import RunSettings
from offload import compute_device
import placement

# The in-memory executor keeps a dense copy of its 4-bit and Q8_0 weights (prefill and batches from
# 16 rows, 3 for Q8_0, run a dense GEMM instead of dequantizing per call) when the copies take at
# most this share of the memory available now; otherwise the quantized weights alone (same results,
# slower prefill). Weights whose both phases run on their codes (our decode kernel and int8 GEMM, in
# their dtype) get none: no full-model copy exists.
DENSE_TWINS_MAX_SHARE = 0.25


def machine_inputs(settings: RunSettings, spec: placement.ModelSpec, reader, on_profile=None) -> dict:
    """What `plan.plan_run` takes from this machine when the settings plan with it (policy "auto"
    offloaded), else {}: `hardware`, the profile (the cached one, or measured now on the model's
    own matrices, `on_profile(path, why)` told first); `disk_bytes`, the disk tier's free space;
    `routing`, a MoE model's routing profile cached by `flexlamps profile --prompts` (or None);
    `in_place`, the checkpoint's blocks the executor keeps as they are (`in_place_coded`)."""
    if not (settings.offloaded and isinstance(settings.policy, str) and settings.policy == "auto"):
        return {}

    scratch = Path(settings.offload_dir) if settings.offload_dir else Path(tempfile.gettempdir()) / "flexlamps-profile"
    hardware = hardware_cache.machine_profile(scratch, on_profile, model_shapes=spec.layer_matrix_shapes(),
                                              expert_dims=spec.routed_expert_dims())
    return dict(hardware=hardware, disk_bytes=free_disk_bytes(settings.offload_dir), routing=cached_routing(reader),
                in_place=in_place_coded(reader, settings.resolve_dtype(reader))[1])


def free_disk_bytes(offload_dir) -> int:
    """The disk tier the planner may use: free space where the offload executor will write, the
    folder given or, as the executor does without one, the default under the cache folder."""
    folder = Path(offload_dir) if offload_dir else default_offload_dir()
    folder.mkdir(parents=True, exist_ok=True)
    return shutil.disk_usage(folder).free


def build_executor(plan: RunPlan, reader) -> Executor:
    """The executor `plan` says, with `reader`'s weights loaded: the offload executor within the
    plan's budgets and policy, else the in-memory one on the settings' device (the GPU when there
    is one)."""
    settings = plan.settings
    if plan.offloaded:
        return OffloadExecutor(reader, plan.policy, gpu_mem=settings.gpu_mem, cpu_mem=settings.cpu_mem,
                               offload_dir=settings.offload_dir, dtype=plan.dtype, weight_quant=settings.weight_quant,
                               model_spec=plan.model)

    device = torch.device(settings.device) if settings.device else compute_device()
    cache_dir = settings.cache_dir
    weights = load_weights(reader, plan.dtype, int4_in_place=True, cache_dir=cache_dir or None,
                           use_cache=cache_dir is not False)  # the executor moves them to `device`
    twins = device.type == "cpu" and _dense_twins_fit(weights)
    return InMemoryExecutor(reader.config, weights, plan.dtype, device, dense_twins=twins,
                            dense_copies=_cached_dense_copies(reader, plan.dtype, cache_dir) if twins else None)


def with_measured_pools(plan: RunPlan, executor: Executor):
    """(`plan` with the augmented face's pools, their `PoolSizes`): sized from what the offload
    executor's budgets leave once its weights are placed (`engine.augmented.pools.pool_sizes`).

    Raises:
        ValueError: the gpu budget leaves no room for one request of `max_context` tokens.
    """
    aug = plan.augmented
    if aug is None or not plan.offloaded:
        raise ValueError("pools are measured on the offload executor of a plan made by plan_augmented")
    sizes = pool_sizes(executor, max_context=aug.max_context, max_num_seqs=aug.max_num_seqs,
                       max_num_batched_tokens=aug.max_num_batched_tokens, block_size=aug.block_size, swap=aug.swap)
    return dataclasses.replace(plan, pools=agents_config(aug, sizes.gpu_kv_bytes, sizes.cpu_swap_bytes)), sizes


def _twinned(w) -> bool:
    """Whether the in-memory executor keeps a dense twin beside `w` (where `_dense_twins_fit`)."""
    return linear.can_have_dense_twin(w) and not linear.codes_serve_both_phases(w)


def _dense_twins_fit(weights: dict) -> bool:
    import psutil

    dense_bytes = sum(w.shape[0] * w.shape[1] * w.dtype.itemsize for w in weights.values() if _twinned(w))
    return 0 < dense_bytes <= DENSE_TWINS_MAX_SHARE * psutil.virtual_memory().available


def in_memory_weight_bytes(reader, dtype: torch.dtype) -> int:
    """Bytes the in-memory executor on this CPU holds for `reader`'s weights in `dtype`: a checkpoint's
    blocks kept as codes as described (`in_place_coded`, `held_bytes`), nothing of them built; the
    others dense."""
    specs, coded = in_place_coded(reader, dtype)
    held = sum(s.numel * dtype.itemsize for s in weight_specs(reader.config) if s.name not in specs)
    return held + sum(held_bytes(w) for w in coded.values())


def held_bytes(coded: CodedMatrix) -> int:
    """Bytes the in-memory executor holds for a matrix kept as codes: the form's
    (`gguf_codes.coded_nbytes`), with the dense twin (and int8 copy) `Int4Twin` adds where
    `_twinned`, as if they fit. The twin rule reads only the form, so it is asked of one tile of it
    (`CodedMatrix.form_tile`); the twin's copies grow with the rows, so its bytes are the tile's
    scaled (building each matrix to ask took a 1B 10.8 s of CPU before its run)."""
    tile = coded.form_tile()
    if not _twinned(tile):
        return coded.nbytes
    copies = linear.with_dense_twin(tile, plain=lambda: None).nbytes - tile.nbytes  # sized, never read
    return coded.nbytes + copies * coded.shape[0] // tile.shape[0]


def _cached_dense_copies(reader, dtype: torch.dtype, cache_dir):
    """The weight cache's dense copies of the 4-bit matrices (see weight_cache.dense_copies), or
    None when the cache is off or the checkpoint is not one file."""
    if cache_dir is False or not Path(reader.path).is_file():
        return None
    entry = weight_cache.entry_path(reader, dtype, True, cache_dir or None)
    return functools.partial(weight_cache.dense_copies, weight_cache.dense_path(entry))

"""The plain in-memory executor: all weights resident on one device, one forward step at a time.

It is the reference every other executor (offloaded, compressed) must reproduce exactly, and
implements the executor contract (see executors.contract) with no tier budgets: its caches
and weights are charged nowhere, and `tier_use` reports the weights on the compute device.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from flexlamps.engine.caches.dense import DenseKVCache
from flexlamps.engine.caches.hybrid import HybridCache, kv_view
from flexlamps.engine.caches.latent import DenseLatentCache
from flexlamps.engine.caches.paged import PagedKVCache
from flexlamps.engine.caches.paged_state import HybridPagedCache
from flexlamps.engine.caches.state import StateCache
from flexlamps.engine.executors.contract import TierUse
from flexlamps.engine.executors.step import Step
from flexlamps.models.blocks.linear import (as_logits_head, can_have_dense_twin, codes_serve_both_phases, pack,
                                            with_dense_twin)
from flexlamps.models.blocks.native_decode import NativeDecode
from flexlamps.models.loading.mapped_pages import release_mapped
from flexlamps.models.config import ModelConfig
from flexlamps.models.forward import forward_for
from flexlamps.models.weight_specs import weight_specs


_ONE_THREAD_LOGITS = 1 << 21  # values up to which `float_logits` converts on the calling thread (~1 ms)


def float_logits(logits: torch.Tensor) -> torch.Tensor:
    """`logits.float().cpu()`, a 16-bit CPU tensor of a step's rows converted on this thread (numpy;
    the same values: the conversion is exact). torch's conversion of a 128k vocabulary's row (above
    its 32768-element grain) wakes its OpenMP team, whose second thread then waits for a core behind
    our kernels' pool worker: 1-15 ms against numpy's 0.13 at 2 threads on a 2-core box (under
    load). Larger ones (a scored prompt's every position) stay torch's, split over its threads."""
    if (logits.device.type != "cpu" or logits.dtype not in (torch.bfloat16, torch.float16)
            or logits.numel() > _ONE_THREAD_LOGITS):
        return logits.float().cpu()
    if logits.dtype == torch.float16:
        return torch.from_numpy(logits.numpy().astype(np.float32))
    bits = logits.view(torch.int16).numpy().astype(np.int32)
    bits <<= 16  # bf16: an fp32's upper half
    return torch.from_numpy(bits.view(np.float32))


def split_weights(cfg: ModelConfig, weights: dict[str, torch.Tensor]):
    """(global weights, per-layer dicts keyed by local name)."""
    glob, layers = {}, [dict() for _ in range(cfg.num_layers)]
    for spec in weight_specs(cfg):
        if spec.layer is None:
            glob[spec.name] = weights[spec.name]
        else:
            layers[spec.layer][spec.local_name] = weights[spec.name]
    if "lm_head" in weights:  # also a tied model's quantized head, kept as blocks beside its table (`read_all`)
        glob["lm_head"] = weights["lm_head"]
    return glob, layers


def _needs_twin(w) -> bool:
    """Whether `w` gets a dense twin: a coded weight some phase does not multiply on its codes (one
    matrix off our kernels twins alone, not the model beside it)."""
    return can_have_dense_twin(w) and not codes_serve_both_phases(w)


def _with_dense_twins(layers: list[dict], dense_copies) -> list[dict]:
    """The layers' coded weights that need one (`_needs_twin`) as `Int4Twin`s, given their dense
    copies when `dense_copies` has them."""
    int4 = {f"{i}.{name}": t for i, w in enumerate(layers) for name, t in w.items() if _needs_twin(t)}
    plain = dense_copies(int4) if dense_copies is not None and int4 else {}
    return [{name: with_dense_twin(t, plain.get(f"{i}.{name}")) if f"{i}.{name}" in int4 else t
             for name, t in w.items()} for i, w in enumerate(layers)]


def _fused(fwd, weights: dict) -> dict:
    """A layer's weights with its projections stacked (`fuse_weights`); the parts' pages of a
    mapped weight cache given back, so the copy does not count them twice (`release_mapped`)."""
    fused = fwd.fuse_weights(weights)
    release_mapped([w for name, w in weights.items() if name not in fused])
    return fused


class InMemoryExecutor:
    def __init__(self, cfg: ModelConfig, weights: dict[str, torch.Tensor], dtype: torch.dtype,
                 device: torch.device | str = "cpu", dense_twins: bool = False,
                 dense_copies: Callable[[dict], dict[str, torch.Tensor]] | None = None):
        """`dense_twins`: keep a dense copy of every 4-bit weight beside it, prepacked on first use
        (`models.linear.Int4Twin`): same results, prefill and large batches skip the per-call
        dequantization. `dense_copies`: gives the dequantized matrices of {key: Int4Weight} (e.g.
        mapped from the weight cache; keys "<layer>.<name>"); without it each twin dequantizes its own."""
        self.cfg = cfg
        self.dtype = dtype
        self.device = torch.device(device)
        self.fwd = forward_for(cfg)
        if self.device.type != "cpu":  # all resident on the compute device, whatever device they were read to
            weights = {name: t.to(self.device) for name, t in weights.items()}
        self.global_weights, layers = split_weights(cfg, weights)
        self._weight_bytes = sum(t.nbytes for t in weights.values())  # tensors and packed 4-bit weights alike
        # Resident weights are prepacked once for the GEMM; outputs are bit-identical to the
        # unpacked weights the offloaded executor streams in (see models.linear).
        self.layer_weights = [{name: pack(t) for name, t in w.items()} for w in layers]  # norms stay as they are
        if hasattr(self.fwd, "fuse_weights"):  # 4-bit projections stacked into fewer kernel calls
            self.layer_weights = [_fused(self.fwd, w) for w in self.layer_weights]
        if dense_twins:
            self.layer_weights = _with_dense_twins(self.layer_weights, dense_copies)
            self._weight_bytes = sum(t.nbytes for t in self.global_weights.values()) + sum(
                t.nbytes for w in self.layer_weights for t in w.values())
        # the output head too (a packed copy of a tied embedding table: the lookup reads it dense);
        # unpacked, oneDNN reorders the whole vocab x hidden matrix on every decode step
        head = as_logits_head(self.global_weights.get("lm_head", self.global_weights["embed_tokens"]))
        if dense_twins and _needs_twin(head):  # a Q8_0 head; a tied one's dense copy is the table
            head = with_dense_twin(head, self.global_weights["embed_tokens"] if cfg.tie_word_embeddings else None)
        self.global_weights["lm_head"] = pack(head)
        # a step's layers in one native call where every layer runs on our kernels (same bits); None:
        # the Python forward (set it to None to run that, as scripts/profile_step.py --python-layers does)
        cpu = self.device.type == "cpu"
        self.native_layers = NativeDecode.build(self.fwd, self.layer_weights, dtype) if cpu else None

    def new_cache(self, num_slots: int, capacity: int):
        if self.cfg.hybrid is not None:  # KV for the full-attention layers, a state for the DeltaNet ones

            hy = self.cfg.hybrid
            kv = DenseKVCache(kv_view(self.cfg), num_slots, capacity, self.dtype, self.device)
            return HybridCache(self.cfg, kv, StateCache(hy, num_slots, self.dtype, ["gpu"] * len(hy.linear_layers),
                                                        self.device))
        if self.cfg.mla is not None:
            return DenseLatentCache(self.cfg, num_slots, capacity, self.dtype, self.device)
        return DenseKVCache(self.cfg, num_slots, capacity, self.dtype, self.device)

    def new_paged_cache(self, num_gpu_blocks: int, num_cpu_blocks: int, block_size: int) -> PagedKVCache:
        if self.cfg.hybrid is not None:  # KV blocks and each request's DeltaNet state in one pool

            return HybridPagedCache(self.cfg, num_gpu_blocks, num_cpu_blocks, block_size, self.dtype, self.device)
        return PagedKVCache(self.cfg, num_gpu_blocks, num_cpu_blocks, block_size, self.dtype, self.device)

    def tier_use(self) -> dict[str, TierUse]:
        return {"gpu": TierUse(self._weight_bytes, self._weight_bytes, None)}

    def planned_sweep_gpu_bytes(self, step_shapes) -> int:
        return 0  # every weight resident: a sweep stages nothing

    def reset_peaks(self) -> None:
        """Nothing to reset: the weights are all this executor counts."""

    def close(self) -> None:
        """Nothing to stop: no worker threads, no files."""

    def forward_steps(self, cache, steps: list[Step]) -> list[torch.Tensor]:
        """Run several micro-batches; one forward each."""
        return [self._forward(cache, s) for s in steps]

    @torch.inference_mode()
    def _forward(self, cache, step: Step) -> torch.Tensor:
        """Run one step: `input_ids` (n, T) at `positions` (n, T) in cache rows `slots` (n,).

        Returns fp32 logits on the CPU: for every position (n, T, V), or only at `logit_rows`
        (n,), the index along T whose logits are wanted for each row (the last real token).
        """
        fwd, dev = self.fwd, self.device
        input_ids, positions, slots = step.input_ids.to(dev), step.positions.to(dev), step.slots.to(dev)
        ctx = fwd.step_context(positions, self.dtype)
        x = fwd.embed(self.global_weights, input_ids, positions)
        writes = step.write_positions.to(dev)  # where keys go: the positions, or a packed row's places
        mask = {k: v.to(dev) for k, v in step.mask_kwargs.items()}  # a packed step's segments
        # masks and spans once per step, not per layer (caches that offer it)
        if hasattr(cache, "step_geometry"):
            lengths = {} if step.lengths is None else {"lengths": step.lengths}
            geo = {"geometry": cache.step_geometry(slots, writes, **mask, **lengths)}
        else:
            geo = mask
        native = self._native_layers(x, cache, step, geo.get("geometry"), ctx)
        if native is not None:
            x = native
        else:
            for i, w in enumerate(self.layer_weights):
                x = fwd.layer(w, x, ctx, cache.attend_fn(i, slots, writes, **geo), i)
        return float_logits(fwd.head(self.global_weights, step.pick_logit_rows(x)))

    def _native_layers(self, x, cache, step: Step, geometry, ctx) -> torch.Tensor | None:
        """x after every layer on the native loop (`NativeDecode`), or None where it does not take the
        step: a dense cache of whole rows, keys written at the positions."""
        if (self.native_layers is None or type(cache) is not DenseKVCache or step.cache_positions is not None
                or any(ring is not None for ring in cache.rings)):
            return None
        return self.native_layers.run(x, cache.k, cache.v, geometry, ctx, step.logit_rows)

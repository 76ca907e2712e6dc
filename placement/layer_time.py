"""Pieces of a layer's time both phases use: the weights a sweep streams, the memory-bound passes, and the
four transfers and compute as per-layer seconds."""

import numpy as np

from placement.affine import Affine, C_DISK, H_DISK, NUM_FRACTIONS, W_DISK
from placement.layer_sizes import LayerSizes
from placement.model_spec import LINEAR_CHUNK, ModelSpec
from placement.specs import HardwareSpec


def streamed_weights(sz: LayerSizes, model: ModelSpec, num_tokens: float, experts: float) -> float:
    """Bytes of a layer (off the gpu tier) that a sweep over `num_tokens` tokens reads: all but
    the input embedding rows its tokens do not look up and the routed experts, and of those the
    expected share its tokens pick (`ModelSpec.expected_experts`:
    from the measured routing profile, else uniform; the engine fetches an expert once its router
    picked it). Priced for every off-gpu expert alike: with the hottest experts placed on the gpu
    tier the ones off it are picked less often, so this is the chord of a convex curve, an upper
    bound exact with all experts on one tier. `experts`: how many of them it reads
    (`expert_groups.experts_read`: streamed over several calls, some more than once)."""
    unread_rows = unread_input_rows(model, num_tokens)
    if not model.num_experts:
        return sz.weight_stored - unread_rows
    return sz.weight_stored - unread_rows - sz.experts_stored * (1 - experts / model.num_experts)


def unread_input_rows(model: ModelSpec, num_tokens: float) -> float:
    """The average layer's share of an untied input embedding table that a sweep over `num_tokens`
    tokens leaves unread: the engine looks up its tokens' rows only (a tied table is read whole,
    as the head). What `sz.weight_stored` counts of it beside those rows."""
    if model.tie_word_embeddings:
        return 0.0
    table = model.vocab_size * model.hidden_size * model.dtype_bytes
    return table * (1 - min(1.0, num_tokens / model.vocab_size)) / model.num_layers


def elementwise_s(num_tokens: float, model: ModelSpec, hardware: HardwareSpec) -> float:
    """Seconds of one layer's memory-bound passes (norms, rotary, activation) over `num_tokens`."""
    elements = num_tokens * model.elementwise_elements_per_token_per_layer()
    return elements * model.dtype_bytes / hardware.gpu_mem_bytes_per_s


def delta_rule_s(num_tokens: float, model: ModelSpec, hardware: HardwareSpec, *, decode: bool) -> float:
    """Seconds of one (average) layer's gated delta rule over `num_tokens` (0 without DeltaNet
    layers): its products at the rule's rate, the passes around it at the memory's."""
    flops = num_tokens * model.delta_rule_flops_per_token_per_layer(decode)
    if not flops:
        return 0.0
    passes = num_tokens * model.delta_rule_passes_per_token_per_layer(decode) * 4 / hardware.gpu_mem_bytes_per_s
    return hardware.delta_rule_seconds("decode" if decode else "prompt", flops, LINEAR_CHUNK) + passes


def layer_seconds(ctog: Affine, gtoc: Affine, dtoc: Affine, ctod: Affine, comp: Affine,
                   hardware: HardwareSpec) -> dict[str, Affine]:
    """Per-layer terms in seconds: the four transfers' bytes over their bandwidths, and compute
    (which the tier copies join when the gpu is the host CPU: `HardwareSpec.gpu_is_host`).
    A decode layer's "routed" term is added by its caller (`cost_experts.routed_reads_s`)."""
    ctog_s = ctog.scaled(1 / hardware.cpu_to_gpu_bytes_per_s)
    gtoc_s = gtoc.scaled(1 / hardware.gpu_to_cpu_bytes_per_s)
    if hardware.gpu_is_host:
        # one memory: what the cpu tier holds is used where it is (charged, never copied); a
        # disk read's copy out of the page cache (and a write's into it) runs on the cores that
        # compute, so it joins compute and no link time is left
        comp.plus(_disk_part(ctog_s)).plus(_disk_part(gtoc_s))
        ctog_s, gtoc_s = Affine(), Affine()
    return {
        "ctog": ctog_s,
        "gtoc": gtoc_s,
        "dtoc": dtoc.scaled(1 / hardware.disk_read_bytes_per_s),
        "ctod": ctod.scaled(1 / hardware.disk_write_bytes_per_s),
        "comp": comp,
    }


def _disk_part(term: Affine) -> Affine:
    """The part of a tier copy that comes from or goes to disk (its disk fractions' terms)."""
    coef = np.zeros(NUM_FRACTIONS)
    for idx in (W_DISK, C_DISK, H_DISK):
        coef[idx] = term.coef[idx]
    return Affine(0.0, coef)

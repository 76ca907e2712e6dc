"""The prompt (prefill) phase's per-layer terms: transfers and compute of one block's prompt sweep."""

from placement.affine import Affine, C_CPU, C_DISK, H_CPU, H_DISK, W_CPU, W_DISK, W_GPU
from placement.cost_experts import cpu_experts_in_place, dequantized_tokens, routed_rows_delta_s
from placement.expert_groups import experts_read
from placement.layer_time import delta_rule_s, elementwise_s, layer_seconds, streamed_weights
from placement.specs import WorkloadSpec
from placement.weight_calls import (call_gemm_s, dequant_s, fp8_upcast_s, resident_delta_s, runs_fused_int4,
                                     weight_dequant_passes, weight_dequant_rate)


def _prefill_tokens(block: int, workload: WorkloadSpec) -> int:
    # a shared prefix is computed (and cached) once per block, not once per sequence
    return block * (workload.prompt_len - workload.shared_prefix_len) + workload.shared_prefix_len


def prompt_terms(choice, sz, model, hardware, workload) -> dict[str, Affine]:
    block = choice.gpu_batch_size * choice.num_gpu_batches
    s, p = workload.prompt_len, workload.shared_prefix_len
    num_tokens = _prefill_tokens(block, workload)
    hidden = block * s * sz.hidden
    new_cache = num_tokens * sz.cache_stored

    ngb = choice.num_gpu_batches
    rows = choice.gpu_batch_size * max(s - p, 1)  # a micro-batch's GEMM rows (the prefix once more)
    streamed = streamed_weights(sz, model, num_tokens, experts_read(model, choice.expert_group, ngb, rows, num_tokens))
    ctog = Affine().add(streamed, W_CPU, W_DISK).add(hidden, H_CPU, H_DISK)
    gtoc = Affine().add(new_cache, C_CPU, C_DISK).add(hidden, H_CPU, H_DISK)
    dtoc = Affine().add(streamed, W_DISK).add(hidden, H_DISK)
    ctod = Affine().add(new_cache, C_DISK).add(hidden, H_DISK)

    # causal attention: the suffix queries see on average (s + p) / 2 tokens, the prefix p / 2
    attn_flops = (block * (s - p) * model.attention_flops_per_query((s + p) / 2)
                  + p * model.attention_flops_per_query(p / 2))
    gemm_flops = num_tokens * model.matmul_flops_per_token_per_layer()
    head_flops = block * model.head_flops_per_token() / model.num_layers  # last position only
    # each micro-batch runs its GEMMs on gbs * (s - p) rows (the prefix once, as one more call)
    embed_share = sz.weight_fp16 - model.weight_bytes_per_layer()
    comp_s = ngb * call_gemm_s(choice, model, hardware, rows, gemm_flops / ngb, head_flops / ngb,
                                sz.weight_fp16, embed_share)
    comp_s += ngb * routed_rows_delta_s(choice, model, hardware, rows, "prompt")
    resident_s = resident_delta_s(choice, model, hardware, rows, gemm_flops / ngb, sz.weight_fp16, ngb)
    comp_s += hardware.attention_seconds("prompt", model.dtype, attn_flops, calls=ngb)
    comp_s += delta_rule_s(num_tokens, model, hardware, decode=False)
    comp_s += elementwise_s(num_tokens, model, hardware)
    if choice.compress_weight and not runs_fused_int4(choice, model, hardware, rows):
        # the layer's matrices (embeddings stay dense): once a sweep for all its micro-batches,
        # or once a call where the engine dequantizes per call (`weight_dequant_passes`)
        passes = weight_dequant_passes(choice, ngb, rows)
        touched = dequantized_tokens(choice, model, hardware, "prompt", num_tokens)  # experts priced whole: 0
        dense_bytes = model.expanded_bytes_per_layer(None if touched else 0)
        comp_s += passes * dequant_s(dense_bytes, model, weight_dequant_rate(choice, hardware))
        comp_s += passes * model.matrices_per_layer(touched) * hardware.gpu_dequant_matrix_s
    if choice.compress_cache:  # quantizing the new cache costs about as much as dequantizing
        comp_s += dequant_s(num_tokens * sz.cache_fp16, model, hardware.gpu_dequant_bytes_per_s)
    comp_s += choice.num_gpu_batches * hardware.gpu_layer_overhead_s
    comp_s += ngb * fp8_upcast_s(choice, model, hardware, model.weight_bytes_per_layer())
    comp = Affine(comp_s).add(resident_s, W_GPU)
    cpu_experts_in_place(choice, sz, model, hardware, (ngb, rows), num_tokens, ctog, comp)

    return layer_seconds(ctog, gtoc, dtoc, ctod, comp, hardware)

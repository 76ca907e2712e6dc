"""Tiny random checkpoints of any family transformers knows, built with its own config classes
(`AutoConfig.for_model`), and the runs the parity tests compare: transformers' greedy decode with
its cache, and ours teacher-forced on its tokens through any executor (in memory or offloaded).

Shared by the dense and the MoE family tests: `make_family_model(folder, spec)` takes any config
fields (model_type included); `family_spec(kind, width)` gives the dense kinds below at a width.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.random_checkpoints import save_random_checkpoint

PROMPT_LEN, DECODE_STEPS = 12, 16  # greedy tokens compared: DECODE_STEPS, past every window below
LOGIT_TOLERANCE = 1e-4

# shapes: head_dim = hidden / heads in both, so classes without a head_dim field agree with it
WIDTHS = {
    "narrow": dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=16),
    "wide": dict(hidden_size=96, intermediate_size=160, num_attention_heads=6, num_key_value_heads=3, head_dim=16),
}
_LONGROPE = {"rope_type": "longrope", "short_factor": [1.0, 1.5, 2.0, 3.0], "long_factor": [2.0, 3.0, 5.0, 9.0],
             "original_max_position_embeddings": 16, "rope_theta": 10000.0, "partial_rotary_factor": 0.5}

# every option each family's tiny checkpoint turns on (windows of 5-6 keys, so 28 tokens cross them)
FAMILY_CONFIGS = {
    "llama_bias": dict(model_type="llama", num_hidden_layers=2, attention_bias=True, mlp_bias=True,
                       rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                                        "rope_theta": 10000.0}),
    "mistral_window": dict(model_type="mistral", num_hidden_layers=2, sliding_window=5),
    "qwen2_window": dict(model_type="qwen2", num_hidden_layers=3, use_sliding_window=True, sliding_window=5,
                         max_window_layers=1),
    "qwen3": dict(model_type="qwen3", num_hidden_layers=2, attention_bias=True,
                  rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1000.0}),
    "gemma2": dict(model_type="gemma2", num_hidden_layers=3, sliding_window=6, query_pre_attn_scalar=24,
                   attn_logit_softcapping=3.0, final_logit_softcapping=4.0),
    "gemma3_text": dict(model_type="gemma3_text", num_hidden_layers=3, sliding_window=5, query_pre_attn_scalar=24,
                        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5000.0},
                                         "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}}),
    "phi3": dict(model_type="phi3", num_hidden_layers=2, sliding_window=7, max_position_embeddings=64,
                 rope_parameters=_LONGROPE),
    "smollm3": dict(model_type="smollm3", num_hidden_layers=3, no_rope_layer_interval=2, attention_bias=True),
    "granite": dict(model_type="granite", num_hidden_layers=2, embedding_multiplier=3.0, attention_multiplier=0.2,
                    residual_multiplier=0.5, logits_scaling=2.5),
    "ernie4_5": dict(model_type="ernie4_5", num_hidden_layers=2, use_bias=True,
                     rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1000.0}),
}


def family_spec(kind: str, width: str = "narrow") -> dict:
    """FAMILY_CONFIGS[kind] at a width (WIDTHS)."""
    return {**WIDTHS[width], **FAMILY_CONFIGS[kind]}


def make_family_model(folder: Path, spec: dict, seed: int = 0, tied: bool = False,
                      init_std: float = 0.2) -> Path:
    """Save a random float32 model of config fields `spec` (a vocab_size among them: wider than
    the tokenizer's) with a tiny tokenizer into `folder`: every parameter drawn from
    N(0, init_std) (transformers' init is too small for logits to differ), the head tied to the
    embedding or not."""
    import transformers

    fields = dict(spec)
    model_type = fields.pop("model_type")
    return save_random_checkpoint(folder, lambda ids: transformers.AutoConfig.for_model(
        model_type, **{"max_position_embeddings": 128, **ids, "pad_token_id": None, "tie_word_embeddings": tied,
                       **fields}), seed=seed, init_std=init_std)


def hf_config(folder: Path) -> dict:
    return json.loads((Path(folder) / "config.json").read_text())


def prompt_ids(vocab_size: int, rows: int = 2, seed: int = 1):
    import torch

    return torch.randint(2, vocab_size, (rows, PROMPT_LEN), generator=torch.Generator().manual_seed(seed))


def reference_run(folder: Path, ids, steps: int = DECODE_STEPS):
    """transformers' logits for the prompt and `steps` greedy steps (its cache), and its tokens."""
    import torch
    import transformers

    ref = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    logits, tokens = [], []
    with torch.no_grad():
        out = ref(ids, use_cache=True)
        logits.append(out.logits)
        for _ in range(steps):
            nxt = out.logits[:, -1:].argmax(-1)
            tokens.append(nxt)
            cache = {"cache": out.cache} if hasattr(out, "cache") else {"past_key_values": out.past_key_values}
            out = ref(nxt, use_cache=True, **cache)
            logits.append(out.logits)
    return logits, tokens


def our_run(executor, ids, tokens) -> list:
    """Our logits for the prompt, then one step per reference token (teacher-forced), in `executor`'s
    own cache: the same list shapes as `reference_run`'s logits."""
    import torch

    from flexlamps.engine.executors.step import Step

    n = ids.shape[0]
    cache = executor.new_cache(n, ids.shape[1] + len(tokens) + 1)
    slots = torch.arange(n)
    got = executor.forward_steps(cache, [Step(ids, torch.arange(ids.shape[1]).expand(n, -1), slots)])
    for i, tok in enumerate(tokens):
        got += executor.forward_steps(cache, [Step(tok, torch.full((n, 1), ids.shape[1] + i), slots)])
    if hasattr(cache, "release"):
        cache.release()
    return got


def worst_gap(ours: list, theirs: list) -> float:
    return max((a - b).abs().max().item() for a, b in zip(ours, theirs))


def greedy_tokens(logits: list):
    """The greedy token after each decode step's logits (the reference's tokens, when they agree)."""
    return [step[:, -1:].argmax(-1) for step in logits[:-1]]


def assert_offloaded_equals_in_memory(reader, policy, ids, tokens, folder: Path) -> None:
    """`policy` spreads the weights over gpu / cpu / disk, and its run gives the in-memory logits bit for bit."""
    import torch

    from flexlamps.engine.executors.in_memory import InMemoryExecutor
    from flexlamps.engine.executors.offloaded import OffloadExecutor
    from flexlamps.models.loading.checkpoint import read_all

    ex = OffloadExecutor(reader, policy, gpu_mem=2**30, cpu_mem=2**30, offload_dir=folder)
    try:
        assert {"gpu", "cpu", "disk"} <= set(ex.tiers.values())
        offloaded = our_run(ex, ids, tokens)
    finally:
        ex.close()
    in_memory = our_run(InMemoryExecutor(reader.config, read_all(reader, torch.float32), torch.float32), ids, tokens)
    assert all(torch.equal(a, b) for a, b in zip(offloaded, in_memory))

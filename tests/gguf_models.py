"""Tiny LLaMA GGUF files written for tests (by scripts/random_gguf.py, the one random-GGUF writer),
and the logits an engine gives on them."""

import importlib
import sys
from pathlib import Path

import torch

from flexlamps.engine.executors.in_memory import InMemoryExecutor
from flexlamps.engine.executors.step import Step

_SCRIPTS = str(Path(__file__).resolve().parent.parent / "scripts")
if _SCRIPTS not in sys.path:
    sys.path.insert(0, _SCRIPTS)
random_gguf = importlib.import_module("random_gguf")
random_k_blocks, add_made_up_vocabulary = random_gguf.random_k_blocks, random_gguf.add_made_up_vocabulary


def llama_gguf_writer(path: Path, *, hidden: int, ffn: int, layers: int, heads: int, kv_heads: int, vocab: int,
                      context: int = 128):
    """A `gguf.GGUFWriter` for a LLaMA of these sizes (`context`: its trained context, tokens) with its
    metadata and a made-up vocabulary written; the caller adds the tensors, then `finish_gguf`."""
    return random_gguf.gguf_writer(path, _llama(hidden, ffn, layers, heads, kv_heads, vocab, context))


def finish_gguf(w, path: Path) -> Path:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _llama(hidden: int, ffn: int, layers: int, heads: int, kv_heads: int, vocab: int, context: int):
    return random_gguf.Shape("llama", hidden, ffn, layers, heads, kv_heads, vocab, context=context)


def write_llama_gguf(path: Path, types, *, seed: int = 0, hidden: int, ffn: int, layers: int, heads: int,
                     kv_heads: int, vocab: int, context: int = 128) -> Path:
    """A LLaMA GGUF of random weights (scripts/random_gguf.py's writer, every tensor N(0, 0.05)),
    each matrix of the ggml type `types(name, layer)` names (its llama.cpp name without `blk.i.` and
    `.weight`, e.g. "attn_v", "token_embd"; layer None for the globals; None: f32); the embedding
    table is tied (no output.weight)."""
    def by_file_name(name: str) -> str | None:
        parts = name.split(".")
        return types(parts[2], int(parts[1])) if parts[0] == "blk" else types(parts[0], None)

    shape = _llama(hidden, ffn, layers, heads, kv_heads, vocab, context)
    return random_gguf.write_random_gguf(path, shape, seed, by_file_name, values=random_gguf.SMALL_NORMAL)


def prefill_and_decode_logits(weights, reader, dtype, *, steps: int, feed=None, **executor_kw):
    """Prefill logits (2 x 12 rows), then `steps` decode steps fed `feed` (default: their own
    greedy tokens): (prefill logits, step logits, greedy tokens of every step)."""
    ex = InMemoryExecutor(reader.config, weights, dtype, **executor_kw)
    ids = torch.randint(0, reader.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    cache = ex.new_cache(2, 12 + steps + 2)
    prefill = ex.forward_steps(cache, [Step(ids, torch.arange(12).expand(2, 12), torch.arange(2))])[0]
    outs, tokens = [], [prefill[:, -1].argmax(-1)]
    for i in range(steps):
        fed = tokens[-1] if feed is None else feed[i]
        out = ex.forward_steps(cache, [Step(fed[:, None], torch.full((2, 1), 12 + i), torch.arange(2))])[0]
        outs.append(out[:, -1])
        tokens.append(out[:, -1].argmax(-1))
    return prefill, torch.stack(outs), torch.stack(tokens)


def assert_as_good_as_a_bf16_copy(got, bf16_copy, ref) -> None:
    """`got` (from `prefill_and_decode_logits`, fed the reference's tokens) is within 10% of the
    largest reference logit and within twice a dense bf16 copy's own error, and its greedy picks
    agree with the reference at least as often as the copy's, less one."""
    for mine, copy, want in zip(got[:2], bf16_copy[:2], ref[:2]):
        err, copy_err = (mine - want).abs().max().item(), (copy - want).abs().max().item()
        assert err <= 0.1 * want.abs().max().item() and err <= 2 * copy_err, (err, copy_err)
    assert (got[2] == ref[2]).sum() >= (bf16_copy[2] == ref[2]).sum() - 1


def assert_int8_x_as_good_as_a_bf16_copy(got, bf16_copy, ref) -> None:
    """As `assert_as_good_as_a_bf16_copy` where our kernel rounds x to int8 a group of 32 in prompts
    and decode (a 4-bit model's every matrix): that rounding sets the logits' error, and one logit's
    (the largest of 1.5k) wanders with it: over kquant seeds 0-7 the Q4_K_M model's prefill reached
    0.45-4.35 times the copy's largest error with Q4_K's exact scales and 0.75-3.89 with them rounded
    to bf16 pairs (2x missed at 3 and 5 of 8). So the error's root mean square, within 3 times the
    copy's (at most 2.97 there, either form), besides the largest within 10% of the largest logit."""
    for mine, copy, want in zip(got[:2], bf16_copy[:2], ref[:2]):
        err, copy_err = (mine - want).pow(2).mean().sqrt().item(), (copy - want).pow(2).mean().sqrt().item()
        assert (mine - want).abs().max().item() <= 0.1 * want.abs().max().item() and err <= 3 * copy_err, (err, copy_err)
    assert (got[2] == ref[2]).sum() >= (bf16_copy[2] == ref[2]).sum() - 1


def assert_cache_gives_back_the_same_weights(path: Path, cache_dir: Path) -> dict:
    """Loads `path` in bf16 with its blocks in place twice (the second from the weight cache):
    every weight comes back of the same kind and with the same values; returns the second load."""
    from flexlamps.models.loading.checkpoint import GGUFReader
    from flexlamps.models.loading.weight_cache import load_weights

    first, second = (load_weights(GGUFReader(path), torch.bfloat16, int4_in_place=True, cache_dir=cache_dir)
                     for _ in range(2))
    assert first.keys() == second.keys()
    for name, w in first.items():
        assert type(second[name]) is type(w), name
        plain = type(w) is torch.Tensor
        assert torch.equal(second[name] if plain else second[name].dequantize(), w if plain else w.dequantize()), name
    return second


def assert_gguf_is_the_hf_model(path: Path, folder: Path, cache_dir: Path, steps: int = 8) -> None:
    """The GGUF at `path` loads as the HF checkpoint in `folder` (float32): the same ModelConfig,
    every weight equal (a Gemma norm: its `1 + w`, the value its norm scales by), and bit-equal
    prefill and `steps` decode logits."""
    from flexlamps.models.loading.checkpoint import GGUFReader, read_all
    from flexlamps.models.loading.registry import open_checkpoint
    from flexlamps.models.weight_specs import weight_specs

    gguf_reader, hf_reader = GGUFReader(path, cache_dir=cache_dir), open_checkpoint(folder)
    differ = {f: (getattr(gguf_reader.config, f), getattr(hf_reader.config, f)) for f in vars(hf_reader.config)
              if getattr(gguf_reader.config, f) != getattr(hf_reader.config, f)}
    assert not differ, differ
    ours, want = read_all(gguf_reader, torch.float32), read_all(hf_reader, torch.float32)
    plus_one = hf_reader.config.decoder.norm_plus_one
    for spec in weight_specs(hf_reader.config):
        a, b = ours[spec.name], want[spec.name]
        if hasattr(b, "dequantize"):
            a, b = a.dequantize(), b.dequantize()
        if plus_one and spec.role == "norm":
            a, b = 1.0 + a, 1.0 + b
        assert torch.equal(a, b), spec.name
    got = prefill_and_decode_logits(ours, gguf_reader, torch.float32, steps=steps)
    ref = prefill_and_decode_logits(want, hf_reader, torch.float32, steps=steps)
    assert all(torch.equal(a, b) for a, b in zip(got, ref))

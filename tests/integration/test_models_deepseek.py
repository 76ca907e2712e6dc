"""DeepSeek-V3 / V3.2 (MLA, MoE, lightning indexer) against transformers on tiny random models."""

import pytest
import torch

from flexlamps.engine.executors.step import Step
from flexlamps.engine.executors.in_memory import InMemoryExecutor
from flexlamps.engine.caches.latent import DenseLatentCache
from flexlamps.models.loading.checkpoint import read_all
from flexlamps.models.loading.registry import open_checkpoint
from tests.checkpoints import GROUPS, to_fp8_checkpoint

PROMPT_LEN, DECODE_STEPS = 12, 32


def _cache_kwarg(out) -> dict:
    """The returned cache handed back: `cache` from transformers 5.2x, `past_key_values` before."""
    if hasattr(out, "cache"):
        return {"cache": out.cache}
    return {"past_key_values": out.past_key_values}


def _reference_run(folder, ids: torch.Tensor):
    """transformers' logits for the prompt and for DECODE_STEPS greedy steps, with the tokens."""
    import transformers

    ref = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    logits, tokens = [], []
    with torch.no_grad():
        out = ref(ids, use_cache=True)
        logits.append(out.logits)
        for _ in range(DECODE_STEPS):
            nxt = out.logits[:, -1:].argmax(-1)
            tokens.append(nxt)
            out = ref(nxt, use_cache=True, **_cache_kwarg(out))
            logits.append(out.logits)
    return logits, tokens


@pytest.mark.parametrize("kind", sorted(GROUPS["deepseek"]))
def test_prefill_and_decode_match_transformers(deepseek_models, kind):
    folder = deepseek_models[kind]
    reader = open_checkpoint(folder)
    assert reader.config.arch == "mla"
    ids = torch.randint(2, reader.config.vocab_size, (1, PROMPT_LEN), generator=torch.Generator().manual_seed(1))
    expected, tokens = _reference_run(folder, ids)
    ex = InMemoryExecutor(reader.config, read_all(reader, torch.float32), torch.float32)
    cache = DenseLatentCache(reader.config, 1, PROMPT_LEN + DECODE_STEPS + 1, torch.float32)
    slots = torch.tensor([0])
    got = [ex.forward_steps(cache, [Step(ids, torch.arange(PROMPT_LEN)[None], slots)])[0]]
    for step, tok in enumerate(tokens):
        got.append(ex.forward_steps(cache, [Step(tok, torch.tensor([[PROMPT_LEN + step]]), slots)])[0])
    worst = max((g - e).abs().max().item() for g, e in zip(got, expected))
    assert worst <= 1e-4, f"{kind}: max |logit difference| {worst}"


def test_fp8_latent_cache_stays_close(deepseek_models):
    """ESS's FP8 records (latent and indexer keys) move logits by FP8 rounding only."""
    folder = deepseek_models["deepseek_v32"]
    reader = open_checkpoint(folder)
    ex = InMemoryExecutor(reader.config, read_all(reader, torch.float32), torch.float32)
    ids = torch.randint(2, reader.config.vocab_size, (2, 20), generator=torch.Generator().manual_seed(4))
    positions, slots = torch.arange(20).expand(2, 20), torch.arange(2)
    outs = []
    for fp8 in (False, True):
        cache = DenseLatentCache(reader.config, 2, 21, torch.float32, fp8=fp8)
        ex.forward_steps(cache, [Step(ids[:, :-1], positions[:, :-1], slots)])[0]
        outs.append(ex.forward_steps(cache, [Step(ids[:, -1:], positions[:, -1:], slots)])[0])
    plain, fp8 = outs
    m = reader.config.mla
    assert DenseLatentCache(reader.config, 1, 1, torch.float32, fp8=True).latent_format.record_bytes == \
        m.kv_lora_rank + 4 * (-(-m.kv_lora_rank // 128)) + 2 * m.qk_rope_head_dim
    assert (fp8 - plain).abs().max().item() <= 0.1 * plain.abs().max().item()
    assert torch.equal(fp8.argmax(-1), plain.argmax(-1))


def test_fp8_checkpoint_loads_as_its_dequantized_weights(deepseek_models, tmp_path):
    from flexlamps.models.weight_specs import hf_name, weight_specs

    dense = to_fp8_checkpoint(deepseek_models["deepseek_v3"], tmp_path / "fp8")
    reader = open_checkpoint(tmp_path / "fp8")
    assert reader.fp8_block == (128, 128)
    for spec in weight_specs(reader.config):
        assert torch.equal(reader.read(spec, torch.float32), dense[hf_name(reader.config, spec)]), spec.name


def test_unsupported_quantization_is_refused(deepseek_models, tmp_path):
    import json
    import shutil

    from flexlamps.models.config import UnsupportedModelError

    folder = shutil.copytree(deepseek_models["deepseek_v3_dense"], tmp_path / "awq")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "quantization_config": {"quant_method": "awq"}}))
    with pytest.raises(UnsupportedModelError, match="config.json: quantization_config.quant_method 'awq' is not"):
        open_checkpoint(folder)

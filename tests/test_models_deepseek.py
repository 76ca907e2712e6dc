"""DeepSeek-V3 / V3.2 (MLA, MoE, lightning indexer) against transformers on tiny random models."""

import pytest
import torch

from flexlamps.engine.executors.in_memory import InMemoryExecutor
from flexlamps.engine.caches.latent import DenseLatentCache
from flexlamps.models.checkpoint import read_all
from flexlamps.models.registry import open_checkpoint
from tests.deepseek_models import DEEPSEEK_CONFIGS, make_deepseek_model

PROMPT_LEN, DECODE_STEPS = 12, 32


@pytest.fixture(scope="module")
def deepseek_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("deepseek")
    return {kind: make_deepseek_model(root / kind, kind) for kind in DEEPSEEK_CONFIGS}


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
            out = ref(nxt, cache=out.cache, use_cache=True)
            logits.append(out.logits)
    return logits, tokens


@pytest.mark.parametrize("kind", sorted(DEEPSEEK_CONFIGS))
def test_prefill_and_decode_match_transformers(deepseek_models, kind):
    folder = deepseek_models[kind]
    reader = open_checkpoint(folder)
    assert reader.config.arch == "mla"
    ids = torch.randint(2, reader.config.vocab_size, (1, PROMPT_LEN), generator=torch.Generator().manual_seed(1))
    expected, tokens = _reference_run(folder, ids)
    ex = InMemoryExecutor(reader.config, read_all(reader, torch.float32), torch.float32)
    cache = DenseLatentCache(reader.config, 1, PROMPT_LEN + DECODE_STEPS + 1, torch.float32)
    slots = torch.tensor([0])
    got = [ex.forward(cache, ids, torch.arange(PROMPT_LEN)[None], slots)]
    for step, tok in enumerate(tokens):
        got.append(ex.forward(cache, tok, torch.tensor([[PROMPT_LEN + step]]), slots))
    worst = max((g - e).abs().max().item() for g, e in zip(got, expected))
    assert worst <= 1e-4, f"{kind}: max |logit difference| {worst}"

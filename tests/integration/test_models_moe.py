"""Mixture-of-experts families against transformers on tiny random checkpoints: greedy tokens
and logits in memory, and the offload engine (weights over gpu / cpu / disk) bit-equal to it."""

import pytest
import torch

from flexlamps.engine.executors.in_memory import InMemoryExecutor
from flexlamps.engine.executors.offloaded import OffloadExecutor
from flexlamps.engine.executors.step import Step
from flexlamps.models.description import model_spec
from flexlamps.models.loading.checkpoint import read_all
from flexlamps.models.loading.registry import open_checkpoint
from placement import Policy, TierSplit
from tests.checkpoints import GROUPS, make_checkpoint

PROMPT_LEN, DECODE_STEPS = 12, 16
GiB = 2**30
# every weight tier used: 30% resident, 30% on the cpu tier, 40% on disk
SPREAD = Policy(gpu_batch_size=2, num_gpu_batches=1, weights=TierSplit(gpu=0.3, cpu=0.3, disk=0.4),
                cache=TierSplit(gpu=1, cpu=0, disk=0), activations=TierSplit(gpu=1, cpu=0, disk=0))


@pytest.fixture(scope="module")
def moe_models(tmp_path_factory):
    """(kind, seed, wide) -> folder, built on first use."""
    root, made = tmp_path_factory.mktemp("moe_models"), {}

    def get(kind: str, seed: int = 0, wide: bool = False):
        key = (kind, seed, wide)
        if key not in made:
            made[key] = make_checkpoint(root / f"{kind}-{seed}-{int(wide)}", kind, seed, wide=wide)
        return made[key]
    return get


def _reference(folder, ids: torch.Tensor):
    """transformers' logits for the prompt and DECODE_STEPS greedy steps, with the tokens."""
    import transformers

    ref = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        out = ref.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=DECODE_STEPS,
                           do_sample=False, output_logits=True,
                           return_dict_in_generate=True, pad_token_id=0, eos_token_id=None)
        prompt_logits = ref(ids).logits
    return prompt_logits, torch.stack(out.logits, 1), out.sequences[:, ids.shape[1]:]


def _ours(ex, ids: torch.Tensor, tokens: torch.Tensor):
    """Our prompt logits and, fed transformers' greedy tokens, each decode step's logits."""
    n = ids.shape[0]
    cache, slots = ex.new_cache(n, PROMPT_LEN + DECODE_STEPS + 1), torch.arange(n)
    prompt = ex.forward_steps(cache, [Step(ids, torch.arange(PROMPT_LEN).expand(n, PROMPT_LEN), slots)])[0]
    steps, nxt = [prompt[:, -1:]], ids[:, -1:]
    for i in range(DECODE_STEPS - 1):
        nxt = tokens[:, i:i + 1]
        steps.append(ex.forward_steps(cache, [Step(nxt, torch.full((n, 1), PROMPT_LEN + i), slots)])[0])
    if hasattr(cache, "release"):
        cache.release()
    return prompt, torch.cat(steps, 1)


def _check_family(folder, tmp_path):
    reader = open_checkpoint(folder)
    ids = torch.randint(2, reader.config.vocab_size, (2, PROMPT_LEN), generator=torch.Generator().manual_seed(1))
    ref_prompt, ref_steps, tokens = _reference(folder, ids)
    plain = InMemoryExecutor(reader.config, read_all(reader, torch.float32), torch.float32)
    prompt, steps = _ours(plain, ids, tokens)
    worst = max((prompt - ref_prompt).abs().max().item(), (steps - ref_steps).abs().max().item())
    assert worst <= 1e-4, f"max |logit difference| {worst}"
    assert torch.equal(steps.argmax(-1), tokens), "greedy tokens differ from transformers'"
    off = OffloadExecutor(reader, SPREAD, model_spec=model_spec(reader.config),
                          gpu_mem=GiB, cpu_mem=GiB, offload_dir=tmp_path / "off")
    try:
        assert {"gpu", "cpu", "disk"} <= set(off.tiers.values())
        assert any(t == "disk" and ".experts." in n for n, t in off.tiers.items())
        off_prompt, off_steps = _ours(off, ids, tokens)
    finally:
        off.close()
    assert torch.equal(off_prompt, prompt) and torch.equal(off_steps, steps), "offloaded != in memory"
    return worst


@pytest.mark.parametrize("kind", sorted(GROUPS["moe"]))
def test_family_matches_transformers_in_memory_and_offloaded(moe_models, kind, tmp_path):
    _check_family(moe_models(kind), tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(GROUPS["moe"]))
@pytest.mark.parametrize("seed,wide", [(1, False), (0, True), (2, True)])
def test_family_at_other_widths_and_seeds(moe_models, kind, seed, wide, tmp_path):
    _check_family(moe_models(kind, seed, wide), tmp_path)


@pytest.mark.parametrize("kind", ["qwen2_moe", "deepseek_v2_grouped"])
def test_python_api_generates_transformers_tokens_in_memory_and_offloaded(moe_models, kind, tmp_path):
    """flexlamps.LLM, in memory and with weights over gpu / cpu / disk, greedy-decodes
    transformers' own tokens (16 new tokens per prompt, two prompts batched)."""
    import transformers

    from flexlamps import LLM, SamplingParams

    folder = moe_models(kind)
    prompts = ["the quick brown fox", "numbers 1 2 3 4 5 6"]
    params = SamplingParams(max_new_tokens=DECODE_STEPS, ignore_eos=True)
    plain = LLM(str(folder), dtype="float32")
    ref = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    expected = []
    for p in prompts:
        ids = torch.tensor([plain.encode_prompt(p, False)])
        with torch.no_grad():
            out = ref.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=DECODE_STEPS,
                               do_sample=False, pad_token_id=0, eos_token_id=None)
        expected.append(out[0, ids.shape[1]:].tolist())
    assert [o.token_ids for o in plain.generate(prompts, params)] == expected
    off = LLM(str(folder), dtype="float32", gpu_mem=GiB, cpu_mem=GiB, offload_dir=str(tmp_path / "off"), policy=SPREAD)
    assert [o.token_ids for o in off.generate(prompts, params)] == expected

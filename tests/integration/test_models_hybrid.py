"""Hybrid gated-DeltaNet models (Qwen3-Next with MoE, Qwen3.5 text) against transformers, and
their recurrent state through the engine: chunked prompts, padded prefill groups, refilled rows,
shared prefixes, offloaded tiers."""

import pytest
import torch

from flexlamps.engine.batch.generate import generate
from flexlamps.engine.batch.sampling import SamplingParams
from flexlamps.engine.executors.in_memory import InMemoryExecutor
from flexlamps.engine.executors.offloaded import OffloadExecutor
from flexlamps.engine.executors.step import Step
from flexlamps.models.description import model_spec
from flexlamps.models.loading.checkpoint import read_all
from flexlamps.models.loading.registry import open_checkpoint
from placement import Policy, TierSplit
from tests.checkpoints import GROUPS, make_checkpoint
from tests.hybrid_reference import float64_logits

PROMPT_LEN, DECODE_STEPS = 70, 28  # the prompt spans five of the chunked form's 16-token chunks
LOGIT_BAR = 1e-4  # max |logit difference| in float32 (issue 34)
GiB = 2**30


def _executor(folder):
    reader = open_checkpoint(folder)
    return reader, InMemoryExecutor(reader.config, read_all(reader, torch.float32), torch.float32)


def _reference_run(folder, ids: torch.Tensor):
    """transformers' DECODE_STEPS greedy tokens (its recurrent decode) and its logits at the prompt's
    last token and each generated one from one forward over the whole sequence (its chunked form),
    which is what our engine computes however the sequence is split (models.blocks.aligned_delta_rule),
    and the latter in float64."""
    import transformers

    ref = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    out = ref.generate(ids, max_new_tokens=DECODE_STEPS, do_sample=False, return_dict_in_generate=True,
                       eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        logits = ref(out.sequences[:, :-1]).logits[:, ids.shape[1] - 1:]
    exact = float64_logits(ref, out.sequences[:, :-1])[:, ids.shape[1] - 1:]
    return out.sequences[0, ids.shape[1]:].tolist(), logits, exact


@pytest.fixture(scope="module")
def hybrid_model_at(tmp_path_factory):
    """(kind, seed) -> a tiny random checkpoint of that kind and seed, built once."""

    made = {}

    def build(kind: str, seed: int):
        if (kind, seed) not in made:
            made[kind, seed] = make_checkpoint(tmp_path_factory.mktemp(f"{kind}_{seed}"), kind, seed=seed)
        return made[kind, seed]
    return build


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("kind", sorted(GROUPS["hybrid"]))
def test_greedy_decode_matches_transformers(hybrid_model_at, kind, seed):
    """Greedy tokens equal to transformers', logits within LOGIT_BAR of its whole forward and of the
    same forward in float64 (tests/hybrid_reference.py). Where its float32 forward is itself more
    than the bar from float64, that miss is reported as an xfail with the measured gaps (qwen3_next
    seed 1, qwen3_next_wide seed 1), never hidden: at these weights transformers' own float32 paths
    differ by more than the bar on a quarter of the checkpoints (scripts/hybrid_parity_spread.py,
    docs/models.md); at its own init every kind is held to 2e-6 below."""
    folder = hybrid_model_at(kind, seed)
    reader, ex = _executor(folder)
    assert reader.config.hybrid is not None
    ids = torch.randint(2, reader.config.vocab_size, (1, PROMPT_LEN), generator=torch.Generator().manual_seed(1))
    tokens, expected, exact = _reference_run(folder, ids)
    cache = ex.new_cache(1, PROMPT_LEN + DECODE_STEPS)
    slots = torch.tensor([0])
    logits = [ex.forward_steps(cache, [Step(ids, torch.arange(PROMPT_LEN)[None], slots)])[0][:, -1:]]
    ours = [int(logits[0].argmax())]
    for t in range(DECODE_STEPS - 1):
        step = Step(torch.tensor([[ours[-1]]]), torch.tensor([[PROMPT_LEN + t]]), slots)
        logits.append(ex.forward_steps(cache, [step])[0])
        ours.append(int(logits[-1].argmax()))
    logits = torch.cat(logits, dim=1)
    assert ours == tokens
    worst, ours_off, theirs_off = ((a.double() - b.double()).abs().max().item()
                                   for a, b in ((logits, expected), (logits, exact), (expected, exact)))
    gaps = f"ours - transformers {worst:.2e}, ours - float64 {ours_off:.2e}, transformers - float64 {theirs_off:.2e}"
    assert ours_off <= LOGIT_BAR, f"{kind} seed {seed}: {gaps}"
    if worst > LOGIT_BAR:
        assert theirs_off > LOGIT_BAR, f"{kind} seed {seed}: {gaps}"
        pytest.xfail(f"transformers' own float32 forward is off: {gaps}")


@pytest.mark.parametrize("kind", sorted(GROUPS["hybrid"]))
def test_at_transformers_own_init_logits_match_its_decode_to_float32_rounding(kind, tmp_path):
    """Weights at transformers' initializer range (N(0, 0.02)), where float32 rounding is not
    amplified: the same greedy tokens and logits within 2e-6 of transformers' cached decode (about
    10x the 2-4e-7 measured, scripts/hybrid_parity_spread.py --init-std 0.02), far inside the
    issue's 1e-4. (At the N(0, 0.2) the other tests draw, transformers' own two float32 paths
    differ by more than 1e-4 on a quarter of the checkpoints: docs/models.md.)"""
    from tests.family_models import greedy_tokens, our_run, prompt_ids, reference_run, worst_gap

    folder = make_checkpoint(tmp_path / kind, kind, seed=5, init_std=0.02)
    reader, ex = _executor(folder)
    ids = prompt_ids(reader.config.vocab_size, seed=5)
    expected, tokens = reference_run(folder, ids, steps=24)
    ours = our_run(ex, ids, tokens)
    assert all(torch.equal(a, b) for a, b in zip(greedy_tokens(ours), tokens))
    assert worst_gap(ours, expected) <= 2e-6


def _chunked_logits(ex, ids: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    cache, out, at = ex.new_cache(ids.shape[0], ids.shape[1]), [], 0
    for size in sizes:
        pos = torch.arange(at, at + size).expand(ids.shape[0], size)
        out.append(ex.forward_steps(cache, [Step(ids[:, at:at + size], pos, torch.arange(ids.shape[0]))])[0])
        at += size
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("kind", ["qwen3_next", "qwen3_5_text_wide"])
def test_prompt_chunking_does_not_change_logits(hybrid_models, kind):
    """Chunks of any size (the chunked form's chunks cut anywhere, single tokens decoded)
    give one whole prefill's logits bit for bit: the rule runs on chunks at absolute positions,
    carrying each row's open chunk (models.blocks.aligned_delta_rule)."""
    reader, ex = _executor(hybrid_models[kind])
    ids = torch.randint(2, reader.config.vocab_size, (2, 150), generator=torch.Generator().manual_seed(4))
    whole = _chunked_logits(ex, ids, [150])
    assert torch.equal(_chunked_logits(ex, ids, [150]), whole)  # the same steps: the same bits
    for sizes in ([64, 86], [30, 30, 90], [7] * 21 + [3], [1] * 70 + [80], [63, 2, 64, 21], [100, 1, 1, 48]):
        chunked = _chunked_logits(ex, ids, sizes)
        assert torch.equal(chunked, whole), f"chunks {sizes}: {(chunked - whole).abs().max().item()}"


def test_padded_prefill_group_and_refilled_rows_equal_each_prompt_alone(hybrid_models):
    """generate() pads a prefill group to its longest prompt and refills finished rows: each
    sequence's tokens equal its generation alone (its state stops at its own last token and a
    new request's state starts at zero)."""
    reader, ex = _executor(hybrid_models["qwen3_next"])
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(2, reader.config.vocab_size, (n,), generator=g).tolist() for n in (23, 5, 70, 12, 40)]
    params = [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in (9, 4, 12, 6, 3)]
    together = generate(ex, reader.tokenizer, prompts, params, max_batch=2, reuse_prefix=False)
    alone = [generate(ex, reader.tokenizer, [p], [sp])[0] for p, sp in zip(prompts, params)]
    assert [o.token_ids for o in together] == [o.token_ids for o in alone]


def test_a_slot_reused_from_position_0_forgets_its_previous_sequence(hybrid_models):
    """A cache row that held 40 tokens starts a 5-token sequence (no chunk completes): its logits
    and decode equal a fresh cache's bit for bit (the row's old boundary state must not survive)."""
    reader, ex = _executor(hybrid_models["qwen3_5_text"])
    g = torch.Generator().manual_seed(11)
    old, new = (torch.randint(2, reader.config.vocab_size, (1, n), generator=g) for n in (40, 5))
    slot = torch.tensor([0])
    used, fresh = ex.new_cache(1, 48), ex.new_cache(1, 48)
    ex.forward_steps(used, [Step(old, torch.arange(40)[None], slot)])
    runs = []
    for cache in (used, fresh):
        logits = [ex.forward_steps(cache, [Step(new, torch.arange(5)[None], slot)])[0]]
        for t in range(5, 9):
            step = Step(logits[-1][:, -1:].argmax(-1), torch.tensor([[t]]), slot)
            logits.append(ex.forward_steps(cache, [step])[0])
        runs.append(torch.cat(logits, 1))
    assert torch.equal(*runs)


def test_shared_prefix_state_is_copied_at_its_end(hybrid_models):
    reader, ex = _executor(hybrid_models["qwen3_5_text"])
    g = torch.Generator().manual_seed(6)
    prefix = torch.randint(2, reader.config.vocab_size, (40,), generator=g).tolist()
    prompts = [prefix + torch.randint(2, reader.config.vocab_size, (n,), generator=g).tolist() for n in (3, 9, 5)]
    params = [SamplingParams(max_new_tokens=6, ignore_eos=True)] * 3
    shared = generate(ex, reader.tokenizer, prompts, params, max_batch=3, reuse_prefix=True)
    plain = generate(ex, reader.tokenizer, prompts, params, max_batch=3, reuse_prefix=False)
    assert [o.token_ids for o in shared] == [o.token_ids for o in plain]


def test_a_step_that_neither_starts_nor_continues_a_state_is_refused(hybrid_models):
    reader, ex = _executor(hybrid_models["qwen3_5_text"])
    cache = ex.new_cache(1, 32)
    ids = torch.randint(2, reader.config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(7))
    ex.forward_steps(cache, [Step(ids, torch.arange(8)[None], torch.tensor([0]))])
    with pytest.raises(ValueError, match="holds the recurrent state of 8 tokens"):
        ex.forward_steps(cache, [Step(ids[:, :2], torch.arange(4, 6)[None], torch.tensor([0]))])


MIXES = {
    "all_gpu": dict(weights=TierSplit(gpu=1, cpu=0, disk=0), cache=TierSplit(gpu=1, cpu=0, disk=0)),
    "weights_and_state_split": dict(weights=TierSplit(gpu=0.4, cpu=0.3, disk=0.3), cache=TierSplit(gpu=0.5, cpu=0.5, disk=0)),
    "cache_cpu_attention": dict(weights=TierSplit(gpu=0.5, cpu=0.5, disk=0), cache=TierSplit(gpu=0, cpu=1, disk=0), cpu_attention=True),
}


def _rounds(vocab: int) -> list[list[Step]]:
    """Two prefill micro-batches (one padded), then decode rounds of all four rows in one step."""
    g = torch.Generator().manual_seed(8)
    ids = torch.randint(2, vocab, (4, 70), generator=g)
    rounds = [[Step(ids[:2, :70], torch.arange(70).expand(2, 70), torch.tensor([0, 1]), torch.tensor([69, 29]),
                    lengths=torch.tensor([70, 30])),
               Step(ids[2:, :17], torch.arange(17).expand(2, 17), torch.tensor([2, 3]))]]
    at = torch.tensor([70, 30, 17, 17])
    for r in range(5):
        rounds.append([Step(ids[:, 20 + r:21 + r], (at + r)[:, None], torch.arange(4))])
    return rounds


@pytest.mark.parametrize("mix", sorted(MIXES))
def test_offloaded_equals_in_memory_bit_for_bit(hybrid_models, mix, tmp_path):
    """Weights, KV cache and DeltaNet states over the tiers: the same steps give the same bits."""
    reader, plain = _executor(hybrid_models["qwen3_next"])
    policy = Policy(gpu_batch_size=2, num_gpu_batches=2, activations=TierSplit(gpu=1, cpu=0, disk=0), **MIXES[mix])
    ex = OffloadExecutor(reader, policy, model_spec=model_spec(reader.config),
                         gpu_mem=GiB, cpu_mem=GiB, offload_dir=tmp_path / "off")
    ref_cache, cache = plain.new_cache(4, 80), ex.new_cache(4, 80)
    for steps in _rounds(reader.config.vocab_size):
        for a, b in zip(plain.forward_steps(ref_cache, steps), ex.forward_steps(cache, steps)):
            assert torch.equal(a, b)
    if mix != "all_gpu":
        assert ex.budgets["cpu"].used_bytes > 0 and "cpu" in cache.state.tiers
    cache.release()
    assert ex.budgets["gpu"].peak_bytes <= GiB
    g = torch.Generator().manual_seed(9)
    prompts = [torch.randint(2, reader.config.vocab_size, (n,), generator=g).tolist() for n in (30, 6, 17, 66)]
    params = [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in (7, 4, 9, 5)]
    expected = generate(plain, reader.tokenizer, prompts, params, max_batch=3)
    got = generate(ex, reader.tokenizer, prompts, params, max_batch=3, micro_batch=2)
    assert [o.token_ids for o in got] == [o.token_ids for o in expected]
    ex.close()


def test_the_kv_only_paged_cache_refuses_a_hybrid_model(hybrid_models):
    """PagedKVCache holds KV blocks only: built for a hybrid model it would drop the DeltaNet
    states, so it names the cache that holds them (tests/integration/test_agents_hybrid.py)."""
    from flexlamps.engine.caches.paged import PagedKVCache

    reader = open_checkpoint(hybrid_models["qwen3_5_text"])
    with pytest.raises(ValueError, match="HybridPagedCache"):
        PagedKVCache(reader.config, 4, 4, 4, torch.float32)


def test_a_gated_deltanet_gguf_without_its_metadata_is_refused_in_one_line(tmp_path):
    import gguf

    path = tmp_path / "qwen3next.gguf"
    writer = gguf.GGUFWriter(str(path), "qwen3next")
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="GGUF metadata key 'qwen3next.attention.head_count' is missing") as e:
        open_checkpoint(path).config
    assert "\n" not in str(e.value) and "Hugging Face folder" in str(e.value)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["qwen3_next", "qwen3_5_text"])
def test_bfloat16_is_as_close_to_float32_as_transformers_own_bfloat16(hybrid_models, kind):
    """bf16 rounding moves these random models' logits by up to ~0.8 (dense) and ~3.7 (MoE: a token
    routed to other experts) in transformers itself; ours moves them no further."""
    import transformers

    folder = hybrid_models[kind]
    ids = torch.randint(2, 300, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        exact = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()(ids).logits
        theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()(ids).logits
    reader = open_checkpoint(folder)
    ex = InMemoryExecutor(reader.config, read_all(reader, torch.bfloat16), torch.bfloat16)
    ours = ex.forward_steps(ex.new_cache(2, 40), [Step(ids, torch.arange(40).expand(2, 40), torch.arange(2))])[0]
    assert (ours - exact).abs().max() <= 1.25 * (theirs.float() - exact).abs().max() + 0.05


def test_scoring_feeds_each_pair_after_the_shared_root_in_a_row_of_its_own(hybrid_models):
    """Rounds of continuations over one row would rewind its state: a hybrid model's pairs are
    scored as leaves after the common root (its state copied at the root's end), as transformers
    scores each context + continuation."""
    import transformers

    from flexlamps.engine.batch.scoring import PrefixScorer

    folder = hybrid_models["qwen3_next"]
    reader, ex = _executor(folder)
    g = torch.Generator().manual_seed(10)
    root = torch.randint(2, reader.config.vocab_size, (20,), generator=g).tolist()
    ctx = [root + torch.randint(2, reader.config.vocab_size, (n,), generator=g).tolist() for n in (4, 9)]
    pairs = [(ctx[0], [5, 6, 7]), (ctx[1], [8]), (ctx[0], [9, 10]), (ctx[1], [11, 12, 13, 14])]
    got = PrefixScorer(ex).score(pairs)
    ref = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    for (c, k), out in zip(pairs, got):
        with torch.no_grad():
            logp = torch.log_softmax(ref(torch.tensor([c + k])).logits[0], -1)
        expected = sum(logp[len(c) - 1 + j, t].item() for j, t in enumerate(k))
        assert abs(out.logprob - expected) <= 1e-4


def test_a_multi_token_prediction_head_is_skipped_but_other_extras_refused(hybrid_models, tmp_path):
    """Released Qwen3-Next / Qwen3.5 checkpoints carry an `mtp.*` head that generation never runs
    (transformers skips it too); any other tensor no weight reads is an error naming it."""
    import shutil

    from safetensors.torch import load_file, save_file

    from flexlamps.models.loading.checkpoint import CheckpointError

    folder = tmp_path / "with_mtp"
    shutil.copytree(hybrid_models["qwen3_5_text"], folder)
    tensors = load_file(str(folder / "model.safetensors"))
    save_file({**tensors, "mtp.fc.weight": torch.zeros(4, 4)}, str(folder / "model.safetensors"))
    assert open_checkpoint(folder).config.hybrid is not None
    save_file({**tensors, "model.layers.0.linear_attn.extra.weight": torch.zeros(4)}, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match="linear_attn.extra.weight is not read"):
        open_checkpoint(folder)


@pytest.mark.parametrize("prefix_len", [40, 64, 100])
def test_a_prefix_states_copy_gives_the_whole_prefills_logits(hybrid_models, prefix_len):
    """A shared prefix's state (its open chunk included) copied at the prefix's end, then the rest
    of the prompt: the logits of one whole prefill, bit for bit."""
    reader, ex = _executor(hybrid_models["qwen3_next"])
    ids = torch.randint(2, reader.config.vocab_size, (2, 150), generator=torch.Generator().manual_seed(5))
    ids[1, :prefix_len] = ids[0, :prefix_len]
    whole = _chunked_logits(ex, ids, [150])
    root = ex.new_cache(1, prefix_len)
    ex.forward_steps(root, [Step(ids[:1, :prefix_len], torch.arange(prefix_len)[None], torch.tensor([0]))])
    cache = ex.new_cache(2, 150)
    cache.copy_prefix_from(root, prefix_len, torch.arange(2))
    pos = torch.arange(prefix_len, 150).expand(2, -1)
    rest = ex.forward_steps(cache, [Step(ids[:, prefix_len:], pos, torch.arange(2))])[0]
    assert torch.equal(rest, whole[:, prefix_len:])

"""Held-out checkpoints: every family against transformers at a width and seeds none of the other
parity tests use (hidden 80, 5 heads over 1 kv head, seeds 3 and 7; the head tied at seed 7 where
the family allows), prompt and 16 greedy steps in float32: the same greedy tokens and max |logit
difference| <= 1e-4. Slow; `-s` prints each family's gap ("held-out <kind> seed <s>: <gap>").

The gated-DeltaNet hybrids (Qwen3-Next, Qwen3.5) are held to the same bar against transformers
and against transformers' forward in float64 (tests/hybrid_reference.py); a miss is an xfail that
prints the three gaps (two of the eight cases today), and a gap over 5e-5 of the largest logit fails."""

import pytest
import torch

from flexlamps.engine.executors.in_memory import InMemoryExecutor
from flexlamps.models.loading.checkpoint import read_all
from flexlamps.models.loading.registry import open_checkpoint
from tests.checkpoints import CHECKPOINTS, GROUPS, checkpoint_fields, make_checkpoint
from tests.family_models import LOGIT_TOLERANCE, greedy_tokens, our_run, prompt_ids, reference_run, worst_gap
from tests.hybrid_reference import float64_logits

pytestmark = pytest.mark.slow

HELD_OUT = dict(hidden_size=80, intermediate_size=112, num_attention_heads=5, num_key_value_heads=1, head_dim=16)
# (gpt-oss in MXFP4: hidden 96, experts 64 wide, as its blocks of 32 need)
_MOE_WIDTHS = dict(moe_intermediate_size=40, shared_expert_intermediate_size=56)
_MLA = dict(hidden_size=80, intermediate_size=112, num_attention_heads=5, num_key_value_heads=5,
            moe_intermediate_size=40)
SEEDS = (3, 7)


def _moe_overrides(kind: str) -> dict:
    fields = CHECKPOINTS[kind]
    if "kv_lora_rank" in fields:
        return {k: v for k, v in _MLA.items() if k in fields or k == "num_key_value_heads"}
    if kind.endswith("_mxfp4"):  # MXFP4 blocks of 32 along the hidden and expert widths
        return {**HELD_OUT, "hidden_size": 96, "intermediate_size": 64}
    return {**HELD_OUT, **{k: v for k, v in _MOE_WIDTHS.items() if k in fields}}


def _make(family: str, kind: str, folder, seed: int):
    if family == "dense":
        tied = seed == 7 and kind != "gemma2" or kind.startswith("gemma")
        return make_checkpoint(folder, {**checkpoint_fields(kind), **HELD_OUT}, seed, tied=tied)
    if family == "moe":
        return make_checkpoint(folder, kind, seed, **_moe_overrides(kind))
    if family == "deepseek":
        return make_checkpoint(folder, kind, seed, **_MLA)
    return make_checkpoint(folder, kind, seed, **HELD_OUT)


CASES = [(family, k) for family, group in (("dense", "family"), ("moe", "moe"), ("deepseek", "deepseek"),
                                           ("hybrid", "hybrid")) for k in sorted(GROUPS[group])]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("family,kind", CASES, ids=[k for _, k in CASES])
def test_held_out_checkpoint_matches_transformers(family, kind, seed, tmp_path):
    folder = _make(family, kind, tmp_path / kind, seed)
    reader = open_checkpoint(folder)
    ids = prompt_ids(reader.config.vocab_size, seed=seed)
    expected, tokens = reference_run(folder, ids)
    ours = our_run(InMemoryExecutor(reader.config, read_all(reader, torch.float32), torch.float32), ids, tokens)
    gap = worst_gap(ours, expected)
    print(f"held-out {kind} seed {seed}: {gap:.3g}")
    assert all(torch.equal(a, b) for a, b in zip(greedy_tokens(ours), tokens)), f"{kind}: greedy tokens differ"
    if family == "hybrid":
        return _against_float64(folder, ids, tokens, ours, expected, f"{kind} seed {seed}")
    assert gap <= LOGIT_TOLERANCE, f"{kind} seed {seed}: max |logit difference| {gap:.3g}"


def _against_float64(folder, ids, tokens, ours, expected, case: str):
    """A hybrid: within LOGIT_TOLERANCE of transformers, else an xfail printing how far each float32
    run (ours, transformers' cached decode, its whole-sequence forward) is from transformers' forward
    in float64. Measured misses: qwen3_next seed 3 (ours 1.8e-4 from float64, its whole forward as
    far, its decode 2.1e-5: at that token the checkpoint amplifies float32 rounding ~50x, layer 0's
    mixer 3.4e-6 off grows to 2.8e-4 after layer 2's MoE in its forward too; ours with the whole
    delta rule in float64 is still 1.7e-4 off) and qwen3_5_text_wide seed 7 (ours and its decode
    1.7-1.9e-4 from float64). Beyond 5e-5 of the largest logit it fails."""
    import transformers

    ref = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    sequence = torch.cat([ids, *tokens], dim=1)
    exact = float64_logits(ref, sequence)
    with torch.no_grad():
        whole = ref(sequence).logits.double()
    ours, expected = torch.cat(ours, dim=1).double(), torch.cat(expected, dim=1).double()
    gap, ours_off, theirs_off, whole_off = ((a - b).abs().max().item() for a, b in (
        (ours, expected), (ours, exact), (expected, exact), (whole, exact)))
    gaps = (f"ours - transformers {gap:.2e}, ours - float64 {ours_off:.2e}, transformers' decode - float64 "
            f"{theirs_off:.2e}, its whole forward - float64 {whole_off:.2e}")
    assert gap <= 5e-5 * expected.abs().max().item(), f"{case}: {gaps}"
    if gap > LOGIT_TOLERANCE or ours_off > LOGIT_TOLERANCE:
        pytest.xfail(f"over the bar of {LOGIT_TOLERANCE}: {gaps}")

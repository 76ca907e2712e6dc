"""Scoring with a 4-bit KV cache (`--compress-cache`): a question's own tokens attend over their
keys as computed (FlexGen's prefill; the cache is still written compressed), the shared prefix
computed before them (at least the BOS) is read back compressed. So per-choice log-probs equal the
uncompressed scoring's bit for bit for a request alone and stay within the quantization error in a
batch, and
no compressed key block is ever reopened (each cache position is written once, so a choice never
sees keys re-quantized after a sibling's continuation filled their block)."""

import json

import pytest
from click.testing import CliRunner

import flexlamps.commands.helm as helm_cmd
from flexlamps import LLM
from placement import Policy, TierSplit
from quant.kv_rows import ChannelGroupedRows
from tests.unit.test_evals_packed_scoring import QUESTIONS, SHOTS

G = TierSplit(gpu=1, cpu=0, disk=0)
# |compressed - uncompressed| per choice, per scored token (the tiny random model: 0.014 at most seen)
PER_TOKEN_TOLERANCE = 0.05


POLICY = Policy(gpu_batch_size=4, num_gpu_batches=1, weights=G, cache=G, activations=G, compress_cache=True)


def _compressed(model: str) -> LLM:
    return LLM(model, dtype="float32", gpu_mem="256MiB", cpu_mem="256MiB", policy=POLICY)


def test_compressed_cache_scoring_close_to_uncompressed(tiny_llama, monkeypatch):
    reopened = []
    truncate = ChannelGroupedRows._truncate

    def spy(self, slot, length):
        if length < self.lengths[slot]:
            reopened.append((slot, length))
        return truncate(self, slot, length)

    monkeypatch.setattr(ChannelGroupedRows, "_truncate", spy)
    contexts = [SHOTS * 3 + ctx for ctx, choices in QUESTIONS for _ in choices]  # past one key block of 32
    conts = [c for _, choices in QUESTIONS for c in choices]
    plain = LLM(str(tiny_llama), dtype="float32").score(contexts, conts)
    llm = _compressed(str(tiny_llama))
    assert llm.executor.kv_qcfg is not None
    got = llm.score(contexts, conts)
    assert reopened == []
    for p, c in zip(plain, got):
        assert c.num_tokens == p.num_tokens
        assert abs(c.logprob - p.logprob) <= PER_TOKEN_TOLERANCE * p.num_tokens
    assert [c.logprob for c in got] != [p.logprob for p in plain]  # the shared prefix was read compressed
    assert llm.executor.budgets["gpu"].used_bytes == sum(  # every cache freed
        t.numel() * t.element_size() for n, t in llm.executor.store._resident.items()
        if llm.executor.store.tier_of(n) == "gpu")


def test_compressed_cache_scoring_without_shared_prefix_equals_uncompressed(tiny_llama):
    """One request alone has no shared prefix (a batch shares at least its BOS): nothing is read back."""
    plain, llm = LLM(str(tiny_llama), dtype="float32"), _compressed(str(tiny_llama))
    for ctx, choices in QUESTIONS[:3]:
        for c in choices:
            assert llm.score([ctx], [c])[0].logprob == plain.score([ctx], [c])[0].logprob


def test_helm_compress_cache_run_close_to_uncompressed(tmp_path, tiny_llama):
    rows = [{"id": f"q{k}", "context": SHOTS + ctx, "choices": [c.strip() for c in choices], "gold": 0}
            for k, (ctx, choices) in enumerate(QUESTIONS) if len(choices) > 1]
    f = tmp_path / "mine.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    policy = tmp_path / "policy.json"
    policy.write_text(POLICY.to_json())
    per_instance = []
    for name, extra in (("plain", []), ("compressed", ["--compress-cache", "--gpu-mem", "256MiB", "--policy",
                                                         str(policy)])):
        res = CliRunner().invoke(helm_cmd.command, ["--suite", "s", "--output-path", str(tmp_path / name), "--model",
                                                    str(tiny_llama), "--dtype", "float32", "--scenario-file", str(f),
                                                    *extra], catch_exceptions=False)
        assert res.exit_code == 0, res.output
        assert ("cache True" in res.output) == (name == "compressed")  # the policy it ran, shown
        run = next((tmp_path / name / "runs" / "s").glob("file:*"))
        states = json.loads((run / "scenario_state.json").read_text())["request_states"]
        per_instance.append({(s["instance"]["id"], s["reference_index"]): s["result"]["completions"][0]
                             for s in states})
    plain, compressed = per_instance
    assert plain.keys() == compressed.keys()
    for key, p in plain.items():
        assert compressed[key]["logprob"] == pytest.approx(p["logprob"], abs=PER_TOKEN_TOLERANCE * len(p["tokens"]))

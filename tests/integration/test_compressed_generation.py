"""4-bit weights and cache end to end: the CLI runs, and SmolLM2's greedy text stays close."""

import json

import pytest
from click.testing import CliRunner

from flexlamps import LLM, SamplingParams
from flexlamps.cli import main
import placement
from placement import Policy, TierSplit

G = TierSplit(gpu=1, cpu=0, disk=0)
PROMPTS = ["The capital of France is", "Water boils at a temperature of", "The three primary colors are",
           "In 1492, Christopher Columbus"]


def agreement(a: list[int], b: list[int]) -> float:
    """Share of positions where the two greedy continuations agree."""
    n = max(len(a), len(b))
    return sum(x == y for x, y in zip(a, b)) / n if n else 1.0


def test_cli_generates_with_compression(tiny_llama, tmp_path, monkeypatch):
    import flexlamps.hardware.cache

    # planned on a preset machine: measuring this one (test_placement_cli's job) took most of this
    # test's time (166 of 167 s in a full run), and compression is what this test checks
    monkeypatch.setattr(flexlamps.hardware.cache, "machine_profile", lambda *a, **k: placement.hardware_preset("rtx3090"))
    prompts = tmp_path / "in.jsonl"
    prompts.write_text("\n".join(json.dumps({"id": i, "prompt": p}) for i, p in enumerate(PROMPTS)) + "\n")
    res = CliRunner().invoke(main, ["generate", "--model", str(tiny_llama), "--prompts", str(prompts), "--out",
                                    str(tmp_path / "o.jsonl"), "--compress-weight", "--compress-cache",
                                    "--gpu-mem", "256MiB", "--max-new-tokens", "5", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "compress weight True, cache True" in res.output
    assert len((tmp_path / "o.jsonl").read_text().splitlines()) == 4


def teacher_forced_agreement(llm, prompt_ids: list[int], continuation: list[int]) -> float:
    """Share of the continuation's tokens that `llm` also ranks first when fed the same prefix
    (teacher forcing: one early difference does not shift every later position)."""
    import torch

    from flexlamps.engine.executors.step import Step

    ids = prompt_ids + continuation
    cache = llm.executor.new_cache(1, len(ids))
    logits = llm.executor.forward_steps(cache, [Step(torch.tensor([ids]), torch.arange(len(ids))[None],
                                                     torch.tensor([0]))])[0]
    cache.release()
    pred = logits[0, len(prompt_ids) - 1: -1].argmax(-1).tolist()
    return sum(p == t for p, t in zip(pred, continuation)) / len(continuation)


@pytest.mark.slow
@pytest.mark.ci
def test_smollm2_compressed_tokens_stay_close(smollm2_path):
    """Slow (49 s of the quick suite: SmolLM2 generating 4 x 32 tokens twice): CI's `-m ci` step runs it."""
    params = SamplingParams(max_new_tokens=32, ignore_eos=True)
    plain = LLM("smollm2-135m", dtype="float32").generate(PROMPTS, params)
    policy = Policy(gpu_batch_size=4, num_gpu_batches=1, weights=G, cache=G, activations=G,
                    compress_weight=True, compress_cache=True)
    llm = LLM("smollm2-135m", dtype="float32", gpu_mem="2GiB", cpu_mem="1GiB", policy=policy)
    packed = llm.generate(PROMPTS, params)
    free_running = [agreement(a.token_ids, b.token_ids) for a, b in zip(plain, packed)]
    forced = [teacher_forced_agreement(llm, llm.tokenizer.encode(p), a.token_ids) for p, a in zip(PROMPTS, plain)]
    print(f"free-running agreement {sum(free_running) / 4:.3f} {free_running}; "
          f"teacher-forced top-1 agreement {sum(forced) / 4:.3f} {forced}")
    assert sum(forced) / len(forced) >= 0.85
    assert all(b.token_ids[:3] == a.token_ids[:3] for a, b in zip(plain, packed))


@pytest.mark.parametrize("backend", ["nf4", "fp4", "groupwise8"])
def test_weight_backends_run_through_the_engine(tiny_llama, backend):
    if backend in ("nf4", "fp4"):
        from quant import QuantBackendUnavailable, get_weight_quantizer

        try:
            get_weight_quantizer(backend)
        except QuantBackendUnavailable as e:
            pytest.skip(str(e))
    import torch

    from flexlamps.engine.executors.step import Step

    plain = LLM(str(tiny_llama))
    assert plain.policy is None and plain.policy_lines() == []  # all in memory: no placement policy
    llm = LLM(str(tiny_llama), weight_quant=backend, gpu_mem="64MiB", cpu_mem="64MiB", policy=None)
    assert llm.policy.compress_weight
    outs = llm.generate(PROMPTS[:2], SamplingParams(max_new_tokens=4, ignore_eos=True))
    assert all(len(o.token_ids) == 4 for o in outs)
    ids = torch.tensor([plain.tokenizer.encode(PROMPTS[0])])
    step = Step(ids, torch.arange(ids.shape[1])[None], torch.tensor([0]))
    a = plain.executor.forward_steps(plain.executor.new_cache(1, ids.shape[1]), [step])[0].flatten()
    cache = llm.executor.new_cache(1, ids.shape[1])
    b = llm.executor.forward_steps(cache, [step])[0].flatten()
    cache.release()
    assert torch.nn.functional.cosine_similarity(a, b, dim=0) > 0.9  # lossy, but the same model

"""`flexlamps helm` on the real engine: a tiny random LLaMA saved in Hugging Face format (and
SmolLM2 when installed), with per-choice log-probabilities checked against transformers."""

import json

import pytest
import torch
from click.testing import CliRunner

pytest.importorskip("flexlamps.api", reason="the engine API (flexlamps/api.py) is not there yet")

import flexlamps.commands.helm as helm_cmd  # noqa: E402
from flexlamps.engine.batch.scoring import split_tokens  # noqa: E402
from flexlamps.evals.helm_output import RUN_FILES  # noqa: E402

CHOICES = [
    {"question": "Which animal barks?", "choices": ["a dog", "a fish", "the moon"], "gold": 0},
    {"question": "What do you drink?", "choices": ["water", "stones"], "gold": 0},
    {"question": "Numbers 0 1 2 3?", "choices": ["4 5 6", "the quick brown fox", "!?"], "gold": 0},
]


@pytest.fixture
def choice_file(tmp_path):
    f = tmp_path / "tiny_mc.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in CHOICES))
    return f


def _hf_choice_logprobs(model, tokenizer, states):
    """Sum of transformers' log-probs over each continuation, on the engine's own token split."""
    out = []
    for st in states:
        ctx, cont = split_tokens(tokenizer, st["_context"], st["_continuation"])
        ids = torch.tensor([ctx + cont])
        with torch.no_grad():
            logp = model(ids).logits.float().log_softmax(-1)[0]
        out.append(sum(logp[len(ctx) - 1 + j, t].item() for j, t in enumerate(cont)))
    return out


def _scored_states(run_dir):
    states = json.loads((run_dir / "scenario_state.json").read_text())["request_states"]
    for st in states:  # rebuild (context, continuation) from HELM's record: prompt = context + continuation
        cont = st["result"]["completions"][0]["text"]
        st["_continuation"], st["_context"] = cont, st["request"]["prompt"][: -len(cont)]
    return states


def _run(args):
    res = CliRunner().invoke(helm_cmd.command, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return res


def test_tiny_llama_end_to_end_and_logprobs_match_transformers(tmp_path, tiny_llama, choice_file):
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "out"
    _run(["--model", str(tiny_llama), "--suite", "tiny", "--output-path", str(out), "--scenario", "demo",
          "--scenario-file", str(choice_file), "--max-eval-instances", "3", "--max-tokens", "4"])
    suite = out / "runs" / "tiny"
    model_slug = f"flexlamps_{tiny_llama.name}"
    demo = suite / f"demo:model={model_slug}"
    mc = suite / f"file:name=tiny_mc,model={model_slug}"
    for run in (demo, mc):
        assert {p.name for p in run.iterdir() if not p.name.startswith(".")} == set(RUN_FILES)
    gen = json.loads((demo / "scenario_state.json").read_text())["request_states"]
    assert len(gen) == 3 and all(len(s["result"]["completions"][0]["tokens"]) <= 4 for s in gen)

    states = _scored_states(mc)
    assert len(states) == 8
    from flexlamps import LLM

    tok = LLM(str(tiny_llama)).tokenizer
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_llama, torch_dtype=torch.float32).eval()
    ref = _hf_choice_logprobs(model, tok, states)
    ours = [s["result"]["completions"][0]["logprob"] for s in states]
    assert ours == pytest.approx(ref, abs=1e-3)
    # and the per-token values add up to the sum HELM reads
    for s in states:
        comp = s["result"]["completions"][0]
        assert sum(t["logprob"] for t in comp["tokens"]) == pytest.approx(comp["logprob"], abs=1e-4)


@pytest.mark.slow
def test_smollm2_choice_logprobs_match_transformers(tmp_path, smollm2_path, choice_file):
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "out"
    # quiz questions, so the quiz template (lighteval's cloze prompt) on request
    _run(["--model", "smollm2-135m", "--dtype", "float32", "--suite", "smol", "--output-path", str(out),
          "--scenario", f"file:path={choice_file},prompt_template=quiz"])
    run = out / "runs" / "smol" / "file:name=tiny_mc,template=quiz,model=flexlamps_smollm2-135m"
    states = _scored_states(run)
    from flexlamps import LLM

    tok = LLM("smollm2-135m").tokenizer
    model = transformers.AutoModelForCausalLM.from_pretrained(
        smollm2_path.parent, gguf_file=smollm2_path.name, torch_dtype=torch.float32).eval()
    ref = _hf_choice_logprobs(model, tok, states)
    assert [s["result"]["completions"][0]["logprob"] for s in states] == pytest.approx(ref, abs=1e-3)
    stats = {s["name"]["name"]: s["sum"] for s in json.loads((run / "stats.json").read_text())}
    assert stats["mc_accuracy_char_norm"] >= 2 / 3  # easy questions: a real model gets most right

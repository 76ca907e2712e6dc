"""A user's file in the documented default format scores what lm-evaluation-harness and the model
cards score: HellaSwag-style `ctx + " " + ending` (checked against transformers, tiny model and
SmolLM2), and WinoGrande-style partial scoring (checked against `LLM.score` per option)."""

import json

import pytest
import torch
from click.testing import CliRunner

import flexlamps.commands.helm as helm_cmd

HELLASWAG = [  # {id, query, choices, gold}, as a user exports HellaSwag
    {"id": "ind_4", "query": "Roof shingle removal: A man is sitting on a roof. He",
     "choices": ["is using wrap to wrap a pair of skis.", "is ripping level tiles off.",
                 "is holding a rubik's cube.", "starts pulling up roofing on a roof."], "gold": "3"},
    {"id": "ind_9", "query": "Clean and jerk: A lady walks to a barbell. She bends down and grabs the pole. The lady",
     "choices": ["swings and lands in her arms.", "pulls the barbell forward.", "pulls a rope attached to the barbell.",
                 "stands and lifts the weight over her head."], "gold": "3"},
    {"id": "ind_12", "query": "Canoeing: Two women and a child are in a canoe. The child and a different man",
     "choices": ["are then shown paddling down a river in a boat while a woman talks.",
                 "are driving the canoe, they go down the river flowing side to side.",
                 "sit in a canoe while the man paddles.", "walking go down the rapids."],
     "gold": "2"},
    {"id": "ind_18", "query": "High jump: A boy is running down a track. The boy",
     "choices": ["runs into a car.", "gets in a mat.", "lifts his body above the height of a pole.",
                 "stands on his hands and springs."], "gold": "2"},
]

WINOGRANDE = [  # one context per option, the sentence's rest shared
    {"id": "wg-1", "contexts": ["Sarah was a much better surgeon than Maria so Sarah",
                                "Sarah was a much better surgeon than Maria so Maria"],
     "continuation": "always got the easier cases.", "gold": 1},
    {"id": "wg-2", "contexts": ["The trophy doesn't fit into the brown suitcase because the trophy",
                                "The trophy doesn't fit into the brown suitcase because the suitcase"],
     "continuation": "is too large.", "gold": 0},
    {"id": "wg-3", "contexts": ["Ian volunteered to eat Dennis's menudo after already having a bowl because Ian",
                                "Ian volunteered to eat Dennis's menudo after already having a bowl because Dennis"],
     "continuation": "despised eating intestine.", "gold": 1},
]


def _write(tmp_path, name, rows):
    f = tmp_path / name
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f


def _helm(tmp_path, model, f):
    out = tmp_path / "out"
    res = CliRunner().invoke(helm_cmd.command, ["--model", model, "--suite", "s", "--output-path", str(out),
                                                "--scenario-file", str(f), "--threads", "1",
                                                "--dtype", "float32"],  # the float reference's dtype
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return next((out / "runs" / "s").glob(f"file:name={f.stem},*"))


def _ours(run):
    states = json.loads((run / "scenario_state.json").read_text())["request_states"]
    lps = {(s["instance"]["id"], s["reference_index"]): s["result"]["completions"][0]["logprob"] for s in states}
    per = json.loads((run / "per_instance_stats.json").read_text())
    picks = {p["instance_id"]: next(s["sum"] for s in p["stats"] if s["name"]["name"] == "predicted_index")
             for p in per}
    return lps, picks


def _transformers_reference(model, tokenizer, rows):
    """lm-evaluation-harness's scoring on transformers: encode ctx + " " + ending whole, the context's
    own encoding is its prefix, sum the ending's log-probs; acc_norm divides by its characters."""
    lps, picks = {}, {}
    for row in rows:
        ctx_ids = tokenizer(row["query"])["input_ids"]
        scores = []
        for k, ending in enumerate(row["choices"]):
            whole = tokenizer(row["query"] + " " + ending)["input_ids"]
            assert whole[: len(ctx_ids)] == ctx_ids
            with torch.no_grad():
                logp = model(torch.tensor([whole])).logits.float().log_softmax(-1)[0]
            lp = sum(float(logp[j - 1, whole[j]]) for j in range(len(ctx_ids), len(whole)))
            lps[(row["id"], k)] = lp
            scores.append(lp / len(" " + ending))
        picks[row["id"]] = float(scores.index(max(scores)))
    return lps, picks


def _check_hellaswag(tmp_path, model_arg, hf_model, hf_tokenizer, tol):
    run = _helm(tmp_path, model_arg, _write(tmp_path, "hellaswag.jsonl", HELLASWAG))
    lps, picks = _ours(run)
    ref_lps, ref_picks = _transformers_reference(hf_model, hf_tokenizer, HELLASWAG)
    assert picks == ref_picks  # the same choice per item, under the user's own ids
    assert [lps[k] for k in ref_lps] == pytest.approx(list(ref_lps.values()), abs=tol)


def test_hellaswag_file_tiny_model_matches_transformers(tmp_path, tiny_llama):
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_llama, torch_dtype=torch.float32).eval()
    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tiny_llama / "tokenizer.json"), bos_token="<s>")
    _check_hellaswag(tmp_path, str(tiny_llama), model, _with_bos(tok), 1e-3)


def _with_bos(tok):
    """Prepend BOS as the tiny model's tokenizer config asks (add_bos_token)."""
    def encode(text):
        return {"input_ids": [tok.bos_token_id] + tok(text, add_special_tokens=False)["input_ids"]}
    return encode


@pytest.mark.slow
def test_hellaswag_file_smollm2_matches_transformers(tmp_path, smollm2_path):
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        smollm2_path.parent, gguf_file=smollm2_path.name, torch_dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(smollm2_path.parent, gguf_file=smollm2_path.name)
    _check_hellaswag(tmp_path, "smollm2-135m", model, tok, 2e-3)


def test_winogrande_partial_scoring_equals_llm_score(tmp_path, tiny_llama):
    from flexlamps import LLM

    run = _helm(tmp_path, str(tiny_llama), _write(tmp_path, "winogrande.jsonl", WINOGRANDE))
    lps, picks = _ours(run)
    llm = LLM(str(tiny_llama))
    for row in WINOGRANDE:
        direct = [o.logprob for o in llm.score(row["contexts"], [" " + row["continuation"]] * len(row["contexts"]))]
        assert [lps[(row["id"], k)] for k in range(len(direct))] == pytest.approx(direct, abs=1e-4)
        assert picks[row["id"]] == direct.index(max(direct))
    stats = {s["name"]["name"]: s["sum"] for s in json.loads((run / "stats.json").read_text())}
    assert "mc_accuracy_raw" in stats and "mc_accuracy_char_norm" not in stats

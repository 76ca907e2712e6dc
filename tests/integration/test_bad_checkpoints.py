"""A damaged or mistyped checkpoint given to --model is one line naming the file and the fix,
before the model loads: a truncated safetensors file, an index without `weight_map` or naming a
missing shard or tensor, config fields of the wrong type (the message names the folder's
config.json), a corrupt tokenizer.json or tokenizer_config.json, a truncated GGUF ("truncated",
the file named, not numpy's words)."""

import json
import shutil

import pytest
from click.testing import CliRunner

from flexlamps.cli import main


def _copy(tiny_llama, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(tiny_llama, folder)
    return folder


def _edit_config(folder, **fields):
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, **fields}))


def _shard(folder, extra_names=()):
    """The folder's one safetensors file renamed as a shard, with an index (plus `extra_names`)."""
    from safetensors import safe_open

    shard = folder / "model-00001-of-00001.safetensors"
    (folder / "model.safetensors").rename(shard)
    with safe_open(str(shard), framework="pt") as handle:
        names = list(handle.keys())
    weight_map = {name: shard.name for name in [*names, *extra_names]}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def _truncate(path, keep):
    path.write_bytes(path.read_bytes()[:keep])


DAMAGES = {
    "truncated safetensors": (lambda f: _truncate(f / "model.safetensors", 300_000),
                              ["model.safetensors", "truncated"]),
    "index without weight_map": (lambda f: (_shard(f), (f / "model.safetensors.index.json").write_text("{}")),
                                 ["model.safetensors.index.json", "weight_map"]),
    "index naming a tensor its shard lacks": (lambda f: _shard(f, ["model.layers.9.mlp.up_proj.weight"]),
                                              ["model-00001-of-00001.safetensors", "model.layers.9.mlp.up_proj"]),
    "index naming a missing shard": (lambda f: (_shard(f), (f / "model-00001-of-00001.safetensors").unlink()),
                                     ["model-00001-of-00001.safetensors", "not in"]),
    "num_hidden_layers a string": (lambda f: _edit_config(f, num_hidden_layers="two"),
                                   ["config.json: num_hidden_layers must be a positive integer, got 'two'"]),
    "rms_norm_eps a string": (lambda f: _edit_config(f, rms_norm_eps="1e-6"),
                              ["config.json: rms_norm_eps must be a number"]),
    "tie_word_embeddings a string": (lambda f: _edit_config(f, tie_word_embeddings="false"),
                                     ["config.json: tie_word_embeddings must be true or false"]),
    "num_attention_heads zero": (lambda f: _edit_config(f, num_attention_heads=0),
                                 ["config.json: num_attention_heads must be a positive integer"]),
    "config not an object": (lambda f: (f / "config.json").write_text("[1, 2]"),
                             ["config.json must hold a JSON object"]),
    "corrupt tokenizer.json": (lambda f: _truncate(f / "tokenizer.json", 100),
                               ["tokenizer.json is not a readable tokenizer file"]),
    "corrupt tokenizer_config.json": (lambda f: (f / "tokenizer_config.json").write_text('{"bos'),
                                      ["tokenizer_config.json is not valid JSON"]),
}


def _generate(model, tmp_path):
    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hello"}\n')
    return CliRunner().invoke(main, ["generate", "--model", str(model), "--prompts", str(prompts), "--out",
                                     str(tmp_path / "out.jsonl"), "--max-new-tokens", "2", "--no-progress"])


def _assert_one_line(res, needles, model):
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output  # no traceback
    lines = [ln for ln in res.output.strip().splitlines() if not ln.startswith("hint: ")]
    assert len(lines) == 1 and lines[0].startswith("Error: ") and str(model) in lines[0], res.output
    words = lines[0].replace(str(model), "MODEL")  # the temp path holds the test's name
    assert all(n in words for n in needles), res.output


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_hf_folder_is_one_line_naming_its_file(damage, tiny_llama, tmp_path, no_model_load):
    folder = _copy(tiny_llama, tmp_path)
    spoil, needles = DAMAGES[damage]
    spoil(folder)
    _assert_one_line(_generate(folder, tmp_path), needles, folder)


@pytest.mark.parametrize("keep", [0, 100, 3000, -1000])
def test_a_truncated_gguf_says_truncated_and_names_the_file(keep, tmp_path, no_model_load):
    from tests.gguf_models import write_llama_gguf

    path = write_llama_gguf(tmp_path / "tiny.gguf", lambda name, layer: None, hidden=64, ffn=128, layers=2,
                            heads=4, kv_heads=2, vocab=300)
    _truncate(path, keep if keep >= 0 else path.stat().st_size + keep)  # in the header, in the tensors
    res = _generate(path, tmp_path)
    _assert_one_line(res, ["empty" if keep == 0 else "truncated"], path)
    assert "reshape" not in res.output and "index" not in res.output


def test_the_folder_that_loads_still_runs(tiny_llama, tmp_path):
    """The checks read headers only: an intact copy generates as before."""
    res = _generate(_copy(tiny_llama, tmp_path), tmp_path)
    assert res.exit_code == 0, res.output


def _nan_weight(folder):
    """One NaN in one matrix of the folder's checkpoint (a damaged or badly converted file)."""
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    tensors = load_file(path)
    tensors["model.layers.0.mlp.down_proj.weight"][0, 0] = float("nan")
    save_file(tensors, path, metadata={"format": "pt"})


def test_a_model_whose_weights_hold_nan_is_refused_when_it_runs(tiny_llama, tmp_path):
    """Checked at each step's chosen logits (a gather), where a NaN weight always shows: not at load,
    where it would cost a pass over every weight of every load."""
    folder = _copy(tiny_llama, tmp_path)
    _nan_weight(folder)
    res = _generate(folder, tmp_path)
    _assert_one_line(res, ["--model MODEL: the model computed NaN logits: its weights hold NaN"], folder)


def test_scoring_a_model_whose_weights_hold_nan_is_refused(tiny_llama, tmp_path):
    from flexlamps import LLM
    from flexlamps.engine.batch.sampling import NonFiniteLogitsError

    folder = _copy(tiny_llama, tmp_path)
    _nan_weight(folder)
    with pytest.raises(NonFiniteLogitsError, match="NaN logits"):
        LLM(str(folder), dtype="float32").score(["hello world"], [" the end"])


def test_a_chat_template_that_does_not_render_is_refused_with_chat(tiny_llama, tmp_path, no_model_load):
    folder = _copy(tiny_llama, tmp_path)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% for m in messages %}{{ m.content }"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hello"}\n')
    res = CliRunner().invoke(main, ["generate", "--model", str(folder), "--prompts", str(prompts), "--out",
                                    str(tmp_path / "out.jsonl"), "--chat"])
    _assert_one_line(res, ["its chat template does not render a user turn (TemplateSyntaxError"], folder)

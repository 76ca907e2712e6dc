"""The family registry: one list of what runs, read alike by `generate` (ModelConfig) and `plan`
(the planner's ModelSpec built from the same description), torch-free."""

import subprocess
import sys

import pytest

from flexlamps.models.config import ModelConfig, UnsupportedModelError
from tests.described import described
from flexlamps.models.families import families, family_for, supported_model_types
from flexlamps.models.forward import FORWARDS
from flexlamps.models.weight_specs import hf_name, weight_specs
from tests.checkpoints import CHECKPOINTS, GROUPS
from tests.conftest import REPO
from tests.unit.test_placement_model_spec import TINY_CONFIGS


def test_every_model_type_has_one_family_and_a_forward():
    claimed = [t for fam in families() for t in fam.model_types]
    assert len(claimed) == len(set(claimed)) == len(supported_model_types())
    for fam in families():
        assert fam.forward in FORWARDS, fam.name
        assert family_for(fam.model_types[0]) is fam


@pytest.mark.parametrize("model_type", sorted(TINY_CONFIGS))
def test_every_weight_has_a_distinct_checkpoint_name(model_type):
    cfg = ModelConfig.from_hf(TINY_CONFIGS[model_type])
    names = [hf_name(cfg, spec) for spec in weight_specs(cfg)]
    assert len(names) == len(set(names)) and all(isinstance(n, str) and n for n in names)


def test_an_unknown_family_is_refused_alike_by_generate_and_plan():
    config = {"model_type": "no-such-family", "hidden_size": 8}
    with pytest.raises(UnsupportedModelError) as by_generate:
        ModelConfig.from_hf(config)
    with pytest.raises(UnsupportedModelError) as by_plan:
        described(config)[1]
    assert str(by_generate.value) == str(by_plan.value)
    assert "no-such-family" in str(by_generate.value) and "flexlamps models" in str(by_generate.value)


def test_the_registry_and_the_planners_view_import_no_torch():
    code = ("import sys; from flexlamps.models.families import families; families(); "
            "import flexlamps.models.description; assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


# the model types of the dense decoder and the hybrid gated-DeltaNet families (their tests' checkpoints)
CHECKED_TYPES = sorted({CHECKPOINTS[k]["model_type"] for k in (*GROUPS["family"], *GROUPS["hybrid"])})


@pytest.mark.parametrize("model_type", CHECKED_TYPES)
def test_every_config_field_transformers_defines_is_read_or_known_inert(model_type):
    """No config option is dropped unseen: each field of transformers' config class of the model
    type is one the family reads (and runs or refuses) or one no forward reads (dropout, cache, init)."""
    import dataclasses

    import transformers

    from flexlamps.models.families.hf_fields import INERT_FIELDS

    cls = type(transformers.AutoConfig.for_model(model_type))
    fields = {f.name for f in dataclasses.fields(cls)}
    fam = family_for(model_type)
    assert fields - fam.reads - INERT_FIELDS == set(), fam.name


def _decoder(model_type: str, **extra) -> dict:
    return {"model_type": model_type, "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, **extra}


@pytest.mark.parametrize("config,field", [
    (_decoder("llama", rope_scaling={"rope_type": "dynamic", "factor": 2.0}), "'dynamic'"),
    (_decoder("qwen3", rope_parameters={"rope_type": "mrope", "rope_theta": 1e4}), "'mrope'"),
    (_decoder("gemma2", layer_types=["sliding_attention", "chunked_attention"], sliding_window=4),
     "'chunked_attention'"),
    (_decoder("gemma3_text", use_bidirectional_attention=True), "use_bidirectional_attention"),
    (_decoder("llama", hidden_act="gelu"), "hidden_act='gelu'"),
    (_decoder("phi3", rope_parameters={"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0] * 4}),
     "'long_factor'"),
    (_decoder("smollm3", no_rope_layers=[1]), "no_rope_layers"),
    (_decoder("phi3", rope_scaling={"type": "linear", "factor": 2.0}), "'linear'"),  # phi3: longrope only
])
def test_options_we_do_not_run_are_refused_alike_by_generate_and_plan(config, field):
    with pytest.raises(UnsupportedModelError) as by_generate:
        ModelConfig.from_hf(config)
    with pytest.raises(UnsupportedModelError) as by_plan:
        described(config)[1]
    assert str(by_generate.value) == str(by_plan.value) and field in str(by_generate.value)


def test_llama_attention_bias_reads_every_bias_transformers_builds():
    """attention_bias: q, k, v and o (o_proj.bias was once never read); mlp_bias: gate, up, down."""
    cfg = ModelConfig.from_hf(_decoder("llama", attention_bias=True, mlp_bias=True))
    names = {hf_name(cfg, s) for s in weight_specs(cfg) if s.layer == 0 and s.role == "bias"}
    assert names == {f"model.layers.0.self_attn.{p}_proj.bias" for p in "qkvo"} | \
        {f"model.layers.0.mlp.{p}_proj.bias" for p in ("gate", "up", "down")}
    qwen2 = ModelConfig.from_hf(_decoder("qwen2"))
    assert {s.local_name for s in weight_specs(qwen2) if s.layer == 0 and s.role == "bias"} == \
        {"q_bias", "k_bias", "v_bias"}


def test_phi3_reads_su_as_longrope():
    factors = {"short_factor": [1.0] * 4, "long_factor": [2.0] * 4}
    cfg = ModelConfig.from_hf(_decoder("phi3", original_max_position_embeddings=16, max_position_embeddings=64,
                                       rope_scaling={"type": "su", **factors}))
    assert cfg.rope_scaling == {"rope_type": "longrope", **factors, "original_max_position_embeddings": 16}


def test_windows_and_per_layer_options_are_read():
    mistral = ModelConfig.from_hf(_decoder("mistral", sliding_window=4096, max_position_embeddings=32768))
    assert [mistral.attention.layer_window(i) for i in range(2)] == [4096, 4096]
    qwen = ModelConfig.from_hf(_decoder("qwen2", use_sliding_window=True, sliding_window=8, max_window_layers=1))
    assert [qwen.attention.layer_window(i) for i in range(2)] == [None, 8]
    assert ModelConfig.from_hf(_decoder("qwen2", sliding_window=8)).attention.window is None  # not used
    gemma = ModelConfig.from_hf(_decoder("gemma3_text", num_hidden_layers=7, head_dim=8, rope_local_base_freq=10.0))
    assert [gemma.attention.layer_local_rope(i) for i in range(7)] == [True] * 5 + [False, True]
    assert gemma.rope_theta == 1_000_000.0 and gemma.attention.local_rope_theta == 10.0
    smol = ModelConfig.from_hf(_decoder("smollm3", num_hidden_layers=4))
    assert [smol.attention.layer_rotates(i) for i in range(4)] == [True, True, True, False]
    assert ModelConfig.from_json(gemma.to_json()) == gemma


def test_a_module_in_the_families_package_registers_its_family(tmp_path, monkeypatch):
    """Adding a family is adding its module: the registry finds every module of the package that
    defines FAMILY, with no list to extend (here a copy of ernie4_5 under another model_type)."""
    import sys

    import flexlamps.models.families as package

    source = (REPO / "flexlamps/models/families/ernie4_5.py").read_text()
    (tmp_path / "added_family.py").write_text(source.replace('name="ernie4_5", model_types=("ernie4_5",)',
                                                             'name="added", model_types=("added_type",)'))
    monkeypatch.setattr(package, "__path__", [*package.__path__, str(tmp_path)])
    monkeypatch.delitem(sys.modules, "flexlamps.models.families.added_family", raising=False)
    package.families.cache_clear()
    package._by_model_type.cache_clear()
    try:
        assert family_for("added_type").name == "added" and "added_type" in supported_model_types()
        cfg = ModelConfig.from_hf(_decoder("added_type"))
        ernie = ModelConfig.from_hf(_decoder("ernie4_5"))
        assert [s.name for s in weight_specs(cfg)] == [s.name for s in weight_specs(ernie)]
    finally:
        package.families.cache_clear()
        package._by_model_type.cache_clear()
        sys.modules.pop("flexlamps.models.families.added_family", None)

"""The tests' checkpoint builders do what they are asked or refuse: a zoo GGUF of quantized experts
holds every stacked expert in that type, and options a builder cannot honour are refused, never
dropped (tests/checkpoints.py, tests/decoder_gguf.py, tests/checkpoint_zoo.py)."""

import pytest

from tests.checkpoint_zoo import KINDS, CheckpointZoo
from tests.checkpoints import GGUF_MOE_OVERRIDES, checkpoint_fields, make_checkpoint
from tests.decoder_gguf import write_decoder_gguf


@pytest.mark.parametrize("kind", sorted(GGUF_MOE_OVERRIDES))
def test_a_zoo_file_of_q8_0_experts_holds_every_expert_in_q8_0(kind, tmp_path):
    """Mixtral's down experts (rows of 48) were written f32 in its `gguf:mixtral:Q8_0` file."""
    import gguf

    path = CheckpointZoo(tmp_path).path(f"gguf:{kind}:Q8_0")
    experts = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors if "_exps." in t.name}
    layers = checkpoint_fields(kind)["num_hidden_layers"]
    assert len(experts) == 3 * layers and set(experts.values()) == {"Q8_0"}, experts


def test_experts_whose_rows_are_not_whole_blocks_are_refused(tmp_path):
    folder = make_checkpoint(tmp_path / "mixtral", "mixtral", intermediate_size=48)
    with pytest.raises(ValueError, match=r"blk\.0\.ffn_down_exps\.weight: rows of 48 are not whole Q8_0 blocks"):
        write_decoder_gguf(folder, tmp_path / "model.gguf", quantize_experts="Q8_0")


def test_the_wide_width_of_config_fields_is_refused(tmp_path):
    with pytest.raises(ValueError, match="wide=True takes a CHECKPOINTS name"):
        make_checkpoint(tmp_path / "llama", checkpoint_fields("llama_gqa"), wide=True)


def test_a_random_llama_gguf_refuses_config_fields_it_cannot_write(tmp_path):
    with pytest.raises(ValueError, match=r"takes a vocab_size alone, not \['hidden_size'\]"):
        KINDS["gguf:llama:Q4_0"][1](tmp_path / "q4", {"hidden_size": 64, "vocab_size": 400})

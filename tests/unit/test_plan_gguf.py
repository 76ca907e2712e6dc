"""`flexlamps plan --model file.gguf`: the planner reads a GGUF's description through its family's
reader of the metadata (`gguf_description`), the one the engine loads it with, without torch."""

import json
import subprocess
import sys

from click.testing import CliRunner

from flexlamps.catalog import describe_model
from flexlamps.cli import main
from flexlamps.models.description import model_spec
from flexlamps.models.loading.checkpoint import GGUFReader
from tests.gguf_models import write_llama_gguf

SHAPE = dict(hidden=64, ffn=128, layers=2, heads=4, kv_heads=2, vocab=300)


def _gguf(tmp_path, types=lambda name, layer: None if name.endswith("norm") else "Q8_0"):
    return write_llama_gguf(tmp_path / "tiny-llama.gguf", types, **SHAPE)


def test_plan_describes_a_gguf_as_the_engine_reads_it(tmp_path):
    path = _gguf(tmp_path)
    spec = describe_model(str(path))
    assert spec == model_spec(GGUFReader(path).config, name="tiny-llama")
    assert (spec.num_layers, spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.intermediate_size,
            spec.vocab_size) == (2, 64, 4, 2, 128, 300)


def test_plan_command_prices_a_gguf(tmp_path):
    path = _gguf(tmp_path)
    result = CliRunner().invoke(main, ["plan", "--model", str(path), "--hardware", "t4-flexgen", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["model"]["name"] == "tiny-llama" and out["model"]["num_layers"] == 2
    assert out["plan"]["tokens_per_s"] > 0


def test_plan_names_a_damaged_gguf(tmp_path):
    path = tmp_path / "cut.gguf"
    path.write_bytes(_gguf(tmp_path).read_bytes()[:64])  # the magic, then the header cut short
    result = CliRunner().invoke(main, ["plan", "--model", str(path), "--hardware", "t4-flexgen"])
    assert result.exit_code == 2 and "truncated" in result.output and "cut.gguf" in result.output


def test_a_gguf_is_described_without_torch(tmp_path):
    path = _gguf(tmp_path)
    code = ("import sys; from flexlamps.catalog import describe_model; "
            f"spec = describe_model({str(path)!r}); assert 'torch' not in sys.modules, 'torch imported'; "
            "print(spec.num_layers)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "2", out.stderr

"""The family registry: one list of what runs, read alike by `generate` (ModelConfig) and `plan`
(the planner's ModelSpec built from the same description), torch-free."""

import subprocess
import sys

import pytest

from flexlamps.models.config import ModelConfig, UnsupportedModelError
from flexlamps.models.description import model_spec_from_hf
from flexlamps.models.families import families, family_for, supported_model_types
from flexlamps.models.forward import FORWARDS
from flexlamps.models.weight_specs import hf_name, weight_specs
from placement import ModelSpec
from tests.conftest import REPO
from tests.unit.test_placement_model_spec import TINY_CONFIGS


def test_every_model_type_has_one_family_and_a_forward():
    claimed = [t for fam in families() for t in fam.model_types]
    assert len(claimed) == len(set(claimed)) == len(supported_model_types())
    for fam in families():
        assert fam.forward in FORWARDS, fam.name
        assert family_for(fam.model_types[0]) is fam


@pytest.mark.parametrize("model_type", sorted(TINY_CONFIGS))
def test_the_planner_sizes_the_model_the_family_describes(model_type):
    """For the families placement also reads on its own, both readings give the same ModelSpec."""
    config = TINY_CONFIGS[model_type]
    assert model_spec_from_hf(config) == ModelSpec.from_hf_config(config)


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
        model_spec_from_hf(config)
    assert str(by_generate.value) == str(by_plan.value)
    assert "no-such-family" in str(by_generate.value) and "flexlamps models" in str(by_generate.value)


def test_the_registry_and_the_planners_view_import_no_torch():
    code = ("import sys; from flexlamps.models.families import families; families(); "
            "import flexlamps.models.description; assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)

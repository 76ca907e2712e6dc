"""The built-in models placement stores (`placement/model_presets.json`) are what their families
read from the presets' config.json subsets now: a change to a family or a preset that is not
written out (`python -m flexlamps.models.presets`) fails here."""

from flexlamps.models.presets import MODEL_CONFIGS, preset_specs, stored_text
from placement import model_preset
from placement.presets import MODEL_PRESETS_PATH, model_presets


def test_the_stored_presets_are_the_families_reading():
    assert MODEL_PRESETS_PATH.read_text() == stored_text()
    specs = preset_specs()
    assert model_presets() == list(MODEL_CONFIGS)
    assert all(model_preset(name) == spec and spec.tensors is not None for name, spec in specs.items())

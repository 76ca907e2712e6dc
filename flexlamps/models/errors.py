"""The error a model the user gave raises when no family runs it (its model_type, a config field or
an option no block implements): a `ValueError` naming the field, shown by every command as one line.
Its own module, torch-free, so the config, the family registry and the GGUF readers all raise it."""


class UnsupportedModelError(ValueError):
    pass

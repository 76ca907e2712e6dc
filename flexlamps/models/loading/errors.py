"""The one error a checkpoint the user gave raises when its files cannot be read as a model:
a `ValueError` whose message names the file and the fix, so every command shows it as one line.
Torch-free, so the readers of config, index and tokenizer files can raise it too."""

import json


class CheckpointError(ValueError):
    pass


def json_file(path, what: str):
    """The JSON value in `path` (the checkpoint's `what`, e.g. "tokenizer config"), or a
    CheckpointError naming the file: unreadable, not UTF-8, or not JSON."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except OSError as e:
        raise CheckpointError(f"cannot read {path} ({e.strerror})") from None
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise CheckpointError(f"{path} is not valid JSON ({e}): the {what} is damaged or cut short; copy or "
                              "download it again") from None

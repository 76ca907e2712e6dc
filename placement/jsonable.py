"""`to_json`/`from_json` for the planner's frozen dataclasses.

Nested dataclass fields are rebuilt from their type annotation; unknown keys are an error
that names the key, so a typo in a hand-written profile.json is caught, not ignored.
"""

import dataclasses
import json
import typing


def _dataclass_in(annotation):
    """The dataclass an annotation names, alone or as `X | None`; None otherwise."""
    if dataclasses.is_dataclass(annotation):
        return annotation
    found = [arg for arg in typing.get_args(annotation) if dataclasses.is_dataclass(arg)]
    return found[0] if len(found) == 1 else None


class JsonMixin:
    """Adds `to_dict`/`to_json`/`from_dict`/`from_json` to a dataclass."""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)

    @classmethod
    def from_dict(cls, data: dict):
        if not isinstance(data, dict):
            raise ValueError(f"{cls.__name__}: expected a JSON object, got {type(data).__name__}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise ValueError(f"{cls.__name__}: unknown field(s) {unknown}; known: {sorted(fields)}")
        hints = typing.get_type_hints(cls)
        kwargs = {}
        for name, value in data.items():
            field_type = _dataclass_in(hints[name])
            if field_type is not None and isinstance(value, dict):
                value = field_type.from_dict(value)
            kwargs[name] = value
        try:
            return cls(**kwargs)
        except TypeError as exc:  # a required field is missing
            raise ValueError(f"{cls.__name__}: {exc}") from None

    @classmethod
    def from_json(cls, text: str):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{cls.__name__}: not valid JSON ({exc})") from None
        return cls.from_dict(data)

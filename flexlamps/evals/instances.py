"""What a scenario is made of, in HELM's own terms: instances with an input and references.

Field names and JSON shapes follow crfm-helm's `Instance` / `Reference` so that the objects can
be written into `scenario_state.json` and `instances.json` without translation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

CORRECT_TAG = "correct"
TRAIN_SPLIT = "train"
VALID_SPLIT = "valid"
TEST_SPLIT = "test"
EVAL_SPLITS = (VALID_SPLIT, TEST_SPLIT)


@dataclass
class Reference:
    text: str
    tags: list[str] = field(default_factory=list)

    @property
    def is_correct(self) -> bool:
        return CORRECT_TAG in self.tags

    def to_json(self) -> dict:
        # HELM nests the text under `output` and refuses a reference without `tags`.
        return {"output": {"text": self.text}, "tags": list(self.tags)}

    @classmethod
    def from_json(cls, d: dict) -> "Reference":
        return cls(text=d["output"]["text"], tags=list(d.get("tags", [])))


@dataclass
class Instance:
    input: str
    references: list[Reference]
    split: str = TEST_SPLIT
    id: Optional[str] = None
    sub_split: Optional[str] = None

    @property
    def first_correct_reference(self) -> Optional[Reference]:
        return next((r for r in self.references if r.is_correct), None)

    @property
    def correct_references(self) -> list[Reference]:
        return [r for r in self.references if r.is_correct]

    @property
    def gold_index(self) -> Optional[int]:
        return next((i for i, r in enumerate(self.references) if r.is_correct), None)

    def to_json(self) -> dict:
        out = {
            "input": {"text": self.input},
            "references": [r.to_json() for r in self.references],
            "split": self.split,
            "id": self.id,
        }
        if self.sub_split is not None:
            out["sub_split"] = self.sub_split
        return out

    @classmethod
    def from_json(cls, d: dict) -> "Instance":
        return cls(
            input=d["input"]["text"],
            references=[Reference.from_json(r) for r in d["references"]],
            split=d.get("split", TEST_SPLIT),
            id=d.get("id"),
            sub_split=d.get("sub_split"),
        )


def mc_instance(question: str, choices: list[str], gold: int, split: str = TEST_SPLIT) -> Instance:
    """A multiple-choice instance: one reference per choice, the gold one tagged correct."""
    if not 0 <= gold < len(choices):
        raise ValueError(f"gold index {gold} is out of range for {len(choices)} choices")
    refs = [Reference(c, [CORRECT_TAG] if i == gold else []) for i, c in enumerate(choices)]
    return Instance(question, refs, split)


@dataclass
class Scenario:
    """A loaded scenario: its instances (train ones supply in-context examples) and metadata."""

    name: str
    description: str
    tags: list[str]
    instances: list[Instance]

    def assign_ids(self) -> None:
        # HELM's tools need an id on every instance; number them per split, in file order.
        counters: dict[str, int] = {}
        for inst in self.instances:
            if inst.id is None:
                n = counters.get(inst.split, 0)
                counters[inst.split] = n + 1
                inst.id = f"id{n}" if inst.split != TRAIN_SPLIT else f"train{n}"

    def to_json(self) -> dict:
        return {"name": self.name, "description": self.description, "tags": list(self.tags)}

"""HELM's `AdapterSpec`: how instances become prompts. Field names and defaults as in crfm-helm,
so `run_spec.json` / `scenario_state.json` carry it unchanged."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Optional

GENERATION = "generation"
MULTIPLE_CHOICE_JOINT = "multiple_choice_joint"
MULTIPLE_CHOICE_SEPARATE = "multiple_choice_separate_original"
LANGUAGE_MODELING = "language_modeling"
# flexlamps' own: log-likelihood of one gold continuation (LAMBADA); HELM has no such method.
CONTINUATION = "continuation_loglikelihood"
# flexlamps' own: one context per choice, one shared continuation scored after each (WinoGrande).
MULTIPLE_CHOICE_PARTIAL = "multiple_choice_partial"

METHODS = (GENERATION, MULTIPLE_CHOICE_JOINT, MULTIPLE_CHOICE_SEPARATE, LANGUAGE_MODELING, CONTINUATION,
           MULTIPLE_CHOICE_PARTIAL)
SCORED_METHODS = (MULTIPLE_CHOICE_SEPARATE, LANGUAGE_MODELING, CONTINUATION, MULTIPLE_CHOICE_PARTIAL)


@dataclass
class AdapterSpec:
    method: str = GENERATION
    global_prefix: str = ""
    global_suffix: str = ""
    instructions: str = ""
    input_prefix: str = "Input: "
    input_suffix: str = "\n"
    reference_prefix: str = "A. "
    reference_suffix: str = "\n"
    output_prefix: str = "Output: "
    output_suffix: str = "\n"
    instance_prefix: str = "\n"
    max_train_instances: int = 5
    max_eval_instances: Optional[int] = None
    num_outputs: int = 1
    num_train_trials: int = 1
    sample_train: bool = True
    model_deployment: str = ""
    model: str = ""
    temperature: float = 0.0
    max_tokens: int = 100
    stop_sequences: list[str] = field(default_factory=list)
    multi_label: bool = False

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"unknown adapter method {self.method!r}; one of {', '.join(METHODS)}")

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "AdapterSpec":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


def format_instructions(instructions: str) -> str:
    # HELM ends non-empty instructions with a newline; joined by instance_prefix that gives a blank line.
    return instructions + "\n" if instructions else ""


def generation_spec(instructions: str = "", input_noun: Optional[str] = None, output_noun: Optional[str] = None,
                    max_train_instances: int = 5, max_tokens: int = 5,
                    stop_sequences: Optional[list[str]] = None) -> AdapterSpec:
    """HELM's `get_generation_adapter_spec` (nouns followed by ': ')."""
    return AdapterSpec(
        method=GENERATION,
        instructions=format_instructions(instructions),
        input_prefix=f"{input_noun}: " if input_noun else "",
        input_suffix="\n",
        output_prefix=f"{output_noun}: " if output_noun else "",
        output_suffix="\n",
        max_train_instances=max_train_instances,
        max_tokens=max_tokens,
        stop_sequences=["\n"] if stop_sequences is None else stop_sequences,
    )


def multiple_choice_joint_spec(instructions: str, input_noun: Optional[str], output_noun: str,
                               max_train_instances: int = 5, max_tokens: int = 1) -> AdapterSpec:
    """HELM's `get_multiple_choice_joint_adapter_spec` (as `get_multiple_choice_adapter_spec` calls it)."""
    return AdapterSpec(
        method=MULTIPLE_CHOICE_JOINT,
        instructions=format_instructions(instructions),
        input_prefix=f"{input_noun}: " if input_noun else "",
        input_suffix="\n" if input_noun else "",
        output_prefix=f"{output_noun}: ",
        output_suffix="\n",
        max_train_instances=max_train_instances,
        num_outputs=5,
        max_tokens=max_tokens,
        stop_sequences=["\n"],
    )


def multiple_choice_separate_spec() -> AdapterSpec:
    """HELM's `get_multiple_choice_separate_adapter_spec`: '<input> <reference>', no examples."""
    return AdapterSpec(
        method=MULTIPLE_CHOICE_SEPARATE, instructions="", input_prefix="", input_suffix="",
        output_prefix=" ", output_suffix="", max_train_instances=0, max_tokens=0,
    )


def cloze_spec(max_train_instances: int = 0) -> AdapterSpec:
    """lighteval's cloze ("CF") formulation, as the SmolLM2 card uses it: 'Question: q\\nAnswer:' and
    each choice scored as ' choice' (examples, if any, end in the gold choice and a blank line)."""
    return AdapterSpec(
        method=MULTIPLE_CHOICE_SEPARATE, instructions="", input_prefix="Question: ", input_suffix="\n",
        output_prefix="Answer: ", output_suffix="\n", max_train_instances=max_train_instances, max_tokens=0,
    )


def language_modeling_spec() -> AdapterSpec:
    return AdapterSpec(method=LANGUAGE_MODELING, input_prefix="", input_suffix="", output_prefix="",
                       output_suffix="", instance_prefix="", max_train_instances=0, max_tokens=0)


def continuation_spec() -> AdapterSpec:
    """Context, then the gold continuation after one space (lm-eval's LAMBADA convention)."""
    return AdapterSpec(method=CONTINUATION, input_prefix="", input_suffix="", output_prefix=" ",
                       output_suffix="", max_train_instances=0, max_tokens=0)

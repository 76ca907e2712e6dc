"""The documented format of a user's own evaluation file (docs/helm.md, "Your own data").

One JSON object a line, all of one kind, told by its fields:

    multiple choice   {"id"?, "context", "choices": [str, ...], "gold": int}
    partial scoring   {"id"?, "contexts": [str, ...], "continuation": str, "gold": int}
    generation        {"id"?, "prompt", "references": str | [str, ...]}

plus an optional `"split": "train"` (in-context examples; "test" by default). Aliases kept from
the first format: `query`/`question` for `context`, `input` for `prompt`, `answer` for
`references`. A first line `{"settings": {...}}` names the metric, the prompt template and, for
generation, `max_tokens` and `stop`; `--scenario file:path=F,metric=...` overrides it.

Multiple choice scores `" " + choice` after the (templated) context; partial scoring scores
`" " + continuation` after each context (WinoGrande's partial evaluation). Nothing is guessed: an
unknown field, kind, metric or template is an error naming the file, the line and the fix.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from flexlamps.evals.adapter_spec import (
    GENERATION,
    MULTIPLE_CHOICE_PARTIAL,
    MULTIPLE_CHOICE_SEPARATE,
    AdapterSpec,
)
from flexlamps.evals.instances import (
    CORRECT_TAG,
    TEST_SPLIT,
    TRAIN_SPLIT,
    VALID_SPLIT,
    Instance,
    Reference,
    Scenario,
    mc_instance,
)
from flexlamps.evals.scenario_files import ScenarioError, read_jsonl

MULTIPLE_CHOICE = "multiple_choice"
PARTIAL = "partial"
GENERATION_KIND = "generation"
KINDS = (MULTIPLE_CHOICE, PARTIAL, GENERATION_KIND)

# The field that tells a line's kind, and every field that kind allows (aliases mapped first).
_KIND_FIELD = {"choices": MULTIPLE_CHOICE, "contexts": PARTIAL, "prompt": GENERATION_KIND}
_FIELDS = {
    MULTIPLE_CHOICE: {"id", "split", "context", "choices", "gold"},
    PARTIAL: {"id", "split", "contexts", "continuation", "gold"},
    GENERATION_KIND: {"id", "split", "prompt", "references"},
}
_ALIASES = {"query": "context", "question": "context", "input": "prompt", "answer": "references"}

# Metric names a file may give -> HELM stat names flexlamps writes.
METRICS = {
    "acc": "mc_accuracy_raw",
    "acc_norm": "mc_accuracy_char_norm",
    "acc_norm_tokens": "mc_accuracy_token_norm",
    "exact_match": "exact_match",
    "quasi_exact_match": "quasi_exact_match",
    "prefix_exact_match": "prefix_exact_match",
    "f1": "f1_score",
    "rouge_l": "rouge_l",
}
KIND_METRICS = {
    MULTIPLE_CHOICE: ("acc_norm", "acc", "acc_norm_tokens"),  # first: the default
    PARTIAL: ("acc",),
    GENERATION_KIND: ("exact_match", "quasi_exact_match", "prefix_exact_match", "f1", "rouge_l"),
}
# Named prompt templates; any other template is a string holding the placeholder once.
TEMPLATES = {"none": "{%s}", "quiz": "Question: {%s}\nAnswer:"}
_PLACEHOLDER = {MULTIPLE_CHOICE: "context", PARTIAL: "context", GENERATION_KIND: "prompt"}
SETTINGS = ("kind", "metric", "prompt_template", "max_tokens", "stop")


class CustomFileError(ScenarioError):
    """The user's file (or its settings) does not follow the documented format."""


@dataclass(frozen=True)
class FileSettings:
    kind: str
    metric: str  # a name from METRICS
    prompt_template: str = "none"  # a TEMPLATES name or a string with the placeholder
    max_tokens: int = 32  # generation only
    stop: tuple[str, ...] = ("\n",)  # generation only

    @property
    def template_text(self) -> str:
        if self.prompt_template in TEMPLATES:
            return TEMPLATES[self.prompt_template] % _PLACEHOLDER[self.kind]
        return self.prompt_template

    @property
    def template_label(self) -> str:
        """Short, file-name-safe name of the template for run names."""
        if self.prompt_template in TEMPLATES:
            return self.prompt_template
        return "t" + hashlib.sha256(self.prompt_template.encode()).hexdigest()[:8]

    def template_parts(self) -> tuple[str, str]:
        """(text before, text after) the placeholder."""
        before, _, after = self.template_text.partition("{%s}" % _PLACEHOLDER[self.kind])
        return before, after


@dataclass
class CustomFile:
    scenario: Scenario
    settings: FileSettings
    sha256: str  # of the file's bytes: part of the run's identity
    lines: dict = field(default_factory=dict)  # instance id -> line number, for messages


def _settings(path: Path, given: dict, kind: str) -> FileSettings:
    unknown = sorted(set(given) - set(SETTINGS))
    if unknown:
        raise CustomFileError(f"{path}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(SETTINGS)}")
    if given.get("kind", kind) != kind:
        raise CustomFileError(f"{path}: settings say kind {given['kind']!r} but the lines are {kind} "
                              f"(fields {sorted(_FIELDS[kind] - {'id', 'split'})})")
    metric = given.get("metric", KIND_METRICS[kind][0])
    if metric not in KIND_METRICS[kind]:
        raise CustomFileError(f"{path}: metric {metric!r} does not apply to {kind}; "
                              f"use one of {', '.join(KIND_METRICS[kind])}")
    template = given.get("prompt_template", "none")
    placeholder = "{%s}" % _PLACEHOLDER[kind]
    if not isinstance(template, str) or (template not in TEMPLATES and template.count(placeholder) != 1):
        raise CustomFileError(f"{path}: prompt_template must be one of {', '.join(TEMPLATES)} or a string "
                              f"holding {placeholder} once, not {template!r}")
    if kind == PARTIAL and template != "none":
        raise CustomFileError(f"{path}: partial scoring takes no prompt_template; put the text in the contexts")
    try:
        max_tokens = int(given.get("max_tokens", 32))
    except (TypeError, ValueError):
        raise CustomFileError(f"{path}: max_tokens must be an integer") from None
    stop = given.get("stop", ["\n"])
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise CustomFileError(f"{path}: stop must be a string or a list of strings")
    if kind != GENERATION_KIND and ("max_tokens" in given or "stop" in given):
        raise CustomFileError(f"{path}: max_tokens and stop apply to generation files only")
    return FileSettings(kind, metric, template, max_tokens, tuple(stop))


def _line_kind(where: str, row: dict) -> str:
    kinds = {k for f, k in _KIND_FIELD.items() if f in row}
    if len(kinds) != 1:
        raise CustomFileError(f"{where}: a line needs exactly one of 'choices' (multiple choice), 'contexts' "
                              f"(partial scoring) or 'prompt' (generation); it has fields {sorted(row)}")
    kind = kinds.pop()
    unknown = sorted(set(row) - _FIELDS[kind])
    if unknown:
        raise CustomFileError(f"{where}: unknown field(s) {', '.join(unknown)} for {kind}; "
                              f"allowed: {', '.join(sorted(_FIELDS[kind]))}")
    return kind


def _gold(where: str, row: dict, n: int) -> int:
    gold = row.get("gold")
    if isinstance(gold, str) and gold.strip().isdigit():
        gold = int(gold)
    if not isinstance(gold, int) or isinstance(gold, bool) or not 0 <= gold < n:
        raise CustomFileError(f"{where}: gold must be the index (0..{n - 1}) of the correct choice, not {gold!r}")
    return gold


def _strings(where: str, row: dict, name: str, least: int) -> list[str]:
    value = row.get(name)
    if isinstance(value, str) and least == 1:
        value = [value]
    if not isinstance(value, list) or len(value) < least or not all(isinstance(v, str) for v in value):
        raise CustomFileError(f"{where}: {name!r} must be a list of at least {least} strings")
    return value


def _instance(where: str, row: dict, kind: str) -> Instance:
    split = row.get("split", TEST_SPLIT)
    if split not in (TRAIN_SPLIT, VALID_SPLIT, TEST_SPLIT):
        raise CustomFileError(f"{where}: split must be train, valid or test, not {split!r}")
    if kind == MULTIPLE_CHOICE:
        if not isinstance(row.get("context"), str):
            raise CustomFileError(f"{where}: 'context' must be a string")
        choices = _strings(where, row, "choices", 2)
        return mc_instance(row["context"], choices, _gold(where, row, len(choices)), split)
    if kind == PARTIAL:
        if not isinstance(row.get("continuation"), str) or not row["continuation"].strip():
            raise CustomFileError(f"{where}: 'continuation' must be a non-empty string")
        contexts = _strings(where, row, "contexts", 2)
        gold = _gold(where, row, len(contexts))
        # HELM terms: the shared continuation is the input, each context a reference.
        refs = [Reference(c, [CORRECT_TAG] if i == gold else []) for i, c in enumerate(contexts)]
        return Instance(row["continuation"].strip(), refs, split)
    if not isinstance(row.get("prompt"), str):
        raise CustomFileError(f"{where}: 'prompt' must be a string")
    refs = _strings(where, row, "references", 1)
    return Instance(row["prompt"], [Reference(r, [CORRECT_TAG]) for r in refs], split)


def _assign_ids(path: Path, insts: list[Instance], given: list[Optional[str]], lines: list[int]) -> dict:
    if any(g is not None for g in given) and not all(g is not None for g in given):
        missing = lines[given.index(None)]
        raise CustomFileError(f"{path}:{missing}: some lines have an 'id' and this one has none; give every "
                              "line an id or none (then lines are numbered id0, id1, ...)")
    seen: dict[str, int] = {}
    for inst, uid, lineno in zip(insts, given, lines):
        if uid is not None:
            if uid in seen:
                raise CustomFileError(f"{path}:{lineno}: id {uid!r} is also on line {seen[uid]}; ids must be unique")
            seen[uid] = lineno
            inst.id = uid
    return seen


def load_custom_file(path: Path, name: Optional[str] = None, overrides: Optional[dict] = None) -> CustomFile:
    """Read and check a whole file; `overrides` (from `--scenario file:...`) win over its settings line."""
    path = Path(path)
    rows = read_jsonl(path)
    given: dict = {}
    if rows and set(rows[0][1]) == {"settings"}:
        given = rows.pop(0)[1]["settings"]
        if not isinstance(given, dict):
            raise CustomFileError(f"{path}:1: 'settings' must be an object, e.g. {{\"metric\": \"acc\"}}")
    given = {**given, **(overrides or {})}
    for lineno, row in rows:
        if "settings" in row:
            raise CustomFileError(f"{path}:{lineno}: a settings line must be the file's first line, alone")
    if not rows:
        raise CustomFileError(f"{path}: no instances in file")
    kind = None
    insts, ids, lines = [], [], []
    for lineno, row in rows:
        where = f"{path}:{lineno}"
        row = {_ALIASES.get(k, k): v for k, v in row.items()}
        line_kind = _line_kind(where, row)
        if kind is None:
            kind, first = line_kind, lineno
        elif line_kind != kind:
            raise CustomFileError(f"{where}: this line is {line_kind} but line {first} is {kind}; "
                                  "one file holds one kind")
        insts.append(_instance(where, row, kind))
        ids.append(None if row.get("id") is None else str(row["id"]))
        lines.append(lineno)
    by_id = _assign_ids(path, insts, ids, lines)
    settings = _settings(path, given, kind)
    scen = Scenario(name or path.stem, f"Instances from {path.name} ({kind}).", ["custom", kind], insts)
    return CustomFile(scen, settings, hashlib.sha256(path.read_bytes()).hexdigest(), by_id)


def adapter_spec_for(settings: FileSettings) -> AdapterSpec:
    """The template around the context (or prompt); choices and continuations follow after one
    space, in-context examples (`split: train` lines) are separated by a blank line."""
    before, after = settings.template_parts()
    if settings.kind == GENERATION_KIND:
        return AdapterSpec(method=GENERATION, input_prefix=before, input_suffix=after, output_prefix=" ",
                           output_suffix="\n", instance_prefix="\n", max_train_instances=0,
                           max_tokens=settings.max_tokens, stop_sequences=list(settings.stop))
    method = MULTIPLE_CHOICE_SEPARATE if settings.kind == MULTIPLE_CHOICE else MULTIPLE_CHOICE_PARTIAL
    return AdapterSpec(method=method, input_prefix=before, input_suffix=after, output_prefix=" ",
                       output_suffix="", instance_prefix="\n\n", max_train_instances=0, max_tokens=0)

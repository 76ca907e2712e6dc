"""Run specs: a scenario description (`mmlu:subject=anatomy,method=cloze`) -> what to run and how.

Defaults follow HELM's run specs where HELM has the scenario (MMLU, GSM8K, TruthfulQA) and
lighteval's cloze prompts where the reference numbers come from lighteval (ARC, PIQA, the
SmolLM2 card's MMLU cloze).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Optional

from flexlamps.evals.adapter_spec import (
    CONTINUATION,
    GENERATION,
    LANGUAGE_MODELING,
    MULTIPLE_CHOICE_JOINT,
    MULTIPLE_CHOICE_SEPARATE,
    AdapterSpec,
    cloze_spec,
    continuation_spec,
    generation_spec,
    language_modeling_spec,
    multiple_choice_joint_spec,
    multiple_choice_separate_spec,
)
from flexlamps.evals.custom_file import GENERATION_KIND, METRICS, MULTIPLE_CHOICE, adapter_spec_for
from flexlamps.evals.scenarios import LOADERS, ScenarioError

if TYPE_CHECKING:
    from flexlamps.evals.custom_file import FileSettings

MC_SCENARIOS = ("mmlu", "arc", "piqa", "boolq", "openbookqa", "truthful_qa")
MC_METHODS = {"joint": MULTIPLE_CHOICE_JOINT, "separate": MULTIPLE_CHOICE_SEPARATE, "cloze": "cloze",
              MULTIPLE_CHOICE_JOINT: MULTIPLE_CHOICE_JOINT, MULTIPLE_CHOICE_SEPARATE: MULTIPLE_CHOICE_SEPARATE}
DEFAULT_MC_METHOD = {"mmlu": "joint", "truthful_qa": "joint", "openbookqa": "joint",
                     "arc": "cloze", "piqa": "cloze", "boolq": "cloze"}

GENERATION_METRICS = ["exact_match", "quasi_exact_match", "prefix_exact_match", "f1_score", "rouge_l"]
MC_SEPARATE_METRICS = ["exact_match", "mc_accuracy_raw", "mc_accuracy_token_norm", "mc_accuracy_char_norm"]
MC_JOINT_METRICS = ["exact_match", "quasi_exact_match"]


@dataclass
class RunSpec:
    name: str  # HELM run name, e.g. "mmlu:subject=anatomy,method=joint,model=flexlamps_smollm2-135m"
    scenario: str
    scenario_args: dict
    adapter_spec: AdapterSpec
    metrics: list[str]
    groups: list[str]
    main_metric: str = "exact_match"
    seed: int = 0

    def to_json(self) -> dict:
        # metric_specs must exist for HELM's tools; the classes named are HELM's equivalents.
        scored = self.adapter_spec.method not in (GENERATION, MULTIPLE_CHOICE_JOINT)
        cls = "BasicReferenceMetric" if scored else "BasicGenerationMetric"
        return {
            "name": self.name,
            "scenario_spec": {"class_name": f"flexlamps.evals.scenarios.{self.scenario}",
                              "args": dict(self.scenario_args)},
            "adapter_spec": self.adapter_spec.to_json(),
            "metric_specs": [{"class_name": f"helm.benchmark.metrics.basic_metrics.{cls}",
                              "args": {"names": list(self.metrics)}}],
            "groups": list(self.groups),
        }


def parse_scenario_arg(text: str) -> tuple[str, dict]:
    """'mmlu:subject=anatomy,method=cloze' -> ('mmlu', {'subject': 'anatomy', 'method': 'cloze'})."""
    name, _, rest = text.partition(":")
    args = {}
    for part in filter(None, rest.split(",")):
        key, eq, value = part.partition("=")
        if not eq or not key:
            raise ScenarioError(f"bad scenario argument {part!r} in {text!r}; write key=value, e.g. "
                                "mmlu:subject=anatomy")
        args[key.strip()] = value.strip()
    if not name:
        raise ScenarioError(f"empty scenario name in {text!r}")
    return name.strip(), args


def model_slug(model: str) -> str:
    return model.replace("/", "_")


def _mc_spec(scenario: str, args: dict, method: str) -> tuple[AdapterSpec, list[str], str, str]:
    """(adapter spec, metrics, run group, main metric) for a multiple-choice scenario."""
    if method == "cloze":
        spec = cloze_spec()
        if scenario == "boolq":  # the passage and question are already in the input text
            spec = replace(spec, input_prefix="")
        return spec, MC_SEPARATE_METRICS, "_cloze", "mc_accuracy_char_norm"
    if method == MULTIPLE_CHOICE_SEPARATE:
        return multiple_choice_separate_spec(), MC_SEPARATE_METRICS, "_separate", "exact_match"
    if scenario == "mmlu":
        subject = args.get("subject", "").replace("_", " ")
        instr = f"The following are multiple choice questions (with answers) about {subject}."
    else:
        instr = ""
    noun = None if scenario == "boolq" else "Question"
    return multiple_choice_joint_spec(instr, noun, "Answer"), MC_JOINT_METRICS, "", "exact_match"


def _file_spec(settings: "FileSettings") -> tuple[AdapterSpec, list[str], str]:
    """(adapter spec, metrics, main metric) of a user's file, from its settings."""
    metrics = {MULTIPLE_CHOICE: MC_SEPARATE_METRICS, GENERATION_KIND: GENERATION_METRICS}.get(
        settings.kind, ["mc_accuracy_raw"])
    return adapter_spec_for(settings), list(metrics), METRICS[settings.metric]


def file_group(name: str) -> str:
    """The HELM run group of a user's file: one per file name (see helm_env.custom_run_group)."""
    return "custom_" + "".join(c if c.isalnum() or c in "_-" else "_" for c in name)


def _with_overrides(spec, name: str, model: str, num_shots: Optional[int], max_eval_instances: Optional[int],
                    max_tokens: Optional[int]):
    """The scenario's adapter spec with the command line's model, shots, instances and tokens."""
    updates = dict(model=model, model_deployment=model)
    if num_shots is not None:
        if spec.method in (LANGUAGE_MODELING, CONTINUATION) and num_shots:
            raise ScenarioError(f"{name}: in-context examples do not apply to {spec.method}; drop --num-shots")
        updates["max_train_instances"] = num_shots
    if max_eval_instances is not None:
        updates["max_eval_instances"] = max_eval_instances
    if max_tokens is not None and spec.method == GENERATION:
        updates["max_tokens"] = max_tokens
    return replace(spec, **updates)


def build_run_spec(scenario: "str | tuple[str, dict]", model: str, num_shots: Optional[int] = None,
                   max_eval_instances: Optional[int] = None, max_tokens: Optional[int] = None,
                   seed: int = 0, file_settings: "Optional[FileSettings]" = None) -> RunSpec:
    """`scenario` is 'name:k=v,...' or an already parsed (name, args); a `file` scenario's args
    carry `path` and `name`, and `file_settings` (from custom_file) says how to run it."""
    name, args = parse_scenario_arg(scenario) if isinstance(scenario, str) else (scenario[0], dict(scenario[1]))
    group = {"arc": f"arc_{args.get('subset', 'easy').lower()}"}.get(name, name)
    main = "exact_match"
    if name == "file":
        if file_settings is None:
            raise ScenarioError("a file scenario needs its settings (load it with custom_file.load_custom_file)")
        spec, metrics, main = _file_spec(file_settings)
        group = file_group(args.get("name", "custom"))
    elif name in MC_SCENARIOS:
        raw = args.get("method", DEFAULT_MC_METHOD.get(name, "cloze"))
        if raw not in MC_METHODS:
            raise ScenarioError(f"{name}: method must be joint, separate or cloze, not {raw!r}")
        method = MC_METHODS[raw]
        args["method"] = {MULTIPLE_CHOICE_JOINT: "joint", MULTIPLE_CHOICE_SEPARATE: "separate"}.get(method, method)
        spec, metrics, suffix, main = _mc_spec(name, args, method)
        group += suffix
    elif name == "gsm8k":
        spec = generation_spec(input_noun="Q", output_noun="A", max_train_instances=5, max_tokens=400,
                               stop_sequences=["\n\n"])
        metrics, main = ["final_number_exact_match", "exact_match"], "final_number_exact_match"
    elif name == "triviaqa":
        spec = generation_spec(input_noun="Question", output_noun="Answer", max_train_instances=0, max_tokens=32)
        metrics, main = list(GENERATION_METRICS), "quasi_exact_match"
    elif name == "lambada":
        spec, metrics = continuation_spec(), ["exact_match", "perplexity", "bits_per_byte"]
    elif name == "wikitext2":
        spec, metrics, main = language_modeling_spec(), ["perplexity", "bits_per_byte"], "bits_per_byte"
    elif name == "demo":
        spec = generation_spec(input_noun="Question", output_noun="Answer", max_train_instances=2, max_tokens=16)
        metrics, main = list(GENERATION_METRICS), "quasi_exact_match"
    else:
        raise ScenarioError(f"unknown scenario {name!r}; known: {', '.join(sorted(LOADERS))}, file")
    spec = _with_overrides(spec, name, model, num_shots, max_eval_instances, max_tokens)
    shown = {k: v for k, v in args.items() if k != "path"}
    if name == "file":  # settings that change the prompts name the run; the metric does not
        shown = {"name": args.get("name", "custom")}
        if file_settings.prompt_template != "none":
            shown["template"] = file_settings.template_label
    if num_shots is not None:
        shown["num_shots"] = str(num_shots)
    if seed:  # another draw of examples is another run
        shown["seed"] = str(seed)
    arg_text = ",".join(f"{k}={v}" for k, v in shown.items())
    run_name = f"{name}:{arg_text + ',' if arg_text else ''}model={model_slug(model)}"
    return RunSpec(run_name, name, args, spec, metrics, [group], main, seed)

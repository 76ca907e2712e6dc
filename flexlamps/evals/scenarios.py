"""Scenario loaders: local benchmark files (never downloaded) -> `Scenario`.

Each loader takes the scenario's arguments (from `name:key=value,...`) and the data folder, and
returns instances in HELM's form. The file formats are those of `../shared/data` (see its README).
"""

from __future__ import annotations

import csv
import os
import re
from pathlib import Path
from typing import Callable, Optional

from flexlamps.evals.custom_file import load_custom_file
from flexlamps.evals.demo_scenario import demo_scenario
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


def default_data_dir() -> Path:
    """$FLEXLAMPS_DATA, else `shared/data` beside the checkout, else `../shared/data` from cwd."""
    env = os.environ.get("FLEXLAMPS_DATA")
    if env:
        return Path(env)
    beside_checkout = Path(__file__).resolve().parents[3] / "shared" / "data"
    if beside_checkout.is_dir():
        return beside_checkout
    return Path("../shared/data")


def _need(path: Path, hint: str = "") -> Path:
    if not path.exists():
        raise ScenarioError(
            f"data file {path} not found{hint}; pass --data-dir DIR (or set FLEXLAMPS_DATA) "
            "to the folder holding the benchmark files"
        )
    return path


# --- text normalization used by lighteval's cloze ("CF") prompts -----------------------------


def lighteval_clean(text: str) -> str:
    """lighteval's English template clean-up: strip, then capitalize the first character.

    (Its ending-punctuation fix maps '?', '.', ',', ':' to themselves for English.)
    """
    text = text.strip()
    return text[:1].upper() + text[1:]


def _strip_prefix(text: str, prefix: str) -> str:
    return text[len(prefix):] if text.startswith(prefix) else text


# --- loaders ----------------------------------------------------------------------------------


def _mc_rows(path: Path, question_prefix: str, clean: bool) -> list[Instance]:
    out = []
    for lineno, row in read_jsonl(_need(path)):
        try:
            q, choices, gold = row["query"], row["choices"], int(row["gold"])
        except (KeyError, TypeError, ValueError):
            raise ScenarioError(f"{path}:{lineno}: expected keys query, choices (list), gold (int)") from None
        q = _strip_prefix(q, question_prefix).strip() if question_prefix else q.strip()
        if clean:
            q, choices = lighteval_clean(q), [lighteval_clean(c) for c in choices]
        try:
            out.append(mc_instance(q, list(choices), gold))
        except ValueError as e:
            raise ScenarioError(f"{path}:{lineno}: {e}") from None
    return out


def _is_cloze(args: dict) -> bool:
    return args.get("method", "") in ("cloze", "lighteval")


def load_arc(args: dict, data: Path) -> Scenario:
    subset = args.get("subset", "easy").lower()
    if subset not in ("easy", "challenge"):
        raise ScenarioError(f"arc: subset must be easy or challenge, not {subset!r}")
    insts = _mc_rows(data / "arc" / f"arc_{subset}.jsonl", "Question: ", _is_cloze(args))
    return Scenario(f"arc_{subset}", f"ARC-{subset.capitalize()} (AI2 Reasoning Challenge), test split.",
                    ["question answering", "science"], insts)


def load_piqa(args: dict, data: Path) -> Scenario:
    insts = _mc_rows(data / "piqa" / "piqa.jsonl", "Question: ", _is_cloze(args))
    return Scenario("piqa", "PIQA physical commonsense, validation split.", ["question answering"], insts)


def load_boolq(args: dict, data: Path) -> Scenario:
    insts = _mc_rows(data / "boolq" / "boolq.jsonl", "", False)
    return Scenario("boolq", "BoolQ yes/no questions on a passage, validation split.",
                    ["question answering"], insts)


def load_openbookqa(args: dict, data: Path) -> Scenario:
    insts = _mc_rows(data / "openbookqa" / "openbook_qa.jsonl", "", _is_cloze(args))
    return Scenario("openbookqa", "OpenBookQA, test split.", ["question answering"], insts)


def _mmlu_csv(path: Path, split: str, clean: bool) -> list[Instance]:
    out = []
    with open(_need(path, " (MMLU subjects are file names like anatomy_test.csv)"), newline="",
              encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header != ["question", "choice0", "choice1", "choice2", "choice3", "answer"]:
            raise ScenarioError(f"{path}:1: expected header question,choice0..choice3,answer")
        for lineno, row in enumerate(reader, 2):
            if len(row) != 6 or not row[5].strip().isdigit():
                raise ScenarioError(f"{path}:{lineno}: expected 6 columns ending in an answer 0-3")
            q, choices = row[0], row[1:5]
            if clean:
                q, choices = lighteval_clean(q), [lighteval_clean(c) for c in choices]
            out.append(mc_instance(q, choices, int(row[5]), split))
    return out


def mmlu_subjects(data: Path) -> list[str]:
    return sorted(p.name[: -len("_test.csv")] for p in (data / "mmlu" / "test").glob("*_test.csv"))


def load_mmlu(args: dict, data: Path) -> Scenario:
    subject = args.get("subject")
    if not subject:
        raise ScenarioError("mmlu needs a subject, e.g. mmlu:subject=anatomy")
    test = data / "mmlu" / "test" / f"{subject}_test.csv"
    if not test.exists() and (data / "mmlu" / "test").is_dir():
        raise ScenarioError(f"mmlu: unknown subject {subject!r}; known: {', '.join(mmlu_subjects(data))}")
    clean = _is_cloze(args)
    insts = _mmlu_csv(data / "mmlu" / "dev" / f"{subject}_dev.csv", TRAIN_SPLIT, clean)
    insts += _mmlu_csv(test, TEST_SPLIT, clean)
    return Scenario(f"mmlu_{subject}", f"MMLU, subject {subject.replace('_', ' ')} (test; dev for examples).",
                    ["knowledge", "multiple choice"], insts)


def gsm8k_reference(answer: str) -> str:
    """HELM's GSM8K target: the worked answer on one line, '#### N' read as 'The answer is N.'."""
    return answer.replace("####", "The answer is").replace("\n", " ") + "."


def load_gsm8k(args: dict, data: Path) -> Scenario:
    insts = []
    for split, fname in ((TRAIN_SPLIT, "train.jsonl"), (TEST_SPLIT, "test.jsonl")):
        path = data / "gsm8k" / fname
        for lineno, row in read_jsonl(_need(path)):
            if "question" not in row or "answer" not in row or "####" not in row["answer"]:
                raise ScenarioError(f"{path}:{lineno}: expected question and an answer ending in '#### N'")
            insts.append(Instance(row["question"], [Reference(gsm8k_reference(row["answer"]), [CORRECT_TAG])], split))
    return Scenario("gsm8k", "GSM8K grade-school math word problems (test; train for examples).",
                    ["reasoning", "math"], insts)


def _tqa_format(s: str) -> str:
    s = s.strip()
    return s if s.endswith(".") else s + "."


def load_truthfulqa(args: dict, data: Path) -> Scenario:
    """HELM's single-answer multiple choice: incorrect answers plus the best one, rotated by its
    first character so the correct letter varies; the first 20% of questions are the train split."""
    path = _need(data / "truthfulqa" / "TruthfulQA.csv")
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    split_k = int(len(rows) * 0.2)
    insts = []
    for i, row in enumerate(rows):
        best = _tqa_format(row["Best Answer"])
        wrong = [_tqa_format(a) for a in row["Incorrect Answers"].split(";") if a.strip()]
        refs = [Reference(a) for a in wrong] + [Reference(best, [CORRECT_TAG])]
        k = ord(best[0]) % len(refs)
        refs = refs[k:] + refs[:k]
        insts.append(Instance(row["Question"].strip(), refs, TRAIN_SPLIT if i < split_k else VALID_SPLIT))
    return Scenario("truthful_qa", "TruthfulQA single-answer multiple choice (HELM's mc_single).",
                    ["question answering", "truthfulness"], insts)


def load_lambada(args: dict, data: Path) -> Scenario:
    path = data / "lambada" / "lambada_openai.jsonl"
    insts = []
    for lineno, row in read_jsonl(_need(path)):
        if "context" not in row or "continuation" not in row:
            raise ScenarioError(f"{path}:{lineno}: expected keys context and continuation")
        insts.append(Instance(row["context"], [Reference(row["continuation"], [CORRECT_TAG])]))
    return Scenario("lambada", "LAMBADA (OpenAI version): predict the last word of a passage.",
                    ["language modeling"], insts)


def load_triviaqa(args: dict, data: Path) -> Scenario:
    path = data / "triviaqa" / "triviaqa_sm_sub.jsonl"
    insts = []
    for lineno, row in read_jsonl(_need(path)):
        if "context" not in row or "answer" not in row:
            raise ScenarioError(f"{path}:{lineno}: expected keys context, answer, aliases")
        q = _strip_prefix(row["context"], "Question: ")
        q = q[: -len("\nAnswer:")] if q.endswith("\nAnswer:") else q
        answers = list(dict.fromkeys([row["answer"], *row.get("aliases", [])]))
        insts.append(Instance(q.strip(), [Reference(a, [CORRECT_TAG]) for a in answers]))
    return Scenario("triviaqa", "TriviaQA closed-book (MosaicML 3,000-question subset).",
                    ["question answering", "knowledge"], insts)


_WIKI_TITLE = re.compile(r"^ = [^=].* = $")


def load_wikitext2(args: dict, data: Path) -> Scenario:
    """WikiText-2 raw test, one instance per article (split at top-level ' = Title = ' lines)."""
    text = _need(data / "wikitext2" / "wikitext-test.txt").read_text(encoding="utf-8").replace("\r\n", "\n")
    articles, current = [], []
    for line in text.split("\n"):
        if _WIKI_TITLE.match(line) and any(s.strip() for s in current):
            articles.append("\n".join(current))
            current = []
        current.append(line)
    if any(s.strip() for s in current):
        articles.append("\n".join(current))
    insts = [Instance(a.strip("\n"), []) for a in articles]
    return Scenario("wikitext2", "WikiText-2 raw test articles: perplexity and bits per byte.",
                    ["language modeling"], insts)


LOADERS: dict[str, Callable[[dict, Path], Scenario]] = {
    "mmlu": load_mmlu,
    "arc": load_arc,
    "piqa": load_piqa,
    "boolq": load_boolq,
    "openbookqa": load_openbookqa,
    "gsm8k": load_gsm8k,
    "truthful_qa": load_truthfulqa,
    "lambada": load_lambada,
    "triviaqa": load_triviaqa,
    "wikitext2": load_wikitext2,
    "demo": lambda args, data: demo_scenario(),
}


def load_scenario(name: str, args: dict, data_dir: Optional[Path] = None) -> Scenario:
    if name == "file":
        if "path" not in args:
            raise ScenarioError("file scenario needs path=FILE (or use --scenario-file FILE)")
        overrides = {k: v for k, v in args.items() if k not in ("path", "name")}
        scen = load_custom_file(Path(args["path"]), args.get("name"), overrides).scenario
    else:
        if name not in LOADERS:
            raise ScenarioError(f"unknown scenario {name!r}; known: {', '.join(sorted(LOADERS))}, "
                                "or --scenario-file FILE.jsonl")
        scen = LOADERS[name](args, Path(data_dir) if data_dir else default_data_dir())
    scen.assign_ids()
    return scen

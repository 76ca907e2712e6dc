"""Metric functions: text matches as HELM defines them, multiple-choice picks, perplexity.

Reference metrics take (gold, pred) and return a float; a run scores a prediction against every
correct reference and keeps the best, as HELM does.
"""

from __future__ import annotations

import math
import re
import string
from functools import lru_cache
from typing import Callable, Sequence

_PUNCT = set(string.punctuation)


def normalize_text(text: str, remove_articles: bool = True) -> str:
    """Lower-case, drop punctuation and (optionally) the articles a/an/the, squeeze whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    if remove_articles:
        text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match(gold: str, pred: str) -> float:
    return float(bool(pred) and gold.strip() == pred.strip())


def quasi_exact_match(gold: str, pred: str) -> float:
    return float(bool(pred) and normalize_text(gold) == normalize_text(pred))


def prefix_exact_match(gold: str, pred: str) -> float:
    """The prediction starts with the gold answer (zero-shot models often keep talking)."""
    return float(bool(pred) and pred.strip().startswith(gold.strip()))


def quasi_prefix_exact_match(gold: str, pred: str) -> float:
    return float(bool(pred) and normalize_text(pred).startswith(normalize_text(gold)))


def f1_score(gold: str, pred: str) -> float:
    """F1 over the *sets* of normalized words (HELM's definition, via nltk's f_measure)."""
    g, p = set(normalize_text(gold).split()), set(normalize_text(pred).split())
    if not g or not p:
        return 0.0
    common = len(g & p)
    if common == 0:
        return 0.0
    precision, recall = common / len(p), common / len(g)
    return 2 * precision * recall / (precision + recall)


# metrics another package computes: metric -> (its module, the pip package that installs it)
METRIC_PACKAGES = {"rouge_l": ("rouge_score", "rouge-score")}


def missing_metric_package(metrics) -> str | None:
    """Why one of `metrics` cannot be computed here (its package does not import), or None: checked
    before a model runs, so a run never ends in an ImportError after its answers are generated."""
    import importlib

    for name in sorted(set(metrics) & set(METRIC_PACKAGES)):
        module, package = METRIC_PACKAGES[name]
        try:
            importlib.import_module(module)
        except ImportError:
            return (f"the metric {name} needs the {package} package, which is not installed: pip install "
                    f"{package} (a dependency of flexlamps: reinstall it with pip install .)")
    return None


@lru_cache(maxsize=1)
def _rouge_l_scorer():
    try:
        from rouge_score import rouge_scorer
    except ImportError as e:  # the [helm] extra
        raise ImportError("rouge_l needs the rouge-score package: pip install rouge-score") from e
    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)


def rouge_l(gold: str, pred: str) -> float:
    return _rouge_l_scorer().score(gold, pred)["rougeL"].fmeasure


def final_number(text: str) -> str:
    """The last number in the text, commas removed ('' if none)."""
    # HELM's pattern, unescaped '.' included, so scores agree with HELM's to the instance.
    found = re.findall(r"-?[\d,]+(?:.\d+)?", text)
    return found[-1].replace(",", "") if found else ""


def final_number_exact_match(gold: str, pred: str) -> float:
    """GSM8K accuracy: the final numbers of gold and prediction agree."""
    return exact_match(final_number(gold), final_number(pred))


REFERENCE_METRICS: dict[str, Callable[[str, str], float]] = {
    "exact_match": exact_match,
    "quasi_exact_match": quasi_exact_match,
    "prefix_exact_match": prefix_exact_match,
    "quasi_prefix_exact_match": quasi_prefix_exact_match,
    "f1_score": f1_score,
    "rouge_l": rouge_l,
    "final_number_exact_match": final_number_exact_match,
}


def best_over_references(name: str, golds: Sequence[str], pred: str) -> float:
    fn = REFERENCE_METRICS[name]
    return max((fn(g, pred) for g in golds), default=0.0)


# --- multiple choice by log-probability ---------------------------------------------------

NORMALIZATIONS = ("raw", "token", "char")


def choice_scores(logprobs: Sequence[float], num_tokens: Sequence[int], texts: Sequence[str],
                  normalization: str) -> list[float]:
    """raw: sum of log-probs; token: per token (HELM's separate adapter); char: per character of
    the scored text, leading space included (lighteval's acc_norm / LogProbCharNorm)."""
    if normalization == "raw":
        return list(logprobs)
    if normalization == "token":
        return [lp / max(n, 1) for lp, n in zip(logprobs, num_tokens)]
    if normalization == "char":
        return [lp / max(len(t), 1) for lp, t in zip(logprobs, texts)]
    raise ValueError(f"normalization must be one of {NORMALIZATIONS}, not {normalization!r}")


def pick(scores: Sequence[float], gold: Sequence[int]) -> tuple[int, float]:
    """(predicted index, accuracy). Ties: first index predicted; accuracy is the share of the tied
    choices that are correct (HELM's rule)."""
    best = max(scores)
    tied = [i for i, s in enumerate(scores) if s >= best]
    return tied[0], len(set(tied) & set(gold)) / len(tied)


# --- language modeling ----------------------------------------------------------------------


def perplexity(total_logprob: float, num_tokens: int) -> float:
    return math.exp(-total_logprob / num_tokens) if num_tokens else float("nan")


def bits_per_byte(total_logprob: float, num_bytes: int) -> float:
    return -total_logprob / (math.log(2) * num_bytes) if num_bytes else float("nan")

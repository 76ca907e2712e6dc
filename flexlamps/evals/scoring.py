"""Per-instance stats from finished request states, the way HELM's basic metrics compute them."""

from __future__ import annotations

from collections import OrderedDict

from flexlamps.evals.adapter_spec import (
    CONTINUATION,
    GENERATION,
    LANGUAGE_MODELING,
    MULTIPLE_CHOICE_JOINT,
    MULTIPLE_CHOICE_PARTIAL,
    MULTIPLE_CHOICE_SEPARATE,
)
from flexlamps.evals.metrics import bits_per_byte, best_over_references, choice_scores, perplexity, pick
from flexlamps.evals.requests import RequestState
from flexlamps.evals.run_specs import RunSpec
from flexlamps.evals.stats import Stat, aggregate, single


def group_by_instance(states: list[RequestState]) -> "OrderedDict[tuple[int, str], list[RequestState]]":
    groups: OrderedDict = OrderedDict()
    for s in states:
        groups.setdefault((s.train_trial_index, s.instance.id), []).append(s)
    return groups


def _efficiency(states: list[RequestState], split: str) -> list[Stat]:
    """HELM's general-information stats; for several requests per instance, their sum."""
    prompt = sum(s.result.num_prompt_tokens or 0 for s in states)
    output = sum(len(s.result.completions[0].tokens) for s in states if not s.is_scored)
    runtime = sum(s.result.request_time or 0.0 for s in states)
    return [
        single("num_prompt_tokens", prompt, split),
        single("num_output_tokens", output, split),
        single("inference_runtime", runtime, split),
        single("num_train_instances", states[0].num_train_instances, split),
        single("prompt_truncated", float(any(s.prompt_truncated for s in states)), split),
    ]


# HELM stat name -> how the choice is picked; HELM's exact_match for separate is the per-token pick.
CHOICE_NORMALIZATION = {"mc_accuracy_raw": "raw", "mc_accuracy_token_norm": "token", "mc_accuracy_char_norm": "char",
                        "exact_match": "token"}


def _choice_stats(spec: RunSpec, states: list[RequestState], split: str) -> list[Stat]:
    """Accuracy under each normalization; `predicted_index` is the pick of the run's main metric."""
    inst = states[0].instance
    by_ref = sorted(states, key=lambda s: s.reference_index)
    lps = [s.result.completions[0].logprob for s in by_ref]
    ntok = [len(s.result.completions[0].tokens) for s in by_ref]
    texts = [s.continuation for s in by_ref]
    gold = [i for i, r in enumerate(inst.references) if r.is_correct]
    picks = {norm: pick(choice_scores(lps, ntok, texts, norm), gold) for norm in ("raw", "token", "char")}
    out = [single(m, picks[CHOICE_NORMALIZATION[m]][1], split) for m in spec.metrics if m in CHOICE_NORMALIZATION]
    shown = CHOICE_NORMALIZATION.get(spec.main_metric, "token")
    out.append(single("predicted_index", picks[shown][0], split))
    return out


def instance_stats(spec: RunSpec, states: list[RequestState]) -> list[Stat]:
    method = spec.adapter_spec.method
    inst = states[0].instance
    split = inst.split
    golds = [r.text for r in inst.correct_references]
    out: list[Stat] = []
    if method == GENERATION:
        pred = states[0].result.completions[0].text
        out += [single(m, best_over_references(m, golds, pred), split) for m in spec.metrics]
    elif method == MULTIPLE_CHOICE_JOINT:
        st = states[0]
        mapped = st.output_mapping.get(st.result.completions[0].text.strip())
        for m in spec.metrics:
            out.append(single(m, best_over_references(m, golds, mapped) if mapped is not None else 0.0, split))
    elif method in (MULTIPLE_CHOICE_SEPARATE, MULTIPLE_CHOICE_PARTIAL):
        out += _choice_stats(spec, states, split)
    elif method == CONTINUATION:
        r = states[0].result
        comp = r.completions[0]
        out.append(single("exact_match", float(bool(r.is_greedy)), split))
        out.append(single("logprob", comp.logprob, split))
        out.append(single("num_perplexity_tokens", len(comp.tokens), split))
        out.append(single("num_bytes", len(states[0].continuation.encode("utf-8")), split))
        out.append(single("perplexity", perplexity(comp.logprob, len(comp.tokens)), split))
        out.append(single("bits_per_byte", bits_per_byte(comp.logprob, len(states[0].continuation.encode())), split))
    elif method == LANGUAGE_MODELING:
        lp = sum(s.result.completions[0].logprob for s in states)
        ntok = sum(len(s.result.completions[0].tokens) for s in states)
        nbytes = sum(len(s.continuation.encode("utf-8")) for s in states)
        out += [single("logprob", lp, split), single("num_perplexity_tokens", ntok, split),
                single("num_bytes", nbytes, split), single("perplexity", perplexity(lp, ntok), split),
                single("bits_per_byte", bits_per_byte(lp, nbytes), split)]
    else:
        raise ValueError(f"no scoring for adapter method {method!r}")
    return out + _efficiency(states, split)


def run_stats(spec: RunSpec, per_instance: list[tuple[int, str, list[Stat]]]) -> list[Stat]:
    """Run-level stats: HELM's one-value-per-trial means, plus num_instances. Perplexity and bits
    per byte are recomputed from the summed log-probs, tokens and bytes (a mean of per-document
    perplexities would overweight short documents)."""
    stats = aggregate((trial, st) for trial, _, st in per_instance)
    splits = {s.split for _, _, sts in per_instance for s in sts} or {"test"}
    trials = {t for t, _, _ in per_instance}
    for split in sorted(splits):
        n = sum(1 for _, _, sts in per_instance if sts and sts[0].split == split) / max(len(trials), 1)
        stats.append(single("num_instances", n, split))
    if spec.adapter_spec.method in (LANGUAGE_MODELING, CONTINUATION):
        for split in splits:
            tot = {name: sum(s.sum for _, _, sts in per_instance for s in sts if s.name == name and s.split == split)
                   for name in ("logprob", "num_perplexity_tokens", "num_bytes")}
            fixed = {"perplexity": perplexity(tot["logprob"], int(tot["num_perplexity_tokens"]))}
            if tot["num_bytes"]:
                fixed["bits_per_byte"] = bits_per_byte(tot["logprob"], int(tot["num_bytes"]))
            stats = [single(s.name, fixed[s.name], split) if s.name in fixed and s.split == split else s
                     for s in stats]
    return stats

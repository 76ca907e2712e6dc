"""Adapters: instances -> prompts -> requests, as HELM's in-context-learning adapters build them.

The prompt is `global_prefix + instance_prefix.join([instructions, *examples, eval_block])`; the
instructions and examples are the same for every instance of a train trial, so they form a shared
prefix the engine computes once.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass
from itertools import cycle
from typing import Callable, Optional

from flexlamps.evals.adapter_spec import (
    CONTINUATION,
    GENERATION,
    LANGUAGE_MODELING,
    MULTIPLE_CHOICE_JOINT,
    MULTIPLE_CHOICE_PARTIAL,
    MULTIPLE_CHOICE_SEPARATE,
    AdapterSpec,
)
from flexlamps.evals.instances import EVAL_SPLITS, TRAIN_SPLIT, Instance
from flexlamps.evals.requests import Request, RequestState


def sample_examples(train: list[Instance], k: int, seed: int, sample_train: bool = True) -> list[Instance]:
    """HELM's example choice: labels ordered by how many train instances carry them (ties shuffled),
    then one instance drawn per label in turn until k; unlabeled instances fill the rest.

    Uses its own `random.Random(seed)`, which draws the same sequence as HELM's seeded global `random`.
    """
    rng = random.Random(seed)
    n = min(len(train), k)
    if not sample_train:
        return train[n * seed: n * (seed + 1)]
    by_label: dict[str, list[Instance]] = defaultdict(list)
    unlabeled = []
    for inst in train:
        ref = inst.first_correct_reference
        if ref is not None:
            by_label[ref.text].append(inst)
        else:
            unlabeled.append(inst)
    by_count: dict[int, list[str]] = defaultdict(list)
    for label, insts in sorted(by_label.items()):
        by_count[len(insts)].append(label)
    ordered: list[str] = []
    for count in sorted(by_count, reverse=True):
        labels = by_count[count]
        rng.shuffle(labels)
        ordered.extend(labels)
    pools = {label: list(insts) for label, insts in by_label.items()}
    examples: list[Instance] = []
    labels_iter = cycle(ordered)
    while n > 0 and ordered:
        pool = pools[next(labels_iter)]
        if not pool:
            if not any(pools.values()):
                break
            continue
        examples.append(pool.pop(rng.randrange(len(pool))))
        n -= 1
    return examples + rng.sample(unlabeled, n)


def reference_letter(spec: AdapterSpec, i: int) -> str:
    first = next(c for c in spec.reference_prefix if c.isalnum())
    return chr(ord(first) + i)


def _labelled_prefix(spec: AdapterSpec, i: int) -> str:
    first = next(c for c in spec.reference_prefix if c.isalnum())
    return spec.reference_prefix.replace(first, reference_letter(spec, i))


def gold_output(spec: AdapterSpec, inst: Instance, reference_index: Optional[int]) -> str:
    if reference_index is not None:
        return inst.references[reference_index].text
    correct = inst.correct_references
    if not correct:
        return "n/a"
    return ", ".join(r.text for r in correct) if spec.multi_label else correct[0].text


def example_block(spec: AdapterSpec, inst: Instance, include_output: bool,
                  reference_index: Optional[int] = None) -> str:
    """One instance's text; without the output it ends in the output prefix, right-stripped."""
    if spec.method == MULTIPLE_CHOICE_PARTIAL:  # an example: the gold context, then the continuation
        gold = inst.references[inst.gold_index].text
        return spec.input_prefix + gold + spec.input_suffix + spec.output_prefix + inst.input + spec.output_suffix
    text = spec.input_prefix + inst.input + spec.input_suffix
    if spec.method == MULTIPLE_CHOICE_JOINT:
        letters = []
        for i, ref in enumerate(inst.references):
            text += _labelled_prefix(spec, i) + ref.text + spec.reference_suffix
            if ref.is_correct:
                letters.append(reference_letter(spec, i))
        out = (", ".join(letters) if spec.multi_label else letters[0]) if letters else "n/a"
    else:
        out = gold_output(spec, inst, reference_index) if include_output else ""
    if include_output:
        return text + spec.output_prefix + out + spec.output_suffix
    return text + spec.output_prefix.rstrip()


@dataclass
class Prompt:
    shared: str  # global prefix + instructions + examples (+ the separator before the eval block)
    eval_block: str
    num_train_instances: int
    truncated: bool = False

    @property
    def text(self) -> str:
        return self.shared + self.eval_block


def build_prompt(spec: AdapterSpec, examples: list[Instance], eval_block: str,
                 fits: Optional[Callable[[str], bool]] = None) -> Prompt:
    """Join the blocks; drop examples from the end while the prompt does not fit, then, with none
    left, cut the text from the right (HELM's rules)."""
    blocks = [example_block(spec, e, include_output=True) for e in examples]
    while True:
        head = ([spec.instructions] if spec.instructions else []) + blocks
        shared = spec.global_prefix + "".join(b + spec.instance_prefix for b in head)
        prompt = Prompt(shared, eval_block + spec.global_suffix, len(blocks))
        if fits is None or fits(prompt.text):
            return prompt
        if not blocks:
            break
        blocks = blocks[:-1]
    lo, hi, text = 0, len(prompt.text), prompt.text  # longest prefix that fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(text[:mid]) else (lo, mid - 1)
    return Prompt(text[:lo], "", 0, truncated=True)


# About 1,500 tokens of English: well inside the context window of every model we run.
LM_PIECE_CHARS = 6000


def split_document(text: str, max_chars: int) -> list[str]:
    """Consecutive pieces of at most max_chars (a single longer line is cut hard), joined they give text."""
    pieces, cur = [], ""
    for line in text.splitlines(keepends=True):
        while len(line) > max_chars:
            if cur:
                pieces.append(cur)
                cur = ""
            pieces.append(line[:max_chars])
            line = line[max_chars:]
        if len(cur) + len(line) > max_chars and cur:
            pieces.append(cur)
            cur = ""
        cur += line
    if cur:
        pieces.append(cur)
    return pieces


def _fitting_pieces(text: str, fits: Optional[Callable[[str], bool]]) -> list[str]:
    """Pieces of LM_PIECE_CHARS at most, halved again until each fits the context window."""
    out, todo = [], split_document(text, LM_PIECE_CHARS)[::-1]
    while todo:
        piece = todo.pop()
        if fits is None or len(piece) < 2 or fits(piece):
            out.append(piece)
        else:
            todo.extend(split_document(piece, (len(piece) + 1) // 2)[::-1])
    return out


def _request(spec: AdapterSpec, prompt: str, **overrides) -> Request:
    kw = dict(model_deployment=spec.model_deployment, model=spec.model, prompt=prompt,
              temperature=spec.temperature, num_completions=spec.num_outputs, max_tokens=spec.max_tokens,
              stop_sequences=list(spec.stop_sequences))
    kw.update(overrides)
    return Request(**kw)


def adapt(spec: AdapterSpec, instances: list[Instance], seed_offset: int = 0,
          fits: Optional[Callable[[str], bool]] = None) -> list[RequestState]:
    """All request states of a run: for each train trial, the examples, then each eval instance's
    requests (one for generation / joint, one per reference for separate scoring)."""
    train = [i for i in instances if i.split == TRAIN_SPLIT]
    evals = [i for i in instances if i.split in EVAL_SPLITS]
    if spec.max_eval_instances is not None:
        evals = evals[: spec.max_eval_instances]
    states: list[RequestState] = []
    for trial in range(spec.num_train_trials):
        examples = sample_examples(train, spec.max_train_instances, seed=trial + seed_offset,
                                   sample_train=spec.sample_train)
        for inst in evals:
            states.extend(_instance_requests(spec, inst, trial, examples, fits))
    return states


def _instance_requests(spec: AdapterSpec, inst: Instance, trial: int, examples: list[Instance],
                       fits) -> list[RequestState]:
    common = dict(instance=inst, train_trial_index=trial, result=None)
    if spec.method in (GENERATION, MULTIPLE_CHOICE_JOINT):
        prompt = build_prompt(spec, examples, example_block(spec, inst, include_output=False), fits)
        if spec.method == GENERATION:
            req = _request(spec, prompt.text)
            mapping = None
        else:
            req = _request(spec, prompt.text, num_completions=1, top_k_per_token=spec.num_outputs,
                           stop_sequences=[])
            mapping = {reference_letter(spec, i): r.text for i, r in enumerate(inst.references)}
        return [RequestState(reference_index=None, request_mode=None, output_mapping=mapping, request=req,
                             num_train_instances=prompt.num_train_instances, prompt_truncated=prompt.truncated,
                             shared_prefix=prompt.shared, **common)]
    if spec.method in (MULTIPLE_CHOICE_SEPARATE, CONTINUATION):
        # Score '<output_prefix trailing space><reference>' after the prompt that ends in the
        # stripped output prefix: the tokens HELM's metric takes from the end of the echoed prompt.
        stem = example_block(spec, inst, include_output=False)
        space = spec.output_prefix[len(spec.output_prefix.rstrip()):]
        prompt = build_prompt(spec, examples, stem, fits)
        out = []
        refs = range(len(inst.references)) if spec.method == MULTIPLE_CHOICE_SEPARATE else [inst.gold_index]
        for i in refs:
            cont = space + inst.references[i].text
            req = _request(spec, prompt.text + cont, num_completions=1, temperature=0.0, max_tokens=0,
                           stop_sequences=[], echo_prompt=True)
            out.append(RequestState(reference_index=i, request_mode="original", output_mapping=None, request=req,
                                    num_train_instances=prompt.num_train_instances,
                                    prompt_truncated=prompt.truncated, context=prompt.text,
                                    continuation=cont, shared_prefix=prompt.shared, **common))
        return out
    if spec.method == MULTIPLE_CHOICE_PARTIAL:
        return _partial_requests(spec, inst, examples, fits, common)
    if spec.method == LANGUAGE_MODELING:
        # A long document is scored in pieces cut at line ends, each on its own (no conditioning).
        out = []
        for piece in _fitting_pieces(inst.input, fits):
            req = _request(spec, piece, num_completions=1, temperature=0.0, max_tokens=0, stop_sequences=[],
                           echo_prompt=True)
            out.append(RequestState(reference_index=None, request_mode=None, output_mapping=None, request=req,
                                    num_train_instances=0, prompt_truncated=False, context="",
                                    continuation=piece, **common))
        return out
    raise ValueError(f"unsupported adapter method {spec.method!r}")


def _partial_requests(spec: AdapterSpec, inst: Instance, examples: list[Instance], fits, common: dict):
    """One request per context (a reference), each scoring the shared continuation (the input)."""
    cont = spec.output_prefix + inst.input
    out = []
    for i, ref in enumerate(inst.references):
        prompt = build_prompt(spec, examples, spec.input_prefix + ref.text + spec.input_suffix, fits)
        req = _request(spec, prompt.text + cont, num_completions=1, temperature=0.0, max_tokens=0,
                       stop_sequences=[], echo_prompt=True)
        out.append(RequestState(reference_index=i, request_mode="original", output_mapping=None, request=req,
                                num_train_instances=prompt.num_train_instances, prompt_truncated=prompt.truncated,
                                context=prompt.text, continuation=cont, shared_prefix=prompt.shared, **common))
    return out

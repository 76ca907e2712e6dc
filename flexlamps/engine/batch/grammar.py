"""JSON-schema constrained decoding through llguidance: each constrained sequence has its own
matcher, which masks the logits of its row to the tokens its schema allows next.

A row's mask depends only on its schema and its own generated tokens, never on the rows beside
it, so a constrained sequence decodes the same in any batch. Why llguidance (and not xgrammar or
outlines-core): docs/generate.md, measured by scripts/bench_grammar_libraries.py.
"""

from __future__ import annotations

import numpy as np
import torch

# Compact JSON (no whitespace between tokens): a small model allowed free whitespace can spend
# every token it has on blanks before the value it was asked for.
_JSON_OPTIONS = {"whitespace_flexible": False}


class GrammarError(ValueError):
    """A schema the grammar library cannot compile (the message says why)."""


class JsonGrammars:
    """Compiles schemas against one tokenizer and vocabulary (the model's logits width), once
    each; built lazily, as building llguidance's token trie takes ~1 s for a 49k vocabulary."""

    def __init__(self, tokenizer, vocab_size: int):
        self._tokenizer, self.vocab_size = tokenizer, vocab_size
        self._ll_tokenizer = None
        self._compiled: dict[str, str] = {}  # schema text -> llguidance grammar

    @property
    def ll_tokenizer(self):
        if self._ll_tokenizer is None:
            import llguidance

            tk = self._tokenizer
            self._ll_tokenizer = llguidance.LLTokenizer(
                tk.tk.to_str(), n_vocab=max(self.vocab_size, tk.vocab_size), eos_token=list(tk.eos_token_ids))
        return self._ll_tokenizer

    def compile(self, schema_text: str) -> str:
        """The grammar of `schema_text` (a JSON schema as text); GrammarError when it cannot be compiled."""
        grammar = self._compiled.get(schema_text)
        if grammar is None:
            import llguidance

            try:
                grammar = llguidance.LLMatcher.grammar_from_json_schema(schema_text, defaults=_JSON_OPTIONS)
            except ValueError as e:
                raise GrammarError(f"the JSON schema is not valid JSON: {e}") from None
            is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, self.ll_tokenizer)
            if is_error:
                raise GrammarError(f"the JSON schema cannot be enforced: {messages[0]}")
            self._compiled[schema_text] = grammar
        return grammar

    def matcher(self, schema_text: str) -> "RowGrammar":
        import llguidance

        return RowGrammar(llguidance.LLMatcher(self.ll_tokenizer, self.compile(schema_text), log_level=0),
                          self.ll_tokenizer.vocab_size)


class RowGrammar:
    """One sequence's matcher: the tokens it allows next, and the token it was given."""

    def __init__(self, matcher, vocab_size: int):
        self.matcher, self.vocab_size = matcher, vocab_size  # the grammar's vocabulary (>= the logits')

    @property
    def is_done(self) -> bool:
        """Nothing can follow (the value and its end token were given), or the matcher failed."""
        return self.matcher.is_stopped() or self.matcher.is_error()

    def fill_mask(self, words: np.ndarray) -> None:
        """Write the allowed tokens as bits into `words` (int32, (vocab + 31) // 32, contiguous)."""
        self.matcher.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)

    def advance(self, token: int) -> None:
        if not self.matcher.consume_token(token):
            raise RuntimeError(f"the grammar refused token {token} it allowed: {self.matcher.get_error()}")


def mask_rows(logits: torch.Tensor, rows: list[int], grammars: list[RowGrammar]) -> None:
    """Set to -inf, in place, every logit of `rows` (of `logits` (n, vocab)) that the row's grammar
    does not allow next."""
    if not rows:
        return
    vocab = logits.shape[1]
    words = np.empty((len(rows), (grammars[0].vocab_size + 31) // 32), dtype=np.int32)
    for k, grammar in enumerate(grammars):
        grammar.fill_mask(words[k])
    # little-endian bit order: bit b of word w is token 32 * w + b
    allowed = np.unpackbits(words.view(np.uint8), axis=1, bitorder="little")[:, :vocab].view(bool)
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        # numpy's masked copy into a view of the logits: ~6x faster than torch's masked_fill here
        values = logits.numpy()
        for k, row in enumerate(rows):
            np.copyto(values[row], -np.inf, where=~allowed[k])
        return
    index = torch.tensor(rows, device=logits.device)
    with torch.inference_mode():  # the executors return inference tensors
        blocked = torch.from_numpy(~allowed).to(logits.device)
        logits[index] = logits[index].masked_fill(blocked, float("-inf"))

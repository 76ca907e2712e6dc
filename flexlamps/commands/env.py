"""`flexlamps env`: what a bug report needs to know about this installation and machine
(`flexlamps.environment`), printed."""

from __future__ import annotations

import json

import click

from flexlamps.environment import environment


def _print(report: dict) -> None:
    for key, value in report.items():
        if key == "cpu":
            click.echo(f"cpu: {value['model']}, {value['cores']} cores; has {' '.join(value['features']) or '-'}; "
                       f"lacks {' '.join(value['lacks']) or '-'}")
        elif key == "native kernels":
            click.echo(f"native kernels (cpu variant: {value['cpu variant']}):")
            for name, outcome in value.items():
                if name != "cpu variant":
                    variant = f" ({outcome['variant']})" if outcome["variant"] else ""
                    click.echo(f"  {name:<12} {outcome['state']}{variant}: {outcome['why']}")
        elif isinstance(value, list):
            click.echo(f"{key}: {', '.join(value) or 'none'}")
        else:
            click.echo(f"{key}: {value}")


@click.command("env")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def command(as_json: bool):
    """Print versions, CPU features, GPU, native kernels (loaded, disabled or failed, and why),
    the cache folder and the hardware profile: what a bug report needs."""
    report = environment()
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        _print(report)

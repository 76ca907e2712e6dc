"""The `flexlamps` command line: a thin click layer over the Python API.

Each subcommand lives in its own module under `flexlamps.commands` and is imported only when
invoked, so `flexlamps plan` or `flexlamps simulate` never pay for importing torch.
"""

import importlib

import click

# name -> module under flexlamps.commands exporting `command`
SUBCOMMANDS = {
    "generate": "generate",
    "eval": "eval",
    "plan": "plan",
    "profile": "profile",
    "helm": "helm",
    "agents": "agents",
    "simulate": "simulate",
    "env": "env",
    "models": "models",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx, name):
        mod = SUBCOMMANDS.get(name)
        if mod is None:
            return None
        return importlib.import_module(f"flexlamps.commands.{mod}").command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="flexlamps")
def main():
    """flexlamps: run LLMs bigger than your GPU, fast, from GPU, CPU and disk."""


if __name__ == "__main__":
    main()

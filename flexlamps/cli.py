"""The `flexlamps` command line: a thin click layer over the Python API.

Each subcommand lives in its own module under `flexlamps.commands` and is imported only when
invoked, so `flexlamps plan` or `flexlamps simulate` never pay for importing torch.
"""

import errno
import importlib
import os
import sys

import click

from flexlamps.kernels import variants

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

    def invoke(self, ctx):
        """Any command; standard output that cannot be written (a full disk: `> /dev/full`) is one
        line, not a traceback (a closed pipe, `| head`, is click's to end quietly)."""
        try:
            return super().invoke(ctx)
        except OSError as e:
            if e.errno == errno.EPIPE or not _stdout_failed(e):
                raise
            raise click.ClickException(f"cannot write to standard output ({e.strerror})") from None

    def get_command(self, ctx, name):
        mod = SUBCOMMANDS.get(name)
        if mod is None:
            return None
        return importlib.import_module(f"flexlamps.commands.{mod}").command


def _stdout_failed(error: OSError) -> bool:
    """Whether `error` was raised by `click.echo` writing standard output (the innermost frame of
    its traceback); if so, stdout is pointed at /dev/null so that Python's own flush at exit does
    not fail again."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None or tb.tb_frame.f_code is not click.utils.echo.__code__:
        return False
    try:
        if tb.tb_frame.f_locals.get("file").fileno() != sys.stdout.fileno():
            return False
    except (AttributeError, OSError, ValueError):  # a stream with no file (a test's capture)
        return False
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return True


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="flexlamps")
def main():
    """flexlamps: run LLMs bigger than your GPU, fast, from GPU, CPU and disk."""
    try:
        variants.process_level()
    except variants.VariantRefused as err:
        raise click.ClickException(str(err)) from None


if __name__ == "__main__":
    main()

"""`python -m flexlamps ...`: the `flexlamps` command.

`-m` puts the working directory first on sys.path, where a folder of the user's named like one
of our top-level packages (`offload/`, `quant/`, `placement/`) would be imported instead of ours;
it is dropped unless it is the folder flexlamps itself was found in (a checkout)."""

import os
import sys
from pathlib import Path

_first = sys.path[0] if sys.path else None
if _first in ("", os.getcwd()) and Path(_first or ".").resolve() != Path(__file__).resolve().parents[1]:
    del sys.path[0]

from flexlamps.cli import main  # noqa: E402  (after the path is settled)

main(prog_name="flexlamps")

"""flexlamps' one cache folder, read when called (never at import): packed weights, GGUF
headers, file hashes and machine profiles all live under it.

`$FLEXLAMPS_CACHE`, else `$XDG_CACHE_HOME/flexlamps`, else `~/.cache/flexlamps`.
`$FLEXLAMPS_CACHE_DIR`, the packed-weight cache's old variable, is still read when
`$FLEXLAMPS_CACHE` is not set, with a warning that names the new one.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

CACHE_ENV = "FLEXLAMPS_CACHE"
_OLD_CACHE_ENV = "FLEXLAMPS_CACHE_DIR"


def cache_root() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    if os.environ.get(_OLD_CACHE_ENV):
        warnings.warn(f"${_OLD_CACHE_ENV} is deprecated and will be ignored in a later release: set ${CACHE_ENV} "
                      "instead (one folder for all of flexlamps' caches)", FutureWarning, stacklevel=2)
        return Path(os.environ[_OLD_CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flexlamps"


def default_offload_dir() -> Path:
    """The disk tier's folder when no --offload-dir is given: `offload/` in the cache folder (never
    a folder of the working directory, which may be a checkout's source package `offload/`)."""
    return cache_root() / "offload"

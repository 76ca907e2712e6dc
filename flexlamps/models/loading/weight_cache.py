"""A cache of a checkpoint's weights as the engine computes with them, so a second load takes
seconds: a GGUF is dequantized or repacked once (4-bit blocks into `Int4Weight`, Q8_0 into
`Int8Weight`, with the fused kernel's own layout), written as one safetensors file and memory-mapped on later loads.

The file is named by the SHA-256 of the checkpoint's bytes plus everything that changes the
packed result (dtype, 4-bit in place or not, torch version, CPU kernel flavour, format
version), so an edited checkpoint or another torch never reads a stale entry. Files are
written to a temp name and renamed; a damaged entry is rebuilt. The folder is `cache_dir`,
else flexlamps' cache folder ($FLEXLAMPS_CACHE; see flexlamps.cache_folder).

Beside an entry, `dense_copies` keeps the dequantized form of its 4-bit matrices (as the in-memory
engine stacks them) for the dense twins of `models.linear.Int4Twin`, in a file of the same key
(`weights-<key>-dense.safetensors`): a warm load maps it instead of dequantizing every matrix.

The entries are kept within `MAX_CACHE_BYTES` together: after an entry is written, the least
recently used ones (a load that reads an entry marks it used) are deleted until the rest fit;
the entry just written is always kept. Only this cache's own files (`weights-*.safetensors`)
are ever deleted. A process that has an entry mapped keeps reading it after the deletion.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Callable

import torch

from flexlamps.cache_folder import cache_root
from flexlamps.models.loading.checkpoint import read_all
from flexlamps.models.loading.gguf_header import file_sha256
from flexlamps.models.loading.in_place import packs_five_bit, packs_six_bit
from flexlamps.models.loading.mapped_pages import release_heap
from flexlamps.models.loading.tensor_file import SAFETENSORS_DTYPES, write_tensors
from flexlamps.models.weight_specs import weight_specs
from quant.int4_weight import Int4Weight
from quant.int8_weight import Int8Weight

# 2: Q8_0 matrices kept int8 (`Int8Weight`), a tied Q8_0 head as "lm_head"; 3: Q4_K and Q5_0 kept
# as their blocks too, a tied 4-bit head as "lm_head"; 4: Q5_1 and Q5_K as int8 codes with zero points;
# 5: Q6_K as int8 codes in groups of 16; 6: Q5_x in the 5-bit form where our AVX-512 kernel runs (keyed by it);
# 7: a llama GGUF's q/k biases un-interleaved as its q/k rows are (6 kept them in llama.cpp's order);
# 8: codes that fit 6 bits (Q6_K) in the 6-bit form where our kernel runs (keyed by it); 9: that form
# with its scales alone where every zero is 8 times its scale (Q6_K); 10: Q4_K's scales as the file holds
# them where our kernel runs (`in_place.keeps_k_scales`); 11: Q6_K's too (`in_place.keeps_q6_k_scales`)
FORMAT_VERSION = 11
MAX_CACHE_BYTES = 8 * 2**30  # all entries of one folder together
_ENTRY_GLOB = "weights-*.safetensors"
log = logging.getLogger(__name__)


def default_cache_dir() -> Path:
    return cache_root()


def cache_key(content_sha256: str, dtype: torch.dtype, int4_in_place: bool) -> str:
    """What the packed weights depend on, hashed: the checkpoint's bytes and how they are packed."""
    parts = {"sha256": content_sha256, "dtype": str(dtype), "int4": int4_in_place,
             "torch": torch.__version__, "cpu": torch.backends.cpu.get_cpu_capability(), "format": FORMAT_VERSION,
             "five_bit": int4_in_place and packs_five_bit(), "six_bit": int4_in_place and packs_six_bit()}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def entry_path(reader, dtype: torch.dtype, int4_in_place: bool, cache_dir: Path | str | None = None) -> Path:
    """Where the packed weights of `reader`'s checkpoint (one file) are cached."""
    content = getattr(reader, "sha256", None) or file_sha256(Path(reader.path))  # a GGUFReader has it from its header
    return Path(cache_dir or default_cache_dir()) / f"weights-{cache_key(content, dtype, int4_in_place)}.safetensors"


def dense_path(entry: Path) -> Path:
    """The file beside `entry` that holds its 4-bit matrices dequantized (see `dense_copies`)."""
    return entry.with_name(entry.name.removesuffix(".safetensors") + "-dense.safetensors")


def dense_copies(path: Path, weights: dict[str, Int4Weight | Int8Weight]) -> dict[str, Callable[[], torch.Tensor | None]]:
    """For every weight, a function that reads `w.dequantize()` from `path`, written there first
    (one matrix at a time) unless the file holds them all (same names, shapes and dtypes). Each read
    maps the file anew and the caller keeps only its packed copy, so no more than one dense matrix
    of the file is held at a time. A read that fails (the file pruned meanwhile, or never written)
    gives None, for the caller to dequantize."""
    if not _holds_dense(path, weights):
        layout = {name: (tuple(w.shape), w.dtype) for name, w in weights.items()}
        try:
            write_tensors(path, layout, lambda name: weights[name].dequantize(), {"format": str(FORMAT_VERSION)})
            prune(path.parent, keep=path)
        except OSError as e:
            log.warning("could not write the weight cache %s (%s); set --cache-dir to a writable folder", path, e)
            return {name: (lambda: None) for name in weights}
    else:
        _mark_used(path)
    return {name: functools.partial(_read_one, path, name) for name in weights}


def _holds_dense(path: Path, weights: dict[str, Int4Weight]) -> bool:
    from safetensors import safe_open

    if not path.exists():
        return False
    try:
        with safe_open(str(path), framework="pt") as f:
            if set(f.keys()) != set(weights):
                return False
            shapes = {name: tuple(f.get_slice(name).get_shape()) for name in weights}
            dtypes = {name: f.get_slice(name).get_dtype() for name in weights}
    except Exception as e:  # a torn or foreign file: rebuilt by the caller
        log.warning("weight cache %s is unreadable (%s); rebuilding it", path, e)
        return False
    return all(shapes[n] == tuple(w.shape) and dtypes[n] == SAFETENSORS_DTYPES.get(w.dtype) for n, w in weights.items())


def _read_one(path: Path, name: str) -> torch.Tensor | None:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return f.get_tensor(name)
    except Exception as e:
        log.warning("weight cache %s: could not read %s (%s); dequantizing it instead", path, name, e)
        return None


def _flatten(weights: dict) -> dict[str, torch.Tensor]:
    flat = {}
    for name, w in weights.items():
        if isinstance(w, (Int4Weight, Int8Weight)):
            flat.update(w.to_tensors(f"{name}.", with_kernel=True))
        else:
            flat[name] = w.contiguous()
    return flat


def _unflatten(flat: dict[str, torch.Tensor], names) -> dict:
    if "lm_head" not in names and any(k.is_stored(flat, "lm_head.") for k in (Int4Weight, Int8Weight)):
        # a tied head kept as the embedding table's blocks (`read_all`)
        names = [*names, "lm_head"]
    return {name: _unflatten_one(flat, name) for name in names}


def _unflatten_one(flat: dict[str, torch.Tensor], name: str):
    for kind in (Int4Weight, Int8Weight):
        if kind.is_stored(flat, f"{name}."):
            return kind.from_tensors(flat, f"{name}.")
    return flat[name]


def _write(path: Path, flat: dict[str, torch.Tensor]) -> None:
    """`flat` as a safetensors file, written tensor by tensor (no second copy of it all in bytes)."""
    write_tensors(path, {name: (tuple(t.shape), t.dtype) for name, t in flat.items()}, flat.__getitem__,
                  {"format": str(FORMAT_VERSION)})


def _read(path: Path, names) -> dict | None:
    """The cached weights (memory-mapped), or None when the file is missing or unreadable."""
    from safetensors import safe_open

    if not path.exists():
        return None
    try:
        with safe_open(str(path), framework="pt") as f:
            flat = {k: f.get_tensor(k) for k in f.keys()}
        return _unflatten(flat, names)
    except Exception as e:  # a torn or foreign file: rebuilt by the caller
        log.warning("weight cache %s is unreadable (%s); rebuilding it", path, e)
        return None


def load_weights(reader, dtype: torch.dtype, *, int4_in_place: bool, cache_dir: Path | str | None = None,
                 use_cache: bool = True) -> dict:
    """`checkpoint.read_all(reader, dtype, int4_in_place)`, from the cache when the checkpoint is one
    file (GGUF) whose packed weights were cached before; otherwise read, then cached. An FP8
    checkpoint (an HF folder: never cached) keeps its matrices FP8 (`quant.fp8.Fp8Weight`)."""
    source = Path(reader.path)
    if not use_cache or not source.is_file():
        return read_all(reader, dtype, int4_in_place=int4_in_place, fp8_in_place=True)
    names = [s.name for s in weight_specs(reader.config)]
    path = entry_path(reader, dtype, int4_in_place, cache_dir)
    cached = _read(path, names)
    if cached is not None:
        _mark_used(path)
        return cached
    weights = read_all(reader, dtype, int4_in_place=int4_in_place)
    try:
        _write(path, _flatten(weights))
        prune(path.parent, keep=path)
    except OSError as e:  # a read-only or full cache folder only costs the next load its speed
        log.warning("could not write the weight cache %s (%s); set --cache-dir to a writable folder", path, e)
        return weights
    # the entry just written, mapped as a later load maps it (the same bytes): the copies read here
    # are let go, so this process holds what a later one does (a tied table's untouched rows not at
    # all), not every weight on the heap (a llama-3.2-1b Q4_K_M GGUF: 2.5 GB after its first load)
    del weights
    release_heap()
    return _read(path, names) or read_all(reader, dtype, int4_in_place=int4_in_place)


def _mark_used(path: Path) -> None:
    try:
        os.utime(path)  # the modification time is the entry's last use, for `prune`
    except OSError:  # a read-only cache folder: its entries age by their writing
        pass


def prune(folder: Path, keep: Path | None = None, max_bytes: int | None = None) -> list[Path]:
    """Delete the least recently used entries of `folder` until the rest take at most `max_bytes`
    (default `MAX_CACHE_BYTES`); `keep` is never deleted. Returns the deleted paths."""
    limit = MAX_CACHE_BYTES if max_bytes is None else max_bytes
    entries = []
    for entry in Path(folder).glob(_ENTRY_GLOB):
        try:
            st = entry.stat()
        except OSError:  # deleted meanwhile by another process's prune
            continue
        entries.append((st.st_mtime_ns, st.st_size, entry))
    total = sum(size for _, size, _ in entries)
    deleted = []
    for _, size, entry in sorted(entries, key=lambda e: e[0]):  # least recently used first
        if total <= limit:
            break
        if keep is not None and entry == keep:
            continue
        try:
            entry.unlink()
        except FileNotFoundError:
            pass
        total -= size
        deleted.append(entry)
        log.info("weight cache: deleted %s (least recently used; the folder is kept under %d MiB)",
                 entry, limit // 2**20)
    return deleted

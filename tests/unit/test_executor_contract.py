"""Every cache an executor hands a face says, as the contract asks, what the face may do with its
rows (`KVCache.packs_rows`, `KVCache.rewinds`): the faces read the flags, never guess them."""

import importlib
import inspect
import pkgutil

import flexlamps.engine.caches
from flexlamps.engine.executors.contract import KVCache


def _cache_classes():
    for info in pkgutil.iter_modules(flexlamps.engine.caches.__path__):
        module = importlib.import_module(f"flexlamps.engine.caches.{info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and hasattr(cls, "attend_fn"):
                yield cls


def test_every_cache_declares_the_flags_of_the_contract():
    """On the class, or set by its constructor where they depend on the model (a ring layer's)."""
    classes = list(_cache_classes())
    assert len(classes) >= 6
    for cls in classes:
        source = inspect.getsource(cls)
        for flag in ("packs_rows", "rewinds"):
            assert isinstance(getattr(cls, flag, None), bool) or f"self.{flag}" in source, (cls.__name__, flag)
    assert set(KVCache.__annotations__) >= {"packs_rows", "rewinds"}

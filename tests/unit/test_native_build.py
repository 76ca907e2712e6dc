"""How every C kernel library is loaded (`quant.native_build.load_checked`: tile_gemv, the int8
GEMM, the attention, RMSNorm and SwiGLU): the switch and a CPU without the instructions leave it unused
without building anything; a failing or missing compiler warns, says what runs instead and
leaves no file behind."""

import pytest

from flexlamps.models import native_attention, native_elementwise
from quant import int8_gemm, native_build, tile_gemv

MODULES = [tile_gemv, int8_gemm, native_attention, native_elementwise]
# what each module's warning names
WHAT = {tile_gemv: "decode kernel is not used", int8_gemm: "int8 GEMM is not used", native_attention: "attention is not used",
        native_elementwise: "RMSNorm and SwiGLU is not used"}


@pytest.fixture(autouse=True)
def _fresh_loads():
    for module in MODULES:
        module.load.cache_clear()
    yield
    for module in MODULES:
        module.load.cache_clear()


def _builds_here() -> bool:
    return all(native_build.cpu_has_flags(m.LIBRARY.cpu_flags) for m in MODULES) and not native_build.switched_off()


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__.split(".")[-1])
def test_no_instructions_or_the_switch_off_gives_none_and_builds_nothing(module, tmp_path, monkeypatch):
    monkeypatch.setattr(native_build, "cpu_has_flags", lambda flags, cpuinfo=None: False)
    assert module.load(tmp_path / "a") is None
    monkeypatch.undo()
    module.load.cache_clear()
    monkeypatch.setenv(native_build.SWITCH_ENV, "0")
    assert module.load(tmp_path / "b") is None
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.skipif(not _builds_here(), reason="no AVX-512 CPU here (or switched off)")
@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__.split(".")[-1])
def test_a_failing_or_missing_compiler_warns_and_leaves_no_file(module, tmp_path, monkeypatch, failing_compiler):
    with pytest.warns(RuntimeWarning, match=f"{WHAT[module]}.*boom"):
        assert module.load(tmp_path / "fresh") is None
    assert not [p for p in (tmp_path / "fresh").iterdir() if p.name.endswith((".so", ".tmp"))]
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    with pytest.warns(RuntimeWarning, match="no C compiler"):
        assert module.load(tmp_path / "other") is None

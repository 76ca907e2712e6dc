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


def test_the_build_key_covers_nested_and_shared_headers(tmp_path):
    """A kernel's header may include quant's shared header (found through INCLUDE_DIR, as the
    compiler's -I finds it): both are in the key, so editing either makes another library."""
    source = tmp_path / "k.c"
    source.write_text('#include "local.h"\nint f(void) { return LOCAL; }\n')
    (tmp_path / "local.h").write_text('#include "native_halves.h"\n#define LOCAL 1\n')
    texts = native_build._texts(source)
    assert texts[0] == source.read_text()
    assert any(t.startswith("local.h\0") for t in texts)
    shared = (native_build.INCLUDE_DIR / "native_halves.h").read_text()
    assert f"native_halves.h\0{shared}" in texts
    (tmp_path / "local.h").write_text('#include "native_halves.h"\n#define LOCAL 2\n')
    assert native_build._texts(source) != texts
    (tmp_path / "local.h").write_text('#include "missing.h"\n')
    with pytest.raises(FileNotFoundError, match="missing.h"):
        native_build._texts(source)


@pytest.mark.skipif(not _builds_here(), reason="no AVX-512 CPU here (or switched off)")
def test_a_kernel_beside_no_shared_header_still_compiles_with_it(tmp_path):
    """The compiler gets INCLUDE_DIR as -I: a source elsewhere (flexlamps/models' kernels) that
    includes quant's header builds and runs."""
    source = tmp_path / "k.c"
    source.write_text('#include "native_halves.h"\nfloat one(void) { __m256i h = _mm256_set1_epi16(0x3F80);\n'
                      '  float out[16]; _mm512_storeu_ps(out, halves_to_floats(h, 0)); return out[3]; }\n')
    lib = native_build.built_library(source, ("-O2", "-fPIC", "-shared", "-mavx512f", "-mavx512bw", "-mavx512vl"),
                                     tmp_path / "build")
    lib.one.restype = native_build.ctypes.c_float
    assert lib.one() == 1.0

"""The one loader of the C kernels (`flexlamps.kernels.loader`): the switch, a CPU without the
instructions and one with AMX leave a kernel unused without building anything; a failing or
missing compiler, a check that fails (a kernel returning zeros: with and without `python -O`) or
raises falls back to torch's kernels with one warning, for every kernel. Stubs stand in for the
compiled libraries, so all of it runs on any CPU; tests/unit/test_tile_gemv.py and its siblings
test the real kernels where they build."""

import dataclasses
import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

from flexlamps.kernels import (attention, build, decode_layers, elementwise, half_amx, half_gemv, int8_gemm, loader,
                               tile_gemv, variants)
from flexlamps.kernels.loader import KernelCheckError, Kernels
from flexlamps.models.blocks import attention as attention_block, dense_gemm, linear, moe, native_decode, norms
from tests.conftest import REPO


class ZeroTileGemv(tile_gemv.TileGemv):
    def __init__(self):
        self.x_bits, self.level, self.tiles, self.takes_five_bit = tile_gemv.X_BITS, "avx512", (32, 64), True

    @classmethod
    def runs(cls, w, x):  # torch's int4 layout has tiles of 64 rows only where it has AVX-512
        return x.dtype == w.dtype and x.device.type == "cpu"

    def matmul(self, w, x):
        return torch.zeros(*x.shape[:-1], w.shape[0], dtype=x.dtype)

    prompt_product = matmul


class TorchTileGemv(ZeroTileGemv):
    def matmul(self, w, x, x_bits=tile_gemv.X_BITS):
        return (tile_gemv.rounded_like_kernel(x, tile_gemv.x_group(w, x_bits), x_bits)
                @ w.dequantize(torch.float32).t()).to(x.dtype)

    def prompt_product(self, w, x):
        return self.matmul(w, x, 8)


class ZeroInt8Gemm(int8_gemm.Int8Gemm):
    def __init__(self):
        pass

    def pack(self, w):
        return int8_gemm.Int8Matrix.from_dense(w)

    def matmul(self, x, w):
        return torch.zeros(*x.shape[:-1], w.shape[0], dtype=x.dtype)


class TorchInt8Gemm(ZeroInt8Gemm):
    def matmul(self, x, w):
        return int8_gemm.reference(x, w)


class ZeroAttention(attention.NativeAttention):
    def __init__(self):
        self.library, self.bf16_dot = None, 0

    def __call__(self, q, keys, values, mask, scale=None):
        return torch.zeros_like(q)


class TorchAttention(ZeroAttention):
    def __call__(self, q, keys, values, mask, scale=None):
        return attention.reference(q, keys, values, mask)


class ZeroElementwise(elementwise.NativeElementwise):
    def __init__(self):
        pass

    def rms_norm(self, x, weight, eps):
        return torch.zeros_like(x)

    def silu_mul(self, gate_up):
        return torch.zeros_like(gate_up[..., : gate_up.shape[-1] // 2])


class TorchElementwise(ZeroElementwise):
    def rms_norm(self, x, weight, eps):
        return weight * torch.rms_norm(x, x.shape[-1:], None, eps)

    def silu_mul(self, gate_up):
        half = gate_up.shape[-1] // 2
        return F.silu(gate_up[..., :half]) * gate_up[..., half:]


class ZeroDecodeLayers(decode_layers.DecodeLayers):
    def __init__(self):
        pass

    def rotate(self, x, cos, signed_sin):
        return torch.zeros_like(x)


class TorchDecodeLayers(ZeroDecodeLayers):
    def rotate(self, x, cos, signed_sin):
        return (x * cos).add_(x.roll(x.shape[-1] // 2, -1).mul_(signed_sin))


class ZeroHalfGemv(half_gemv.HalfGemv):
    def __init__(self):
        self.level = "avx512"

    def matmul(self, x, w, b=None):
        return torch.zeros(*x.shape[:-1], w.shape[0], dtype=x.dtype)

    def expert_swiglu(self, x, gate, up, down, picks, slots, weights, out):
        pass  # adds nothing


class TorchHalfGemv(ZeroHalfGemv):
    def matmul(self, x, w, b=None):
        return F.linear(x, w, b)

    def expert_swiglu(self, x, gate, up, down, picks, slots, weights, out):
        tokens = picks // slots
        y = half_gemv.reference_swiglu(x[tokens], gate, up, down)
        out.index_add_(0, tokens, (y * weights[picks, None]).to(out.dtype))


class ZeroHalfAmx(half_amx.HalfAmx):
    def __init__(self):
        self.level = "amx"

    def matmul(self, x, w, b=None):
        return torch.zeros(*x.shape[:-1], w.shape[0], dtype=x.dtype)


class TorchHalfAmx(ZeroHalfAmx):  # (the bits it is held to: oneDNN's 32-row call)
    def matmul(self, x, w, b=None):
        return half_amx.onednn_rows(x, w, b)


ZERO = {"tile_gemv": ZeroTileGemv, "int8_gemm": ZeroInt8Gemm, "attention": ZeroAttention, "elementwise": ZeroElementwise,
        "half_gemv": ZeroHalfGemv, "half_gemm": ZeroHalfGemv, "half_amx": ZeroHalfAmx, "decode_layers": ZeroDecodeLayers}
TORCH = {"tile_gemv": TorchTileGemv, "int8_gemm": TorchInt8Gemm, "attention": TorchAttention,
         "elementwise": TorchElementwise, "half_gemv": TorchHalfGemv, "half_gemm": TorchHalfGemv,
         "half_amx": TorchHalfAmx, "decode_layers": TorchDecodeLayers}
# what the models ask for each kernel
ENTRY = {"tile_gemv": lambda: linear.native_kernel(), "int8_gemm": lambda: linear.int8_kernel(),
         "attention": lambda: attention_block.native_attention_kernel(), "elementwise": lambda: norms.native_ops(),
         "half_gemv": lambda: moe.decode_expert_kernel(), "half_gemm": lambda: moe.prompt_expert_kernel(),
         "half_amx": lambda: dense_gemm._amx_decode(torch.ones(1, 4).bfloat16(), torch.ones(4, 4).bfloat16(), None),
         "decode_layers": lambda: native_decode.native_loop()}


def test_every_kernel_module_is_registered():
    assert set(ZERO) == set(loader.NAMES) == {loader.kernel_spec(n).name for n in loader.NAMES}


# the kernels whose check runs here: half_amx's calls oneDNN's bf16 product, which oneDNN capped at AVX2
# ($ONEDNN_MAX_CPU_ISA, a simulated AVX2 box) cannot make (nor is the kernel offered there: `_unfit`)
CHECKED = [n for n in loader.NAMES if n != "half_amx" or half_amx._unfit(half_amx.KERNEL.variants[0]) is None]
CHECKS_HERE = [pytest.param(n, marks=() if n in CHECKED else pytest.mark.skip(reason="oneDNN makes no bf16 call here"))
               for n in loader.NAMES]


@pytest.mark.parametrize("name", CHECKS_HERE)
def test_the_check_passes_a_kernel_computing_as_torch_does(name):
    loader.kernel_spec(name).check(TORCH[name]())


@pytest.mark.parametrize("name", CHECKS_HERE)
def test_a_kernel_returning_zeros_is_rejected(name):
    with pytest.raises(KernelCheckError, match="check failed"):
        loader.kernel_spec(name).check(ZERO[name]())


def test_a_kernel_returning_zeros_is_rejected_under_python_O():
    """`python -O` strips asserts: the checks must not be asserts."""
    code = ("import sys; from flexlamps.kernels import loader\n"
            "from tests.unit.test_kernels_loader import ZERO\n"
            "assert True, 'unreachable'\n"
            "from tests.unit.test_kernels_loader import CHECKED\n"
            "for name in CHECKED:\n"
            "    try:\n        loader.kernel_spec(name).check(ZERO[name]())\n"
            "    except loader.KernelCheckError as err:\n        print('rejected', name, 'check failed' in str(err))\n"
            "print('optimize', sys.flags.optimize)\n")
    proc = subprocess.run([sys.executable, "-O", "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[:-1] == [f"rejected {n} True" for n in CHECKED] + ["optimize 1"]


# every variant's flags but AMX-BF16's (which leave the int8 GEMM to oneDNN): half_amx alone is given them
AMX_BF16 = sorted(set(loader.kernel_spec("half_amx").variants[-1].cpu_flags) - set(variants.LEVELS["amx"][0]))
EVERY_FLAG = sorted({f for n in loader.NAMES for v in loader.kernel_spec(n).variants for f in v.cpu_flags} - {*AMX_BF16})


@pytest.fixture
def cpu_has_everything(monkeypatch, request):
    """A CPU with every variant's flags (AMX-BF16 for half_amx alone), and no override of the level."""
    flags = EVERY_FLAG + (AMX_BF16 if request.node.callspec.params.get("name") == "half_amx" else [])
    monkeypatch.setattr(build, "cpu_flags", lambda cpuinfo=None: list(flags))
    monkeypatch.delenv(variants.VARIANT_ENV, raising=False)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)  # (half_amx is offered: `half_amx._unfit`)


SPECS = {name: loader.kernel_spec(name) for name in loader.NAMES}


class _Raising:
    def __getattr__(self, name):
        raise ValueError("boom from a raising check")


@pytest.mark.parametrize("name", loader.NAMES)
@pytest.mark.parametrize("make", [lambda n: ZERO[n](), lambda n: _Raising()], ids=["zeros", "raises"])
def test_a_failing_or_raising_check_falls_back_with_one_warning(name, make, tmp_path, monkeypatch, cpu_has_everything):
    if name not in CHECKED and not isinstance(make(name), _Raising):
        pytest.skip("oneDNN makes no bf16 call here: half_amx's check cannot run")
    monkeypatch.setattr(build, "built_library", lambda *args: None)
    monkeypatch.setattr(loader, "kernel_spec", lambda n: dataclasses.replace(SPECS[n], make=lambda library, level: make(n)))
    kernels = Kernels(tmp_path)
    monkeypatch.setattr(loader, "chosen", lambda: kernels)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert ENTRY[name]() is None and ENTRY[name]() is None  # the model's question, asked twice
    assert len(caught) == 1 and caught[0].category is RuntimeWarning
    assert loader.kernel_spec(name).what in str(caught[0].message)
    outcome = kernels.outcome(name)
    assert outcome.state == "failed" and ("KernelCheckError" in outcome.why or "boom" in outcome.why)


@pytest.mark.parametrize("name", loader.NAMES)
def test_a_failing_or_missing_compiler_warns_and_leaves_no_file(name, tmp_path, monkeypatch, cpu_has_everything):
    failing = tmp_path / "cc"
    failing.write_text("#!/bin/sh\ncase \"$1\" in --version) echo fake 1.0;; *) echo boom >&2; exit 1;; esac\n")
    failing.chmod(0o755)
    monkeypatch.setenv("CC", str(failing))
    with pytest.warns(RuntimeWarning, match=f"{loader.kernel_spec(name).what}.*boom"):
        assert loader.load(loader.kernel_spec(name), tmp_path / "fresh").kernel is None
    assert not [p for p in (tmp_path / "fresh").iterdir() if p.name.endswith((".so", ".tmp"))]
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    with pytest.warns(RuntimeWarning, match="no C compiler"):
        assert loader.load(loader.kernel_spec(name), tmp_path / "other").state == "failed"


@pytest.mark.parametrize("name", loader.NAMES)
def test_no_instructions_or_the_switch_off_disables_and_builds_nothing(name, tmp_path, monkeypatch):
    monkeypatch.delenv(variants.VARIANT_ENV, raising=False)  # (a CI run at avx2 sets it; this CPU has none)
    monkeypatch.setattr(build, "cpu_flags", lambda cpuinfo=None: ["fpu", "sse2"])  # below AVX2, or an ARM CPU
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        outcome = loader.load(loader.kernel_spec(name), tmp_path / "a")
    assert outcome == loader.Outcome(None, "disabled", variants.BELOW_BASELINE)
    monkeypatch.undo()
    monkeypatch.setenv(loader.SWITCH_ENV, "0")
    assert loader.load(loader.kernel_spec(name), tmp_path / "b") == loader.Outcome(None, "disabled",
                                                                                   "$FLEXLAMPS_NATIVE_KERNELS=0")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_on_a_cpu_with_amx_the_int8_gemm_is_left_to_onednn(tmp_path, monkeypatch):
    monkeypatch.setattr(build, "cpu_flags", lambda cpuinfo=None: [*EVERY_FLAG, "amx_bf16"])
    monkeypatch.delenv(variants.VARIANT_ENV, raising=False)  # (a variant forced below: the next test)
    outcome = loader.load(loader.kernel_spec("int8_gemm"), tmp_path)
    assert outcome.state == "disabled" and "AMX" in outcome.why
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_a_variant_forced_below_amx_runs_the_int8_gemm_as_a_cpu_of_that_level(monkeypatch):
    # else prompts at that level take neither the codes nor the int8 GEMM: every matrix gets a dense twin
    amx = [*EVERY_FLAG, "amx_bf16"]
    assert "AMX" in _picked("int8_gemm", amx, monkeypatch)
    assert _picked("int8_gemm", amx, monkeypatch, "avx512") == "avx512"
    assert _picked("int8_gemm", amx, monkeypatch, "avx2") == "avx2"


def test_the_build_key_covers_nested_headers(tmp_path):
    source = tmp_path / "k.c"
    source.write_text('#include "local.h"\nint f(void) { return LOCAL; }\n')
    (tmp_path / "local.h").write_text('#include "inner.h"\n#define LOCAL 1\n')
    (tmp_path / "inner.h").write_text("#define INNER 1\n")
    texts = build._texts(source)
    assert texts[0] == source.read_text() and any(t.startswith("local.h\0") for t in texts)
    (tmp_path / "inner.h").write_text("#define INNER 2\n")
    assert build._texts(source) != texts
    (tmp_path / "local.h").write_text('#include "missing.h"\n')
    with pytest.raises(FileNotFoundError, match="missing.h"):
        build._texts(source)


def test_every_kernel_source_and_header_sits_in_the_kernels_folder():
    for name in loader.NAMES:
        source = loader.kernel_spec(name).source
        assert source.parent == build.SOURCES and source.is_file()
        build._texts(source)  # every header it includes is beside it
    assert not [p for root in ("flexlamps", "quant", "offload", "placement") for ext in ("*.c", "*.h")
                for p in (REPO / root).rglob(ext) if p.parent != build.SOURCES]


def _picked(name: str, flags: list[str], monkeypatch, level_env: str | None = None, torch_tiles: int = 64):
    monkeypatch.setattr(build, "cpu_flags", lambda cpuinfo=None: flags)
    # torch's int4 tiles as its AVX-512 level lays them out (whatever $ATEN_CPU_CAPABILITY this run has)
    monkeypatch.setattr(tile_gemv, "tile_rows", lambda cols: torch_tiles)
    if level_env is None:
        monkeypatch.delenv(variants.VARIANT_ENV, raising=False)
    else:
        monkeypatch.setenv(variants.VARIANT_ENV, level_env)
    chosen = loader.pick(loader.kernel_spec(name))
    return chosen if isinstance(chosen, str) else chosen.level


AVX2 = ["sse2", "avx", "avx2", "fma", "f16c"]
AVX512 = [*AVX2, "avx512f", "avx512bw", "avx512vl", "avx512dq"]


def test_each_kernel_runs_its_best_variant_the_cpu_has(monkeypatch):
    assert _picked("tile_gemv", AVX2, monkeypatch) == "avx2"
    assert _picked("tile_gemv", [*AVX2, "avx_vnni"], monkeypatch) == "avx_vnni"
    assert _picked("tile_gemv", AVX512, monkeypatch) == "avx2"  # no VBMI / VNNI: Skylake-X
    assert _picked("tile_gemv", [*AVX512, "avx512vbmi", "avx512_vnni"], monkeypatch) == "avx512"
    assert _picked("elementwise", AVX512, monkeypatch) == "avx512"
    assert _picked("int8_gemm", [*AVX512, "avx512_vnni", "avx_vnni"], monkeypatch) == "avx512"


def test_the_override_caps_the_level_and_refuses_one_the_cpu_lacks(monkeypatch):
    full = [*AVX512, "avx512vbmi", "avx512_vnni", "avx_vnni"]
    assert _picked("tile_gemv", full, monkeypatch, "avx2") == "avx2"
    assert _picked("tile_gemv", full, monkeypatch, "AVX_VNNI") == "avx_vnni"
    with pytest.raises(variants.VariantRefused, match=r"^\$FLEXLAMPS_CPU_VARIANT=avx512: this CPU lacks avx512f"):
        _picked("tile_gemv", AVX2, monkeypatch, "avx512")
    with pytest.raises(variants.VariantRefused, match="no such CPU variant; use one of avx2, avx_vnni, avx512"):
        _picked("tile_gemv", full, monkeypatch, "sse4")
    monkeypatch.setenv(loader.SWITCH_ENV, "0")  # switched off: nothing is tried, nothing refused
    assert _picked("tile_gemv", AVX2, monkeypatch, "avx2") == f"${loader.SWITCH_ENV}=0"


def test_torch_capped_at_avx2_runs_the_best_variant_that_takes_its_tiles(monkeypatch):
    """$ATEN_CPU_CAPABILITY=avx2 on an AVX-512 CPU: torch's int4 tiles have 32 rows, which the AVX-512
    variants do not take (their check would fail and torch's int4 kernel run): the AVX-VNNI one runs,
    and the other kernels keep theirs."""
    full = [*AVX512, "avx512vbmi", "avx512_vnni", "avx_vnni", "amx_tile", "amx_int8"]
    assert _picked("tile_gemv", full, monkeypatch, torch_tiles=32) == "avx_vnni"
    assert _picked("tile_gemv", full, monkeypatch, "avx512", torch_tiles=32) == "avx_vnni"
    assert _picked("attention", full, monkeypatch, torch_tiles=32) == "avx512"
    assert "where its int4 tiles have 32 rows; the amx variant takes 64" in tile_gemv._unfit(tile_gemv.KERNEL.variant("amx"))
    assert _picked("tile_gemv", full, monkeypatch) == "amx"


def test_a_kernel_without_a_variant_for_this_cpu_says_what_it_lacks(monkeypatch):
    spec = dataclasses.replace(loader.kernel_spec("attention"), variants=(variants.variant("avx512"),))
    monkeypatch.setattr(loader, "kernel_spec", lambda name: spec)
    assert _picked("attention", AVX2, monkeypatch) == "this CPU lacks avx512f avx512bw avx512vl avx512dq"


def test_the_cli_refuses_an_override_the_cpu_lacks_in_one_line(monkeypatch):
    from click.testing import CliRunner

    from flexlamps.cli import main

    monkeypatch.setattr(build, "cpu_flags", lambda cpuinfo=None: AVX2)
    monkeypatch.setenv(variants.VARIANT_ENV, "avx512")
    result = CliRunner().invoke(main, ["env"])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1
    assert result.output.startswith("Error: $FLEXLAMPS_CPU_VARIANT=avx512: this CPU lacks avx512f")


def test_a_variant_the_compiler_refuses_falls_back_to_the_one_below(tmp_path, monkeypatch):
    """gcc before 11 has no -mamx-tile: on an AMX CPU tile_gemv then runs its avx512 variant (and the
    kernels sharing its pool theirs), not torch's."""
    real = subprocess.run(["sh", "-c", "command -v ${CC:-cc}"], capture_output=True, text=True).stdout.strip()
    picky = tmp_path / "picky-cc"
    picky.write_text(f'#!/bin/sh\nfor a; do [ "$a" = -mamx-tile ] && {{ echo "error: no AMX" >&2; exit 1; }}; done\n'
                     f'exec {real} "$@"\n')
    picky.chmod(0o755)
    monkeypatch.setenv("CC", str(picky))
    flags = build.cpu_flags() + ["amx_tile", "amx_int8"]
    monkeypatch.setattr(build, "cpu_flags", lambda cpuinfo=None: flags)
    monkeypatch.delenv(variants.VARIANT_ENV, raising=False)
    if "avx512" not in variants.cpu_levels(flags) or loader.switched_off():
        pytest.skip("needs an AVX-512 CPU and the kernels on")
    if (unfit := tile_gemv._unfit(tile_gemv.KERNEL.variant("avx512"))) is not None:
        pytest.skip(f"tile_gemv avx512: {unfit}")
    with pytest.warns(RuntimeWarning, match="its avx512 variant runs"):
        outcome = loader.load(tile_gemv.KERNEL, tmp_path / "kernels")
    assert outcome.state == "loaded" and outcome.variant == "avx512" and not outcome.kernel.amx_prompts
    attention = loader.load(loader.kernel_spec("attention"), tmp_path / "kernels")
    assert attention.state == "loaded" and attention.variant == "avx512"

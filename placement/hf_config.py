"""Read the shape numbers of a Hugging Face config.json dict into `ModelSpec` keyword arguments.

Only the keys we need are read; a missing one raises ValueError naming the key and the file's
model_type, so a user knows which config is malformed.
"""

_LLAMA_LIKE = ("llama", "mistral", "qwen2")
_DEEPSEEK = ("deepseek_v3", "deepseek_v32")
SUPPORTED_MODEL_TYPES = _LLAMA_LIKE + ("opt",) + _DEEPSEEK
_HF_DTYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}


def _get(config: dict, key: str, default=None):
    value = config.get(key, default)
    if value is None:
        raise ValueError(f"config.json (model_type {config.get('model_type')!r}) lacks {key!r}")
    return value


def hf_dtype(config: dict, default: str) -> str:
    """The checkpoint's stored dtype as a `DTYPE_BYTES` key (`default` when the config names none)."""
    raw = config.get("torch_dtype") or config.get("dtype")
    return _HF_DTYPES.get(str(raw), default)


def model_spec_kwargs(config: dict, name: str | None = None) -> dict:
    if not isinstance(config, dict):
        raise ValueError(f"config.json must hold a JSON object, got {type(config).__name__}")
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"config.json model_type {model_type!r} is not supported; "
                         f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    name = name or config.get("_name_or_path") or model_type
    if model_type == "opt":
        kwargs = _opt(config, name)
    elif model_type in _DEEPSEEK:
        kwargs = _deepseek(config, name)
    else:
        kwargs = _llama(config, name, model_type)
    return {**kwargs, "weight_format": weight_format(config)}


def weight_format(config: dict) -> str:
    """"fp8" for an FP8 checkpoint (2-D weights in float8 with tile scales), "mxfp4" for gpt-oss's (experts 4-bit)."""
    quant = config.get("quantization_config") or {}
    method = quant.get("quant_method")
    if method in (None, "fp8", "mxfp4"):
        return method or "dense"
    raise ValueError(f"config.json quantization_config.quant_method {method!r} is not supported "
                     "(fp8 and mxfp4 are); give the unquantized checkpoint")


def _llama(config: dict, name: str, model_type: str) -> dict:
    hidden = _get(config, "hidden_size")
    heads = _get(config, "num_attention_heads")
    return dict(
        name=name, arch="llama",
        num_layers=_get(config, "num_hidden_layers"), hidden_size=hidden, num_heads=heads,
        num_kv_heads=config.get("num_key_value_heads") or heads,
        head_dim=config.get("head_dim") or hidden // heads,
        intermediate_size=_get(config, "intermediate_size"),
        vocab_size=_get(config, "vocab_size"),
        dtype=hf_dtype(config, "bf16"),
        qkv_bias=model_type == "qwen2" or bool(config.get("attention_bias", False)),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
    )


def _opt(config: dict, name: str) -> dict:
    hidden = _get(config, "hidden_size")
    heads = _get(config, "num_attention_heads")
    return dict(
        name=name, arch="opt",
        num_layers=_get(config, "num_hidden_layers"), hidden_size=hidden, num_heads=heads,
        num_kv_heads=heads, head_dim=hidden // heads,
        intermediate_size=_get(config, "ffn_dim"), vocab_size=_get(config, "vocab_size"),
        dtype=hf_dtype(config, "fp16"), qkv_bias=True,
        tie_word_embeddings=bool(config.get("tie_word_embeddings", True)),
        # OPT's learned position table has 2 extra rows (padding offset)
        num_learned_positions=_get(config, "max_position_embeddings") + 2,
    )


def _deepseek(config: dict, name: str) -> dict:
    heads = _get(config, "num_attention_heads")
    num_experts = config.get("n_routed_experts") or 0
    return dict(
        name=name, arch="mla",
        num_layers=_get(config, "num_hidden_layers"), hidden_size=_get(config, "hidden_size"),
        num_heads=heads, num_kv_heads=heads,
        head_dim=_get(config, "qk_nope_head_dim"),
        intermediate_size=_get(config, "intermediate_size"),
        vocab_size=_get(config, "vocab_size"),
        dtype=hf_dtype(config, "bf16"),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        q_lora_rank=config.get("q_lora_rank") or 0,
        kv_lora_rank=_get(config, "kv_lora_rank"),
        qk_rope_head_dim=_get(config, "qk_rope_head_dim"),
        v_head_dim=_get(config, "v_head_dim"),
        index_num_heads=config.get("index_n_heads") or 0,
        index_head_dim=config.get("index_head_dim") or 0,
        index_topk=config.get("index_topk") or 0,
        num_experts=num_experts,
        num_experts_per_token=(config.get("num_experts_per_tok") or 0) if num_experts else 0,
        num_shared_experts=(config.get("n_shared_experts") or 0) if num_experts else 0,
        moe_intermediate_size=(config.get("moe_intermediate_size") or 0) if num_experts else 0,
        num_dense_layers=(config.get("first_k_dense_replace") or 0) if num_experts else 0,
    )

"""Frozen configuration objects. `ModelConfig` is read from an HF `config.json` and normalised."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from roseinfer.kv.cache_dtype import check_kv_cache_dtype_name

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


# What `dtype=` / the --dtype flags take: "auto" (config.json's torch_dtype, bfloat16 for a float32 one on the
# GPU; float32 on the CPU) or a name.
DTYPE_CHOICES = ("auto", *sorted(_DTYPES))


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    return _DTYPES[dtype]


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_position_embeddings: int
    norm_eps: float
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    hidden_act: str = "silu"
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    sliding_window: int | None = None  # attention window (HF Mistral; Qwen2/3 with use_sliding_window)
    hf_config: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @staticmethod
    def from_dict(cfg: dict[str, Any]) -> ModelConfig:
        archs = cfg.get("architectures") or []
        model_type = cfg.get("model_type", "")
        arch = archs[0] if archs else _ARCH_BY_TYPE.get(model_type, "")
        if model_type == "gpt2" or arch == "GPT2LMHeadModel":
            hidden = cfg["n_embd"]
            heads = cfg["n_head"]
            return ModelConfig(
                architecture="GPT2LMHeadModel",
                model_type="gpt2",
                vocab_size=cfg["vocab_size"],
                hidden_size=hidden,
                num_layers=cfg["n_layer"],
                num_heads=heads,
                num_kv_heads=heads,
                head_dim=hidden // heads,
                intermediate_size=cfg.get("n_inner") or 4 * hidden,
                max_position_embeddings=cfg.get("n_positions", 1024),
                norm_eps=cfg.get("layer_norm_epsilon", 1e-5),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)),
                qkv_bias=True,
                hidden_act=cfg.get("activation_function", "gelu_new"),
                eos_token_ids=_as_tuple(cfg.get("eos_token_id")),
                bos_token_id=cfg.get("bos_token_id"),
                hf_config=dict(cfg),
            )
        supported = sorted(set(_ARCH_BY_TYPE.values()))
        if arch not in supported:  # before reading fields other architectures may lack (a KeyError)
            raise ValueError(
                f"architecture {arch or None!r} (model_type {model_type!r}) is not supported; supported: {supported}"
            )
        # HF's llama and qwen3 then bias q/k/v and o_proj, or every MLP projection.
        for flag, where in (("attention_bias", "o_proj"), ("mlp_bias", "the MLP")):
            if cfg.get(flag) and arch in ("LlamaForCausalLM", "Qwen3ForCausalLM"):
                raise ValueError(f"{flag}=true is not supported (roseinfer has no bias on {where})")
        hidden = cfg["hidden_size"]
        heads = cfg["num_attention_heads"]
        defaults = _HF_DEFAULTS.get(arch, {})
        rope_scaling = cfg.get("rope_scaling")
        rope_theta = cfg.get("rope_theta")
        rope_params = cfg.get("rope_parameters")  # transformers >= 5 folds theta/scaling in here
        if isinstance(rope_params, dict):
            rope_theta = rope_theta or rope_params.get("rope_theta")
            if rope_scaling is None and rope_params.get("rope_type", "default") != "default":
                rope_scaling = dict(rope_params)
        if rope_scaling is not None:
            rope_type = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
            if rope_type not in ("default", "llama3"):
                raise ValueError(f"rope_scaling type {rope_type!r} is not supported (supported: llama3)")
            if rope_type == "default":
                rope_scaling = None
        sliding_window = cfg.get("sliding_window") if model_type == "mistral" else None
        if model_type in ("qwen2", "qwen3") and cfg.get("use_sliding_window"):
            layers = cfg["num_hidden_layers"]
            types = cfg.get("layer_types") or [
                "sliding_attention" if i >= cfg.get("max_window_layers", 28) else "full_attention"
                for i in range(layers)
            ]
            if "sliding_attention" in types:
                sliding_window = cfg.get("sliding_window", 4096)
        return ModelConfig(
            architecture=arch,
            model_type=model_type,
            vocab_size=cfg["vocab_size"],
            hidden_size=hidden,
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads", defaults.get("num_key_value_heads")) or heads,
            head_dim=cfg.get("head_dim", defaults.get("head_dim")) or hidden // heads,
            intermediate_size=cfg["intermediate_size"],
            max_position_embeddings=cfg.get(
                "max_position_embeddings", defaults.get("max_position_embeddings", 2048)
            ),
            norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta or 10000.0),
            rope_scaling=rope_scaling,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=model_type == "qwen2",
            qk_norm=model_type == "qwen3",
            hidden_act=cfg.get("hidden_act", "silu"),
            eos_token_ids=_as_tuple(cfg.get("eos_token_id")),
            bos_token_id=cfg.get("bos_token_id"),
            sliding_window=sliding_window,
            hf_config=dict(cfg),
        )

    @staticmethod
    def from_path(path: str) -> ModelConfig:
        """`path` is a config.json file or a directory holding one."""
        file = os.path.join(path, "config.json") if os.path.isdir(path) else path
        config = ModelConfig.from_dict(_read_json(file))
        gen_file = os.path.join(os.path.dirname(file), "generation_config.json")
        if os.path.isfile(gen_file):  # HF generate and vLLM also stop at generation_config's eos ids
            extra = _as_tuple(_read_json(gen_file).get("eos_token_id"))
            eos = config.eos_token_ids + tuple(t for t in extra if t not in config.eos_token_ids)
            config = dataclasses.replace(config, eos_token_ids=eos)
        return config

    def layer_params(self) -> int:
        """Matmul parameters of one decoder layer."""
        h, inter, d = self.hidden_size, self.intermediate_size, self.head_dim
        attn = h * d * (self.num_heads + 2 * self.num_kv_heads) + self.num_heads * d * h
        mlp = (2 if self.model_type == "gpt2" else 3) * h * inter
        return attn + mlp

    def params_count(self) -> int:
        """Parameters in the decoder (embedding counted once when tied)."""
        emb = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * self.layer_params() + emb

    def kv_bytes_per_token(self, dtype: torch.dtype) -> int:
        elem = torch.empty((), dtype=dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * elem


# What HF's config classes (MistralConfig, Qwen2Config, Qwen3Config) take for keys a config.json leaves out; a key
# set to null falls back to the heads (kv heads) or hidden_size / heads (head_dim), llama's defaults for both.
_HF_DEFAULTS: dict[str, dict[str, int]] = {
    "MistralForCausalLM": {"num_key_value_heads": 8, "max_position_embeddings": 131072},
    "Qwen2ForCausalLM": {"num_key_value_heads": 32, "max_position_embeddings": 32768},
    "Qwen3ForCausalLM": {"num_key_value_heads": 32, "head_dim": 128, "max_position_embeddings": 32768},
}

_ARCH_BY_TYPE = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gpt2": "GPT2LMHeadModel",
}


def _read_json(file: str) -> dict[str, Any]:
    with open(file) as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as e:  # a truncated download, an edit gone wrong
            raise ValueError(f"{file} is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise ValueError(f"{file} holds no JSON object (got a {type(data).__name__})")
    return data


def _as_tuple(x: Any) -> tuple[int, ...]:
    if x is None:
        return ()
    if isinstance(x, list | tuple):
        return tuple(int(i) for i in x)
    return (int(x),)


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    num_blocks: int | None = None  # explicit pool size; overrides the two below
    cpu_kv_tokens: int = 16384  # pool size in tokens when running on the CPU
    enable_prefix_caching: bool = True
    kv_cache_dtype: str = "auto"  # auto (the model's dtype) | fp8 (= fp8_e4m3) | fp8_e5m2: kv/cache_dtype.py
    # The CPU tier below the GPU prefix cache (kv/offload.py): its pinned host memory in GiB (vLLM's
    # --kv-offloading-size); 0: none. `num_cpu_blocks` sets its size in blocks instead.
    kv_offloading_size: float = 0.0
    num_cpu_blocks: int | None = None
    # False: prefixes are reused from the CPU tier only, as if the GPU cache were always thrashed (benchmarks).
    gpu_prefix_reuse: bool = True

    def __post_init__(self) -> None:
        check_kv_cache_dtype_name(self.kv_cache_dtype)
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two >= 1, got {self.block_size}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.num_blocks is not None and self.num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {self.num_blocks}")
        if not self.kv_offloading_size >= 0:
            raise ValueError(f"kv_offloading_size must be >= 0 GiB, got {self.kv_offloading_size}")
        if self.num_cpu_blocks is not None and self.num_cpu_blocks < 0:
            raise ValueError(f"num_cpu_blocks must be >= 0, got {self.num_cpu_blocks}")
        if self.offloads and not self.enable_prefix_caching:
            raise ValueError("the CPU tier (kv_offloading_size) needs prefix caching on: it is keyed by its hashes")

    @property
    def offloads(self) -> bool:
        return bool(self.num_cpu_blocks) if self.num_cpu_blocks is not None else self.kv_offloading_size > 0


SCHEDULER_MODES = ("continuous", "static", "naive")
# Attention launches put a step's sequences on a grid axis that CUDA caps at 65,535 programs.
MAX_NUM_SEQS = 65_535


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 16384  # vLLM's offline default on large GPUs
    mode: str = "continuous"
    enable_chunked_prefill: bool = True
    policy: str = "fcfs"  # admission order: fcfs | lpm | lof (scheduler/policy.py)

    def __post_init__(self) -> None:
        if self.mode not in SCHEDULER_MODES:
            raise ValueError(f"scheduler mode must be one of {SCHEDULER_MODES}, got {self.mode!r}")
        if not 1 <= self.max_num_seqs <= MAX_NUM_SEQS:
            raise ValueError(f"max_num_seqs must be in [1, {MAX_NUM_SEQS}], got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")


@dataclass(frozen=True)
class EngineConfig:
    model: str
    model_config: ModelConfig
    cache: CacheConfig
    scheduler: SchedulerConfig
    dtype: torch.dtype
    device: torch.device
    load_format: str = "auto"  # auto | dummy
    tokenizer: str | None = None
    attention_backend: str = "torch"
    enforce_eager: bool = False
    # Steps with prefill work of up to this many tokens replay CUDA graphs (runner/mixed_graphs.py); 0: eager;
    # None: chosen from the model's size (`auto_mixed_graph_max_tokens`).
    mixed_graph_max_tokens: int | None = None
    # Schedule step N+1 while step N runs on the device (its sampled ids are fed on the device).
    async_scheduling: bool = True
    # Batches of one token run as GEMVs with the norms and residual adds folded in (llama family, CUDA).
    one_token_gemv: bool = True
    # Fold each layer's RMSNorm weights into the linear after it, so that decode-only steps launch no norm:
    # the kernels that read those linears' outputs apply 1 / rms (llama family without q/k norm, Triton
    # attention, bf16/fp32; fp16 is left alone, as un-normalised rows times weights may overflow it).
    fold_norms: bool = True
    # Decode-only steps with folded norms on an sm_90+ GPU run their GEMMs as Triton kernels that, with SiLU
    # and attention, form one programmatic-dependent-launch chain: each launch overlaps the tail of the one
    # before (kernels/pdl.py, kernels/skinny_gemm.py). Small models (hidden <= 1024) chain steps of up to 64
    # rows; wider ones up to 24, attention only up to 8 (models/llama.decode_chain).
    pdl_decode: bool = True
    # Prefill attention may cut a short chunk's keys over a long cached prefix across programs
    # (kernels/prefill_plan.py; Triton attention).
    prefill_key_splits: bool = True
    seed: int = 0
    max_model_len: int = 0  # 0: the model's max_position_embeddings
    # As vLLM's: the most logprobs a request may ask for a token (SamplingParams.logprobs, -1 counting as the
    # vocabulary's size); -1: no cap.
    max_logprobs: int = 20

    def __post_init__(self) -> None:
        if not isinstance(self.max_logprobs, int) or self.max_logprobs < -1:
            raise ValueError(f"max_logprobs must be an int >= 0, or -1 (no cap), got {self.max_logprobs!r}")
        if self.mixed_graph_max_tokens is not None and self.mixed_graph_max_tokens < 0:
            raise ValueError(f"mixed_graph_max_tokens must be >= 0, got {self.mixed_graph_max_tokens}")

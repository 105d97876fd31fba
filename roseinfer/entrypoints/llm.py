"""`LLM(model=...).generate(prompts, SamplingParams)`: the offline API, shaped like vLLM's."""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from roseinfer.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig, parse_dtype
from roseinfer.engine.llm_engine import LLMEngine, Prompt, default_device
from roseinfer.entrypoints.beam_search import BeamSearchOutput, BeamSearchParams, run_beam_search
from roseinfer.metrics import Metric
from roseinfer.models.loader import resolve_model_path
from roseinfer.outputs import RequestOutput
from roseinfer.sampling_params import RequestOutputKind, SamplingParams


class InvalidRequestError(ValueError):
    """Some prompts of a `generate` call were rejected; the valid ones ran and are in `outputs`."""

    def __init__(self, errors: dict[int, str], outputs: list[RequestOutput | None]) -> None:
        lines = "; ".join(f"prompt {i}: {msg}" for i, msg in errors.items())
        super().__init__(f"{len(errors)} of {len(outputs)} requests rejected: {lines}")
        self.errors = errors
        self.outputs = outputs


def make_engine_config(
    model: str,
    *,
    load_format: str = "auto",
    dtype: str | torch.dtype = "auto",
    device: str | torch.device | None = None,
    tokenizer: str | None = None,
    block_size: int = 16,
    gpu_memory_utilization: float = 0.9,
    num_kv_blocks: int | None = None,
    cpu_kv_tokens: int = 16384,
    enable_prefix_caching: bool = True,
    kv_cache_dtype: str = "auto",
    kv_offloading_size: float = 0.0,
    num_cpu_blocks: int | None = None,
    gpu_prefix_reuse: bool = True,
    max_num_seqs: int = 256,
    max_num_batched_tokens: int = 16384,
    scheduler_mode: str = "continuous",
    enable_chunked_prefill: bool = True,
    admission_policy: str = "fcfs",
    max_model_len: int | None = None,
    attention_backend: str | None = None,
    enforce_eager: bool = False,
    mixed_graph_max_tokens: int | None = None,
    async_scheduling: bool = True,
    one_token_gemv: bool = True,
    fold_norms: bool = True,
    pdl_decode: bool = True,
    prefill_key_splits: bool = True,
    seed: int = 0,
    max_logprobs: int = 20,
) -> tuple[EngineConfig, str]:
    path = resolve_model_path(model, need_weights=load_format != "dummy")
    model_config = ModelConfig.from_path(path)
    dev = torch.device(device) if device is not None else default_device()
    if dtype == "auto":
        dtype = model_config.hf_config.get("torch_dtype") or model_config.hf_config.get("dtype") or "float32"
        if dev.type == "cpu":
            dtype = "float32"  # half precision matmuls on CPU are slow and gain nothing here
        elif dtype == "float32":
            dtype = "bfloat16"  # as vLLM: a float32 (or untyped) checkpoint serves in bf16 on the GPU
    if max_model_len is not None and max_model_len < 0:
        raise ValueError(f"max_model_len must be >= 0 (0: the model's), got {max_model_len}")
    limit = model_config.max_position_embeddings
    if model_config.sliding_window is not None:
        limit = min(limit, model_config.sliding_window)  # up to the window, full attention is exact
    max_len = max_model_len or limit
    if max_len > limit:
        what = f"max_position_embeddings {model_config.max_position_embeddings}"
        if limit < model_config.max_position_embeddings:
            what = f"sliding_window {limit} (sliding-window attention is not supported; within it, full is exact)"
        raise ValueError(f"max_model_len {max_len} exceeds the model's {what}")
    if attention_backend is None:
        attention_backend = "triton" if dev.type == "cuda" and _triton_available() else "torch"
    config = EngineConfig(
        model=model,
        model_config=model_config,
        cache=CacheConfig(
            block_size,
            gpu_memory_utilization,
            num_kv_blocks,
            cpu_kv_tokens,
            enable_prefix_caching,
            kv_cache_dtype,
            kv_offloading_size,
            num_cpu_blocks,
            gpu_prefix_reuse,
        ),
        scheduler=SchedulerConfig(
            max_num_seqs, max_num_batched_tokens, scheduler_mode, enable_chunked_prefill, admission_policy
        ),
        dtype=parse_dtype(dtype),
        device=dev,
        load_format=load_format,
        tokenizer=tokenizer,
        attention_backend=attention_backend,
        enforce_eager=enforce_eager,
        mixed_graph_max_tokens=mixed_graph_max_tokens,
        async_scheduling=async_scheduling,
        one_token_gemv=one_token_gemv,
        fold_norms=fold_norms,
        pdl_decode=pdl_decode,
        prefill_key_splits=prefill_key_splits,
        seed=seed,
        max_model_len=max_len,
        max_logprobs=max_logprobs,
    )
    return config, path


def load_prefix_file(path: str) -> list[str | list[int]]:
    """Prefixes to pin: a JSON list (of strings or token-id lists), or JSON lines with one such item each."""
    with open(path) as f:
        text = f.read()
    try:
        items = json.loads(text)
    except json.JSONDecodeError:
        items = [json.loads(line) for line in text.splitlines() if line.strip()]
    if not isinstance(items, list) or not all(isinstance(i, str | list) for i in items):
        raise ValueError(
            f"{path}: expected a JSON list of prompts (strings or token-id lists), or JSON lines"
        )
    return items


def final_only(params: list) -> list:
    """As vLLM's `generate`: each request returns its finished output only (FINAL_ONLY), whatever its params
    asked. Set on copies, one per distinct params object: the caller's are left as they were."""
    copies: dict[int, SamplingParams] = {}
    out = []
    for p in params:
        if isinstance(p, SamplingParams) and p.output_kind is not RequestOutputKind.FINAL_ONLY:
            if id(p) not in copies:
                copies[id(p)] = copy.copy(p)
                copies[id(p)].output_kind = RequestOutputKind.FINAL_ONLY
            p = copies[id(p)]
        out.append(p)
    return out


def _as_batch(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    """One prompt (text, a dict, or token ids, not a batch of one-token prompts) as a batch of one."""
    if isinstance(prompts, str | dict) or (
        isinstance(prompts, list | tuple | np.ndarray)
        and len(prompts) > 0
        and isinstance(prompts[0], int | np.integer)
    ):
        return [prompts]  # type: ignore[list-item]
    return list(prompts)  # type: ignore[arg-type]


def _triton_available() -> bool:
    try:
        import roseinfer.attention.triton_backend  # noqa: F401
    except ImportError:
        return False
    return True


class LLM:
    """Offline engine. `model` is an HF directory, a hub id, a config.json, or a built-in shape id
    (`roseinfer.models.loader.builtin_shapes()`) with `load_format="dummy"`."""

    def __init__(
        self,
        model: str,
        pinned_prefixes: Sequence[str | list[int]] = (),
        pin_prefix_file: str | None = None,
        **kwargs,
    ) -> None:
        config, path = make_engine_config(model, **kwargs)
        self.engine = LLMEngine(config, path)
        prefixes = list(pinned_prefixes) + (load_prefix_file(pin_prefix_file) if pin_prefix_file else [])
        self.pinned_tokens = [self.engine.pin_prefix(p) for p in prefixes]

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def chat(
        self,
        conversations: list[dict] | list[list[dict]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """`generate` over chat conversations ([{"role": ..., "content": ...}, ...]), rendered with the
        tokenizer's chat template and a generation prompt."""
        from roseinfer.tokenizer import apply_chat_template

        if self.tokenizer is None:
            raise ValueError("chat needs a tokenizer with a chat template; this engine has none")
        if conversations and isinstance(conversations[0], dict):
            conversations = [conversations]  # type: ignore[list-item]
        prompts = [apply_chat_template(self.tokenizer, conv) for conv in conversations]  # type: ignore[arg-type]
        return self.generate(prompts, sampling_params, use_tqdm)

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Outputs come back in input order. Invalid prompts are reported together, after the valid ones
        have run, as an `InvalidRequestError` (a ValueError) carrying the valid outputs."""
        prompts = _as_batch(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        params = (
            [sampling_params] * len(prompts)
            if isinstance(sampling_params, SamplingParams)
            else list(sampling_params)
        )
        if len(params) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(params)} sampling params")
        params = final_only(params)
        engine = self.engine
        index: dict[str, int] = {}
        errors: dict[int, str] = {}
        results: list[RequestOutput | None] = [None] * len(prompts)
        try:
            for i, (prompt, p) in enumerate(zip(prompts, params)):
                try:
                    index[engine.add_request(prompt, p)] = i
                except ValueError as e:
                    errors[i] = str(e)
            self._run(index, results, use_tqdm)
        except BaseException:
            engine.abort_request(index)  # as vLLM: a call that raises leaves none of its requests queued
            raise
        if errors:
            raise InvalidRequestError(errors, results)
        return results  # type: ignore[return-value]

    def beam_search(
        self, prompts: Prompt | Sequence[Prompt], params: BeamSearchParams, use_tqdm: bool = False
    ) -> list[BeamSearchOutput]:
        """vLLM's offline beam search (`roseinfer.entrypoints.beam_search`): one `BeamSearchOutput` a prompt, in
        input order, holding its best `params.beam_width` beams, best first. Prompts as `generate` takes them;
        a bad one raises a ValueError naming it before anything runs."""
        return run_beam_search(self, _as_batch(prompts), params, use_tqdm)

    def get_metrics(self) -> list[Metric]:
        """The engine's counters and gauges now (`roseinfer.metrics`: Counter and Gauge, each a name, labels and a
        value), as vLLM v1's `LLM.get_metrics()`: requests running and waiting, KV cache usage, prefix-cache
        queries and hits (tokens), preemptions, prompt and generated tokens, finished requests by reason."""
        return self.engine.get_metrics()

    def _run(self, index: dict[str, int], results: list[RequestOutput | None], use_tqdm: bool) -> None:
        """Steps the engine until it is idle; the output of request `rid` goes to `results[index[rid]]`."""
        engine = self.engine
        # Each request's token budget as admitted (max_tokens=None resolved), for the progress bar.
        budget = {i: engine.groups[rid].root.params for rid, i in index.items()}
        total = sum(p.max_tokens * p.n for p in budget.values())
        with tqdm(total=total, desc="generate", unit="tok", disable=not use_tqdm or not index) as bar:
            while engine.has_unfinished_requests():
                before = engine.num_generated_tokens
                for out in engine.step():
                    i = index.get(out.request_id)
                    if i is not None:
                        results[i] = out
                        # Requests that stop early: count their unused budget as done.
                        unused = budget[i].max_tokens * budget[i].n - sum(
                            len(c.token_ids) for c in out.outputs
                        )
                        bar.update(unused)
                bar.update(engine.num_generated_tokens - before)

"""Offline throughput: one workload through the naive / static / continuous schedulers, and HF `generate`
on the same weights as the peer, with the roofline floor of the run when on a GPU.

    roseinfer bench throughput --model-shape qwen2.5-0.5b --workload W1 --mode all --peer hf

Report per mode, as the original notes printed it. "Elapsed (decode/run)" is the wall time of the engine
steps that held no prefill work (`EngineCore.stats.decode_time`); "Elapsed (prefill/add)" is everything
else of the timed run: adding the requests, the steps that held prefill work, the loop around them.
The two add up to "Elapsed (total)", the wall time of the timed run.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from roseinfer.bench.env import bench_header, format_header, measure_copy_bandwidth, measure_matmul_tflops
from roseinfer.bench.workloads import WORKLOADS, Workload, build_workload
from roseinfer.config import SCHEDULER_MODES, ModelConfig
from roseinfer.engine.llm_engine import LLMEngine
from roseinfer.entrypoints.llm import make_engine_config
from roseinfer.models.loader import DEFAULT_MODEL
from roseinfer.profiling import profile_to

CPU_KV_TOKENS = 16384  # make_engine_config's default pool on the CPU; grown to fit the workload


# -- results ---------------------------------------------------------------------------------------


@dataclass
class RunResult:
    name: str
    num_requests: int
    prefill_time: float
    decode_time: float
    total_time: float
    prompt_tokens: int
    completion_tokens: int
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def completion_throughput(self) -> float:
        return self.completion_tokens / self.total_time

    @property
    def total_throughput(self) -> float:
        return self.total_tokens / self.total_time

    def report(self) -> str:
        return "\n".join(
            [
                f"=== {self.name} ===",
                f"Requests: {self.num_requests}",
                f"Elapsed (prefill/add): {self.prefill_time:.6f} seconds",
                f"Elapsed (decode/run): {self.decode_time:.6f} seconds",
                f"Elapsed (total): {self.total_time:.6f} seconds",
                f"Prompt tokens: {self.prompt_tokens}",
                f"Completion tokens: {self.completion_tokens}",
                f"Total tokens: {self.total_tokens}",
                f"Throughput (completion): {self.completion_throughput:.2f} tokens/s",
                f"Throughput (total): {self.total_throughput:.2f} tokens/s",
            ]
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(
            total_tokens=self.total_tokens,
            completion_throughput=self.completion_throughput,
            total_throughput=self.total_throughput,
        )
        return d


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# -- roseinfer -------------------------------------------------------------------------------------


def run_engine(engine: LLMEngine, workload: Workload, name: str) -> RunResult:
    """Add every request of `workload`, step until all finish; timed from the first add to the last step."""
    core = engine.core
    device = engine.config.device
    _sync(device)
    core.stats.reset()
    t0 = time.perf_counter()
    for prompt, params in zip(workload.prompts, workload.params):
        engine.add_request(prompt, params)
    t_added = time.perf_counter()
    completion = 0
    while engine.has_unfinished_requests():
        for out in engine.step(final_only=True):
            completion += sum(len(c.token_ids) for c in out.outputs)
    _sync(device)
    total = time.perf_counter() - t0
    if completion != workload.num_output_tokens:
        raise RuntimeError(
            f"{name}: {completion} completion tokens, the workload asked for {workload.num_output_tokens}"
        )
    stats = core.stats
    return RunResult(
        name=name,
        num_requests=workload.num_requests,
        prefill_time=total - stats.decode_time,
        decode_time=stats.decode_time,
        total_time=total,
        prompt_tokens=workload.num_prompt_tokens,
        completion_tokens=completion,
        extra={
            "add_time": t_added - t0,
            "prefill_step_time": stats.prefill_time,
            "num_steps": stats.num_steps,
            "num_prompt_tokens_computed": stats.num_prompt_tokens_computed,
            "num_preemptions": core.scheduler.num_preemptions,
            "num_kv_blocks": core.num_blocks,
        },
    )


def warmup_workload(args: argparse.Namespace, workload: Workload, vocab_size: int) -> Workload:
    """The workload's requests with other token ids (another seed: nothing left in a prefix cache for the
    timed run to hit) and short outputs. By default every request: the warm-up then meets the timed run's
    prefill chunk and decode batch shapes, so that one-time costs (kernel compiles and autotuning,
    allocator growth) stay out of the timed run; a 4-request warm-up left ~1 s of them in W1's prefill."""
    n = args.warmup_requests if args.warmup_requests is not None else workload.num_requests
    n = max(1, min(n, workload.num_requests))
    out_len = max(1, args.warmup_output_len)
    other = build_workload(
        workload.id,
        vocab_size,
        num_requests=n,
        max_prompt_len=args.max_prompt_len,
        max_output_len=min(args.max_output_len or out_len, out_len),
        seed=workload.seed + 1,
    )
    return other.head(n)


def engine_kwargs(args: argparse.Namespace, workload: Workload, mode: str) -> dict[str, Any]:
    """make_engine_config keywords: explicit options win over the workload's, which win over defaults."""
    kw: dict[str, Any] = {"load_format": "dummy", "dtype": args.dtype, "scheduler_mode": mode}
    if args.device is not None:
        kw["device"] = args.device
    kw.update(workload.engine_overrides)
    names = (
        "max_num_seqs",
        "max_num_batched_tokens",
        "block_size",
        "gpu_memory_utilization",
        "attention_backend",
        "num_kv_blocks",
        "enable_prefix_caching",
        "enable_chunked_prefill",
        "max_model_len",
    )
    for name in names:
        value = getattr(args, name, None)
        if value is not None:
            kw[name] = value
    if args.enforce_eager:
        kw["enforce_eager"] = True
    # On the CPU the pool is sized in tokens: make the whole workload fit, as it would on a GPU.
    block = kw.get("block_size", 16)
    need = sum(
        -(-(len(p) + s.max_tokens) // block) * block for p, s in zip(workload.prompts, workload.params)
    )
    kw["cpu_kv_tokens"] = max(CPU_KV_TOKENS, need)
    return kw


# -- HF transformers peer --------------------------------------------------------------------------


def build_hf_model(model_config: ModelConfig, dtype: torch.dtype, device: torch.device) -> nn.Module:
    """An HF model of the same config (random weights until `export_to_hf` fills them)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = {k: v for k, v in model_config.hf_config.items() if k not in ("torch_dtype", "dtype")}
    hf_config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype)
    return model.eval()


def _hf_source(ours: dict[str, torch.Tensor], model: nn.Module, name: str) -> torch.Tensor | None:
    """The slice of roseinfer's parameters that holds HF parameter `name` (as roseinfer's own
    `load_weight` would have placed it), or None when there is none."""
    stacked: dict[str, tuple[str, int]] | None = getattr(model, "stacked_params", None)
    if stacked is not None:  # Llama family: fused qkv_proj / gate_up_proj
        for frag, (fused, shard) in stacked.items():
            if frag in name:
                target = ours.get(name.replace(frag, fused))
                if target is None:
                    return None
                sizes = model.shard_sizes(fused)
                start = sum(sizes[:shard])
                return target[start : start + sizes[shard]]
        return ours.get(name)
    # GPT-2: our names drop HF's "transformer." prefix; the LM head is the token embedding.
    if name == "lm_head.weight":
        return ours.get("wte.weight")
    return ours.get(name.removeprefix("transformer."))


@torch.no_grad()
def export_to_hf(model: nn.Module, hf_model: nn.Module) -> None:
    """Copy roseinfer's weights into an HF model of the same config. Raises ValueError naming every HF
    parameter left unfilled and every shape that does not match."""
    ours = dict(model.named_parameters(remove_duplicate=False))
    modules = dict(hf_model.named_modules())
    unfilled: list[str] = []
    mismatched: list[str] = []
    for name, param in hf_model.named_parameters(remove_duplicate=False):
        src = _hf_source(ours, model, name)
        if src is None:
            unfilled.append(name)
            continue
        owner = modules.get(name.rpartition(".")[0])
        if type(owner).__name__ == "Conv1D" and name.endswith(".weight"):
            src = src.t()  # HF GPT-2 Conv1D stores [in, out]; our nn.Linear holds [out, in]
        if src.shape != param.shape:
            mismatched.append(f"{name}: HF {tuple(param.shape)} vs ours {tuple(src.shape)}")
            continue
        param.copy_(src)
    if unfilled or mismatched:
        raise ValueError(
            f"cannot export {type(model).__name__} to {type(hf_model).__name__}: "
            f"{len(unfilled)} HF parameters have no source {unfilled[:8]}, "
            f"{len(mismatched)} shapes differ {mismatched[:8]}"
        )


def _first_call_timer(device: torch.device) -> Any:
    from transformers import LogitsProcessor

    class FirstCallTimer(LogitsProcessor):
        """Notes when the first logits (the end of the prefill forward) reach the sampler."""

        def __init__(self) -> None:
            self.time: float | None = None

        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            if self.time is None:
                _sync(device)
                self.time = time.perf_counter()
            return scores

    return FirstCallTimer()


def _hf_batches(workload: Workload, batch_size: int | None) -> list[list[int]]:
    n = workload.num_requests
    uniform = len(set(workload.prompt_lens)) == 1 and len(set(workload.output_lens)) == 1
    size = batch_size or (n if uniform else 64)
    return [list(range(i, min(i + size, n))) for i in range(0, n, size)]


@torch.inference_mode()
def hf_generate_batch(
    hf_model: nn.Module,
    prompts: list[list[int]],
    max_new_tokens: int,
    temperature: float,
    device: torch.device,
    pad_token_id: int = 0,
) -> tuple[torch.Tensor, float | None]:
    """Left-padded static batch through `generate`, never stopping early. Returns (new tokens
    [batch, max_new_tokens], perf_counter time of the first logits)."""
    from transformers import LogitsProcessorList

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, width - len(p) :] = torch.tensor(p)
        mask[row, width - len(p) :] = 1
    timer = _first_call_timer(device)
    sampling: dict[str, Any] = (
        {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
        if temperature >= 1e-5
        else {"do_sample": False}
    )
    out = hf_model.generate(
        ids.to(device),
        attention_mask=mask.to(device),
        max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens,
        pad_token_id=pad_token_id,
        logits_processor=LogitsProcessorList([timer]),
        **sampling,
    )
    return out[:, width:], timer.time


def run_hf(
    hf_model: nn.Module, workload: Workload, device: torch.device, batch_size: int | None
) -> RunResult:
    prefill = decode = 0.0
    completion = 0
    batches = _hf_batches(workload, batch_size)
    _sync(device)
    t0 = time.perf_counter()
    for rows in batches:
        temps = {workload.params[i].temperature for i in rows}
        if len(temps) != 1:
            raise ValueError(f"HF batches need one temperature, got {sorted(temps)}")
        max_new = max(workload.params[i].max_tokens for i in rows)
        _sync(device)
        start = time.perf_counter()
        new, first = hf_generate_batch(
            hf_model, [workload.prompts[i] for i in rows], max_new, temps.pop(), device
        )
        _sync(device)
        end = time.perf_counter()
        if new.shape[1] != max_new:
            raise RuntimeError(f"HF generate returned {new.shape[1]} new tokens, asked for {max_new}")
        first = first if first is not None else end
        prefill += first - start
        decode += end - first
        completion += sum(workload.params[i].max_tokens for i in rows)  # each request's own length
    total = time.perf_counter() - t0
    return RunResult(
        name="hf",
        num_requests=workload.num_requests,
        prefill_time=total - decode,
        decode_time=decode,
        total_time=total,
        prompt_tokens=workload.num_prompt_tokens,
        completion_tokens=completion,
        extra={
            "num_batches": len(batches),
            "prefill_forward_time": prefill,
            "generated_tokens_incl_padding": sum(
                len(rows) * max(workload.params[i].max_tokens for i in rows) for rows in batches
            ),
        },
    )


# -- roofline floor --------------------------------------------------------------------------------


def roofline_floor(
    model_config: ModelConfig,
    dtype: torch.dtype,
    workload: Workload,
    max_num_seqs: int,
    bandwidth: float,
    tflops: float,
) -> dict[str, float]:
    """Lower bound of the run's time on this device.

    Prefill: 2 x matmul params x prompt tokens (the LM head only at each request's last prompt token)
    at the measured matmul rate. Decode: every decode step reads all weights once, and each generated
    token reads its context's KV once, at the measured copy bandwidth. Steps: at least the longest
    output, and at least the decode tokens over the batch limit.
    """
    c = model_config
    elem = torch.empty((), dtype=dtype).element_size()
    embed = c.vocab_size * c.hidden_size
    layer_params = c.params_count() - embed * (1 if c.tie_word_embeddings else 2)
    prefill_flops = 2 * layer_params * workload.num_prompt_tokens + 2 * embed * workload.num_requests
    decode_tokens = [max(0, n - 1) for n in workload.output_lens]  # the first token comes from prefill
    steps = max(max(decode_tokens), math.ceil(sum(decode_tokens) / max_num_seqs))
    weight_bytes = (layer_params + embed) * elem
    kv_bytes = c.kv_bytes_per_token(dtype) * sum(
        d * (p + 1 + (d - 1) / 2) for p, d in zip(workload.prompt_lens, decode_tokens)
    )
    prefill_s = prefill_flops / (tflops * 1e12)
    decode_s = (steps * weight_bytes + kv_bytes) / bandwidth
    return {
        "bandwidth_bytes_per_s": bandwidth,
        "matmul_tflops": tflops,
        "prefill_flops": float(prefill_flops),
        "decode_steps": float(steps),
        "decode_weight_bytes": float(steps * weight_bytes),
        "decode_kv_bytes": float(kv_bytes),
        "prefill_floor_s": prefill_s,
        "decode_floor_s": decode_s,
        "floor_s": prefill_s + decode_s,
    }


def format_roofline(floor: dict[str, float], results: list[RunResult]) -> str:
    lines = [
        "=== roofline floor ===",
        f"Copy bandwidth (read+write): {floor['bandwidth_bytes_per_s'] / 1e12:.3f} TB/s",
        f"Matmul rate: {floor['matmul_tflops']:.1f} TFLOP/s",
        f"Prefill floor: {floor['prefill_floor_s']:.6f} seconds",
        f"Decode floor: {floor['decode_floor_s']:.6f} seconds "
        f"({floor['decode_steps']:.0f} steps, {floor['decode_weight_bytes'] / 1e9:.2f} GB weights, "
        f"{floor['decode_kv_bytes'] / 1e9:.2f} GB KV)",
        f"Floor (total): {floor['floor_s']:.6f} seconds",
    ]
    lines += [f"{r.name}: {r.total_time / floor['floor_s']:.2f}x floor" for r in results]
    return "\n".join(lines)


# -- the command -----------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--model-shape", default=None, help=f"built-in shape id (default {DEFAULT_MODEL})")
    src.add_argument("--model", default=None, help="HF model directory or config.json (dummy weights)")
    parser.add_argument("--workload", default="W1", type=str.upper, choices=sorted(WORKLOADS))
    parser.add_argument("--mode", default="continuous", choices=[*SCHEDULER_MODES, "all"])
    parser.add_argument("--peer", choices=["hf"], default=None, help="also run HF generate, same weights")
    parser.add_argument(
        "--hf-batch-size", type=int, default=None, help="HF batch (default: all if uniform, else 64)"
    )
    parser.add_argument("--num-requests", type=int, default=None, help="shrink the workload (quick runs)")
    parser.add_argument("--max-prompt-len", type=int, default=None, help="shrink prompt lengths")
    parser.add_argument("--max-output-len", type=int, default=None, help="shrink output lengths")
    parser.add_argument("--seed", type=int, default=0, help="workload seed")
    parser.add_argument("--warmup-requests", type=int, default=None, help="default: all of the workload's")
    parser.add_argument("--warmup-output-len", type=int, default=4, help="output tokens per warm-up request")
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--json", default=None, metavar="PATH", help="write every number here")
    parser.add_argument("--no-roofline", action="store_true", help="skip measuring the device limits")
    parser.add_argument("--profile", default=None, metavar="PATH", help="torch profiler trace of the timed run(s)")
    engine = parser.add_argument_group("engine")
    engine.add_argument("--max-num-seqs", type=int, default=None)
    engine.add_argument("--max-num-batched-tokens", type=int, default=None)
    engine.add_argument("--block-size", type=int, default=None)
    engine.add_argument("--gpu-memory-utilization", type=float, default=None)
    engine.add_argument("--num-kv-blocks", type=int, default=None)
    engine.add_argument("--max-model-len", type=int, default=None)
    engine.add_argument("--attention-backend", default=None)
    engine.add_argument("--enforce-eager", action="store_true")
    engine.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    engine.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=None)


def run_throughput(args: argparse.Namespace) -> dict[str, Any]:
    """Runs the command; prints the report and returns every number (also written to --json)."""
    model = args.model or args.model_shape or DEFAULT_MODEL
    shape = os.path.basename(os.path.normpath(model)).removesuffix(".json")
    modes = list(SCHEDULER_MODES[::-1]) if args.mode == "all" else [args.mode]  # naive, static, continuous

    # The first config only resolves the model and device; each mode builds its own engine.
    probe, path = make_engine_config(model, load_format="dummy", dtype=args.dtype, device=args.device)
    model_config, device, dtype = probe.model_config, probe.device, probe.dtype
    workload = build_workload(
        args.workload,
        model_config.vocab_size,
        num_requests=args.num_requests,
        max_prompt_len=args.max_prompt_len,
        max_output_len=args.max_output_len,
        seed=args.seed,
    )
    header = bench_header(
        workload.id,
        shape,
        command=getattr(args, "argv", None),
        device=device,
        workload_description=workload.description,
        workload_scaled=workload.scaled,
        dtype=str(dtype).removeprefix("torch."),
        modes=",".join(modes),
        peer=args.peer or "none",
    )
    print(format_header(header), flush=True)

    # Device limits first: the engine takes most of the GPU memory for its KV cache.
    limits: tuple[float, float] | None = None
    if device.type == "cuda" and not args.no_roofline:
        mm_dtype = dtype if dtype in (torch.float16, torch.bfloat16) else torch.bfloat16
        limits = (measure_copy_bandwidth(device), measure_matmul_tflops(device, mm_dtype))

    warmup = warmup_workload(args, workload, model_config.vocab_size)
    results: list[RunResult] = []
    shared_model: nn.Module | None = None
    max_num_seqs = 0
    for mode in modes:
        config, path = make_engine_config(model, **engine_kwargs(args, workload, mode))
        engine = LLMEngine(config, path, shared_model)
        shared_model = engine.core.runner.model
        max_num_seqs = max(max_num_seqs, 1 if mode == "naive" else config.scheduler.max_num_seqs)
        run_engine(engine, warmup, f"{mode} (warm-up)")
        trace = f"{args.profile.removesuffix('.json')}.{mode}.json" if args.profile else None
        with profile_to(trace):
            result = run_engine(engine, workload, mode)
        results.append(result)
        print(result.report(), flush=True)
        del engine
        _free(device)

    hf_result: RunResult | None = None
    if args.peer == "hf":
        assert shared_model is not None
        hf_model = build_hf_model(model_config, dtype, device)
        export_to_hf(shared_model, hf_model)
        shared_model = None
        _free(device)
        run_hf(hf_model, warmup, device, args.hf_batch_size)
        hf_result = run_hf(hf_model, workload, device, args.hf_batch_size)
        print(hf_result.report(), flush=True)
        for r in results:
            ratio = r.completion_throughput / hf_result.completion_throughput
            print(f"Ratio roseinfer/HF (completion tok/s), {r.name}: {ratio:.2f}x")
        del hf_model
        _free(device)

    floor: dict[str, float] | None = None
    if limits is not None:
        floor = roofline_floor(model_config, dtype, workload, max(max_num_seqs, 1), *limits)
        print(format_roofline(floor, results + ([hf_result] if hf_result else [])), flush=True)

    report: dict[str, Any] = {
        "header": header,
        "workload": workload.summary(),
        "results": {r.name: r.to_dict() for r in results},
        "peer": hf_result.to_dict() if hf_result else None,
        "ratio_to_hf": (
            {r.name: r.completion_throughput / hf_result.completion_throughput for r in results}
            if hf_result
            else None
        ),
        "roofline": floor,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return report


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run(args: argparse.Namespace) -> int:
    run_throughput(args)
    return 0

"""The HF transformers peer of `bench throughput`: an HF model of the same config, roseinfer's weights
copied into it, and the workload through HF `generate`, timed."""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

from roseinfer.bench.device import sync
from roseinfer.bench.run_result import RunResult
from roseinfer.bench.workloads import Workload
from roseinfer.config import ModelConfig


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
    # GPT-2: our names drop HF's "transformer." prefix; a tied LM head is the token embedding.
    if name == "lm_head.weight":
        return ours.get("lm_head.weight", ours.get("wte.weight"))
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
                sync(device)
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
    sync(device)
    t0 = time.perf_counter()
    for rows in batches:
        temps = {workload.params[i].temperature for i in rows}
        if len(temps) != 1:
            raise ValueError(f"HF batches need one temperature, got {sorted(temps)}")
        max_new = max(workload.params[i].max_tokens for i in rows)
        sync(device)
        start = time.perf_counter()
        new, first = hf_generate_batch(
            hf_model, [workload.prompts[i] for i in rows], max_new, temps.pop(), device
        )
        sync(device)
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

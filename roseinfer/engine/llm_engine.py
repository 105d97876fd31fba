"""Synchronous engine for offline use: validation, tokenization, detokenization, stop strings, outputs."""

from __future__ import annotations

import itertools
import math
import os
from typing import Any

import torch
from torch import nn

from roseinfer.config import EngineConfig
from roseinfer.engine.core import EngineCore
from roseinfer.outputs import CompletionOutput, RequestMetrics, RequestOutput
from roseinfer.request import Request, RequestStatus
from roseinfer.sampling_params import SamplingParams

Prompt = str | list[int]


class LLMEngine:
    def __init__(self, config: EngineConfig, model_path: str, model: nn.Module | None = None) -> None:
        self.config = config
        self.model_config = config.model_config
        self.tokenizer = self._load_tokenizer(config, model_path)
        self.core = EngineCore(config, model_path, model)
        self.requests: dict[str, _Tracked] = {}
        self._ids = itertools.count()

    @staticmethod
    def _load_tokenizer(config: EngineConfig, model_path: str) -> Any | None:
        from roseinfer.tokenizer import load_tokenizer

        if config.tokenizer is not None:
            return load_tokenizer(config.tokenizer)
        has_files = os.path.isdir(model_path) and any(
            os.path.isfile(os.path.join(model_path, f)) for f in ("tokenizer.json", "tokenizer_config.json")
        )
        return load_tokenizer(model_path) if has_files else None

    # -- front door -------------------------------------------------------------------------------

    def validate(self, prompt: Prompt, params: SamplingParams) -> list[int]:
        """Tokenize and check one request; raises ValueError naming the field and the limit."""
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling params must be a SamplingParams, got {type(params).__name__}")
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer; this engine has none (use stop_token_ids)")
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("prompt is text but this engine has no tokenizer; pass token ids")
            ids = self.tokenizer.encode(prompt)
        elif isinstance(prompt, list | tuple):
            ids = list(prompt)
        else:
            raise ValueError(f"prompt must be a string or a list of token ids, got {type(prompt).__name__}")
        if not ids:
            raise ValueError("prompt must not be empty")
        vocab = self.model_config.vocab_size
        for i, t in enumerate(ids):
            if isinstance(t, float) and math.isnan(t):
                raise ValueError(f"prompt token id at position {i} is NaN")
            if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab:
                raise ValueError(
                    f"prompt token id {t!r} at position {i} is outside the vocabulary [0, {vocab})"
                )
        max_len = self.config.max_model_len
        if len(ids) >= max_len:
            raise ValueError(f"prompt has {len(ids)} tokens; the model context is {max_len} (max_model_len)")
        if len(ids) + params.max_tokens > max_len:
            raise ValueError(
                f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) exceeds the model context "
                f"of {max_len} tokens (max_model_len)"
            )
        pool_tokens = self.core.num_blocks * self.config.cache.block_size
        if len(ids) + params.max_tokens > pool_tokens:
            raise ValueError(
                f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) can never fit the KV cache "
                f"of {pool_tokens} tokens ({self.core.num_blocks} blocks)"
            )
        return ids

    def add_request(
        self,
        prompt: Prompt,
        params: SamplingParams,
        request_id: str | None = None,
        arrival_time: float | None = None,
    ) -> str:
        ids = self.validate(prompt, params)
        rid = request_id if request_id is not None else str(next(self._ids))
        if rid in self.requests:
            raise ValueError(f"request_id {rid!r} is already in use")
        req = Request(
            rid,
            ids,
            params,
            self.model_config.eos_token_ids,
            prompt if isinstance(prompt, str) else None,
            arrival_time,
        )
        self.requests[rid] = _Tracked(req, self._detokenizer(req))
        self.core.add_request(req)
        return rid

    def _detokenizer(self, req: Request) -> Any | None:
        if self.tokenizer is None:
            return None
        from roseinfer.tokenizer import IncrementalDetokenizer

        return IncrementalDetokenizer(self.tokenizer, req.prompt_token_ids, req.params.skip_special_tokens)

    def abort_request(self, request_id: str) -> None:
        tracked = self.requests.pop(request_id, None)
        if tracked is not None:
            self.core.finish(tracked.req, RequestStatus.FINISHED_ABORTED)

    def has_unfinished_requests(self) -> bool:
        return self.core.has_unfinished()

    # -- the loop ---------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """One engine step; returns an output for every request that produced a token or finished."""
        got, _ = self.core.step()
        outputs = []
        for req in got:
            tracked = self.requests.get(req.request_id)
            if tracked is None:
                continue
            tracked.on_token(self)
            outputs.append(tracked.output())
            if req.is_finished:
                del self.requests[req.request_id]
        return outputs


class _Tracked:
    """Per-request text state that lives outside the step loop."""

    def __init__(self, req: Request, detok: Any | None) -> None:
        self.req = req
        self.detok = detok
        self.text = ""

    def on_token(self, engine: LLMEngine) -> None:
        req = self.req
        if self.detok is None:
            return
        before = len(self.text)
        self.text += self.detok.add(req.output_token_ids[-1:])
        if req.is_finished:
            self.text += self.detok.flush()
        stops = req.params.stop
        if not stops:
            return
        # Only the new text, plus the overlap a stop string could straddle, needs searching.
        start = max(0, before - max(len(s) for s in stops) + 1)
        found = [(i, s) for s in stops if (i := self.text.find(s, start)) >= 0]
        if found:
            hit, stop = min(found)
            self.text = self.text[:hit]
            req.stop_reason = stop
            if req.is_finished:
                req.status = RequestStatus.FINISHED_STOPPED
            else:
                engine.core.finish(req, RequestStatus.FINISHED_STOPPED)

    def output(self) -> RequestOutput:
        req = self.req
        return RequestOutput(
            request_id=req.request_id,
            prompt=req.prompt,
            prompt_token_ids=req.prompt_token_ids,
            outputs=[CompletionOutput(0, self.text, list(req.output_token_ids), req.finish_reason)],
            finished=req.is_finished,
            num_cached_tokens=req.num_cached_tokens,
            metrics=RequestMetrics(req.arrival_time, req.first_token_time),
        )


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")

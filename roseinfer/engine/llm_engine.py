"""Synchronous engine for offline use: validation, tokenization, detokenization, stop strings, outputs."""

from __future__ import annotations

import functools
import itertools
import math
import os
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch import nn

from roseinfer.bad_words import tokenize_bad_words
from roseinfer.config import EngineConfig
from roseinfer.engine.core import EngineCore
from roseinfer.engine.request_outputs import RequestGroup
from roseinfer.logprobs import (
    num_logprobs,
)
from roseinfer.metrics import Metric, engine_metrics
from roseinfer.outputs import RequestOutput
from roseinfer.request import Request, RequestStatus
from roseinfer.runner.gc_heap import freeze_startup_heap
from roseinfer.sampling_params import SamplingParams

# Text, token ids, or a dict: {"prompt" | "prompt_token_ids": ..., "cache_salt": ...}.
Prompt = str | list[int] | tuple[int, ...] | np.ndarray | dict[str, Any]
PROMPT_DICT_KEYS = ("prompt", "prompt_token_ids", "cache_salt")


def unpack_prompt(prompt: Prompt) -> tuple[Any, str | None]:
    """(text or token ids, cache salt) of a prompt; a dict prompt takes vLLM's keys, and any other key (a
    multimodal input, a misspelling) is refused by name rather than dropped."""
    if not isinstance(prompt, dict):
        return prompt, None
    unknown = sorted(map(str, set(prompt) - set(PROMPT_DICT_KEYS)))
    if unknown or not ("prompt" in prompt or "prompt_token_ids" in prompt):
        what = (
            f"has key(s) {unknown} this engine does not take"
            if unknown
            else "has neither 'prompt' nor 'prompt_token_ids'"
        )
        raise ValueError(
            f"a dict prompt {what}; its keys: 'prompt' (text) or 'prompt_token_ids', and 'cache_salt'"
        )
    inner = prompt["prompt_token_ids"] if "prompt_token_ids" in prompt else prompt["prompt"]
    return inner, prompt.get("cache_salt")


class LLMEngine:
    def __init__(self, config: EngineConfig, model_path: str, model: nn.Module | None = None) -> None:
        self.config = config
        self.model_config = config.model_config
        self.tokenizer = self._load_tokenizer(config, model_path)
        # A token's text decoded alone (Logprob.decoded_token, as vLLM's), remembered: top-k ids recur. A closure
        # over the tokenizer, not a bound method: a dropped engine must not wait in a cycle for the collector.
        tokenizer = self.tokenizer
        self.token_text = (
            functools.cache(lambda token_id: tokenizer.decode([token_id])) if tokenizer is not None else None
        )
        # As vLLM: the tokenizer's eos stops too, beside config.json's and generation_config.json's.
        tok_eos = getattr(self.tokenizer, "eos_token_id", None)
        eos = self.model_config.eos_token_ids
        self.eos_token_ids = eos + (tok_eos,) if isinstance(tok_eos, int) and tok_eos not in eos else eos
        self.core = EngineCore(config, model_path, model)
        self.groups: dict[str, RequestGroup] = {}
        self.num_generated_tokens = 0
        self.num_prompt_tokens = 0  # of the requests add_request took
        self._ids = itertools.count()
        # What a failed step raised: its state is half updated (tokens pending that no step resolves, blocks
        # registered whose KV was never computed), so, as vLLM, the engine serves nothing more.
        self.dead: BaseException | None = None
        freeze_startup_heap()

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

    def validate(self, prompt: Prompt, params: SamplingParams) -> tuple[list[int], SamplingParams]:
        """Tokenize and check one request; raises ValueError naming the field and the limit. Returns the prompt's
        ids and the params to run, `max_tokens=None` resolved to what the context and the KV cache leave."""
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling params must be a SamplingParams, got {type(params).__name__}")
        # The request's own copy, checked again: the caller may change or reuse theirs (vLLM clones them too).
        params = replace(params)
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer; this engine has none (use stop_token_ids)")
        self.check_logprobs(params)
        self._check_logit_controls(params)
        max_seqs = self.config.scheduler.max_num_seqs
        if params.n > max_seqs:
            # Its n samples run at once (they fork after the prompt): the sampler and the penalty table are
            # sized at start-up for max_num_seqs rows.
            raise ValueError(
                f"n={params.n} exceeds max_num_seqs={max_seqs}: an n > 1 request runs its samples at once"
            )
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("prompt is text but this engine has no tokenizer; pass token ids")
            try:
                ids = self.tokenizer.encode(prompt)
            except (TypeError, UnicodeError) as e:  # e.g. lone surrogates
                raise ValueError(f"prompt text could not be tokenized: {e}") from e
        elif isinstance(prompt, list | tuple | np.ndarray):
            ids = prompt.tolist() if isinstance(prompt, np.ndarray) else list(prompt)
        else:
            raise ValueError(f"prompt must be a string or a list of token ids, got {type(prompt).__name__}")
        if not ids:
            raise ValueError("prompt must not be empty")
        ids = self._truncated(ids, params.truncate_prompt_tokens)
        vocab = self.model_config.vocab_size
        # Plain ints in range are checked without a per-token loop, which took ~6 ms for W1's 64 prompts
        # of 512 tokens on a GPU machine's host; anything else gets the per-token checks.
        if set(map(type, ids)) != {int} or min(ids) < 0 or max(ids) >= vocab:
            ids = checked_token_ids(ids, vocab)
        max_len = self.config.max_model_len
        if len(ids) >= max_len:
            raise ValueError(f"prompt has {len(ids)} tokens; the model context is {max_len} (max_model_len)")
        pool_tokens = self.core.num_blocks * self.config.cache.block_size
        if params.max_tokens is None:
            params = self._run_to_limit(params, len(ids), pool_tokens)
        if len(ids) + params.max_tokens > max_len:
            raise ValueError(
                f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) exceeds the model context "
                f"of {max_len} tokens (max_model_len)"
            )
        sched = self.config.scheduler
        if not sched.enable_chunked_prefill and len(ids) > sched.max_num_batched_tokens:
            raise ValueError(
                f"prompt has {len(ids)} tokens; with chunked prefill off a prompt must fit one step's "
                f"budget of {sched.max_num_batched_tokens} tokens (max_num_batched_tokens)"
            )
        if len(ids) + params.max_tokens > pool_tokens:
            raise ValueError(
                f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) can never fit the KV cache "
                f"of {pool_tokens} tokens ({self.core.num_blocks} blocks)"
            )
        return ids, params

    def check_logprobs(self, params: SamplingParams) -> None:
        """As vLLM: at most `max_logprobs` a token, for the output's and the prompt's logprobs alike, -1 (the
        whole vocabulary) and a cap of -1 counting as the vocabulary's size. Never more than the vocabulary
        holds, whatever the cap."""
        vocab = self.model_config.vocab_size
        cap = min(num_logprobs(self.config.max_logprobs, vocab), vocab)
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(params, name)
            if value and (asked := num_logprobs(value, vocab)) > cap:
                raise ValueError(
                    f"{name}={value} asks for {asked} logprobs a token; this engine returns at most "
                    f"{cap} (max_logprobs={self.config.max_logprobs}; -1: the vocabulary, {vocab})"
                )

    def _check_logit_controls(self, params: SamplingParams) -> None:
        """allowed_token_ids and logit_bias ids within the vocabulary; bad_words need a tokenizer."""
        vocab = self.model_config.vocab_size
        if params.allowed_token_ids is not None:
            bad = [t for t in params.allowed_token_ids if t >= vocab]
            if bad:
                raise ValueError(f"allowed_token_ids {bad} are outside the vocabulary [0, {vocab})")
        if params.logit_bias is not None:
            bad = [t for t in params.logit_bias if t >= vocab]
            if bad:
                raise ValueError(f"logit_bias token ids {bad} are outside the vocabulary [0, {vocab})")
        if params.bad_words and self.tokenizer is None:
            raise ValueError(
                "bad_words need a tokenizer; this engine has none (use allowed_token_ids or logit_bias)"
            )

    def _truncated(self, ids: list, keep: int | None) -> list:
        """As vLLM: the last `keep` prompt tokens (-1: max_model_len), before the prompt's length is checked."""
        if keep is None:
            return ids
        max_len = self.config.max_model_len
        if keep > max_len:
            raise ValueError(
                f"truncate_prompt_tokens ({keep}) is greater than the model context of {max_len} tokens "
                "(max_model_len)"
            )
        return ids[-(max_len if keep == -1 else keep) :]

    def _run_to_limit(self, params: SamplingParams, prompt_len: int, cache_tokens: int) -> SamplingParams:
        """`max_tokens=None` resolved: as many tokens as the context and `cache_tokens` leave the prompt. A larger
        min_tokens is cut to it, which masks the same tokens (vLLM does not check it against this limit)."""
        room = max(min(self.config.max_model_len, cache_tokens) - prompt_len, 1)
        return replace(params, max_tokens=room, min_tokens=min(params.min_tokens, room))

    def add_request(
        self,
        prompt: Prompt,
        params: SamplingParams | Prompt,
        request_id: str | SamplingParams | None = None,
        arrival_time: float | None = None,
        cache_salt: str | None = None,
    ) -> str:
        """Queues one request and returns its id (`request_id`, else a fresh one). vLLM's positional order,
        `add_request(request_id, prompt, params)`, is taken too: its SamplingParams comes third, which in this
        order is never a request id, so a client written for vLLM runs unchanged."""
        if isinstance(request_id, SamplingParams) and isinstance(prompt, str):
            prompt, params, request_id = params, request_id, prompt
        if isinstance(prompt, dict):
            prompt, salt = unpack_prompt(prompt)
            cache_salt = cache_salt if salt is None else salt
        self._check_alive()
        ids, resolved = self.validate(prompt, params)
        unresolved, params = params.max_tokens is None, resolved
        if cache_salt is not None and not isinstance(cache_salt, str):
            raise ValueError(f"cache_salt must be a string, got {type(cache_salt).__name__}")
        if request_id is not None and not isinstance(request_id, str):  # else abort_request cannot name it
            raise ValueError(f"request_id must be a string, got {type(request_id).__name__}")
        rid = request_id
        while rid is None or (request_id is None and rid in self.groups):  # never one the caller took
            rid = str(next(self._ids))
        if rid in self.groups:
            raise ValueError(f"request_id {rid!r} is already in use")
        text = prompt if isinstance(prompt, str) else None
        bad_words = (
            tokenize_bad_words(self.tokenizer, params.bad_words, self.model_config.vocab_size)
            if params.bad_words
            else ()
        )
        req = Request(rid, ids, params, self.eos_token_ids, text, arrival_time, cache_salt)
        req.bad_words_token_ids = bad_words
        kv = self.core.kv
        open_blocks = kv.blocks_open_to(req)
        if unresolved and open_blocks < kv.num_blocks:
            # Pinned blocks are never freed: max_tokens=None runs to the blocks they leave it, not the pool.
            req.params = params = self._run_to_limit(params, len(ids), open_blocks * kv.block_size)
        if kv.blocks_for(len(ids) + params.max_tokens) > open_blocks:
            raise ValueError(
                f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) can never fit the "
                f"{open_blocks} KV blocks of {kv.block_size} tokens that pinned prefixes leave it"
            )
        self.groups[rid] = RequestGroup(req, self)
        self.core.add_request(req)
        self.num_prompt_tokens += len(ids)
        return rid

    def get_metrics(self) -> list[Metric]:
        """The engine's counters and gauges now, as vLLM v1's `get_metrics()` (`roseinfer/metrics.py`)."""
        return engine_metrics(self)

    def detokenizer(self, req: Request) -> Any | None:
        """The sample's incremental detokenizer; None where it has no text (no tokenizer, or detokenize off)."""
        params = req.params
        if self.tokenizer is None or not params.detokenize:
            return None
        from roseinfer.tokenizer import IncrementalDetokenizer

        return IncrementalDetokenizer(
            self.tokenizer,
            req.prompt_token_ids,
            params.skip_special_tokens,
            params.spaces_between_special_tokens,
        )

    def abort_request(self, request_id: str | Iterable[str]) -> None:
        """Aborts one request or several (as vLLM's); ids unknown or already finished are ignored."""
        for rid in [request_id] if isinstance(request_id, str) else request_id:
            group = self.groups.pop(rid, None)
            if group is not None and self.dead is None:  # a dead engine's core is not to be touched
                for seq in group.seqs:
                    self.core.finish(seq.req, RequestStatus.FINISHED_ABORTED)

    def _check_alive(self) -> None:
        if self.dead is not None:
            raise RuntimeError(
                f"the engine is dead: a step failed with {self.dead!r}, leaving its state half updated; "
                "build a new engine"
            ) from self.dead

    def pin_prefix(self, prefix: str | list[int]) -> int:
        """Compute `prefix` now and pin its full blocks so they are never evicted; returns tokens pinned.

        The prefix is cut to a whole number of blocks (page-aligned): a partial block cannot be pinned.
        """
        if not self.config.cache.enable_prefix_caching:
            raise ValueError("pinned prefixes need enable_prefix_caching=True")
        if self.core.scheduler.has_unfinished():
            raise RuntimeError("pin prefixes before adding requests: pinning steps the engine")
        while self.has_unfinished_requests():  # a step of aborted requests may still be in flight
            self.step()
        ids, _ = self.validate(prefix, SamplingParams(max_tokens=1))
        aligned = len(ids) - len(ids) % self.config.cache.block_size
        if aligned == 0:
            raise ValueError(
                f"prefix of {len(ids)} tokens is shorter than one block ({self.config.cache.block_size} tokens)"
            )
        ids = ids[:aligned]
        rid = self.add_request(
            ids, SamplingParams(max_tokens=1, ignore_eos=True), request_id=f"pin-{next(self._ids)}"
        )
        while rid in self.groups:
            self.step()
        return self.core.kv.pin(Request(rid, ids, SamplingParams(max_tokens=1)))

    def has_unfinished_requests(self) -> bool:
        return self.core.has_unfinished()

    # -- the loop ---------------------------------------------------------------------------------

    def step(self, final_only: bool = False) -> list[RequestOutput]:
        """One engine step; returns outputs as each request's `SamplingParams.output_kind` asks: CUMULATIVE (all
        so far) or DELTA (what is new since the sample's last output), one output per sample that got a token or
        finished, holding that sample alone (vLLM v1's n > 1 streaming); FINAL_ONLY (one output with every sample
        once the last finishes, which spares building running outputs each step).
        `final_only=True` treats every request as FINAL_ONLY for this step.
        Whatever a step raises leaves the engine dead: every later step or add_request raises."""
        self._check_alive()
        try:
            return self._step(final_only)
        except BaseException as e:
            self.dead = e
            raise

    def _step(self, final_only: bool) -> list[RequestOutput]:
        got, _ = self.core.step()
        self.num_generated_tokens += len(got)
        # In the order the core gave them: a finished FINAL_ONLY group under its request id (once, whichever of
        # its samples ends it), a streamed sample under its Request (once, though async scheduling may have
        # given it two tokens). The outputs are built after every token is taken: a stop string found in one
        # sample's text may finish it after a sibling was looked at.
        ready: dict[str | Request, tuple[RequestGroup, Request]] = {}
        for req in got:
            root = req.parent or req
            group = self.groups.get(root.request_id)
            if group is None:
                continue  # aborted meanwhile
            group.on_token(req)
            if not (final_only or group.final_only):
                ready[req] = (group, req)
            elif req.is_finished:  # cheap test first: the group ends with one of its samples
                ready[root.request_id] = (group, req)
        outputs = []
        for key, (group, req) in ready.items():
            if key.__class__ is str:
                if not group.finished:
                    group.held = True  # a streamed request's sample ended unseen: its next output brings it
                    continue  # waits for a sibling
                out: RequestOutput | None = group.output()
            else:
                if group.held:
                    outputs += group.held_outputs(req)
                out = group.sample_output(req)
            if out is not None:
                outputs.append(out)
            if group.done:
                self.groups.pop(group.root.request_id, None)
        return outputs


def checked_token_ids(prompt: list, vocab: int) -> list[int]:
    """The prompt's token ids as ints, or a ValueError naming the first bad one and its position."""
    ids = [int(t) if isinstance(t, np.integer) else t for t in prompt]
    for i, t in enumerate(ids):
        if isinstance(t, float) and math.isnan(t):
            raise ValueError(f"prompt token id at position {i} is NaN")
        if not isinstance(t, int | np.integer) or isinstance(t, bool):
            raise ValueError(f"prompt token id {t!r} at position {i} is not an integer ({type(t).__name__})")
        if not 0 <= t < vocab:
            raise ValueError(f"prompt token id {t!r} at position {i} is outside the vocabulary [0, {vocab})")
    return ids


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")

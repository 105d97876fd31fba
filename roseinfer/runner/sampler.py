"""Batched sampling: greedy, temperature, top-k, top-p, min-p; per-request seeded generators; banned tokens;
penalties; sample logprobs.

As in vLLM v1, a row's allowed_token_ids mask its other ids to -inf first, then its bad words' and banned tokens
(its stop ids while it is under min_tokens) are set to -inf, then its logit_bias is added (`logit_controls.py`),
then its presence, frequency and repetition penalties apply (`penalties.py`), then its logits are divided by its
temperature, then min-p drops the tokens less likely than min_p times the most likely one, then top-k and top-p
cut what is left. Logprobs, as vLLM v1's default `raw_logprobs`, are the log_softmax of the logits before any of
that (`compute_logprobs`), gathered for the sampled tokens and the top k (`gather_logprobs`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from roseinfer.logprobs import TokenLogprobs, num_logprobs
from roseinfer.runner.host_copy import to_device
from roseinfer.runner.logit_controls import StepControls
from roseinfer.runner.penalties import StepPenalties
from roseinfer.sampling_params import SamplingParams


@dataclass
class SamplingBatch:
    """Per-row sampling settings as tensors, built once per step for the rows that sample."""

    temperature: torch.Tensor | None  # [N] float32, 0.0 for greedy rows; None if all greedy
    top_k: torch.Tensor | None  # [N] int64, vocab size where disabled; None if no row uses it
    top_p: torch.Tensor | None  # [N] float32
    min_p: torch.Tensor | None  # [N] float32
    greedy: torch.Tensor | None  # [N] bool; None if all greedy
    all_greedy: bool
    any_greedy: bool
    generators: list[torch.Generator | None]  # per row: the request's own generator if seeded
    # Greedy and plain-temperature rows with no generator of their own are sampled inside decode graphs,
    # from these host temperatures (None: all greedy).
    in_graph: bool = False
    host_temperature: np.ndarray | None = None
    # Where rows without a generator of their own draw their noise: the runner's, seeded from the engine's
    # seed, so that `LLM(seed=...)` makes unseeded sampling repeatable (None: torch's global generator).
    shared_generator: torch.Generator | None = None
    # Some row draws from a generator of its own: the torch sampler serves the batch (see `_fused_sampling_for`).
    any_seeded: bool = False
    # Some row has a min_tokens: each step asks which rows are still under it (`Request.banned_token_ids`).
    any_min_tokens: bool = False
    # Some row has a presence, frequency or repetition penalty: the step samples outside the decode graph.
    any_penalties: bool = False
    # Some row has allowed_token_ids, logit_bias or bad_words (`logit_controls.py`): outside the decode graph.
    any_logit_controls: bool = False
    any_bad_words: bool = False
    # The most logprobs any row asks for a token (-1 resolved to the vocabulary); None: no row asks, and the
    # step computes none.
    num_logprobs: int | None = None

    @staticmethod
    def build(
        params: list[SamplingParams],
        generators: list[torch.Generator | None],
        vocab_size: int,
        device: torch.device,
        shared_generator: torch.Generator | None = None,
    ) -> SamplingBatch:
        greedy = [p.greedy for p in params]
        all_greedy = all(greedy)
        any_seeded = any(g is not None for g in generators)
        any_min_tokens = any(p.min_tokens for p in params)
        any_penalties = any(p.has_penalties for p in params)
        any_logit_controls = any(p.has_logit_controls for p in params)
        any_bad_words = any_logit_controls and any(p.bad_words for p in params)
        asked = [num_logprobs(p.logprobs, vocab_size) for p in params if p.logprobs is not None]
        most_logprobs = min(max(asked), vocab_size) if asked else None
        if all_greedy:  # nothing to move to the device: sample() takes the argmax
            return SamplingBatch(
                temperature=None,
                top_k=None,
                top_p=None,
                min_p=None,
                greedy=None,
                all_greedy=True,
                any_greedy=True,
                generators=generators,
                in_graph=True,
                shared_generator=shared_generator,
                any_seeded=any_seeded,
                any_min_tokens=any_min_tokens,
                any_penalties=any_penalties,
                any_logit_controls=any_logit_controls,
                any_bad_words=any_bad_words,
                num_logprobs=most_logprobs,
            )
        temps = [0.0 if g else p.temperature for p, g in zip(params, greedy)]
        use_k = any(p.top_k > 0 for p in params)
        use_p = any(p.top_p < 1.0 for p in params)
        use_min_p = any(p.min_p > 0.0 for p in params)
        in_graph = not (use_k or use_p or use_min_p or any_seeded)

        pin = device.type == "cuda"  # a copy from pageable memory would wait for the queued steps

        def t(values: list, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, pin_memory=pin).to(device, non_blocking=True)

        return SamplingBatch(
            temperature=t(temps, torch.float32),
            top_k=t([min(p.top_k, vocab_size) if p.top_k > 0 else vocab_size for p in params], torch.int64)
            if use_k
            else None,
            top_p=t([p.top_p for p in params], torch.float32) if use_p else None,
            min_p=t([p.min_p for p in params], torch.float32) if use_min_p else None,
            greedy=t(greedy, torch.bool),
            all_greedy=all_greedy,
            any_greedy=any(greedy),
            generators=generators,
            in_graph=in_graph,
            host_temperature=np.array(temps, np.float32) if in_graph else None,
            shared_generator=shared_generator,
            any_seeded=any_seeded,
            any_min_tokens=any_min_tokens,
            any_penalties=any_penalties,
            any_logit_controls=any_logit_controls,
            any_bad_words=any_bad_words,
            num_logprobs=most_logprobs,
        )


# (rows, token ids) int64 [P] each: logits[rows[i], ids[i]] may not be drawn.
BannedTokens = tuple[torch.Tensor, torch.Tensor]


def banned_pairs(banned: Sequence[Sequence[int]], vocab: int, device: torch.device) -> BannedTokens | None:
    """Each row's banned ids (`banned[row]`) as index pairs on `device`; ids past the vocabulary, which are
    never drawn, are left out. None where no row bans anything."""
    rows: list[int] = []
    ids: list[int] = []
    for row, tokens in enumerate(banned):
        for t in tokens:
            if t < vocab:
                rows.append(row)
                ids.append(t)
    if not rows:
        return None
    pairs = to_device(np.array([rows, ids], dtype=np.int64), device)
    return pairs[0], pairs[1]


def compute_logprobs(logits: torch.Tensor) -> torch.Tensor:
    """logits [N, V] (any float dtype, as the model gave them) -> their log_softmax [N, V] in float32."""
    return logits.log_softmax(dim=-1, dtype=torch.float32)


def gather_logprobs(logprobs: torch.Tensor, tokens: torch.Tensor, k: int) -> torch.Tensor:
    """From each row's logprobs [N, V] (float32) and sampled token [N]: the token's logprob and rank (how many
    tokens are at least as likely, as vLLM counts), and the row's k most likely ids and logprobs. Packed in one
    int32 tensor [N, 2k + 3], so that one copy takes it to the host: ids (sampled, then top k), the logprobs'
    float32 bits in the same order, the rank (`unpack_logprobs` reads it)."""
    sampled = tokens.long().unsqueeze(1)
    sampled_logprob = logprobs.gather(1, sampled)
    rank = (logprobs >= sampled_logprob).sum(dim=-1, dtype=torch.int32).unsqueeze(1)
    top_logprobs, top_ids = logprobs.topk(k, dim=-1)
    ids = torch.cat((sampled, top_ids), dim=1).to(torch.int32)
    values = torch.cat((sampled_logprob, top_logprobs), dim=1)
    return torch.cat((ids, values.view(torch.int32), rank), dim=1)


def unpack_logprobs(packed: np.ndarray) -> list[TokenLogprobs]:
    """`gather_logprobs`' rows, on the host, as one `TokenLogprobs` each."""
    k1 = (packed.shape[1] - 1) // 2  # k + 1
    ids = packed[:, :k1].tolist()
    values = packed[:, k1 : 2 * k1].view(np.float32).tolist()
    ranks = packed[:, -1].tolist()
    return [TokenLogprobs(i, v, r) for i, v, r in zip(ids, values, ranks)]


# The relative rounding allowed where a nucleus' mass meets top_p (float32 sums of float32 probabilities).
_TOP_P_ROUNDING = 1e-5


def apply_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None
) -> torch.Tensor:
    """Mask (to -inf) the logits outside each row's top-k and top-p nucleus. As in vLLM, top-k keeps every
    token whose logit is at least the k-th largest (tokens tied with the k-th all stay); top_k [N] in [1, V]."""
    if top_k is None and top_p is None:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    mask = torch.zeros_like(sorted_logits, dtype=torch.bool)
    if top_k is not None:
        kth = sorted_logits.gather(1, (top_k - 1).unsqueeze(1))
        mask |= sorted_logits < kth
    if top_p is not None:
        probs = sorted_logits.masked_fill(mask, float("-inf")).softmax(dim=-1)
        # Keep a token while the mass before it is below top_p: while it and the tokens after it hold more
        # than 1 - top_p. That sum, run from the least likely token up, stays accurate where little mass is
        # left, where a running sum from the top reaches 1 early by rounding (it cut even a top_p of 1 short
        # of the vocabulary). A mass within rounding of top_p counts as reaching it (0.5 + 0.3 reaches a top_p
        # of 0.8, which float32 holds as 0.8000000119). The top token always stays.
        mass_from = probs.flip(-1).cumsum(dim=-1).flip(-1)
        cut = mass_from <= (1.0 - top_p).unsqueeze(1) * (1.0 + _TOP_P_ROUNDING)
        cut[:, 0] = False
        mask |= cut
    sorted_logits = sorted_logits.masked_fill(mask, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def apply_controls(
    logits: torch.Tensor,
    banned: BannedTokens | None = None,
    penalties: StepPenalties | None = None,
    controls: StepControls | None = None,
) -> torch.Tensor:
    """The logits a step draws from, in vLLM v1's order, in place where `logits` are float32: the `controls`'
    allowed-ids mask and the bad-word bans waiting on a token in flight, the `banned` tokens (bad words',
    min_tokens') set to -inf, the `controls`' logit biases, then the `penalties` rows penalized (in float32)."""
    if controls is not None:
        logits = controls.mask(logits)
    if banned is not None:
        logits[banned] = float("-inf")
    if controls is not None:
        controls.bias(logits)
    if penalties is not None:
        logits = penalties.apply(logits)
    return logits


def sample(
    logits: torch.Tensor,
    batch: SamplingBatch,
    banned: BannedTokens | None = None,
    penalties: StepPenalties | None = None,
    controls: StepControls | None = None,
) -> torch.Tensor:
    """logits [N, V] (any float dtype) -> token ids [N] int64: the logits under `apply_controls`, then greedy rows
    take the argmax of the result and sampled rows draw from it."""
    logits = apply_controls(logits, banned, penalties, controls)
    if _fused_sampling_for(logits, batch):
        return _sample_fused(logits, batch)
    if batch.all_greedy:  # the argmax needs no float32 copy of the logits
        return logits.argmax(dim=-1)
    # Greedy rows carry temperature 0: divide them by 1 (their draw is replaced by the argmax below).
    scores = logits.float() / torch.where(batch.greedy, 1.0, batch.temperature).unsqueeze(1)
    # Exponential race: argmax(p / E) with E ~ Exp(1) draws from p, with no host sync and per-row noise.
    noise = torch.empty_like(scores).exponential_(generator=batch.shared_generator)
    for row, gen in enumerate(batch.generators):
        if gen is not None:
            noise[row].exponential_(generator=gen)
    if batch.top_k is None and batch.top_p is None and batch.min_p is None:
        # Plain temperature: argmax(p / E) = argmax(scores - log E); the softmax is never needed.
        sampled = (scores - noise.clamp_(min=1e-20).log_()).argmax(dim=-1)
    else:
        # vLLM's order: min-p on the tempered distribution, then top-k and top-p on what it leaves.
        if batch.min_p is not None:
            probs = scores.softmax(dim=-1)
            floor = probs.max(dim=-1, keepdim=True).values * batch.min_p.unsqueeze(1)
            scores = scores.masked_fill(probs < floor, float("-inf"))
        scores = apply_top_k_top_p(scores, batch.top_k, batch.top_p)
        probs = scores.softmax(dim=-1)
        sampled = (probs / noise.clamp_(min=1e-20)).argmax(dim=-1)
    if not batch.any_greedy:
        return sampled
    return torch.where(batch.greedy, logits.argmax(dim=-1), sampled)


def _fused_sampling_for(logits: torch.Tensor, batch: SamplingBatch) -> bool:
    """The one-pass Triton sampler serves greedy and plain-temperature rows on CUDA, where no row has a
    generator of its own: a seeded row always draws its noise the torch sampler's way, so that its tokens
    depend on its seed and logits alone, not on whether a top-k / top-p / min-p row shares its batch."""
    return (
        logits.is_cuda
        and _sampling is not None
        and batch.top_k is None
        and batch.top_p is None
        and batch.min_p is None
        and (batch.all_greedy or not batch.any_seeded)
    )


def _sample_fused(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    assert _sampling is not None
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    if batch.all_greedy:
        return _sampling.sample_tokens(logits, None, None)
    n = logits.shape[0]
    # Consecutive Philox seeds from one draw of the shared generator (no row has a generator of its own).
    first = torch.randint(0, 2**62, (1,), device=logits.device, generator=batch.shared_generator)
    seeds = first + torch.arange(n, device=logits.device)
    return _sampling.sample_tokens(logits, batch.temperature, seeds)


try:
    from roseinfer.kernels import sampling as _sampling
except ImportError:  # CPU installs without Triton
    _sampling = None

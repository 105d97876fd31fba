"""The sampler's worst case, for start-up sizing (`ModelRunner.profile_peak_memory`), as vLLM's dummy sampler run.

What a busy engine holds beside the forward and the lm_head: the penalty table, full at `max_num_seqs` rows,
and its last growth, when the old table and the new one both live (`PenaltyTable._grow`); the cached batch's
allowed-ids masks; and in a step the temporaries of `sample` over `max_num_seqs` rows with every feature on
(allowed ids, bad words, min_tokens' bans, bias, penalties, temperature, min-p, top-k, top-p, seeded and greedy
rows), the logprobs at `max_logprobs` and one prompt-logprobs slice. Here they are built by the real code
(`SamplingState.batch` and `masks`, `PromptLogprobsRows`) from requests that ask for all of it, in a
`SamplingState` of their own, so that running them measures the bytes and the runner's own state (its table,
its generators, its cached batch) is never touched.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from roseinfer.logprobs import num_logprobs
from roseinfer.request import Request
from roseinfer.runner.logit_controls import StepControls
from roseinfer.runner.penalties import StepPenalties
from roseinfer.runner.prompt_logprobs import SLICE_ROWS, PromptLogprobsRows
from roseinfer.runner.sampler import BannedTokens, SamplingBatch
from roseinfer.runner.sampling_state import SamplingState
from roseinfer.sampling_params import SamplingParams

# Every row may draw only these ids; the first is a stop id under min_tokens, the second a bad word: each row
# draws one of the last two (the bias favours the first of them).
ALLOWED = (0, 1, 2, 3)
STOP_ID, BAD_ID, BIASED_ID = 0, 1, 2


def logprobs_cap(max_logprobs: int, vocab_size: int) -> int:
    """The most logprobs a request may ask for a token (`EngineConfig.max_logprobs`, -1: the vocabulary)."""
    return min(num_logprobs(max_logprobs, vocab_size), vocab_size)


def worst_case_requests(num_rows: int, vocab_size: int, max_logprobs: int) -> list[Request]:
    """`num_rows` requests, each launched for its first sampled token, asking for every sampling feature; the
    first row greedy, every other one seeded."""
    if vocab_size <= len(ALLOWED):
        raise ValueError(f"vocab_size must be > {len(ALLOWED)}, got {vocab_size}")
    k = logprobs_cap(max_logprobs, vocab_size)
    reqs = []
    for i in range(num_rows):
        params = SamplingParams(
            temperature=0.0 if i == 0 else 0.8,
            top_p=0.9,
            top_k=50,
            min_p=0.05,
            seed=i if i % 2 else None,
            max_tokens=1,
            stop_token_ids=[STOP_ID],
            min_tokens=1,
            logprobs=k,
            prompt_logprobs=k,
            presence_penalty=0.5,
            frequency_penalty=0.5,
            repetition_penalty=1.2,
            allowed_token_ids=list(ALLOWED),
            logit_bias={BIASED_ID: 1.0},
            bad_words=["profile"],
        )
        # Its prompt holds the biased id: the repetition penalty acts on it.
        prompt = [len(ALLOWED) + i % (vocab_size - len(ALLOWED)), BIASED_ID]
        req = Request(f"profile-{i}", prompt, params)
        req.bad_words_token_ids = ((BAD_ID,),)
        req.num_pending = 1  # its token of the step being launched (`Scheduler._commit`)
        reqs.append(req)
    return reqs


@dataclass
class WorstCaseSampling:
    """What `sample` takes for a step of `num_rows` rows with every feature on, and one prompt-logprobs slice;
    alive from `build` on, as a cached batch and its table are across a running engine's steps."""

    state: SamplingState
    batch: SamplingBatch
    banned: BannedTokens | None
    controls: StepControls | None
    prompt_job: PromptLogprobsRows

    @property
    def penalties(self) -> StepPenalties | None:
        return self.state.penalties

    @staticmethod
    def build(
        num_rows: int,
        vocab_size: int,
        device: torch.device,
        max_logprobs: int,
        prompt_rows: int,
    ) -> WorstCaseSampling:
        """`prompt_rows`: the rows of the step's hidden states a prompt-logprobs slice may read (up to
        `SLICE_ROWS` of them are taken)."""
        reqs = worst_case_requests(num_rows, vocab_size, max_logprobs)
        state = SamplingState(vocab_size, device, 0, num_rows)
        rows = list(range(num_rows))
        # The table's largest growth: every row but one, then all of them (no growth where the first size,
        # 8 rows, is the cap already).
        if num_rows > 1:
            state.batch(rows[:-1], reqs[:-1], None)
        batch = state.batch(rows, reqs, None)
        banned, controls = state.masks(reqs, batch, None)
        n = min(SLICE_ROWS, prompt_rows)
        job = PromptLogprobsRows(
            [(0, 0, n)],
            np.arange(n, dtype=np.int64),
            np.zeros(n, np.int64),
            logprobs_cap(max_logprobs, vocab_size),
        )
        return WorstCaseSampling(state, batch, banned, controls, job)

"""Request: one sequence the scheduler owns, from arrival to its single terminal state."""

from __future__ import annotations

import enum
import itertools
import time

from roseinfer.bad_words import BadWords, bad_word_bans
from roseinfer.logprobs import TokenLogprobs
from roseinfer.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def finished(self) -> bool:
        # Asked for every request on every step: a lookup of the value (a str, its hash cached), since
        # hashing a member runs Enum.__hash__ in Python.
        return self._value_ in _FINISHED


_FINISHED = frozenset({"stop", "length", "abort"})


_UIDS = itertools.count()


class Request:
    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        eos_token_ids: tuple[int, ...] = (),
        prompt: str | None = None,
        arrival_time: float | None = None,
        cache_salt: str | None = None,
    ) -> None:
        if params.max_tokens is None:
            raise ValueError("a Request needs max_tokens resolved (LLMEngine.add_request resolves None)")
        self.request_id = request_id
        self.uid = next(_UIDS)  # engine-internal identity: user request ids may look like anything
        self.prompt = prompt
        self.prompt_token_ids = list(prompt_token_ids)
        self.params = params
        self.eos_token_ids = () if params.ignore_eos else eos_token_ids
        # What it may not sample before min_tokens: as vLLM, its stop token ids and the eos ids, even under
        # ignore_eos (a fork takes its parent's: `Scheduler._fork`).
        self.min_tokens_stop_ids: tuple[int, ...] = (
            tuple(dict.fromkeys([*params.stop_token_ids, *eos_token_ids])) if params.min_tokens else ()
        )
        # params.bad_words as token sequences (`bad_words.py`), set by the engine, which has the tokenizer.
        self.bad_words_token_ids: BadWords = ()
        self.output_token_ids: list[int] = []
        self.all_token_ids: list[int] = list(prompt_token_ids)
        # With params.logprobs: what the sampler gave for each output token, and the sum of their logprobs.
        wants_logprobs = params.logprobs is not None
        self.logprobs: list[TokenLogprobs] | None = [] if wants_logprobs else None
        self.cumulative_logprob: float | None = 0.0 if wants_logprobs else None
        # With params.prompt_logprobs: entry p for prompt position p (the distribution of prompt token p + 1),
        # filled chunk by chunk up to the prompt's last position but one. None on n > 1 forks: the request
        # they fork from holds the prompt's.
        self.prompt_logprobs: list[TokenLogprobs] | None = [] if params.prompt_logprobs is not None else None
        self.status = RequestStatus.WAITING
        self.block_ids: list[int] = []  # the block table, in token order
        self.table_row = -1  # its row in the KV cache manager's block-table mirror (`kv/block_tables.py`)
        self.block_hashes: list[bytes] = []  # content keys of the full blocks of all_token_ids so far
        self.num_registered_blocks = 0  # leading blocks already registered in the prefix cache
        self.cache_salt = cache_salt
        self.parent: Request | None = None  # set on the n-1 extra samples forked from an n > 1 request
        self.sample_index = 0
        self.enqueued_step = 0  # scheduler step at which it first entered the waiting queue (its age)
        self.scheduled_step = -1  # the last scheduler step that gave it work as a running request
        self.num_computed_tokens = (
            0  # tokens whose KV is in the cache, or is being written by a launched step
        )
        # Tokens sampled by a launched step whose ids the host does not know yet (async scheduling); they
        # follow all_token_ids. The latest one is row `pending_row` of that step's sampled tokens.
        self.num_pending = 0
        self.pending_row = -1
        self.num_cached_tokens = 0  # prompt tokens served from the prefix cache at first admission
        self.num_preemptions = 0
        self.arrival_time = arrival_time if arrival_time is not None else time.monotonic()
        self.first_token_time: float | None = None
        self.finished_time: float | None = None
        self.stop_reason: str | int | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        """Known tokens plus pending ones: what the scheduler plans with."""
        return len(self.all_token_ids) + self.num_pending

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids) + self.num_pending

    @property
    def needs_prompt_logprobs(self) -> bool:
        """Some prompt position's logprobs are still to come: it needs every position's logits, so it reads no
        cached prefix (as vLLM v1)."""
        plp = self.prompt_logprobs
        return plp is not None and len(plp) < len(self.prompt_token_ids) - 1

    def add_prompt_logprobs(self, start: int, entries: list[TokenLogprobs]) -> None:
        """Positions start, start + 1, ... of a resolved step. Positions already held (recomputed after a
        preemption) are kept as they are; steps resolve in order, so a chunk never starts past the end."""
        plp = self.prompt_logprobs
        if plp is None:
            raise RuntimeError(f"{self} got prompt logprobs it did not ask for")
        if start > len(plp):
            raise RuntimeError(f"{self}: prompt logprobs from position {start}, but it holds {len(plp)}")
        plp.extend(entries[len(plp) - start :])

    @property
    def is_finished(self) -> bool:
        return self.status.finished

    @property
    def finish_reason(self) -> str | None:
        return self.status.value if self.status.finished else None

    def append_token(self, token_id: int, logprobs: TokenLogprobs | None = None) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)
        if self.logprobs is not None:
            if logprobs is None or logprobs.token_ids[0] != token_id:
                raise RuntimeError(f"{self} wants logprobs, but token {token_id} came with {logprobs}")
            self.logprobs.append(logprobs)
            self.cumulative_logprob += logprobs.logprobs[0]  # type: ignore[operator]
        if self.first_token_time is None:
            self.first_token_time = time.monotonic()

    def drop_last_tokens(self, count: int) -> None:
        """Forgets the last `count` output tokens (generated past a stop string), and their logprobs."""
        if count <= 0:
            return
        del self.output_token_ids[-count:]
        del self.all_token_ids[-count:]
        if self.logprobs is not None:
            del self.logprobs[-count:]
            total = 0.0
            for entry in self.logprobs:  # summed in order, as appended
                total += entry.logprobs[0]
            self.cumulative_logprob = total

    def check_stop_token(self, max_model_len: int) -> RequestStatus | None:
        """Stop conditions that need no text: stop/eos token ids (as vLLM, not before min_tokens), max_tokens,
        context length (known tokens only: a pending token after a stop is dropped)."""
        last = self.output_token_ids[-1]
        if last in self.params.stop_token_ids or last in self.eos_token_ids:
            if len(self.output_token_ids) >= self.params.min_tokens:  # the sampler masks them before it
                self.stop_reason = last
                return RequestStatus.FINISHED_STOPPED
        if len(self.output_token_ids) >= self.params.max_tokens or len(self.all_token_ids) >= max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

    def banned_token_ids(self) -> tuple[int, ...]:
        """The ids it may not sample in the step being launched: its `min_tokens_stop_ids` while it has
        generated fewer than min_tokens tokens before it, else none. Asked for a launched step's sampled row,
        whose own token already counts as pending (`Scheduler._commit`); with async scheduling the tokens of
        the step still in flight count too, and after a recompute-style preemption the output it keeps."""
        if len(self.output_token_ids) + self.num_pending - 1 < self.params.min_tokens:
            return self.min_tokens_stop_ids
        return ()

    def bad_word_bans(self) -> tuple[list[int], list[tuple[int, int]]]:
        """Its bad words' bans for the step being launched (`bad_words.bad_word_bans`): asked, as
        `banned_token_ids`, for a launched step's sampled row, whose own token counts as pending; a pending
        token beyond it is in flight, row `pending_row` of the previous launch's sampled tokens."""
        if not self.bad_words_token_ids:
            return [], []
        in_flight = self.num_pending - 1
        if in_flight > 1:
            raise RuntimeError(f"{self} has more than one earlier token in flight")
        return bad_word_bans(self.bad_words_token_ids, self.output_token_ids, in_flight == 1)

    def reached_length_limit(self, max_model_len: int) -> bool:
        """Counting pending tokens: no further token may be scheduled (the last is still in flight)."""
        pending = self.num_pending  # asked for every scheduled request on every step: fields, not properties
        return (
            len(self.output_token_ids) + pending >= self.params.max_tokens
            or len(self.all_token_ids) + pending >= max_model_len
        )

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id}, {self.status.value}, prompt={self.num_prompt_tokens}, "
            f"out={self.num_output_tokens}, computed={self.num_computed_tokens}, blocks={len(self.block_ids)})"
        )

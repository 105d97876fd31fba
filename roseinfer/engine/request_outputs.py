"""What `LLMEngine.step` returns, built from its requests: each sample's text (stop strings found as it
grows) and logprob dicts, and a request's outputs with its prompt logprobs, whole or (`RequestOutputKind.DELTA`)
only what is new since the sample's previous output. As vLLM v1's (`ParentRequest.get_outputs`): a streamed
n > 1 request gives one output per sample that moved, holding that sample alone; a FINAL_ONLY one gives a single
output holding all n samples once the last finishes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from roseinfer.logprobs import (
    PromptLogprobs,
    SampleLogprobs,
    TokenLogprobs,
    num_logprobs,
    position_logprobs,
    prompt_position_logprobs,
)
from roseinfer.outputs import CompletionOutput, RequestMetrics, RequestOutput
from roseinfer.request import Request, RequestStatus
from roseinfer.sampling_params import RequestOutputKind

if TYPE_CHECKING:
    from roseinfer.engine.llm_engine import LLMEngine


class SequenceOutput:
    """One sample's text state, and its logprob dicts, kept outside the step loop."""

    def __init__(self, req: Request, detok: Any | None, engine: LLMEngine) -> None:
        self.req = req
        self.detok = detok
        self.text = ""
        self.num_seen = 0  # output tokens already detokenized
        self.logprobs: SampleLogprobs = []  # one dict per output token, built as outputs are made
        self.num_logprobs = num_logprobs(req.params.logprobs, engine.model_config.vocab_size)
        self.decode = engine.token_text if req.params.detokenize else None
        self.num_outputs = 0  # streamed outputs made (DELTA: the first carries the prompt logprobs)
        self.returned_final = False  # its finished output went out: it yields nothing more
        # DELTA: the output tokens (and their logprob dicts) and the text characters already returned.
        self.num_sent_tokens = 0
        self.num_sent_chars = 0

    def on_token(self, engine: LLMEngine) -> None:
        """Takes every output token not seen yet, in order: with async scheduling one engine step can
        apply two tokens to a request (the step in flight and a step resolved at once)."""
        if self.detok is None:
            return  # no text to build: the output reads the token ids when it is made
        req = self.req
        while self.num_seen < len(req.output_token_ids):
            self.num_seen += 1
            if self._take(req.output_token_ids[self.num_seen - 1], engine):
                return

    def _take(self, token: int, engine: LLMEngine) -> bool:
        """Detokenizes one token; True when a stop string ends the sequence at it."""
        req = self.req
        last = self.num_seen == len(req.output_token_ids)
        before = len(self.text)
        # As vLLM: a stop token id (or eos) that ends the sequence keeps its id but adds no text, unless
        # include_stop_str_in_output keeps its text too.
        stop_token = (
            last
            and req.status is RequestStatus.FINISHED_STOPPED
            and req.stop_reason == token
            and not req.params.include_stop_str_in_output
        )
        if not stop_token:
            self.text += self.detok.add([token])
        if req.is_finished and last:
            self.text += self.detok.flush()
        stops = req.params.stop
        # As vLLM, no stop string ends a sequence within its first min_tokens tokens: their text is never
        # searched again, though a match may begin in it and end in a later token's text.
        if not stops or self.num_seen <= req.params.min_tokens:
            return False
        # Only the new text, plus the overlap a stop string could straddle, needs searching.
        found = [(i, s) for s in stops if (i := self.text.find(s, max(0, before - len(s) + 1))) >= 0]
        if not found:
            return False
        hit, stop = min(found)
        self.text = self.text[: hit + len(stop) if req.params.include_stop_str_in_output else hit]
        req.stop_reason = stop
        req.drop_last_tokens(len(req.output_token_ids) - self.num_seen)  # generated past the stop meanwhile
        if req.is_finished:
            engine.core.scheduler.restate_finished(req, RequestStatus.FINISHED_STOPPED)
        else:
            engine.core.finish(req, RequestStatus.FINISHED_STOPPED)
        return True

    def output(self, delta: bool = False) -> CompletionOutput:
        """The sample's output: everything so far, or with `delta` what is new since its last output (text,
        token ids and logprob dicts; the cumulative logprob stays the sum over all tokens, as vLLM's)."""
        req = self.req
        reason = req.stop_reason
        if isinstance(reason, int) and reason not in req.params.stop_token_ids:
            reason = None  # an eos id: vLLM reports no stop reason for it
        text = self.text
        if req.params.stop and not req.params.include_stop_str_in_output and not req.is_finished:
            # As vLLM: hold back what could still begin a stop string, so streamed text is never cut back.
            text = text[: max(len(text) - max(len(s) for s in req.params.stop) + 1, 0)]
        ids = req.output_token_ids
        if req.logprobs is not None:
            self._add_logprobs(req.logprobs)
        if delta:
            # A stop string never cuts into text already returned: the held-back text covers any it could.
            sent, self.num_sent_tokens = self.num_sent_tokens, len(ids)
            text, self.num_sent_chars = text[self.num_sent_chars :], len(text)
            ids, logprobs = ids[sent:], self.logprobs[sent:]
        else:
            ids, logprobs = list(ids), list(self.logprobs)
        out = CompletionOutput(req.sample_index, text, ids, req.finish_reason, reason)
        if req.logprobs is not None:
            out.logprobs = logprobs
            out.cumulative_logprob = req.cumulative_logprob
        return out

    def _add_logprobs(self, raw: list[TokenLogprobs]) -> None:
        """One dict per output token (as vLLM, each token's text decoded alone), built once per token: a
        streamed output's list extends the one before."""
        del self.logprobs[len(raw) :]  # tokens dropped past a stop string (never shown yet)
        for entry in raw[len(self.logprobs) :]:
            self.logprobs.append(position_logprobs(entry, self.num_logprobs, self.decode))


class RequestGroup:
    """A request and, for n > 1, the samples forked from it after its prefill."""

    def __init__(self, req: Request, engine: LLMEngine) -> None:
        self.root = req
        self.engine = engine
        # Every output of the request shares one copy of its prompt ids, as vLLM's share one list: a caller's
        # edit never reaches the engine, and a stream of 256 requests with 512-token prompts is not slowed by
        # a copy per output (and by the cyclic collector walking them).
        self.prompt_token_ids = list(req.prompt_token_ids)
        self.seqs = [SequenceOutput(req, engine.detokenizer(req), engine)]
        self.has_text = self.seqs[0].detok is not None  # else a token needs no work until the output
        self.prompt_logprobs: PromptLogprobs | None = None  # built once, with the first output
        kind = req.params.output_kind
        self.delta = kind is RequestOutputKind.DELTA
        self.final_only = kind is RequestOutputKind.FINAL_ONLY  # `LLMEngine.step` skips it until it finishes
        self.num_open = req.params.n  # samples whose finished output has not gone out yet
        self.held = False  # a streamed sample finished in a `step(final_only=True)`: see `held_outputs`

    def on_token(self, req: Request) -> None:
        if req.sample_index >= len(self.seqs):
            self.seqs.append(SequenceOutput(req, self.engine.detokenizer(req), self.engine))
        if self.has_text:  # else nothing to do per token (a W2 step touches 256 groups)
            self.seqs[req.sample_index].on_token(self.engine)

    @property
    def finished(self) -> bool:
        return len(self.seqs) == self.root.params.n and all(seq.req.is_finished for seq in self.seqs)

    @property
    def done(self) -> bool:
        """Every sample's finished output has gone out (streamed); the group has nothing more to give."""
        return self.num_open == 0

    def output(self) -> RequestOutput:
        """The finished request's one output (FINAL_ONLY): every sample, in index order."""
        self.num_open = 0
        return self._request_output([seq.output(self.delta) for seq in self.seqs], self._prompt_logprobs())

    def held_outputs(self, req: Request) -> list[RequestOutput]:
        """The ends of samples (other than `req`) that finished in a `step(final_only=True)`, which showed nothing
        while the request ran: streamed with the request's next streamed output, so none is lost."""
        self.held = False
        held = [
            seq.req
            for seq in self.seqs
            if seq.req is not req and seq.req.is_finished and not seq.returned_final
        ]
        return [out for r in held if (out := self.sample_output(r)) is not None]

    def sample_output(self, req: Request) -> RequestOutput | None:
        """A streamed output for the sample `req` that moved this step: that sample alone, everything so far or
        (DELTA) what is new for it. None once its finished output went out. `finished` is set on the output that
        brings the last sample's end, as vLLM's; DELTA gives each sample the prompt logprobs on its first output,
        as vLLM's per-sample requests each do."""
        seq = self.seqs[req.sample_index]
        if seq.returned_final:
            return None
        if req.is_finished:
            seq.returned_final = True
            self.num_open -= 1
        prompt_logprobs = None if self.delta and seq.num_outputs else self._prompt_logprobs()
        seq.num_outputs += 1
        return self._request_output([seq.output(self.delta)], prompt_logprobs)

    def _request_output(
        self, outputs: list[CompletionOutput], prompt_logprobs: PromptLogprobs | None
    ) -> RequestOutput:
        root, done = self.root, self.num_open == 0
        return RequestOutput(
            request_id=root.request_id,
            prompt=root.prompt,
            prompt_token_ids=self.prompt_token_ids,
            outputs=outputs,
            finished=done,
            num_cached_tokens=root.num_cached_tokens,
            metrics=RequestMetrics(
                root.arrival_time,
                root.first_token_time,
                max((s.req.finished_time or 0.0) for s in self.seqs) if done else None,
            ),
            prompt_logprobs=prompt_logprobs,
        )

    def _prompt_logprobs(self) -> PromptLogprobs | None:
        """The prompt's entries (None first), complete by the first output: its prompt has been computed."""
        root, raw = self.root, self.root.prompt_logprobs
        if raw is not None and self.prompt_logprobs is None:
            if root.needs_prompt_logprobs:
                raise RuntimeError(f"{root} has {len(raw)} prompt logprobs at its first output")
            k = num_logprobs(root.params.prompt_logprobs, self.engine.model_config.vocab_size)
            decode = self.engine.token_text if root.params.detokenize else None
            self.prompt_logprobs = prompt_position_logprobs(raw, k, decode)
        return None if self.prompt_logprobs is None else list(self.prompt_logprobs)

"""SchedulerOutput -> tensors -> forward -> sample. The only place that touches the model and the cache."""

from __future__ import annotations

from operator import attrgetter

import numpy as np
import torch
from torch import nn

from roseinfer.attention.backend import get_backend
from roseinfer.attention.metadata import AttentionMetadata
from roseinfer.config import EngineConfig
from roseinfer.kernels.pdl import pdl_supported
from roseinfer.kernels.prefill_plan import LONG_TILE, TilePlanner, cuts_keys
from roseinfer.kv.cache_dtype import check_fp8_cache_support, resolve_kv_cache_dtype
from roseinfer.models.layers import ForwardContext
from roseinfer.models.loader import build_model
from roseinfer.profiling import record
from roseinfer.request import Request
from roseinfer.runner.cuda_graphs import DecodeGraphs, sample_rows
from roseinfer.runner.gc_heap import release_dead_engines
from roseinfer.runner.inputs import Staging, build_host_step, one_prefill_step, upload_step
from roseinfer.runner.kv_offload import KVOffloader, cpu_tier_num_blocks, staging_blocks
from roseinfer.runner.kv_sizing import GpuMemory, kv_cache_num_blocks
from roseinfer.runner.logit_controls import StepControls
from roseinfer.runner.mixed_graphs import MAX_CHUNKS, MixedGraphs, auto_mixed_graph_max_tokens
from roseinfer.runner.penalties import StepPenalties
from roseinfer.runner.prompt_logprobs import (
    PromptLogprobsResult,
    compute_prompt_logprobs,
    prompt_logprobs_rows,
)
from roseinfer.runner.sampler import (
    BannedTokens,
    SamplingBatch,
    compute_logprobs,
    gather_logprobs,
    sample,
)
from roseinfer.runner.sampler_profile import WorstCaseSampling
from roseinfer.runner.sampling_state import SamplingState
from roseinfer.runner.step_future import StepFuture
from roseinfer.scheduler.scheduler import SchedulerOutput

_REQUEST = attrgetter("request")


def draw(
    logits: torch.Tensor,
    batch: SamplingBatch,
    banned: BannedTokens | None,
    penalties: StepPenalties | None,
    controls: StepControls | None,
    graph_tokens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A step's tokens [R] (int32; `graph_tokens` where the decode graph drew them) from its sampled rows' logits
    [R, V], counted in their penalty rows, and their packed logprobs where some row asks for them."""
    # Logprobs of the raw logits, taken before `sample` masks banned tokens in them; the draw is the same with
    # or without them (in the graph or out of it).
    k = batch.num_logprobs
    raw = None if k is None else compute_logprobs(logits)
    if graph_tokens is not None:
        tokens = graph_tokens
    else:
        tokens = sample(logits, batch, banned, penalties, controls).to(torch.int32)
    if penalties is not None:
        penalties.fold(tokens)
    packed = None if k is None or raw is None else gather_logprobs(raw, tokens, k)
    return tokens, packed


class ModelRunner:
    def __init__(self, config: EngineConfig, model_path: str, model: nn.Module | None = None) -> None:
        self.config = config
        self.cfg = config.model_config
        self.device = config.device
        self.dtype = config.dtype
        self.kv_dtype = resolve_kv_cache_dtype(config.cache.kv_cache_dtype, self.dtype)
        self.block_size = config.cache.block_size
        self.max_model_len = config.max_model_len
        self.max_blocks_per_seq = -(-self.max_model_len // self.block_size)
        release_dead_engines(self.device)
        self.model = model or build_model(
            self.cfg, model_path, config.load_format, self.dtype, self.device, self.max_model_len, config.seed
        )
        if hasattr(self.model, "one_token_gemv"):
            self.model.one_token_gemv = config.one_token_gemv
        self.backend = get_backend(config.attention_backend)
        check_fp8_cache_support(self.kv_dtype, self.device, config.attention_backend)
        # Eager steps' prefill tile maps: key splits for short chunks over long prefixes, the long chunks' tile.
        self.tile_planner: TilePlanner | None = None
        if self.backend.takes_tile_maps and config.prefill_key_splits:
            heads, dim, kv = self.cfg.num_heads, self.cfg.head_dim, self.kv_dtype
            self.tile_planner = TilePlanner(heads, dim, self.dtype, self.device, True, kv, self.block_size)
        if (
            config.fold_norms
            and self.backend.defers_norm
            and getattr(self.model, "can_fold_norms", False)
            and self.dtype != torch.float16
        ):
            self.model.fold_norm_weights()
        if hasattr(self.model, "pdl_decode"):
            self.model.pdl_decode = (
                config.pdl_decode and pdl_supported(self.device) and self.model.pdl_decode_pays
            )
        self.kv_cache: torch.Tensor | None = None
        self.offloader: KVOffloader | None = None
        self.staging = Staging(self.device)  # start-up profiling and benchmarks
        self.stagings = (Staging(self.device), Staging(self.device))  # alternate launches
        self.num_launches = 0
        self.last_sampled: torch.Tensor | None = None  # the latest launch's sampled tokens, on the device
        self.copy_staging = Staging(self.device, capacity=1024)
        self.graphs: DecodeGraphs | None = None
        self.mixed_graphs: MixedGraphs | None = None
        cap = config.mixed_graph_max_tokens
        cap = auto_mixed_graph_max_tokens(self.cfg) if cap is None else cap
        # The largest step with prefill work that replays a graph (where graphs are captured at all).
        self.mixed_graph_max_tokens = min(cap, config.scheduler.max_num_batched_tokens)
        # Steps by path: decode graph, mixed-step graph, eager; of the last two, those that cut prefill keys or took LONG_TILE.
        self.step_paths = {"decode_graph": 0, "mixed_graph": 0, "eager": 0, "key_split": 0, "long_tile": 0}
        self.sampling = SamplingState(
            self.cfg.vocab_size, self.device, config.seed, config.scheduler.max_num_seqs
        )
        self._seeds = np.random.default_rng(config.seed)  # per-step seeds of graph-sampled rows

    # -- KV cache ---------------------------------------------------------------------------------

    def block_bytes(self) -> int:
        return self.block_size * self.cfg.kv_bytes_per_token(self.kv_dtype)

    def determine_num_blocks(self) -> int:
        cache = self.config.cache
        if cache.num_blocks is not None:
            return cache.num_blocks
        if self.device.type != "cuda":
            return max(1, cache.cpu_kv_tokens // self.block_size)
        peak = self.profile_peak_memory()
        if cache.offloads:  # the CPU tier's two staging buffers, allocated after the KV cache
            bb = self.block_bytes()
            peak += 2 * staging_blocks(cpu_tier_num_blocks(cache, bb), bb) * bb
        free, total = torch.cuda.mem_get_info(self.device)
        mem = GpuMemory(total=total, free=free, reserved=torch.cuda.memory_reserved(self.device), peak=peak)
        return kv_cache_num_blocks(mem, cache.gpu_memory_utilization, self.block_bytes())

    @torch.inference_mode()
    def profile_peak_memory(self) -> int:
        """Peak bytes used by weights plus the worst step at start-up sizing (`run_worst_case_step`)."""
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        self.run_worst_case_step()
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device)
        torch.cuda.empty_cache()
        return peak

    @torch.inference_mode()
    def run_worst_case_step(self) -> torch.Tensor:
        """One forward of a full token budget (over a scratch cache), beside the sampler's worst-case state (a
        full penalty table after its largest growth, every row's allowed ids: `sampler_profile.py`); then, as
        an eager step, one prompt-logprobs slice and a draw over `max_num_seqs` rows with every sampling
        feature on. Leaves the runner as it was (its KV cache, its sampling state). Returns the drawn tokens."""
        sched = self.config.scheduler
        num_tokens = min(sched.max_num_batched_tokens, self.max_model_len)
        num_blocks = -(-num_tokens // self.block_size)
        kv_cache = self._new_kv_cache(num_blocks)
        vocab = self.cfg.vocab_size
        worst = WorstCaseSampling.build(
            sched.max_num_seqs, vocab, self.device, self.config.max_logprobs, num_tokens
        )
        step = one_prefill_step(num_tokens, self.block_size)
        ids, pos, meta, _ = upload_step(step, self.staging)
        hidden = self.model(ids, pos, ForwardContext(kv_cache, meta, self.backend))
        del kv_cache
        # Its packed rows go to the host before the step samples (`PromptLogprobsResult`).
        compute_prompt_logprobs(self.model.compute_logits, hidden, worst.prompt_job, self.device)
        # As many sampled rows as max_num_seqs, more than the step's tokens where n > 1 forks are drawn.
        rows = torch.arange(sched.max_num_seqs, device=self.device) % num_tokens
        logits = self.model.compute_logits(hidden[rows])
        tokens, _ = draw(logits, worst.batch, worst.banned, worst.penalties, worst.controls)
        return tokens

    def allocate_kv_cache(self, num_blocks: int) -> None:
        self.kv_cache = self._new_kv_cache(num_blocks)

    def allocate_cpu_tier(self, num_slots: int) -> None:
        assert self.kv_cache is not None, "allocate_kv_cache() first"
        self.offloader = KVOffloader(self.kv_cache, num_slots) if num_slots else None

    def _new_kv_cache(self, num_blocks: int) -> torch.Tensor:
        c = self.cfg
        shape = (num_blocks, c.num_layers, 2, self.block_size, c.num_kv_heads, c.head_dim)
        return torch.zeros(shape, dtype=self.kv_dtype, device=self.device)

    # -- one step ---------------------------------------------------------------------------------

    def prepare_inputs(self, out: SchedulerOutput) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        ids, positions, meta, _ = upload_step(
            build_host_step(out, self.block_size), self.staging, self.last_sampled
        )
        return ids, positions, meta

    def _forward_sample(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        temperature: torch.Tensor,
        seeds: torch.Tensor,
        tokens: torch.Tensor,
    ) -> torch.Tensor:
        """Every row's logits, each row's token drawn into `tokens` (the decode graphs' body, where every row
        samples): in the model's decode chain where it has one (`forward_sample`), else the lm_head, then
        `sample_rows`."""
        ctx = ForwardContext(self.kv_cache, meta, self.backend)
        on_chain = getattr(self.model, "forward_sample", None)
        logits = on_chain(ids, positions, ctx, temperature, seeds, tokens) if on_chain else None
        if logits is None:
            logits = self.model.compute_logits(self.model(ids, positions, ctx))
            tokens.copy_(sample_rows(logits, temperature, seeds))
        return logits

    def _forward_hidden(
        self, ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        return self.model(ids, positions, ForwardContext(self.kv_cache, meta, self.backend))

    def capture_graphs(self) -> None:
        """Decode and mixed-step CUDA graphs; only on CUDA with a graph-safe backend and enforce_eager off."""
        if self.device.type != "cuda" or self.config.enforce_eager or self.backend.name == "torch":
            return
        sched = self.config.scheduler
        self.graphs = DecodeGraphs(
            self._forward_sample, self.device, sched.max_num_seqs, self.max_blocks_per_seq, self.block_size
        )
        self.graphs.capture()
        if self.mixed_graph_max_tokens > 0:
            self.mixed_graphs = self.build_mixed_graphs(self.mixed_graph_max_tokens)
            self.mixed_graphs.capture()

    def num_graphs(self) -> tuple[int, int]:
        """Captured graphs: (decode, mixed-step)."""
        decode = len(self.graphs.graphs) if self.graphs is not None else 0
        mixed = self.mixed_graphs.num_graphs() if self.mixed_graphs is not None else 0
        return decode, mixed

    def build_mixed_graphs(self, max_tokens: int, max_chunks: int = MAX_CHUNKS) -> MixedGraphs:
        return MixedGraphs(
            self._forward_hidden,
            self.device,
            max_tokens,
            self.config.scheduler.max_num_seqs,
            self.max_blocks_per_seq,
            self.block_size,
            self.cfg.num_heads,
            self.cfg.head_dim,
            self.dtype,
            max_chunks,
            key_splits=self.config.prefill_key_splits,
            cache_dtype=self.kv_dtype,
        )

    def warm_up(self) -> None:
        """Compile the attention kernel variants later steps could meet first (after allocate_kv_cache)."""
        assert self.kv_cache is not None
        if self.device.type == "cuda":
            long_tile = self.tile_planner is not None and self.tile_planner.long_split is not None
            kv = self.kv_cache[:, 0]
            self.backend.warm_up(kv[:, 0], kv[:, 1], self.cfg.num_heads, self.dtype, long_tile)

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """All copy-on-write copies of a step in one batched operation (a block spans every layer)."""
        # Its own staging buffer: the step's inputs are uploaded through `self.staging` right after.
        (idx,) = self.copy_staging.upload([np.asarray(pairs, dtype=np.int32).T.copy()])
        self.backend.copy_blocks(self.kv_cache, idx[0].long(), idx[1].long())

    def execute(self, out: SchedulerOutput) -> list[list[int]]:
        """Runs one step and waits for it; returns the sampled tokens of each scheduled request."""
        return self.launch(out).result()

    @torch.inference_mode()
    def launch(self, out: SchedulerOutput) -> StepFuture:
        """Queues one step on the device without waiting for it. Input ids still pending on the host are
        taken from the previous launch's sampled tokens, which stay on the device."""
        assert self.kv_cache is not None, "allocate_kv_cache() first"
        if out.kv_loads:
            assert self.offloader is not None
            with record("kv_load"):
                self.offloader.load(out.kv_loads, out.kv_loads_wait)
        if out.blocks_to_copy:
            with record("copy_blocks"):
                self.copy_blocks(out.blocks_to_copy)
        staging = self.stagings[self.num_launches % 2]  # the other one may still be feeding a queued step
        self.num_launches += 1
        with record("prepare_inputs"):
            step = build_host_step(out, self.block_size)
            # Prompt logprobs need every prompt row's hidden state: only the eager forward keeps them all.
            eager = bool(out.prompt_logprobs)
            use_graph = not eager and self.graphs is not None and self.graphs.can_run(step)
            mixed = None
            if not use_graph and not eager and self.mixed_graphs is not None:
                mixed = self.mixed_graphs.plan(step)
            if not use_graph and mixed is None:
                tiles = None
                if self.tile_planner is not None and step.max_query_len > 1:
                    tiles = self.tile_planner.eager_map(step.query_start_loc, step.seq_lens)
                    if tiles is not None:  # a map that cuts keys, or LONG_TILE's (which may not)
                        self.step_paths["key_split"] += cuts_keys(tiles[0])
                        self.step_paths["long_tile"] += tiles[1] >= LONG_TILE[0]
                ids, positions, meta, logits_index = upload_step(step, staging, self.last_sampled, tiles)
            rows = step.sample_rows.tolist()
            sched = out.scheduled
            reqs = list(map(_REQUEST, sched)) if step.one_sample_each else [sched[i].request for i in rows]
            batch = self.sampling.batch(rows, reqs, self.last_sampled) if rows else None
            banned = controls = None
            if batch is not None and (batch.any_min_tokens or batch.any_logit_controls):
                banned, controls = self.sampling.masks(reqs, batch, self.last_sampled)
            penalties = self.sampling.penalties if batch is not None and batch.any_penalties else None
        graph_tokens = None
        prompt = None
        with record("forward"):
            if use_graph:
                # The graph samples one token per input row: a fork's rows are drawn outside, and so are
                # the rows of a step where some row may not draw its stop ids (min_tokens), has penalties or
                # logit controls (allowed_token_ids, logit_bias, bad_words).
                in_graph = (
                    batch is not None
                    and batch.in_graph
                    and banned is None
                    and penalties is None
                    and controls is None
                    and len(rows) == step.num_seqs
                )
                temperature = batch.host_temperature if in_graph else None
                seed = int(self._seeds.integers(2**62)) if temperature is not None else 0
                logits, graph_tokens = self.graphs.run(step, self.last_sampled, temperature, seed)
                if not in_graph:
                    graph_tokens = None
                self.step_paths["decode_graph"] += 1
            elif mixed is not None:
                assert self.mixed_graphs is not None
                sampled_hidden = self.mixed_graphs.run(step, mixed, self.last_sampled)
                self.step_paths["key_split"] += cuts_keys(mixed.tiles)
                self.step_paths["long_tile"] += mixed.long
                if rows:
                    logits = self.model.compute_logits(sampled_hidden)
                self.step_paths["mixed_graph"] += 1
            else:
                hidden = self.model(ids, positions, ForwardContext(self.kv_cache, meta, self.backend))
                if eager:
                    with record("prompt_logprobs"):
                        job = prompt_logprobs_rows(out, step, self.cfg.vocab_size)
                        packed = compute_prompt_logprobs(self.model.compute_logits, hidden, job, self.device)
                        prompt = PromptLogprobsResult(job.spans, packed)
                if rows:
                    logits = self.model.compute_logits(hidden[logits_index.long()])
                self.step_paths["eager"] += 1
        if out.kv_stores:
            self.store_kv(out.kv_stores)
        if batch is None:
            done = None
            if prompt is not None and self.device.type == "cuda":
                done = torch.cuda.Event()
                done.record()
            return StepFuture(len(out.scheduled), rows, None, done, prompt=prompt)
        with record("sample"):
            previous = -1
            for k, (i, r) in enumerate(zip(rows, reqs)):  # rows are grouped by scheduled request
                if i != previous:
                    r.pending_row = k
                    previous = i
            tokens, packed = draw(logits, batch, banned, penalties, controls, graph_tokens)
            self.last_sampled = tokens
            if self.device.type != "cuda":
                return StepFuture(
                    len(out.scheduled), rows, tokens.clone(), None, step.one_sample_each, packed, prompt
                )
            host = torch.empty(tokens.shape, dtype=torch.int32, pin_memory=True)
            host.copy_(tokens, non_blocking=True)
            host_logprobs = None
            if packed is not None:  # with the tokens, before the same event
                host_logprobs = torch.empty(packed.shape, dtype=torch.int32, pin_memory=True)
                host_logprobs.copy_(packed, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
        return StepFuture(len(out.scheduled), rows, host, done, step.one_sample_each, host_logprobs, prompt)

    def store_kv(self, pairs: list[tuple[int, int]]) -> None:
        """(block, host slot) stores into the CPU tier, after whatever fills those blocks."""
        assert self.offloader is not None
        with record("kv_store"):
            self.offloader.store(pairs)

    def release(self, req: Request) -> None:
        """A finished request's sampling state (its generator, its penalty row)."""
        self.sampling.release(req)

    def preempted(self, reqs: list[Request]) -> None:
        """Preempted requests' penalty rows (rebuilt when they sample again)."""
        self.sampling.preempted(reqs)

"""SchedulerOutput -> tensors -> forward -> sample. The only place that touches the model and the cache."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from roseinfer.attention.backend import get_backend
from roseinfer.attention.metadata import AttentionMetadata
from roseinfer.config import EngineConfig
from roseinfer.models.layers import ForwardContext
from roseinfer.models.loader import build_model
from roseinfer.profiling import record
from roseinfer.runner.sampler import SamplingBatch, sample
from roseinfer.scheduler.scheduler import SchedulerOutput


class ModelRunner:
    def __init__(self, config: EngineConfig, model_path: str, model: nn.Module | None = None) -> None:
        self.config = config
        self.cfg = config.model_config
        self.device = config.device
        self.dtype = config.dtype
        self.block_size = config.cache.block_size
        self.max_model_len = config.max_model_len
        self.max_blocks_per_seq = -(-self.max_model_len // self.block_size)
        self.model = model or build_model(
            self.cfg, model_path, config.load_format, self.dtype, self.device, self.max_model_len, config.seed
        )
        self.backend = get_backend(config.attention_backend)
        self.kv_cache: torch.Tensor | None = None
        self.generators: dict[str, torch.Generator] = {}

    # -- KV cache ---------------------------------------------------------------------------------

    def block_bytes(self) -> int:
        return self.block_size * self.cfg.kv_bytes_per_token(self.dtype)

    def determine_num_blocks(self) -> int:
        cache = self.config.cache
        if cache.num_blocks is not None:
            return cache.num_blocks
        if self.device.type != "cuda":
            return max(1, cache.cpu_kv_tokens // self.block_size)
        peak = self.profile_peak_memory()
        total = torch.cuda.mem_get_info(self.device)[1]
        available = int(total * cache.gpu_memory_utilization) - peak
        num_blocks = available // self.block_bytes()
        if num_blocks < 1:
            raise RuntimeError(
                f"no GPU memory left for the KV cache: peak use {peak / 2**30:.2f} GiB of "
                f"{total / 2**30:.2f} GiB at gpu_memory_utilization={cache.gpu_memory_utilization}"
            )
        return num_blocks

    @torch.inference_mode()
    def profile_peak_memory(self) -> int:
        """Peak bytes used by weights plus one forward of a full token budget (with a scratch cache)."""
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        num_tokens = min(self.config.scheduler.max_num_batched_tokens, self.max_model_len)
        num_blocks = -(-num_tokens // self.block_size)
        self.allocate_kv_cache(num_blocks)
        seq_lens = [num_tokens]
        meta = self._metadata(
            np.arange(num_tokens, dtype=np.int64),
            [0, num_tokens],
            seq_lens,
            np.arange(num_blocks)[None],
            num_tokens,
        )
        ids = torch.zeros(num_tokens, dtype=torch.long, device=self.device)
        pos = torch.arange(num_tokens, device=self.device)
        hidden = self.model(ids, pos, ForwardContext(self.kv_cache, meta, self.backend))
        logits = self.model.compute_logits(hidden[-self.config.scheduler.max_num_seqs :])
        del hidden, logits
        self.kv_cache = None
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device)
        torch.cuda.empty_cache()
        return peak

    def allocate_kv_cache(self, num_blocks: int) -> None:
        c = self.cfg
        shape = (num_blocks, c.num_layers, 2, self.block_size, c.num_kv_heads, c.head_dim)
        self.kv_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)

    # -- one step ---------------------------------------------------------------------------------

    def _metadata(
        self,
        slots: np.ndarray,
        query_start_loc: list[int],
        seq_lens: list[int],
        block_tables: np.ndarray,
        max_query_len: int,
    ) -> AttentionMetadata:
        dev = self.device

        def t(a: np.ndarray | list, dtype: torch.dtype) -> torch.Tensor:
            return torch.as_tensor(np.asarray(a), dtype=dtype).to(dev, non_blocking=True)

        return AttentionMetadata(
            slot_mapping=t(slots, torch.int64),
            query_start_loc=t(query_start_loc, torch.int32),
            seq_lens=t(seq_lens, torch.int32),
            block_tables=t(block_tables, torch.int32),
            max_query_len=max_query_len,
            max_seq_len=max(seq_lens),
            query_start_loc_cpu=query_start_loc,
            seq_lens_cpu=seq_lens,
        )

    def prepare_inputs(self, out: SchedulerOutput) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        sched = out.scheduled
        starts = np.fromiter((s.request.num_computed_tokens for s in sched), np.int64, len(sched))
        lens = np.fromiter((s.num_new_tokens for s in sched), np.int64, len(sched))
        cu = np.zeros(len(sched) + 1, np.int64)
        np.cumsum(lens, out=cu[1:])
        total = int(cu[-1])
        ids = np.empty(total, np.int64)
        width = max(len(s.request.block_ids) for s in sched)
        tables = np.zeros((len(sched), width), np.int64)
        for i, s in enumerate(sched):
            r = s.request
            ids[cu[i] : cu[i + 1]] = r.all_token_ids[starts[i] : starts[i] + lens[i]]
            tables[i, : len(r.block_ids)] = r.block_ids
        seq_of_token = np.repeat(np.arange(len(sched)), lens)
        positions = np.arange(total) - cu[:-1][seq_of_token] + starts[seq_of_token]
        slots = (
            tables[seq_of_token, positions // self.block_size] * self.block_size + positions % self.block_size
        )
        seq_lens = (starts + lens).tolist()
        meta = self._metadata(slots, cu.tolist(), seq_lens, tables, int(lens.max()))
        ids_t = torch.from_numpy(ids).to(self.device, non_blocking=True)
        pos_t = torch.from_numpy(positions).to(self.device, non_blocking=True)
        return ids_t, pos_t, meta

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """All copy-on-write copies of a step in one batched operation (a block spans every layer)."""
        src = torch.tensor([p[0] for p in pairs], dtype=torch.int64).to(self.device, non_blocking=True)
        dst = torch.tensor([p[1] for p in pairs], dtype=torch.int64).to(self.device, non_blocking=True)
        self.kv_cache[dst] = self.kv_cache[src]

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> list[list[int]]:
        """Runs one step; returns the sampled tokens of each scheduled request (empty if it did not sample)."""
        assert self.kv_cache is not None, "allocate_kv_cache() first"
        if out.blocks_to_copy:
            with record("copy_blocks"):
                self.copy_blocks(out.blocks_to_copy)
        with record("prepare_inputs"):
            ids, positions, meta = self.prepare_inputs(out)
        with record("forward"):
            hidden = self.model(ids, positions, ForwardContext(self.kv_cache, meta, self.backend))
        rows = [i for i, s in enumerate(out.scheduled) for _ in range(s.num_samples)]
        result: list[list[int]] = [[] for _ in out.scheduled]
        if not rows:
            return result
        with record("sample"):
            last = torch.tensor([meta.query_start_loc_cpu[i + 1] - 1 for i in rows], device=self.device)
            logits = self.model.compute_logits(hidden[last])
            reqs = [out.scheduled[i].request for i in rows]
            seen: dict[int, int] = {}
            gens = []
            for i, r in zip(rows, reqs):
                k = seen[i] = seen.get(i, -1) + 1  # the k-th sample of this row: child k of a fork
                gens.append(self._generator(r, k))
            batch = SamplingBatch.build([r.params for r in reqs], gens, self.cfg.vocab_size, self.device)
            tokens = sample(logits, batch).tolist()
        for i, tok in zip(rows, tokens):
            result[i].append(tok)
        return result

    def _generator(self, req, sample_index: int = 0) -> torch.Generator | None:
        """The request's own generator when seeded; sample i of an n > 1 request uses seed + i."""
        seed = req.params.seed
        if seed is None or req.params.greedy:
            return None
        key = req.request_id if sample_index == 0 else f"{req.request_id}#{sample_index}"
        gen = self.generators.get(key)
        if gen is None:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(seed + sample_index + req.sample_index)
            self.generators[key] = gen
        return gen

    def release(self, request_id: str) -> None:
        self.generators.pop(request_id, None)

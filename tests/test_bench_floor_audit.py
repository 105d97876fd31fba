"""The roofline floors of shared/WORKLOADS.md recomputed by hand from the model shapes' HF config.json files:
a decode step reads the weights once plus its KV (bytes / copy bandwidth, counting read + written), a prefill of
N tokens costs 2 x params x N FLOPs (/ matmul rate). Checked against `bench throughput`'s run floor
(`roofline_floor`), `bench roofline`'s per-step floors and rows, and the device-limit arithmetic."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from roseinfer.bench import env
from roseinfer.bench.roofline import (
    decode_floor_bytes,
    decode_row,
    decode_step,
    prefill_flops,
    prefill_row,
    prefill_step,
    weight_bytes_per_decode,
)
from roseinfer.bench.roofline_floor import distinct_prompt_tokens, format_roofline, roofline_floor
from roseinfer.bench.run_result import RunResult
from roseinfer.bench.workloads import Workload, build_workload
from roseinfer.config import ModelConfig
from roseinfer.models.loader import BUILTIN_CONFIG_DIR
from roseinfer.sampling_params import SamplingParams

SHAPES = ("qwen2.5-0.5b", "qwen3-0.6b", "llama-3.1-8b", "qwen3-8b", "gpt2", "tiny-llama")
# WORKLOADS.md's "params" column, to the digits it gives
PARAMS_B = {
    "qwen2.5-0.5b": "0.49",
    "qwen3-0.6b": "0.6",
    "llama-3.1-8b": "8.0",
    "qwen3-8b": "8.2",
    "gpt2": "0.12",
}


@dataclass
class Dims:
    """A shape's dimensions read from its config.json (HF names, GPT-2's included), not through ModelConfig."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    vocab: int
    tied: bool
    gated: bool

    @staticmethod
    def of(shape: str) -> Dims:
        d = json.loads(Path(BUILTIN_CONFIG_DIR, f"{shape}.json").read_text())
        h = d.get("hidden_size") or d["n_embd"]
        heads = d.get("num_attention_heads") or d["n_head"]
        return Dims(
            hidden=h,
            layers=d.get("num_hidden_layers") or d["n_layer"],
            heads=heads,
            kv_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or h // heads,
            inter=d.get("intermediate_size") or d.get("n_inner") or 4 * h,
            vocab=d["vocab_size"],
            tied=d.get("tie_word_embeddings", True),  # HF's default (GPT-2 leaves it out)
            gated=d["model_type"] != "gpt2",  # gate + up + down against GPT-2's fc + proj
        )

    def layer_matmul_params(self) -> int:
        q = self.hidden * self.heads * self.head_dim
        k = v = self.hidden * self.kv_heads * self.head_dim
        o = self.heads * self.head_dim * self.hidden
        mlp = (3 if self.gated else 2) * self.hidden * self.inter
        return q + k + v + o + mlp

    def lm_head(self) -> int:
        return self.vocab * self.hidden

    def decode_weight_params(self) -> int:
        """What a decode step reads: every layer's matmuls and the LM head (of the input embedding only a row
        per token, nothing next to the rest)."""
        return self.layers * self.layer_matmul_params() + self.lm_head()

    def kv_bytes_per_token(self, elem: int) -> int:
        return self.layers * 2 * self.kv_heads * self.head_dim * elem  # K and V of every layer


def config(shape: str) -> ModelConfig:
    return ModelConfig.from_path(f"{BUILTIN_CONFIG_DIR}/{shape}.json")


@pytest.mark.parametrize("shape", list(PARAMS_B))
def test_the_hand_count_is_the_params_workloads_md_gives(shape: str):
    """Anchors the hand count of these tests (and ModelConfig's) to the page: embeddings once when tied."""
    dims = Dims.of(shape)
    total = dims.layers * dims.layer_matmul_params() + dims.lm_head() * (1 if dims.tied else 2)
    given = PARAMS_B[shape]
    assert f"{total / 1e9:.{len(given.split('.')[1])}f}" == given
    assert config(shape).params_count() == total


def random_workload(rng: np.random.Generator, vocab: int) -> Workload:
    """Requests with random lengths whose prompts share random prefixes (some whole prompts repeat)."""
    n = int(rng.integers(1, 12))
    base = rng.integers(0, vocab, size=int(rng.integers(1, 80))).tolist()
    prompts: list[list[int]] = []
    for _ in range(n):
        keep = int(rng.integers(0, len(base) + 1))
        tail = rng.integers(0, vocab, size=int(rng.integers(0 if keep else 1, 40))).tolist()
        prompts.append(base[:keep] + tail)
    outputs = [int(x) for x in rng.integers(1, 60, size=n)]
    params = [SamplingParams(max_tokens=o, ignore_eos=True) for o in outputs]
    return Workload("test", "random", prompts, params)


def hand_floor(
    dims: Dims, elem: int, kv_elem: int, w: Workload, batch: int, bw: float, tf: float, cached: bool
) -> dict[str, float]:
    """The floor of WORKLOADS.md step by step: prefill = 2 x matmul params x prompt tokens computed (the LM
    head only for each request's last token); every later token is a decode step that reads the weights and
    the KV of every token before it and of itself."""
    if cached:  # a prefix cache computes each distinct prefix once: count the distinct prefixes
        computed = len({tuple(p[: i + 1]) for p in w.prompts for i in range(len(p))})
    else:
        computed = sum(len(p) for p in w.prompts)
    flops = 2 * dims.layers * dims.layer_matmul_params() * computed + 2 * dims.lm_head() * len(w.prompts)
    kv_tokens = 0
    decode_tokens = []
    for p, s in zip(w.prompts, w.params):
        decode_tokens.append(s.max_tokens - 1)  # the first output token comes out of the prefill
        for j in range(1, s.max_tokens):  # the j-th decode step attends over the prompt and j tokens
            kv_tokens += len(p) + j
    # one step a token for the longest request, and no more than `batch` tokens a step
    steps = max(max(decode_tokens), -(-sum(decode_tokens) // batch))
    weights = steps * dims.decode_weight_params() * elem
    kv = kv_tokens * dims.kv_bytes_per_token(kv_elem)
    return {
        "prefill_flops": flops,
        "decode_steps": steps,
        "decode_weight_bytes": weights,
        "decode_kv_bytes": kv,
        "prefill_floor_s": flops / (tf * 1e12),
        "decode_floor_s": (weights + kv) / bw,
        "floor_s": flops / (tf * 1e12) + (weights + kv) / bw,
    }


KV_DTYPES = (None, torch.float8_e4m3fn, torch.float32)


@pytest.mark.parametrize("shape", SHAPES)
def test_the_run_floor_is_the_hand_floor(shape: str):
    rng = np.random.default_rng()
    dims, cfg = Dims.of(shape), config(shape)
    for _ in range(6):
        w = random_workload(rng, 50)
        dtype = [torch.bfloat16, torch.float16, torch.float32][int(rng.integers(3))]
        kv_dtype = KV_DTYPES[int(rng.integers(3))]
        batch = int(rng.integers(1, 8))
        bw, tf = float(rng.uniform(1e12, 5e12)), float(rng.uniform(100, 1000))
        cached = bool(rng.integers(2))
        got = roofline_floor(cfg, dtype, w, batch, bw, tf, kv_dtype=kv_dtype, prefix_caching=cached)
        elem = dtype.itemsize
        want = hand_floor(dims, elem, (kv_dtype or dtype).itemsize, w, batch, bw, tf, cached)
        for key, value in want.items():
            assert got[key] == pytest.approx(value, rel=1e-12), key
        assert (got["bandwidth_bytes_per_s"], got["matmul_tflops"]) == (bw, tf)


def test_the_w1_floor_of_llama_3_1_8b():
    """Issue 3's `llama-3.1-8b W1 <= 1.1x its floor`: 64 x 512 prompt tokens, 127 decode steps of the 8B weights
    in bf16 and of the KV of 64 sequences growing from 513 to 639 tokens."""
    w = build_workload("W1", 128256)
    bw, tf = 2.99e12, 792.0
    got = roofline_floor(config("llama-3.1-8b"), torch.bfloat16, w, 256, bw, tf)
    dims = Dims.of("llama-3.1-8b")
    assert got["decode_steps"] == 127
    assert got["decode_weight_bytes"] == 127 * dims.decode_weight_params() * 2
    kv_token = 32 * 2 * 8 * 128 * 2  # layers x (K, V) x kv heads x head dim x bf16
    assert got["decode_kv_bytes"] == 64 * kv_token * sum(range(513, 640))
    assert (
        got["prefill_flops"]
        == 2 * dims.layers * dims.layer_matmul_params() * 64 * 512 + 2 * dims.lm_head() * 64
    )
    # PERFORMANCE.md's reading of it: 0.58 s of prefill FLOPs at 792 TFLOP/s + 0.84 s of decode at 2.99 TB/s
    assert round(got["prefill_floor_s"], 2) == 0.58 and round(got["decode_floor_s"], 2) == 0.84


def test_the_prefix_cache_floor_counts_each_distinct_prefix_once():
    rng = np.random.default_rng()
    for _ in range(20):
        w = random_workload(rng, 4)  # a tiny vocabulary: many shared prefixes
        want = len({tuple(p[: i + 1]) for p in w.prompts for i in range(len(p))})
        assert distinct_prompt_tokens(w.prompts) == want
    assert distinct_prompt_tokens([[1, 2, 3], [1, 2, 4], [2, 3]]) == 6  # 1, 12, 123, 124, 2, 23


def test_the_floor_report_lines():
    rng = np.random.default_rng()
    w = random_workload(rng, 50)
    bw, tf = float(rng.uniform(1e12, 5e12)), float(rng.uniform(100, 1000))
    floor = roofline_floor(config("qwen2.5-0.5b"), torch.bfloat16, w, 4, bw, tf)
    runs = [RunResult(name, 1, 0.1, 0.2, t, 1, 1) for name, t in (("a", floor["floor_s"] * 1.37), ("b", 2.0))]
    text = format_roofline(floor, runs)

    def number(label: str) -> float:
        m = re.search(rf"^{re.escape(label)}: ([\d.]+)", text, re.M)
        assert m, label
        return float(m.group(1))

    assert number("Copy bandwidth (read+write)") == pytest.approx(bw / 1e12, abs=1e-3)
    assert number("Matmul rate") == pytest.approx(tf, abs=0.1)
    assert number("Prefill floor") == pytest.approx(floor["prefill_flops"] / (tf * 1e12), abs=1e-6)
    assert number("Decode floor") == pytest.approx(floor["decode_floor_s"], abs=1e-6)
    assert number("Floor (total)") == pytest.approx(floor["floor_s"], abs=1e-6)
    m = re.search(r"\((\d+) steps, ([\d.]+) GB weights, ([\d.]+) GB KV\)", text)
    assert m and int(m.group(1)) == floor["decode_steps"]
    assert float(m.group(2)) == pytest.approx(floor["decode_weight_bytes"] / 1e9, abs=0.005)
    assert float(m.group(3)) == pytest.approx(floor["decode_kv_bytes"] / 1e9, abs=0.005)
    assert number("a") == 1.37
    assert number("b") == pytest.approx(2.0 / floor["floor_s"], abs=0.005)
    assert text.splitlines()[-2:] == [f"a: {1.37:.2f}x floor", f"b: {2.0 / floor['floor_s']:.2f}x floor"]


# -- bench roofline ---------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES)
def test_a_decode_steps_floor_is_weights_plus_the_batchs_kv(shape: str):
    rng = np.random.default_rng()
    dims, cfg = Dims.of(shape), config(shape)
    for elem in (1, 2, 4):
        assert weight_bytes_per_decode(cfg, elem) == dims.decode_weight_params() * elem
    for _ in range(4):
        batch, context = int(rng.integers(1, 300)), int(rng.integers(1, 9000))
        dtype = [torch.bfloat16, torch.float8_e4m3fn, torch.float32][int(rng.integers(3))]
        got = decode_floor_bytes(cfg, 2, dtype, batch, context)
        assert got == dims.decode_weight_params() * 2 + batch * context * dims.kv_bytes_per_token(
            dtype.itemsize
        )


def test_qwen_decode_b64_ctx1k_floor():
    """Issue 3's `qwen2.5-0.5b decode b=64 ctx 1k <= 1.6x floor`; PERFORMANCE.md reads the floor as 0.603-0.608 ms
    at 2.95-2.97 TB/s."""
    cfg = config("qwen2.5-0.5b")
    floor_bytes = decode_floor_bytes(cfg, 2, torch.bfloat16, 64, 1024)
    assert floor_bytes / 2.97e12 * 1e3 == pytest.approx(0.604, abs=0.001)


@pytest.mark.parametrize("shape", SHAPES)
def test_a_prefills_flops_are_2_x_params_x_n_plus_causal_attention(shape: str):
    rng = np.random.default_rng()
    dims, cfg = Dims.of(shape), config(shape)
    for n in [1, *(int(x) for x in rng.integers(2, 10000, size=3))]:
        # QK^T and PV, 2 FLOPs a multiply-add, over the causal half of the n x n scores, every head and layer
        attention = dims.layers * dims.heads * 2 * (2 * dims.head_dim * n * n / 2)
        want = 2 * dims.layers * dims.layer_matmul_params() * n + attention + 2 * dims.lm_head()
        assert prefill_flops(cfg, n) == pytest.approx(want, rel=1e-12)


def test_the_roofline_rows():
    rng = np.random.default_rng()
    seconds, steady, bw = float(rng.uniform(1e-4, 1e-2)), float(rng.uniform(1e-4, 1e-2)), 3e12
    floor_bytes = int(rng.integers(10**8, 10**10))
    row = decode_row(64, 1024, True, seconds, steady, floor_bytes, bw)
    floor_s = floor_bytes / bw
    assert row == pytest.approx(
        {
            "kind": "decode",
            "batch": 64,
            "context": 1024,
            "graph": True,
            "ms": seconds * 1e3,
            "floor_ms": floor_s * 1e3,
            "x_floor": seconds / floor_s,
            "achieved_TBps": floor_bytes / seconds / 1e12,
            "steady_ms": steady * 1e3,
            "steady_x_floor": steady / floor_s,
        }
    )
    flops, tf = float(rng.uniform(1e12, 1e14)), 790.0
    row = prefill_row(4096, False, seconds, flops, tf)
    achieved = flops / seconds  # FLOP/s
    assert row == pytest.approx(
        {
            "kind": "prefill",
            "tokens": 4096,
            "graph": False,
            "ms": seconds * 1e3,
            "floor_ms": flops / (tf * 1e12) * 1e3,
            "x_floor": seconds / (flops / (tf * 1e12)),
            "achieved_TFLOPs": achieved / 1e12,
            "pct_matmul_rate": 100 * achieved / (tf * 1e12),
        }
    )


def test_the_decode_and_prefill_steps_the_roofline_times():
    rng = np.random.default_rng()
    for _ in range(5):
        batch, context, block = (
            int(rng.integers(1, 40)),
            int(rng.integers(1, 3000)),
            int(rng.choice([16, 64])),
        )
        vocab = int(rng.choice([1500, 20000, 151936]))
        s = decode_step(batch, context, block, vocab, rng)
        assert s.num_seqs == batch and s.max_query_len == 1
        assert np.all(s.positions == context - 1) and np.all(s.seq_lens == context)  # the last token's step
        assert s.block_tables.shape == (batch, math.ceil(context / block))
        assert len(np.unique(s.block_tables)) == s.block_tables.size  # no sequence shares a block
        blocks = s.block_tables[np.arange(batch), (context - 1) // block]
        assert np.array_equal(s.slot_mapping, blocks * block + (context - 1) % block)
        assert np.array_equal(s.query_start_loc, np.arange(batch + 1)) and np.array_equal(
            s.logits_index, np.arange(batch)
        )
        assert s.input_ids.min() >= 1000 and s.input_ids.max() < min(vocab, 32000)
        n = int(rng.integers(1, 3000))
        p = prefill_step(n, block, 20000, rng)
        assert np.array_equal(p.positions, np.arange(n)) and np.array_equal(p.slot_mapping, np.arange(n))
        assert (
            list(p.seq_lens) == [n] and list(p.query_start_loc) == [0, n] and list(p.logits_index) == [n - 1]
        )
        assert p.block_tables.shape == (1, math.ceil(n / block)) and p.max_query_len == n
        assert p.input_ids.min() >= 1000 and p.input_ids.max() < 20000


def test_device_limits_count_bytes_read_and_written_and_2n3_flops(monkeypatch):
    """WORKLOADS.md: copy bandwidth counts bytes read plus written; a matmul of n^3 is 2 n^3 FLOPs."""
    rng = np.random.default_rng()
    t = float(rng.uniform(1e-4, 1e-2))
    monkeypatch.setattr(env, "_require_cuda", lambda device: torch.device("cpu"))
    monkeypatch.setattr(env, "_time_copy", lambda dev, num_bytes, warmup, repeats: t)
    monkeypatch.setattr(env, "_time_matmul", lambda dev, dtype, n, warmup, repeats: t)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    assert env.measure_copy_bandwidth("cuda", num_bytes=1 << 20) == pytest.approx(2 * (1 << 20) / t)
    assert env.measure_matmul_tflops("cuda", n=512) == pytest.approx(2 * 512**3 / t / 1e12)

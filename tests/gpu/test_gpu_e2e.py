"""End to end on the GPU: HF parity in float32, Triton backend == torch backend, graphs on and off."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from roseinfer import LLM, SamplingParams
from roseinfer.bench.roofline import decode_step
from roseinfer.kernels.pdl import pdl_supported
from roseinfer.models import llama
from roseinfer.models.layers import LT_DOWN_MIN_K, LT_DOWN_ROWS
from tests.engine.test_logprobs import check_outputs, check_sample
from tests.engine.test_logprobs import reference as reference_logprobs
from tests.gpu.conftest import fp32_triton_engine, free_gpu
from tests.kernels.test_deferred_norm_model import hf_model_with_spread_norms
from tests.models.test_hf_parity import hf_greedy, hf_regret, random_prompts
from tests.models.tiny_models import save_hf_model

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _release_engines():
    yield
    free_gpu()


def greedy(n: int = 12) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


def token_ids(llm: LLM, prompts) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, greedy(), use_tqdm=False)]


@pytest.mark.parametrize("block_size", [1, 16, 64])
def test_hf_parity_float32_on_gpu(model_dir, block_size):
    model, directory = model_dir
    prompts = random_prompts(model.config.vocab_size, seed=block_size)
    want = [hf_greedy(model, p, 12) for p in prompts]
    for backend, eager in [("torch", True), ("triton", True), ("triton", False)]:
        llm = LLM(
            directory,
            device="cuda",
            dtype="float32",
            block_size=block_size,
            attention_backend=backend,
            enforce_eager=eager,
            num_kv_blocks=4096 // block_size,
            max_num_seqs=16,
        )
        assert token_ids(llm, prompts) == want, f"{backend} eager={eager}"
        del llm
        free_gpu()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_triton_matches_torch_backend_half(model_dir, dtype):
    """In half precision the Triton path (graphs; in bf16 with folded norms) is as close to HF in float32
    as the torch path: the first 4 greedy tokens agree on at least as many prompts, give or take one.
    (Comparing the two half-precision paths with each other measures only where their roundings flip
    near-ties: once norms were folded, mistral's two bf16 paths fell below 3 in 4 prompts agreeing, while
    against float32 the torch path agreed on 12 of 18 prompts and the folded Triton path on 15.)"""
    model, directory = model_dir
    prompts = random_prompts(model.config.vocab_size, seed=11) + random_prompts(
        model.config.vocab_size, seed=12
    )
    exact = [hf_greedy(model, p, 4) for p in prompts]
    common = dict(device="cuda", dtype=dtype, block_size=16, num_kv_blocks=256, max_num_seqs=32)
    ref = LLM(directory, attention_backend="torch", enforce_eager=True, **common)
    by_torch = token_ids(ref, prompts)
    del ref
    free_gpu()
    fast = LLM(directory, attention_backend="triton", enforce_eager=False, **common)
    by_triton = token_ids(fast, prompts)
    torch_agree = sum(g[:4] == w for g, w in zip(by_torch, exact))
    triton_agree = sum(g[:4] == w for g, w in zip(by_triton, exact))
    assert torch_agree >= 0.5 * len(prompts), (by_torch, exact)  # the test has teeth: half is close to fp32
    assert triton_agree >= torch_agree - 1, (triton_agree, torch_agree)


def test_fp8_kv_cache_triton_equals_torch_in_float32(model_dir):
    """With the KV cache in fp8 and float32 compute, every path reads the same rounded K/V: the torch backend,
    the Triton backend eager and with graphs give the same greedy tokens; all blocks come back."""
    model, directory = model_dir
    prompts = random_prompts(model.config.vocab_size, seed=41)
    common = dict(device="cuda", dtype="float32", kv_cache_dtype="fp8", block_size=16, num_kv_blocks=256)
    outs = {}
    for backend, eager in [("torch", True), ("triton", True), ("triton", False)]:
        llm = LLM(directory, attention_backend=backend, enforce_eager=eager, max_num_seqs=16, **common)
        assert llm.engine.core.runner.kv_cache.dtype == torch.float8_e4m3fn
        outs[(backend, eager)] = token_ids(llm, prompts)
        kv = llm.engine.core.kv
        assert kv.num_free_blocks == kv.num_blocks
        del llm
        free_gpu()
    assert outs[("triton", True)] == outs[("torch", True)]
    assert outs[("triton", False)] == outs[("torch", True)]


def test_fp8_kv_cache_half_precision_paths_agree_with_hf(model_dir):
    """bf16 with an fp8 cache, the Triton path as it serves (graphs, the decode chain where the GPU has PDL,
    folded norms) against the torch path, both against HF in float32: the tokens the Triton path picks fall no
    further below HF's choices than the torch path's do (regret, `hf_regret`). Counting prompts whose tokens
    equal HF's swings too much for this: fp8 noise flips near-ties on half the prompts, and llama's two paths,
    equally right by regret (7.5 against 8.5 on 54 prompts, scripts/probe_fp8_agreement.py), once agreed on 4
    and 8 of 18."""
    model, directory = model_dir
    vocab = model.config.vocab_size
    prompts = [p for seed in range(11, 17) for p in random_prompts(vocab, seed=seed)]
    common = dict(device="cuda", dtype="bfloat16", kv_cache_dtype="fp8", block_size=16, num_kv_blocks=1024)
    regret = {}
    for backend, eager in [("torch", True), ("triton", False)]:
        llm = LLM(directory, attention_backend=backend, enforce_eager=eager, max_num_seqs=32, **common)
        outs = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy(4), use_tqdm=False)]
        regret[backend] = sum(hf_regret(model, p, o) for p, o in zip(prompts, outs))
        del llm
        free_gpu()
    rng = np.random.default_rng(0)
    blind = sum(hf_regret(model, p, rng.integers(3, vocab, 4).tolist()) for p in prompts)
    assert regret["triton"] < 0.2 * blind, (regret, blind)  # a path reading garbage K/V picks blindly
    assert regret["triton"] <= 1.25 * regret["torch"] + 0.5, regret


def test_prefix_cache_and_preemption_on_gpu(model_dir):
    model, directory = model_dir
    prompts = random_prompts(model.config.vocab_size, seed=5, lengths=[40, 41, 48, 9])
    prompts = prompts + [prompts[0], prompts[0][:33] + [5, 6]]
    common = dict(device="cuda", dtype="float32", block_size=16, attention_backend="triton", max_num_seqs=8)
    off = LLM(directory, enable_prefix_caching=False, num_kv_blocks=256, **common)
    want = token_ids(off, prompts)
    on = LLM(directory, num_kv_blocks=12, **common)
    assert token_ids(on, prompts) == want
    assert token_ids(on, prompts) == want  # second round: hits
    assert on.engine.core.kv.num_hit_tokens > 0
    assert on.engine.core.scheduler.num_preemptions > 0


@pytest.mark.alone  # sizes its engines by the GPU's free memory
def test_a_dropped_engine_leaves_the_next_one_the_whole_gpu(llama_dir):
    """A dropped engine caught in a reference cycle (its owner's here) lives until gc runs; the next engine
    collects it before measuring memory, and sizes its cache as the first did."""
    free_gpu()
    gc.disable()
    try:
        first = LLM(llama_dir, device="cuda", dtype="bfloat16", gpu_memory_utilization=0.5)
        assert first.generate([[1, 2, 3]], greedy(4), use_tqdm=False)[0].outputs[0].token_ids
        blocks = first.engine.core.num_blocks
        first.engine.core.runner.owner = first
        del first
        assert torch.cuda.memory_allocated() > 0.4 * torch.cuda.mem_get_info()[1]  # still held
        second = LLM(llama_dir, device="cuda", dtype="bfloat16", gpu_memory_utilization=0.5)
        assert abs(second.engine.core.num_blocks - blocks) <= 0.01 * blocks
    finally:
        gc.enable()


@pytest.mark.alone  # sizes its engines by the GPU's free memory
def test_a_dropped_engine_with_graphs_frees_the_gpu_at_once(llama_dir):
    """Nothing ties a graphed engine in a cycle: dropping it frees its cache without the cyclic collector."""
    kwargs = dict(device="cuda", dtype="bfloat16", gpu_memory_utilization=0.3)
    free_gpu()
    before = torch.cuda.memory_allocated()
    gc.disable()
    try:
        llm = LLM(llama_dir, **kwargs)
        assert llm.engine.core.runner.graphs is not None and llm.engine.core.runner.mixed_graphs is not None
        assert llm.generate([[1, 2, 3]], greedy(4), use_tqdm=False)[0].outputs[0].token_ids
        assert torch.cuda.memory_allocated() > before + 0.2 * torch.cuda.mem_get_info()[1]
        del llm
        assert torch.cuda.memory_allocated() < before + 2**30
    finally:
        gc.enable()


@pytest.mark.parametrize("budget", [7, 64])
def test_mixed_step_graphs_match_hf_on_gpu(model_dir, budget):
    """Chunked prefill beside decodes: every step with prefill work replays a mixed-step graph (padded
    tokens and sequences, decode rows, a prefill tile map), against HF in float32."""
    model, directory = model_dir
    prompts = random_prompts(model.config.vocab_size, seed=41, lengths=[1, 5, 17, 40, 100, 129])
    want = [hf_greedy(model, p, 12) for p in prompts]
    llm = fp32_triton_engine(
        directory, False, num_kv_blocks=256, max_num_seqs=8, max_num_batched_tokens=budget
    )
    assert token_ids(llm, prompts) == want
    paths = llm.engine.core.runner.step_paths
    assert paths["mixed_graph"] > 0 and paths["eager"] == 0, paths
    # A second round hits the prefix cache: chunks start after cached blocks.
    assert token_ids(llm, prompts) == want
    assert llm.engine.core.kv.num_hit_tokens > 0


@pytest.mark.parametrize("eager", [True, False], ids=["eager", "graphs"])
def test_prefill_key_splits_match_hf_on_gpu(model_dir, eager):
    """Short chunks over long prefixes (a small token budget, then prefix-cache hits): prefill attention
    cuts their keys across programs, in eager steps and in mixed-step graphs; against HF in float32, and
    against the same engine with the splits off."""
    model, directory = model_dir
    prompts = random_prompts(model.config.vocab_size, seed=43, lengths=[470, 300, 7, 385])
    want = [hf_greedy(model, p, 12) for p in prompts]
    common = dict(num_kv_blocks=256, max_num_seqs=8, max_num_batched_tokens=32)
    llm = fp32_triton_engine(directory, eager, **common)
    assert token_ids(llm, prompts) == want
    assert token_ids(llm, prompts) == want  # hits: one chunk after ~460 cached tokens
    paths = llm.engine.core.runner.step_paths
    assert paths["key_split"] > 0, paths
    assert paths["eager" if eager else "mixed_graph"] >= paths["key_split"], paths
    del llm
    free_gpu()
    off = fp32_triton_engine(directory, eager, prefill_key_splits=False, **common)
    assert token_ids(off, prompts) == want
    assert off.engine.core.runner.step_paths["key_split"] == 0


def test_long_prefill_steps_replay_graphs_by_default_on_gpu(model_dir):
    """Unset, the graphs' token cap comes from the model's size: the tiny models' small layers give the upper
    bound, so a first step of 1,199 prompt tokens (four prompts) and the later ones beside decodes replay
    graphs, against HF in float32."""
    model, directory = model_dir
    prompts = random_prompts(model.config.vocab_size, seed=43, lengths=[480, 333, 257, 129, 7, 1])
    want = [hf_greedy(model, p, 12) for p in prompts]
    llm = fp32_triton_engine(directory, False, num_kv_blocks=512, max_num_seqs=4)
    assert llm.engine.core.runner.mixed_graph_max_tokens == 4096
    assert token_ids(llm, prompts) == want
    paths = llm.engine.core.runner.step_paths
    assert paths["mixed_graph"] > 0 and paths["eager"] == 0, paths


def test_batch_of_one_matches_hf_on_gpu(model_dir):
    """One prompt at a time, so every decode step is a batch of one: the fused GEMV path on llama-family
    models, eager and as a CUDA graph."""
    model, directory = model_dir
    prompts = random_prompts(model.config.vocab_size, seed=31, lengths=[1, 17, 64])
    want = [hf_greedy(model, p, 12) for p in prompts]
    for eager in (True, False):
        llm = fp32_triton_engine(directory, eager, num_kv_blocks=256, max_num_seqs=4)
        assert [token_ids(llm, [p])[0] for p in prompts] == want, f"eager={eager}"
        del llm
        free_gpu()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_decode_without_norm_launches_matches_hf_on_gpu(arch, tmp_path, monkeypatch):
    """Batched decode-only steps skip the RMSNorm launches (norm weights folded, spread far from 1), eager
    and as CUDA graphs, against HF in float32: without the PDL chain, with the small models' chain, and with
    the wide models' (9 rows, 16 in a graph: attention outside PDL)."""
    model = hf_model_with_spread_norms(arch, tmp_path)
    prompts = random_prompts(model.config.vocab_size, seed=41)
    want = [hf_greedy(model, p, 12) for p in prompts]
    own_chain = llama.decode_chain
    wide = own_chain(4096)
    assert not wide.attention_joins(len(prompts)) and wide.max_rows >= 16
    for eager in (True, False):
        for pdl, chain in ((True, None), (True, wide), (False, None)):
            monkeypatch.setattr(
                llama, "decode_chain", (lambda hidden, chain=chain: chain) if chain else own_chain
            )
            llm = fp32_triton_engine(str(tmp_path), eager, num_kv_blocks=512, max_num_seqs=16, pdl_decode=pdl)
            runner_model = llm.engine.core.runner.model
            assert runner_model.norms_folded
            assert runner_model.pdl_decode == (pdl and pdl_supported(torch.device("cuda")))
            assert runner_model.decode_chain == (chain or own_chain(model.config.hidden_size))
            assert token_ids(llm, prompts) == want, f"eager={eager} pdl={pdl} chain={chain}"
            del llm, runner_model
            free_gpu()


def test_down_gemm_on_cublaslt_matches_hf_on_gpu(tmp_path, monkeypatch):
    """A llama MLP with a down GEMM long enough for cuBLASLt, decoding a batch inside LT_DOWN_ROWS, eager and
    as CUDA graphs, matches HF in float32; torch's BLAS preference is as it was after every step."""
    model = save_hf_model("llama", tmp_path, intermediate_size=LT_DOWN_MIN_K)
    batch = LT_DOWN_ROWS[0] + 8
    prompts = random_prompts(
        model.config.vocab_size, seed=43, lengths=[3 + (7 * i) % 41 for i in range(batch)]
    )
    want = [hf_greedy(model, p, 6) for p in prompts]
    asked: list[str | None] = []
    real = llama.preferred_blas

    def recording(library):
        asked.append(library)
        return real(library)

    monkeypatch.setattr(llama, "preferred_blas", recording)
    before = torch.backends.cuda.preferred_blas_library()
    for eager in (True, False):
        llm = fp32_triton_engine(str(tmp_path), eager, num_kv_blocks=512, max_num_seqs=64)
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy(6), use_tqdm=False)]
        assert got == want, f"eager={eager}"
        assert torch.backends.cuda.preferred_blas_library() == before
        del llm
        free_gpu()
    assert "cublaslt" in asked and None in asked  # decode batches on cuBLASLt, prefill on the default


def test_decode_graphs_sample_each_row_on_gpu(model_dir):
    """Greedy and temperature rows are sampled inside the decode graphs: greedy rows beside hot ones keep
    their greedy tokens, and the hot rows' draws after the first token (which prefill samples) are rarely
    the argmax after their own prefix. Seeded rows, sampled outside the graphs, repeat eager's draws."""
    model, directory = model_dir
    prompts = random_prompts(model.config.vocab_size, seed=41, lengths=[3, 17, 30, 64, 5, 9])
    llm = fp32_triton_engine(directory, False, num_kv_blocks=256, max_num_seqs=16)
    want = token_ids(llm, prompts)
    hot = SamplingParams(temperature=50.0, max_tokens=12, ignore_eos=True)
    mixed = [greedy() if i % 2 == 0 else hot for i in range(len(prompts))]
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, mixed, use_tqdm=False)]
    assert [got[i] for i in range(0, len(prompts), 2)] == [want[i] for i in range(0, len(prompts), 2)]
    odd = range(1, len(prompts), 2)
    prefixes = [prompts[i] + got[i][:k] for i in odd for k in range(1, 12)]
    drawn = [got[i][k] for i in odd for k in range(1, 12)]
    argmax = [o.outputs[0].token_ids[0] for o in llm.generate(prefixes, greedy(1), use_tqdm=False)]
    assert sum(a == d for a, d in zip(argmax, drawn)) <= len(drawn) // 4
    seeded = [SamplingParams(temperature=0.8, max_tokens=12, ignore_eos=True, seed=i) for i in range(6)]
    graphed = [o.outputs[0].token_ids for o in llm.generate(prompts, seeded, use_tqdm=False)]
    del llm
    free_gpu()
    eager = fp32_triton_engine(directory, True, num_kv_blocks=256, max_num_seqs=16)
    assert [o.outputs[0].token_ids for o in eager.generate(prompts, seeded, use_tqdm=False)] == graphed


def test_decode_steps_repeat_bit_for_bit_on_gpu():
    """One decode step, replayed again and again, gives the same logits bit for bit: nothing on the decode
    path (the PDL chain's split-K GEMMs and their reduces, decode attention's split merge) adds in an order
    that changes from run to run. qwen2.5-0.5b's shape in bf16, so that the chain's down GEMM splits K and
    attention splits its keys; a random cache, so that every split has something to add."""
    context = 1024
    llm = LLM(
        "qwen2.5-0.5b",
        load_format="dummy",
        dtype="bfloat16",
        block_size=16,
        num_kv_blocks=64 * (context // 16 + 1) + 16,
        max_num_seqs=64,
        max_model_len=context + 16,
        mixed_graph_max_tokens=0,
        enable_prefix_caching=False,
    )
    runner = llm.engine.core.runner
    assert runner.model.pdl_decode == pdl_supported(torch.device("cuda"))
    torch.manual_seed(0)
    runner.kv_cache.normal_()
    for batch in (16, 64):
        step = decode_step(batch, context, 16, runner.cfg.vocab_size, np.random.default_rng(batch))
        assert runner.graphs.can_run(step)
        runner.graphs.run(step, None)  # the first run stores the step's own K/V in its slots
        first = runner.graphs.run(step, None)[0].clone()
        assert torch.isfinite(first).all()
        for _ in range(4):
            assert torch.equal(runner.graphs.run(step, None)[0], first), f"batch {batch}"
    del llm, runner


@pytest.mark.parametrize("params", ["temperature", "top_p"])
def test_the_engine_seed_fixes_unseeded_sampling_on_gpu(model_dir, params):
    """Unseeded rows draw from the runner's generator, seeded from `LLM(seed=...)`: in the graphs
    (temperature alone) and eagerly (top-p, and every first token), whatever torch's global generator holds."""
    model, directory = model_dir
    prompts = random_prompts(model.config.vocab_size, seed=43, lengths=[3, 17, 30, 5])
    top_p = 0.9 if params == "top_p" else 1.0
    sampling = SamplingParams(temperature=1.0, top_p=top_p, max_tokens=10, ignore_eos=True)

    def run(seed: int, global_seed: int) -> list[list[int]]:
        torch.manual_seed(global_seed)
        llm = LLM(directory, device="cuda", dtype="float32", num_kv_blocks=256, seed=seed)
        out = [o.outputs[0].token_ids for o in llm.generate(prompts, sampling, use_tqdm=False)]
        del llm
        free_gpu()
        return out

    first = run(0, 1)
    assert run(0, 2) == first
    assert run(1, 1) != first


def test_min_tokens_masks_stop_ids_in_graph_steps_on_gpu(model_dir):
    """min_tokens on the decode graphs: a step with a row under min_tokens samples outside the graph, from
    the logits the graph (the fused lm_head + sampler where the model has one) returns, with the row's stop
    ids at -inf; later steps sample in the graph again. Half the vocabulary stops a request: without
    min_tokens each stops within a few tokens, with min_tokens=6 its first 6 tokens are never stop ids. In
    float32, graphs give eager's tokens (greedy and seeded); bf16 keeps the property."""
    model, directory = model_dir
    vocab, k = model.config.vocab_size, 6
    prompts = random_prompts(vocab, seed=47, lengths=[3, 17, 30, 5, 9, 64])
    stops = list(range(0, vocab, 2))
    kinds = [
        dict(temperature=0.0),
        dict(temperature=1.0),
        dict(temperature=0.8, seed=5),
        dict(temperature=1.0, top_k=50),
        dict(temperature=1.0, n=2),
    ]

    def check(llm: LLM, min_tokens: int) -> list[list[list[int]]]:
        got = []
        for kind in kinds:
            p = SamplingParams(max_tokens=12, min_tokens=min_tokens, stop_token_ids=stops, **kind)
            for out in llm.generate(prompts, p, use_tqdm=False):
                for c in out.outputs:
                    ids = c.token_ids
                    assert all(t % 2 for t in ids[:-1]) and len(ids) > min_tokens, (kind, ids)
                    assert (c.finish_reason == "stop") == (ids[-1] % 2 == 0), (kind, ids)
                got.append([c.token_ids for c in out.outputs])
        return got

    runs = {}
    for eager in (True, False):
        llm = fp32_triton_engine(directory, eager, num_kv_blocks=256, max_num_seqs=16)
        plain = check(llm, 0)
        seqs = [ids for s in plain for ids in s]
        assert sum(map(len, seqs)) < 4 * len(seqs)  # most stop within a few tokens
        runs[eager] = check(llm, k)
        if not eager:
            assert llm.engine.core.runner.step_paths["decode_graph"] > 0
        del llm
        free_gpu()
    per_kind = len(prompts)
    for i, kind in enumerate(kinds):
        if kind["temperature"] == 0.0 or "seed" in kind:
            s = slice(i * per_kind, (i + 1) * per_kind)
            assert runs[False][s] == runs[True][s], kind
    llm = LLM(directory, device="cuda", dtype="bfloat16", num_kv_blocks=256, max_num_seqs=16)
    check(llm, k)


def test_logprobs_agree_between_graphs_and_eager_on_gpu(model_dir):
    """logprobs=5 on the decode graphs (taken from the logits the graph returns: the fused lm_head + sampler's
    where the model's decode chain has one) and eagerly. In float32 each path matches a whole-sequence forward
    within 1e-4 (values, top-5 sets, ranks, cumulative sums), draws the tokens a fresh engine draws without
    logprobs (unseeded ones too: the engine seed fixes them), and the two paths draw the same greedy and seeded
    tokens with the same sampled logprobs. In bf16 each path matches the float32 forward along its own tokens
    within 0.5 each and 0.06 on average, and the paths' sampled logprobs agree within 0.5 where their tokens
    do."""
    model, directory = model_dir
    prompts = random_prompts(model.config.vocab_size, seed=53, lengths=[3, 17, 30, 5, 9, 64])
    kinds = [
        dict(temperature=0.0),
        dict(temperature=1.0),
        dict(temperature=0.8, seed=5),
        dict(temperature=1.0, top_p=0.9, seed=2),
        dict(temperature=1.0, n=2),
    ]
    common = dict(num_kv_blocks=256, max_num_seqs=16)

    def run(llm: LLM, logprobs: int | None) -> list:
        return [
            out
            for kind in kinds
            for out in llm.generate(
                prompts,
                SamplingParams(max_tokens=12, ignore_eos=True, logprobs=logprobs, **kind),
                use_tqdm=False,
            )
        ]

    def samples(outs: list) -> list:
        return [c for o in outs for c in o.outputs]

    runs = {}
    for eager in (True, False):
        plain = samples(run(fp32_triton_engine(directory, eager, **common), None))
        free_gpu()
        llm = fp32_triton_engine(directory, eager, **common)
        outs = run(llm, 5)
        assert [c.token_ids for c in samples(outs)] == [c.token_ids for c in plain]
        check_outputs(llm, prompts * len(kinds), outs, 5)
        if not eager:
            assert llm.engine.core.runner.step_paths["decode_graph"] > 0
        runs[eager] = samples(outs)
        reference = llm  # the float32 forward the bf16 runs are checked against
    # Greedy and seeded plain temperature: the same draws on both paths (a top-p cut could flip on a rounding).
    fixed = [
        kind["temperature"] == 0.0 or set(kind) == {"temperature", "seed"} for kind in kinds for _ in prompts
    ]
    for same, g, e in zip(fixed, runs[False], runs[True]):  # n=2 (last, unseeded) is never compared
        if same:
            assert g.token_ids == e.token_ids
            for a, b, t in zip(g.logprobs, e.logprobs, g.token_ids):
                assert abs(a[t].logprob - b[t].logprob) < 2e-4
    # bf16 against the float32 forward along its own tokens: on the CPU the tiny models' bf16 logprobs stray from
    # float32's by 0.02 at the median, 0.11 at the 99th percentile and 0.3 at worst (of a spread of ~9.5).
    bf16, errors = {}, []
    for eager in (True, False):
        llm = LLM(directory, device="cuda", dtype="bfloat16", enforce_eager=eager, **common)
        outs = run(llm, 5)
        for prompt, out in zip(prompts * len(kinds), outs):
            for c in out.outputs:
                check_sample(reference, prompt, c, 5, tol=0.5)
                ref = reference_logprobs(reference, prompt, c.token_ids)
                errors += [
                    abs(lp.logprob - float(ref[i, t]))
                    for i, e in enumerate(c.logprobs)
                    for t, lp in e.items()
                ]
        bf16[eager] = samples(outs)
        del llm
        free_gpu()
    assert sum(errors) / len(errors) < 0.06, sum(errors) / len(errors)
    for same, g, e in zip(fixed, bf16[False], bf16[True]):
        if same:
            for a, b, t, u in zip(g.logprobs, e.logprobs, g.token_ids, e.token_ids):
                if t != u:
                    break
                assert abs(a[t].logprob - b[t].logprob) < 0.5

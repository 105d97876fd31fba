"""Decode steps without RMSNorm launches (norm weights folded into the linears), end to end against HF.

On a GPU, decode-only steps take this path by themselves. Here, on the CPU, the test makes the model use
its Triton kernels (run by Triton's interpreter) and the Triton attention backend, then checks greedy output
token for token against HF transformers on the same random weights. The layer norms' weights are spread
far from 1 so that a weight left unfolded, or a 1 / rms left out, changes the tokens.
"""

from __future__ import annotations

import pytest
import torch

import roseinfer.models.layers as layers
import roseinfer.models.llama as llama
import roseinfer.runner.model_runner as model_runner
from roseinfer import LLM, SamplingParams
from tests.models.test_hf_parity import hf_greedy, random_prompts
from tests.models.tiny_models import make_hf_model

MAX_TOKENS = 4
# Engines on the CPU with Triton kernels: where CUDA is, the interpreter is off and these paths are the GPU
# tests' (tests/gpu/test_gpu_e2e.py), compiled.
pytestmark = pytest.mark.interpreter


@pytest.fixture
def triton_kernels_on_cpu(monkeypatch):
    """Counts the layers that ran without norm launches, and every RMSNorm launch."""
    calls = {"deferred_layers": 0, "rmsnorm": 0}
    real_layer, real_rms = llama.LlamaDecoderLayer.forward_deferred_norm, layers._rms.rmsnorm

    def counting_layer(*args, **kwargs):
        calls["deferred_layers"] += 1
        return real_layer(*args, **kwargs)

    def counting_rms(*args, **kwargs):
        calls["rmsnorm"] += 1
        return real_rms(*args, **kwargs)

    monkeypatch.setattr(llama, "fused_kernels_for", lambda x: True)
    monkeypatch.setattr(layers, "fused_kernels_for", lambda x: True)
    monkeypatch.setattr(llama.LlamaDecoderLayer, "forward_deferred_norm", counting_layer)
    monkeypatch.setattr(layers._rms, "rmsnorm", counting_rms)
    return calls


def hf_model_with_spread_norms(arch: str, directory):
    model = make_hf_model(arch)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layernorm" in name:
                p.copy_(0.2 + 1.8 * torch.rand(p.shape, generator=g))
    model.save_pretrained(directory, safe_serialization=True)
    return model


def _engine(directory, **kwargs) -> LLM:
    return LLM(
        str(directory),
        device="cpu",
        dtype="float32",
        block_size=16,
        cpu_kv_tokens=1024,
        attention_backend="triton",
        one_token_gemv=False,
        **kwargs,
    )


@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # llama3 rope; qkv bias + tied lm_head
def test_decode_without_norm_launches_matches_hf(arch, tmp_path, triton_kernels_on_cpu):
    model = hf_model_with_spread_norms(arch, tmp_path)
    prompts = random_prompts(model.config.vocab_size, seed=23, lengths=[1, 17, 30])
    want = [hf_greedy(model, p, MAX_TOKENS) for p in prompts]
    llm = _engine(tmp_path)
    assert llm.engine.core.runner.model.norms_folded
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == want
    layers_n = model.config.num_hidden_layers
    # One prefill step for all three prompts, then MAX_TOKENS - 1 decode-only steps of three rows: those
    # run every layer without a norm launch, and launch only the final norm.
    decode_steps = MAX_TOKENS - 1
    assert triton_kernels_on_cpu["deferred_layers"] == decode_steps * layers_n
    assert triton_kernels_on_cpu["rmsnorm"] == (2 * layers_n + 1) + decode_steps
    assert llm.engine.core.kv.num_free_blocks == llm.engine.core.kv.num_blocks


def test_deferred_norm_only_where_the_backend_says_it_pays(tmp_path, triton_kernels_on_cpu, monkeypatch):
    from roseinfer.attention.triton_backend import TritonAttentionBackend

    backend = TritonAttentionBackend()
    assert backend.deferred_norm_pays(128, 128) and backend.deferred_norm_pays(256, 64)
    assert not backend.deferred_norm_pays(256, 128)
    asked = []

    def pays(self, batch, head_dim):
        asked.append(batch)
        return batch <= 2

    monkeypatch.setattr(TritonAttentionBackend, "deferred_norm_pays", pays)
    model = hf_model_with_spread_norms("llama", tmp_path)
    prompts = random_prompts(model.config.vocab_size, seed=25, lengths=[4, 9, 12])
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (2, 4, 4)]
    outs = _engine(tmp_path).generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [
        hf_greedy(model, p, n) for p, n in zip(prompts, (2, 4, 4))
    ]
    # Decode steps of 3, 2 and 2 rows: only the two-row steps skip the norms.
    assert asked == [3, 2, 2]
    assert triton_kernels_on_cpu["deferred_layers"] == 2 * model.config.num_hidden_layers


def test_fold_norms_switched_off_and_qk_norm_models_unfolded(tmp_path, triton_kernels_on_cpu):
    hf_model_with_spread_norms("llama", tmp_path / "llama")
    llm = _engine(tmp_path / "llama", fold_norms=False)
    assert not llm.engine.core.runner.model.norms_folded
    llm.generate(
        [[5, 6, 7], [8, 9]], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True), use_tqdm=False
    )
    assert triton_kernels_on_cpu["deferred_layers"] == 0

    model = hf_model_with_spread_norms("qwen3", tmp_path / "qwen3")  # q/k norms: nothing to fold into
    llm = _engine(tmp_path / "qwen3")
    assert not llm.engine.core.runner.model.norms_folded
    prompts = random_prompts(model.config.vocab_size, seed=24, lengths=[3, 9])
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [hf_greedy(model, p, 3) for p in prompts]
    assert triton_kernels_on_cpu["deferred_layers"] == 0
    with pytest.raises(ValueError, match="q/k norms"):
        llm.engine.core.runner.model.fold_norm_weights()


def test_decode_chain_by_model_width():
    """Small models chain every decode step the skinny GEMM takes, attention included; wide ones (llama-3.1-8b)
    chain up to 24 rows, attention up to 8 (the H100 A/B in `decode_chain`'s docstring)."""
    from roseinfer.kernels.skinny_gemm import MAX_ROWS

    small = llama.DecodeChain(MAX_ROWS, attention_max_rows=MAX_ROWS)
    assert llama.decode_chain(896) == small
    assert llama.decode_chain(llama.PDL_DECODE_MAX_HIDDEN) == small
    wide = llama.decode_chain(4096)
    assert wide == llama.DecodeChain(24, attention_max_rows=8)
    assert [wide.attention_joins(rows) for rows in (1, 8, 9, 24)] == [True, True, False, False]


@pytest.mark.parametrize(
    "chain",
    [None, llama.DecodeChain(3, attention_max_rows=2), llama.DecodeChain(2, attention_max_rows=2)],
    ids=["own", "attention-outside", "steps-too-wide"],
)
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_pdl_decode_chain_matches_hf(arch, chain, tmp_path, triton_kernels_on_cpu, monkeypatch):
    """Decode steps as the PDL chain (`pdl_decode`): the skinny Triton GEMMs into the same buffers, SiLU and
    attention launched as its members (or attention outside it, as wide models run it; or no chain for steps
    wider than it takes). The interpreter runs the launches in order (no PDL there), so this checks the
    chain's arithmetic and wiring; the GPU tests check its ordering."""
    import roseinfer.kernels.skinny_gemm as skinny

    shapes = []
    attention_pdl = []
    real, real_norm = skinny.skinny_gemm, llama.DeferredNorm

    def counting(x, w, *args, **kwargs):
        assert kwargs.get("pdl") is True
        shapes.append(tuple(w.shape))
        return real(x, w, *args, **kwargs)

    def recording_norm(*args):
        attention_pdl.append(args[3])
        return real_norm(*args)

    monkeypatch.setattr(layers, "skinny_gemm", counting)
    monkeypatch.setattr(llama, "DeferredNorm", recording_norm)
    model = hf_model_with_spread_norms(arch, tmp_path)
    prompts = random_prompts(model.config.vocab_size, seed=26, lengths=[2, 15, 33])
    want = [hf_greedy(model, p, MAX_TOKENS) for p in prompts]
    llm = _engine(tmp_path)
    runner_model = llm.engine.core.runner.model
    assert not runner_model.pdl_decode  # no sm_90 GPU here
    assert runner_model.pdl_decode_pays  # a folded model
    assert runner_model.decode_chain == llama.decode_chain(model.config.hidden_size)
    runner_model.pdl_decode = True
    runner_model.decode_chain = chain or runner_model.decode_chain
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == want
    cfg = model.config
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    per_layer = [
        ((cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * head_dim, cfg.hidden_size),
        (cfg.hidden_size, cfg.num_attention_heads * head_dim),
        (2 * cfg.intermediate_size, cfg.hidden_size),
        (cfg.hidden_size, cfg.intermediate_size),
    ]
    decode_layers = (MAX_TOKENS - 1) * cfg.num_hidden_layers  # decode-only steps of three rows
    chained = chain is None or chain.max_rows >= 3
    assert shapes == (per_layer * decode_layers if chained else [])
    assert attention_pdl == [chained and (chain is None or chain.attention_joins(3))] * decode_layers
    assert triton_kernels_on_cpu["deferred_layers"] == decode_layers


def test_decode_graphs_chain_the_lm_head_and_sampler(tmp_path, triton_kernels_on_cpu, monkeypatch):
    """A decode graph samples in the lm_head's epilogue (`kernels/logits_sample.py`), greedy tokens still
    HF's: on the chain the final norm and the fused lm_head join it (PDL), off the chain the fused lm_head runs
    without PDL, and past `MAX_FUSED_ROWS` rows the graph runs the lm_head, then the sampler. The graphs' body
    runs on the CPU (stand-in replays, the interpreter: no PDL there)."""
    from tests.engine.cpu_graph_replay import cpu_decode_graphs

    fused_pdl, norm_pdl, sampler_rows = [], [], []
    real_fused, real_rms = llama.logits_and_sample, layers._rms.rmsnorm
    real_sample_rows = model_runner.sample_rows

    def counting_fused(h, *args, pdl=False, **kwargs):
        assert h.shape[0] == 4  # three rows padded to four
        fused_pdl.append(pdl)
        return real_fused(h, *args, pdl=pdl, **kwargs)

    def recording_rms(*args, pdl=False, **kwargs):
        norm_pdl.append(pdl)
        return real_rms(*args, pdl=pdl, **kwargs)

    def counting_sample_rows(logits, *args):
        sampler_rows.append(logits.shape[0])
        return real_sample_rows(logits, *args)

    monkeypatch.setattr(llama, "logits_and_sample", counting_fused)
    monkeypatch.setattr(layers._rms, "rmsnorm", recording_rms)
    monkeypatch.setattr(model_runner, "sample_rows", counting_sample_rows)
    model = hf_model_with_spread_norms("qwen2", tmp_path)
    prompts = random_prompts(model.config.vocab_size, seed=27, lengths=[2, 15, 33])
    want = [hf_greedy(model, p, MAX_TOKENS) for p in prompts]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    for chained, fused in ((True, True), (False, True), (False, False)):
        monkeypatch.setattr(llama, "MAX_FUSED_ROWS", 4 if fused else 3)
        llm = _engine(tmp_path)
        runner = llm.engine.core.runner
        runner.model.pdl_decode = chained
        runner.graphs, replays = cpu_decode_graphs(runner, 4)
        for calls in (fused_pdl, norm_pdl, sampler_rows):
            calls.clear()
        outs = llm.generate(prompts, params, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == want, f"chained={chained} fused={fused}"
        graphed = sum(r.replays for r in replays.values())
        assert graphed == MAX_TOKENS - 1  # the decode-only steps
        assert fused_pdl == ([chained] * graphed if fused else [])
        assert sampler_rows == ([] if fused else [4] * graphed)
        assert norm_pdl.count(True) == (graphed if chained else 0)

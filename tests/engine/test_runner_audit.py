"""Mutation audit (runner/model_runner.py): the KV pool a CPU engine sizes, the decode graphs' reach to
max_model_len, prompt logprobs in steps a decode graph could hold, and start-up sizing's step within
max_model_len; outputs compared with an engine without graphs (the eager torch path)."""

from __future__ import annotations

from roseinfer import LLM, SamplingParams
from tests.engine.cpu_graph_replay import cpu_decode_graphs, cpu_mixed_graphs


def make(llama_dir: str, graphs: bool = False, async_scheduling: bool = False, **kw) -> LLM:
    kw.setdefault("cpu_kv_tokens", 2048)
    llm = LLM(llama_dir, device="cpu", dtype="float32", block_size=4, async_scheduling=async_scheduling, **kw)
    if graphs:
        runner = llm.engine.core.runner
        runner.graphs, _ = cpu_decode_graphs(runner, 8)
        runner.mixed_graphs, _ = cpu_mixed_graphs(runner, 16)
    return llm


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


def token_ids(outs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


def test_the_cpu_pool_holds_whole_blocks_within_cpu_kv_tokens(llama_dir):
    assert make(llama_dir, cpu_kv_tokens=30).engine.core.kv.num_blocks == 7  # 30 tokens: 7 blocks of 4
    assert make(llama_dir, cpu_kv_tokens=3).engine.core.kv.num_blocks == 1  # never none


def test_decode_graphs_reach_max_model_len(llama_dir):
    """max_model_len 30 is 7.5 blocks of 4: a sequence decoding its last tokens holds 8 blocks, which the decode
    graphs' block tables must hold too."""
    prompt = [[11 + i for i in range(26)]]
    want = token_ids(make(llama_dir, max_model_len=30).generate(prompt, greedy(4), use_tqdm=False))
    llm = make(llama_dir, graphs=True, max_model_len=30)
    assert token_ids(llm.generate(prompt, greedy(4), use_tqdm=False)) == want
    paths = llm.engine.core.runner.step_paths
    assert paths["decode_graph"] == 3  # every step after the prompt's


def prompt_logprobs(outs) -> list:
    return [
        [None if e is None else {t: round(lp.logprob, 4) for t, lp in e.items()} for e in o.prompt_logprobs]
        for o in outs
    ]


def test_one_token_prompt_chunks_with_prompt_logprobs_run_eager(llama_dir):
    """A budget of one token a step feeds a prompt in one-token chunks: steps a decode graph could hold, but
    the prompt logprobs need their hidden states, which only the eager forward keeps."""
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, prompt_logprobs=2)
    prompt = [[20 + i for i in range(6)]]
    want = make(llama_dir, max_num_batched_tokens=1).generate(prompt, params, use_tqdm=False)
    llm = make(llama_dir, graphs=True, max_num_batched_tokens=1)
    got = llm.generate(prompt, params, use_tqdm=False)
    assert prompt_logprobs(got) == prompt_logprobs(want) and len(got[0].prompt_logprobs) == 6
    assert token_ids(got) == token_ids(want)
    assert llm.engine.core.runner.step_paths["decode_graph"] > 0  # the decodes after it still replay


def test_the_worst_case_step_stays_within_max_model_len(llama_dir):
    """Start-up sizing's prefill is the token budget, but never longer than a sequence may be."""
    llm = make(llama_dir, max_model_len=16, max_num_batched_tokens=64, max_num_seqs=4)
    tokens = llm.engine.core.runner.run_worst_case_step()
    assert tokens.shape == (4,)

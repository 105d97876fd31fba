"""Mutation audit (entrypoints/cli.py, arg_types.py, logprob_text.py): every engine flag of `roseinfer
generate` reaches the engine it builds, every sampling flag the tokens (against the offline API with that
field), and the argument types' edges."""

from __future__ import annotations

import argparse
import re

import pytest
import torch

from roseinfer import LLM, SamplingParams
from roseinfer.entrypoints import arg_types
from roseinfer.entrypoints.cli import main
from roseinfer.models.loader import DEFAULT_MODEL

PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]  # generate's default without a tokenizer


def built_engine_config(monkeypatch, capsys, *flags: str):
    """The config of the engine `roseinfer generate *flags` builds (a spy on `LLM.__init__`)."""
    import roseinfer.entrypoints.llm as llm_module

    made: list[LLM] = []
    real = llm_module.LLM.__init__

    def spy(self, *args, **kwargs):
        real(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(llm_module.LLM, "__init__", spy)
    assert main(["generate", "--max-tokens", "2", *flags]) == 0
    capsys.readouterr()
    assert len(made) == 1
    return made[0].engine.config


@pytest.mark.parametrize(
    "flags, field, want",
    [
        (
            [],
            lambda c: (c.dtype, c.cache.block_size, c.cache.enable_prefix_caching),
            (torch.float32, 16, True),
        ),
        (["--dtype", "bfloat16"], lambda c: c.dtype, torch.bfloat16),
        (["--block-size", "8"], lambda c: c.cache.block_size, 8),
        (["--kv-cache-dtype", "fp8"], lambda c: c.cache.kv_cache_dtype, "fp8"),
        (["--no-prefix-caching"], lambda c: c.cache.enable_prefix_caching, False),
        (["--admission-policy", "lof"], lambda c: c.scheduler.policy, "lof"),
        (["--max-model-len", "64"], lambda c: c.max_model_len, 64),
        (["--num-kv-blocks", "8"], lambda c: c.cache.num_blocks, 8),
        ([], lambda c: (c.cache.num_blocks, c.cache.gpu_memory_utilization), (None, 0.9)),
        (["--gpu-memory-utilization", "0.5"], lambda c: c.cache.gpu_memory_utilization, 0.5),
        ([], lambda c: (c.load_format, c.model), ("dummy", DEFAULT_MODEL)),
    ],
)
def test_engine_flags_reach_the_engine(monkeypatch, capsys, flags, field, want):
    assert field(built_engine_config(monkeypatch, capsys, *flags)) == want


def ids_of(capsys, *flags: str) -> list[int]:
    assert main(["generate", "--max-tokens", "6", *flags]) == 0
    return [int(t) for t in capsys.readouterr().out.strip().split(",")]


def test_sampling_flags_reach_the_tokens(capsys):
    """--seed, --top-k, --top-p and --min-p draw what the offline API draws with those fields."""
    llm = LLM(DEFAULT_MODEL, load_format="dummy")

    def api(**kw) -> list[int]:
        sp = SamplingParams(max_tokens=6, **kw)
        return llm.generate([PROMPT], sp, use_tqdm=False)[0].outputs[0].token_ids

    greedy = api(temperature=0.0)
    assert ids_of(capsys, "--seed", "3") == api(seed=3) != api(seed=4)
    assert ids_of(capsys, "--top-k", "1", "--seed", "5") == greedy != api(seed=5)
    assert ids_of(capsys, "--top-p", "1e-9", "--seed", "5") == greedy
    assert ids_of(capsys, "--min-p", "1", "--seed", "5") == greedy


def test_presence_and_frequency_flags_reach_their_own_fields(capsys):
    """Token 7 biased to be the favourite: a presence penalty of 2 with a frequency penalty of -2 lowers it by
    2 - 2 x its count, never more than 0 (it stays the favourite); the two swapped lower it by 2 x its count
    - 2, more each time it repeats."""
    llm = LLM(DEFAULT_MODEL, load_format="dummy")
    flags = ["--temperature", "0", "--ignore-eos", "--logit-bias", "7=5"]
    got = ids_of(capsys, *flags, "--presence-penalty", "2", "--frequency-penalty", "-2")
    kw = dict(temperature=0.0, max_tokens=6, ignore_eos=True, logit_bias={7: 5.0})
    want = llm.generate(
        [PROMPT], SamplingParams(presence_penalty=2.0, frequency_penalty=-2.0, **kw), use_tqdm=False
    )
    swapped = llm.generate(
        [PROMPT], SamplingParams(presence_penalty=-2.0, frequency_penalty=2.0, **kw), use_tqdm=False
    )
    assert got == want[0].outputs[0].token_ids == [7] * 6 != swapped[0].outputs[0].token_ids


def test_ignore_eos_and_min_tokens_reach_the_request(capsys):
    """A bias that makes eos the favourite ends the output at once, unless --ignore-eos; --min-tokens holds
    it back for that many tokens."""
    eos = LLM(DEFAULT_MODEL, load_format="dummy").engine.eos_token_ids[0]
    favour = ["--temperature", "0", "--logit-bias", f"{eos}=100"]
    assert ids_of(capsys, *favour) == [eos]
    assert ids_of(capsys, *favour, "--ignore-eos") == [eos] * 6
    got = ids_of(capsys, *favour, "--min-tokens", "3")
    assert len(got) == 4 and got[3] == eos and eos not in got[:3]


def test_max_model_len_flag_refuses_a_longer_prompt(capsys):
    assert main(["generate", "--max-model-len", "8", "--max-tokens", "2"]) == 2
    assert "max_model_len" in capsys.readouterr().err


@pytest.mark.parametrize(
    "parse, text, want",
    [
        (arg_types.positive_int, "1", 1),
        (arg_types.non_negative_int, "0", 0),
        (arg_types.logprob_count, "-1", -1),
        (arg_types.truncate_count, "-1", -1),
        (arg_types.truncate_count, "1", 1),
        (arg_types.additive_penalty, "-2", -2.0),
        (arg_types.additive_penalty, "2", 2.0),
        (arg_types.positive_float, "1e-9", 1e-9),
        (arg_types.token_ids, "0, 5 7,,9,", [0, 5, 7, 9]),
        (arg_types.logit_bias_map, "0=-1.5, 7=2", {0: -1.5, 7: 2.0}),
        (arg_types.memory_fraction, "1", 1.0),
        (arg_types.memory_fraction, "1e-9", 1e-9),
        (arg_types.power_of_two, "1", 1),
        (arg_types.power_of_two, "2", 2),
        (arg_types.torch_device, "cpu", "cpu"),
    ],
)
def test_argument_types_take_their_edges(parse, text, want):
    assert parse(text) == want


@pytest.mark.parametrize(
    "parse, text, message",
    [
        (arg_types.positive_int, "0", "must be >= 1"),
        (arg_types.non_negative_int, "-1", "must be >= 0"),
        (arg_types.logprob_count, "-2", "must be >= -1"),
        (arg_types.truncate_count, "-2", "must be >= -1"),
        (arg_types.truncate_count, "0", "must be >= 1 or -1"),
        (arg_types.additive_penalty, "-2.001", r"must be in \[-2, 2\]"),
        (arg_types.positive_float, "0", "must be > 0"),
        (arg_types.positive_float, "nan", "finite"),
        (arg_types.token_ids, "3,-1", "token ids must be >= 0"),
        (arg_types.logit_bias_map, "", "expected ID=BIAS pairs"),
        (arg_types.logit_bias_map, ",", "expected ID=BIAS pairs"),
        (arg_types.logit_bias_map, "5=1,7", "expected ID=BIAS pairs, got '7'"),
        (arg_types.logit_bias_map, "-1=1", "must be >= 0"),
        (arg_types.logit_bias_map, "5=-inf", "finite"),
        (arg_types.memory_fraction, "0", r"must be in \(0, 1\]"),
        (arg_types.memory_fraction, "1.001", r"must be in \(0, 1\]"),
        (arg_types.memory_fraction, "nan", "finite"),
        (arg_types.power_of_two, "6", "power of two"),
        (arg_types.torch_device, "gpu0", "not a torch device"),
    ],
)
def test_argument_types_refuse_past_their_edges(parse, text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        parse(text)


def test_logprob_lines_spell_each_position():
    """The documented format: `index token logprob (rank r)`, then ` | ` and the others most likely first
    only where there are others; a token with text shows its text quoted (repr), else its id; a position
    with no entry (the prompt's first token) shows `index id -`."""
    from roseinfer.entrypoints.logprob_text import logprob_lines
    from roseinfer.logprobs import Logprob

    entries = [
        None,
        {9: Logprob(-0.25, 1, " the")},
        {4: Logprob(-3.0, 3, None), 8: Logprob(-0.5, 1, None), 2: Logprob(-1.0, 2, "\n")},
    ]
    assert logprob_lines("prompt_logprobs", [5, 9, 4], entries) == [
        "prompt_logprobs:",
        "  0 5 -",
        "  1 ' the' -0.2500 (rank 1)",
        "  2 4 -3.0000 (rank 3) | 8 -0.5000, '\\n' -1.0000",
    ]


def test_a_text_prompt_without_a_tokenizer_says_how_to_give_one(capsys, monkeypatch):
    """A refused prompt, as the README says of every refused input: one line on stderr, exit status 2."""
    monkeypatch.delenv("ROSEINFER_TRACEBACK", raising=False)
    assert main(["generate", "--prompt", "Hello"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("roseinfer generate: error: ") and len(err.strip().splitlines()) == 1
    assert "has no tokenizer; give --prompt-ids or --tokenizer" in err


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--gpu-memory-utilization", "1.5", r"must be in \(0, 1\]"),
        ("--gpu-memory-utilization", "0", r"must be in \(0, 1\]"),
        ("--num-kv-blocks", "0", "must be >= 1"),
    ],
)
def test_memory_flags_refuse_past_their_edges_before_anything_runs(capsys, flag, value, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "--max-tokens", "2", flag, value])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}:" in err and re.search(message, err)

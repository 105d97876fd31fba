"""`roseinfer generate` with the prefix-cache options."""

from __future__ import annotations

import json

import pytest

from roseinfer.entrypoints.cli import main


def test_generate_with_pinned_prefix_file(tmp_path, capsys):
    pins = tmp_path / "pins.json"
    prefix = list(range(100, 140))
    pins.write_text(json.dumps([prefix]))
    ids = ",".join(str(t) for t in prefix + [7, 8])
    assert (
        main(
            [
                "generate",
                "--pin-prefix-file",
                str(pins),
                "--prompt-ids",
                ids,
                "--temperature",
                "0",
                "--max-tokens",
                "4",
            ]
        )
        == 0
    )
    pinned_run = capsys.readouterr().out.strip()
    assert (
        main(
            [
                "generate",
                "--no-prefix-caching",
                "--prompt-ids",
                ids,
                "--temperature",
                "0",
                "--max-tokens",
                "4",
            ]
        )
        == 0
    )
    assert capsys.readouterr().out.strip() == pinned_run  # same greedy output, cache or not
    assert len(pinned_run.split(",")) == 4


def test_generate_with_pin_prefix_flag_and_lpm(capsys):
    # A text prefix needs a tokenizer; the built-in dummy model has none: a clear error, before serving.
    assert main(["generate", "--pin-prefix", "You are a helpful assistant."]) == 2
    assert "error: prompt is text but this engine has no tokenizer" in capsys.readouterr().err
    assert main(["generate", "--admission-policy", "lpm", "--max-tokens", "2", "--temperature", "0"]) == 0
    assert len(capsys.readouterr().out.strip().split(",")) == 2


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["generate", "--dtype", "bogus"], "--dtype"),
        (["generate", "--device", "bogus"], "--device"),
        (["generate", "--max-tokens", "0"], "--max-tokens"),
        (["generate", "--block-size", "3"], "--block-size"),
        (["bench", "throughput", "--dtype", "fp64"], "--dtype"),
        (["bench", "prefix", "--device", "gpu0"], "--device"),
        (["bench", "roofline", "--dtype", "auto16"], "--dtype"),
    ],
)
def test_a_bad_flag_value_is_an_argparse_error_not_a_traceback(argv, flag, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert f"argument {flag}:" in capsys.readouterr().err


def test_a_refused_input_is_one_line_on_stderr_not_a_traceback(capsys, monkeypatch):
    for off in (None, "0", ""):
        if off is None:
            monkeypatch.delenv("ROSEINFER_TRACEBACK", raising=False)
        else:
            monkeypatch.setenv("ROSEINFER_TRACEBACK", off)
        assert main(["generate", "--model", "qwen2.5-0.5b"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("roseinfer generate: error: ") and "--load-format dummy" in err
        assert "ROSEINFER_TRACEBACK=1" in err and len(err.strip().splitlines()) == 1
    monkeypatch.setenv("ROSEINFER_TRACEBACK", "1")  # for whoever debugs it
    with pytest.raises(ValueError, match="built-in shape without weights"):
        main(["generate", "--model", "qwen2.5-0.5b"])


def test_a_refusal_with_a_multi_line_message_is_still_one_line(capsys, monkeypatch):
    """The hub's errors span lines (a model id that is neither local nor on the hub, offline): the refusal that
    carries one is still one line on stderr, every line of it kept."""
    import huggingface_hub

    def offline(*args, **kwargs):
        raise OSError("Got: ConnectError\nAn error happened while trying to locate the files on the Hub.")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    monkeypatch.delenv("ROSEINFER_TRACEBACK", raising=False)
    assert main(["generate", "--model", "no-such-org/no-such-model", "--prompt-ids", "1,2"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("roseinfer generate: error: model ")
    assert "ConnectError" in err and "locate the files on the Hub" in err


def _greedy_ids(capsys, *flags: str) -> list[int]:
    assert main(["generate", "--temperature", "0", "--max-tokens", "6", "--ignore-eos", *flags]) == 0
    return [int(t) for t in capsys.readouterr().out.strip().split(",")]


def test_generate_takes_stop_token_ids_and_min_tokens(capsys):
    free = _greedy_ids(capsys)
    assert len(free) == 6
    stop = str(free[0])
    # The first token stops it; with --min-tokens 4 it may not be drawn among the first four.
    assert _greedy_ids(capsys, "--stop-token-ids", stop) == free[:1]
    held = _greedy_ids(capsys, "--stop-token-ids", stop, "--min-tokens", "4")
    assert len(held) >= 4 and free[0] not in held[:4]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--min-tokens", "-1"], "argument --min-tokens:"),
        (["--stop-token-ids", "1,x"], "argument --stop-token-ids:"),
    ],
)
def test_bad_stop_flags_are_argparse_errors(flags, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", *flags])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_a_stop_string_needs_a_tokenizer(capsys):
    assert main(["generate", "--stop", "###"]) == 2
    assert "stop strings need a tokenizer" in capsys.readouterr().err


def _logprob_sections(text: str) -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines()[1:]:  # the first line: the generated ids
        if not line.startswith(" "):
            current = sections.setdefault(line.rstrip(":"), [])
        else:
            assert current is not None
            current.append(line.strip())
    return sections


def test_generate_prints_logprobs_and_prompt_logprobs(capsys):
    """One line a position: index, token, its logprob and rank, then the others of its dict, most likely
    first. The values are the engine's (`LLM.generate` with the same settings gives them); greedy tokens rank
    first, and a prompt's first token has no entry."""
    from roseinfer.entrypoints.llm import LLM
    from roseinfer.models.loader import DEFAULT_MODEL
    from roseinfer.sampling_params import SamplingParams

    prompt = [5, 6, 7, 8, 9]
    flags = ["--temperature", "0", "--max-tokens", "3", "--ignore-eos", "--prompt-ids", "5,6,7,8,9"]
    assert main(["generate", *flags, "--logprobs", "2", "--prompt-logprobs", "3"]) == 0
    text = capsys.readouterr().out
    ids = [int(t) for t in text.splitlines()[0].split(",")]
    sections = _logprob_sections(text)
    assert sorted(sections) == ["logprobs", "prompt_logprobs"]
    llm = LLM(DEFAULT_MODEL, load_format="dummy")
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, logprobs=2, prompt_logprobs=3)
    want = llm.generate([prompt], params, use_tqdm=False)[0]
    assert ids == want.outputs[0].token_ids
    assert sections["prompt_logprobs"][0] == "0 5 -"
    for title, tokens, entries, k in [
        ("prompt_logprobs", prompt, want.prompt_logprobs, 3),
        ("logprobs", ids, want.outputs[0].logprobs, 2),
    ]:
        lines = sections[title]
        assert len(lines) == len(tokens)
        for i, (line, token, entry) in enumerate(zip(lines, tokens, entries)):
            if entry is None:
                continue
            head, _, rest = line.partition(" | ")
            index, tok, value, _, rank = head.split()
            assert (int(index), int(tok), int(rank.rstrip(")"))) == (i, token, entry[token].rank)
            assert abs(float(value) - entry[token].logprob) < 1e-4
            others = [pair.split() for pair in rest.split(", ")] if rest else []
            assert [int(t) for t, _ in others] == sorted(
                (t for t in entry if t != token), key=lambda t: entry[t].rank
            )
            assert len(others) in (k - 1, k)
            if title == "logprobs":
                assert entry[token].rank == 1  # greedy


def test_bad_logprobs_flags_are_argparse_errors(capsys):
    for flag in ("--logprobs", "--prompt-logprobs"):
        with pytest.raises(SystemExit) as exit_info:
            main(["generate", flag, "-2"])
        assert exit_info.value.code == 2 and f"argument {flag}:" in capsys.readouterr().err


def test_generate_takes_the_penalty_flags(capsys):
    """Each flag reaches its SamplingParams field: the tokens equal the offline API's with that field, and
    differ from the free run's (greedy repeats ids there)."""
    from roseinfer import LLM, SamplingParams
    from roseinfer.models.loader import DEFAULT_MODEL

    free = _greedy_ids(capsys, "--max-tokens", "8")
    assert len(set(free)) < len(free)
    llm = LLM(DEFAULT_MODEL, load_format="dummy", block_size=16)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]  # generate's default without a tokenizer
    for flag, field, value in [
        ("--presence-penalty", "presence_penalty", 2.0),
        ("--frequency-penalty", "frequency_penalty", -1.5),
        ("--repetition-penalty", "repetition_penalty", 5.0),
    ]:
        got = _greedy_ids(capsys, "--max-tokens", "8", flag, str(value))
        params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, **{field: value})
        assert got == llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids, flag
        assert got != free, flag


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--presence-penalty", "2.5"], "argument --presence-penalty:"),
        (["--frequency-penalty", "-3"], "argument --frequency-penalty:"),
        (["--frequency-penalty", "x"], "argument --frequency-penalty:"),
        (["--repetition-penalty", "0"], "argument --repetition-penalty:"),
        (["--repetition-penalty", "inf"], "argument --repetition-penalty:"),
    ],
)
def test_bad_penalty_flags_are_argparse_errors(flags, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", *flags])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_generate_takes_the_logit_control_flags(capsys):
    """Each flag reaches its SamplingParams field: the tokens equal the offline API's with that field, and
    differ from the free run's."""
    from roseinfer import LLM, SamplingParams
    from roseinfer.models.loader import DEFAULT_MODEL

    free = _greedy_ids(capsys, "--max-tokens", "6")
    llm = LLM(DEFAULT_MODEL, load_format="dummy", block_size=16)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]  # generate's default without a tokenizer
    allowed = [free[0] + 1, free[1] + 2, 3]
    for flags, field, value in [
        (["--allowed-token-ids", ",".join(map(str, allowed))], "allowed_token_ids", allowed),
        (["--logit-bias", f"{free[0]}=-1000,5=2.5"], "logit_bias", {free[0]: -1000.0, 5: 2.5}),
        (["--truncate-prompt-tokens", "3"], "truncate_prompt_tokens", 3),
    ]:
        got = _greedy_ids(capsys, "--max-tokens", "6", *flags)
        params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, **{field: value})
        assert got == llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids, flags
        assert got != free, flags
    assert set(_greedy_ids(capsys, "--allowed-token-ids", "4,9")) <= {4, 9}


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--allowed-token-ids", "1,x"], "argument --allowed-token-ids:"),
        (["--logit-bias", "5"], "argument --logit-bias:"),
        (["--logit-bias", "5=inf"], "argument --logit-bias:"),
        (["--logit-bias", "-1=2"], "argument --logit-bias:"),
        (["--truncate-prompt-tokens", "0"], "argument --truncate-prompt-tokens:"),
        (["--truncate-prompt-tokens", "-2"], "argument --truncate-prompt-tokens:"),
    ],
)
def test_bad_logit_control_flags_are_argparse_errors(flags, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", *flags])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_refused_logit_controls_are_one_line_errors(capsys):
    assert main(["generate", "--bad-words", "hello"]) == 2
    assert "bad_words need a tokenizer" in capsys.readouterr().err
    assert main(["generate", "--allowed-token-ids", "99999999"]) == 2
    assert "allowed_token_ids" in capsys.readouterr().err


def test_generate_bans_bad_words_with_a_tokenizer(model_with_tokenizer, capsys):
    """A word of the tokenized model's greedy text banned through the flag: the text equals the offline API's
    with that bad word, which differs from the free text."""
    from roseinfer import LLM, SamplingParams
    from tests.engine.test_bad_words import words_from

    base = ["generate", "--model", model_with_tokenizer, "--prompt-ids", "40,41,42", "--temperature", "0"]
    base += ["--max-tokens", "8", "--ignore-eos", "--device", "cpu", "--block-size", "4"]
    assert main(base) == 0
    free = capsys.readouterr().out.rstrip("\n")
    llm = LLM(model_with_tokenizer, device="cpu", block_size=4)

    def api(words: list[str] | None) -> str:
        sp = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, bad_words=words)
        return llm.generate([[40, 41, 42]], sp, use_tqdm=False)[0].outputs[0].text

    assert api(None) == free
    ids = llm.generate([[40, 41, 42]], SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)[0]
    # A generated token whose text tokenizes back to it (not counting the first two: words_from skips them)
    word = next(w for w in words_from(llm, [0, 0, *ids.outputs[0].token_ids], 1) if api([w]) != free)
    assert main([*base, "--bad-words", word]) == 0
    assert capsys.readouterr().out.rstrip("\n") == api([word])

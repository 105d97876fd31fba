"""`LLM.beam_search(prompts, BeamSearchParams(...))`, as vLLM's offline beam search, against a plain-Python beam
search over HF transformers' float32 model (tests/engine/beam_reference.py): the same beams, best first, the
same cumulative logprobs; the length penalty's ranking; eos handling; width 1 is greedy; prompts as text,
token ids or dicts; bad input refused by name; nothing left behind (the invariants fixture checks every step)."""

from __future__ import annotations

import math
import random

import pytest
import torch
from transformers import AutoModelForCausalLM

from roseinfer import LLM, BeamSearchOutput, BeamSearchParams, SamplingParams
from roseinfer.entrypoints.beam_search import BeamSearchSequence, _advance, _Instance
from roseinfer.logprobs import Logprob
from tests.engine.beam_reference import next_logprobs, reference_beam_search, score
from tests.models.tiny_models import save_hf_model

TOL = 1e-3
PROMPTS = [[11, 12, 13, 14, 15], [40, 41, 42]]


def hf_model(directory: str) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(directory, torch_dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tok_llm(model_with_tokenizer: str) -> tuple[LLM, torch.nn.Module]:
    llm = LLM(model_with_tokenizer, device="cpu", dtype="float32", block_size=4, cpu_kv_tokens=2048)
    return llm, hf_model(model_with_tokenizer)


@pytest.fixture(scope="module")
def eos_llm(tmp_path_factory: pytest.TempPathFactory) -> tuple[LLM, torch.nn.Module, int]:
    """A tiny Llama whose eos id is the most likely token after PROMPTS[0]: a beam completes in round one, so
    completed beams are shorter than live ones (the weights do not depend on the eos id)."""
    probe = tmp_path_factory.mktemp("beam-probe")
    eos = int(next_logprobs(save_hf_model("llama", probe), PROMPTS[0]).argmax())
    directory = tmp_path_factory.mktemp("beam-eos")
    save_hf_model("llama", directory, eos_token_id=eos, bos_token_id=1)
    llm = LLM(str(directory), device="cpu", dtype="float32", block_size=4, cpu_kv_tokens=2048)
    assert set(llm.engine.eos_token_ids) == {eos}
    return llm, hf_model(str(directory)), eos


def assert_same(got: BeamSearchOutput, want: list, prompt: list[int]) -> None:
    assert [s.tokens for s in got.sequences] == [b.tokens for b in want]
    assert [s.cum_logprob for s in got.sequences] == pytest.approx([b.cum_logprob for b in want], abs=TOL)
    assert [s.finish_reason for s in got.sequences] == [b.finish_reason for b in want]
    for s in got.sequences:
        assert s.tokens[: len(prompt)] == prompt
        # One position dict a round the beam ran, the beam's own token in it, summing to its cum_logprob.
        generated = s.tokens[len(prompt) :]
        assert len(s.logprobs) == len(generated) + (
            s.finish_reason == "stop" and s.tokens[-1] != s.stop_reason
        )
        for token, position in zip(generated, s.logprobs, strict=False):
            assert token in position
        assert sum(p[t].logprob for t, p in zip(generated, s.logprobs, strict=False)) + (
            s.logprobs[-1][s.stop_reason].logprob if len(s.logprobs) > len(generated) else 0.0
        ) == pytest.approx(s.cum_logprob, abs=1e-5)


@pytest.mark.parametrize("width", [1, 2, 3])
@pytest.mark.parametrize("length_penalty", [1.0, 0.5])
def test_beams_match_the_reference(tok_llm, width: int, length_penalty: float) -> None:
    llm, model = tok_llm
    params = BeamSearchParams(beam_width=width, max_tokens=5, length_penalty=length_penalty)
    got = llm.beam_search(PROMPTS, params)
    assert len(got) == len(PROMPTS)
    for out, prompt in zip(got, PROMPTS, strict=True):
        assert len(out.sequences) == width
        want = reference_beam_search(model, prompt, width, 5, llm.engine.eos_token_ids, False, length_penalty)
        assert_same(out, want, prompt)
        assert all(s.text == llm.tokenizer.decode(s.tokens) for s in out.sequences)
    assert not llm.engine.groups and not llm.engine.has_unfinished_requests()


def test_length_penalty_ranks_by_the_formula(eos_llm) -> None:
    """Completed beams (short) against live ones (long): a larger penalty favours the longer beams, and each
    result is ranked best first by cum_logprob / length ** length_penalty."""
    llm, model, eos = eos_llm
    orders = []
    for penalty in [0.0, 1.0, 4.0]:
        (out,) = llm.beam_search([PROMPTS[0]], BeamSearchParams(3, 6, length_penalty=penalty))
        assert_same(out, reference_beam_search(model, PROMPTS[0], 3, 6, [eos], False, penalty), PROMPTS[0])
        scores = [score(s.tokens, s.cum_logprob, [eos], penalty) for s in out.sequences]
        assert scores == sorted(scores, reverse=True)
        orders.append([s.tokens for s in out.sequences])
    assert orders[0] != orders[2], "the penalty should change which beams win"
    assert len(orders[0][0]) < len(orders[2][0])


@pytest.mark.parametrize("include", [False, True])
def test_an_eos_candidate_completes_its_beam(eos_llm, include: bool) -> None:
    llm, model, eos = eos_llm
    params = BeamSearchParams(3, 6, length_penalty=0.0, include_stop_str_in_output=include)
    (out,) = llm.beam_search([PROMPTS[0]], params)
    want = reference_beam_search(model, PROMPTS[0], 3, 6, [eos], False, 0.0, include_eos=include)
    assert_same(out, want, PROMPTS[0])
    stopped = [s for s in out.sequences if s.finish_reason == "stop"]
    assert stopped and all(s.stop_reason == eos for s in stopped)
    assert all((s.tokens[-1] == eos) is include for s in stopped)
    live = [s for s in out.sequences if s.finish_reason == "length"]
    assert all(len(s.tokens) == len(PROMPTS[0]) + 6 and eos not in s.tokens[len(PROMPTS[0]) :] for s in live)


def test_ignore_eos_keeps_eos_beams_running(eos_llm) -> None:
    llm, model, eos = eos_llm
    (out,) = llm.beam_search([PROMPTS[0]], BeamSearchParams(3, 6, ignore_eos=True, length_penalty=0.0))
    want = reference_beam_search(model, PROMPTS[0], 3, 6, [eos], True, 0.0)
    assert_same(out, want, PROMPTS[0])
    assert all(s.finish_reason == "length" and len(s.tokens) == len(PROMPTS[0]) + 6 for s in out.sequences)
    # One round: the most likely token, eos, leads a live beam where length does not count; where it does
    # (penalty 1) the eos beam's length leaves its eos out, as vLLM's, which ranks it lower.
    # Width 1: the round's own ranking decides alone (the final one sees a single beam).
    for width, penalty in [(3, 0.0), (3, 1.0), (1, 0.0), (1, 1.0)]:
        params = BeamSearchParams(width, 1, ignore_eos=True, length_penalty=penalty)
        (one,) = llm.beam_search([PROMPTS[0]], params)
        assert_same(one, reference_beam_search(model, PROMPTS[0], width, 1, [eos], True, penalty), PROMPTS[0])
        assert (one.sequences[0].tokens == PROMPTS[0] + [eos]) is (penalty == 0.0)
        assert (PROMPTS[0] + [eos] in [s.tokens for s in one.sequences]) is (width == 3 or penalty == 0.0)


def test_beam_width_1_is_greedy(tok_llm) -> None:
    llm, _ = tok_llm
    greedy = SamplingParams(temperature=0.0, max_tokens=7, ignore_eos=True, logprobs=0)
    want = llm.generate(PROMPTS, greedy, use_tqdm=False)
    got = llm.beam_search(PROMPTS, BeamSearchParams(1, 7, ignore_eos=True))
    for out, ref, prompt in zip(got, want, PROMPTS, strict=True):
        (seq,) = out.sequences
        assert seq.tokens == prompt + ref.outputs[0].token_ids
        assert seq.cum_logprob == pytest.approx(ref.outputs[0].cumulative_logprob, abs=TOL)


def test_text_token_id_and_dict_prompts_agree(tok_llm) -> None:
    llm, _ = tok_llm
    text = "Hello world! How are"
    ids = llm.tokenizer.encode(text)
    params = BeamSearchParams(2, 4)
    (by_text,) = llm.beam_search(text, params)  # one prompt, not a batch
    by_ids, by_dict = llm.beam_search([ids, {"prompt_token_ids": ids}], params)
    (by_text_dict,) = llm.beam_search([{"prompt": text}], params)
    for out in (by_ids, by_dict, by_text_dict):
        assert [s.tokens for s in out.sequences] == [s.tokens for s in by_text.sequences]
    for s in by_text.sequences:
        assert s.tokens[: len(ids)] == ids and s.text == llm.tokenizer.decode(s.tokens)
        assert all(e.decoded_token == llm.tokenizer.decode([t]) for p in s.logprobs for t, e in p.items())


def cached_tokens_per_call(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """Spies on LLM.generate: each call appends its outputs' num_cached_tokens to the returned list."""
    calls: list[list[int]] = []
    generate = LLM.generate

    def spy(self, prompts, params=None, use_tqdm=True):
        outs = generate(self, prompts, params, use_tqdm)
        calls.append([o.num_cached_tokens for o in outs])
        return outs

    monkeypatch.setattr(LLM, "generate", spy)
    return calls


def test_each_round_is_one_batch_and_reuses_the_beams_prefixes(
    tok_llm, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every live beam of every prompt in one generate call a round; after the first round the beams' prompts
    hit the prefix cache (their shared prefix was computed the round before)."""
    llm, _ = tok_llm
    calls = cached_tokens_per_call(monkeypatch)
    long_prompts = [list(range(20, 45)), list(range(60, 78))]
    llm.beam_search(long_prompts, BeamSearchParams(2, 4))
    assert [len(c) for c in calls] == [2, 4, 4, 4]
    assert all(n >= 16 for c in calls[1:] for n in c)  # at least the prompts' full blocks
    assert not llm.engine.groups and not llm.engine.has_unfinished_requests()


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"beam_width": 0, "max_tokens": 4}, "beam_width"),
        ({"beam_width": 1.0, "max_tokens": 4}, "beam_width"),
        ({"beam_width": True, "max_tokens": 4}, "beam_width"),
        ({"beam_width": 2, "max_tokens": 0}, "max_tokens"),
        ({"beam_width": 2, "max_tokens": None}, "max_tokens"),
        ({"beam_width": 2, "max_tokens": 4, "temperature": -0.5}, "temperature"),
        ({"beam_width": 2, "max_tokens": 4, "temperature": math.nan}, "temperature"),
        ({"beam_width": 2, "max_tokens": 4, "length_penalty": math.inf}, "length_penalty"),
        ({"beam_width": 2, "max_tokens": 4, "length_penalty": "1"}, "length_penalty"),
        ({"beam_width": 2, "max_tokens": 4, "ignore_eos": 1}, "ignore_eos"),
        (
            {"beam_width": 2, "max_tokens": 4, "include_stop_str_in_output": "no"},
            "include_stop_str_in_output",
        ),
    ],
)
def test_bad_params_name_their_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        BeamSearchParams(**kwargs)


def test_bad_calls_are_refused_before_anything_runs(tok_llm, llama_dir: str) -> None:
    llm, _ = tok_llm
    with pytest.raises(ValueError, match="BeamSearchParams"):
        llm.beam_search(PROMPTS, SamplingParams())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="beam_width=11"):  # 22 logprobs a token; max_logprobs is 20
        llm.beam_search(PROMPTS, BeamSearchParams(11, 2))
    max_len = llm.engine.config.max_model_len
    with pytest.raises(ValueError, match="prompt 1.*max_model_len"):
        llm.beam_search([PROMPTS[0], [5] * (max_len - 2)], BeamSearchParams(2, 3))
    with pytest.raises(ValueError, match="prompt 0.*empty"):
        llm.beam_search([[]], BeamSearchParams(2, 3))
    assert not llm.engine.groups and not llm.engine.has_unfinished_requests()
    no_tokenizer = LLM(llama_dir, device="cpu", block_size=4, cpu_kv_tokens=512)
    with pytest.raises(ValueError, match="prompt 0.*tokenizer"):
        no_tokenizer.beam_search(["text"], BeamSearchParams(2, 3))
    (out,) = no_tokenizer.beam_search([[5, 6, 7]], BeamSearchParams(2, 3))
    assert all(s.text is None and len(s.tokens) == 6 for s in out.sequences)


def test_defaults_are_vllms(eos_llm) -> None:
    """vLLM's BeamSearchParams defaults: greedy probes, eos honoured, length penalty 1, eos left out."""
    llm, model, eos = eos_llm
    params = BeamSearchParams(3, 6)
    assert (params.ignore_eos, params.temperature, params.length_penalty) == (False, 0.0, 1.0)
    assert params.include_stop_str_in_output is False
    (out,) = llm.beam_search([PROMPTS[0]], params)
    assert_same(out, reference_beam_search(model, PROMPTS[0], 3, 6, [eos], False, 1.0), PROMPTS[0])


def test_each_dict_is_the_top_2_width_raw_logprobs(tok_llm) -> None:
    """At temperature 0 a round's dict is exactly the 2 * beam_width most likely next tokens, with the model's
    logprobs; at temperature 1 the sampled token joins them when it is not among those."""
    llm, model = tok_llm
    width = 2
    for temperature in [0.0, 1.0]:
        outs = llm.beam_search(PROMPTS, BeamSearchParams(width, 4, temperature=temperature, ignore_eos=True))
        extra = 0
        for out, prompt in zip(outs, PROMPTS, strict=True):
            for s in out.sequences:
                for i, position in enumerate(s.logprobs):
                    ref = next_logprobs(model, s.tokens[: len(prompt) + i])
                    values, ids = torch.topk(ref, 2 * width)
                    assert set(ids.tolist()) <= set(position)
                    extra += len(position) - 2 * width
                    assert len(position) - 2 * width in ((0,) if temperature == 0.0 else (0, 1))
                    for token, entry in position.items():
                        assert entry.logprob == pytest.approx(float(ref[token]), abs=TOL)
        # Near-uniform tiny model, hundreds of tokens: a sample lands outside the top 4 almost always.
        assert (extra > 0) is (temperature > 0.0)


def test_a_cache_salt_keeps_the_beams_apart(tok_llm, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each round's requests carry the prompt's cache_salt: a new salt's first round hits nothing cached, the
    same salt again hits its own blocks."""
    llm, _ = tok_llm
    firsts = cached_tokens_per_call(monkeypatch)
    prompt = list(range(100, 121))
    cached = []
    for salt in ["a", "b", "a"]:
        firsts.clear()
        llm.beam_search([{"prompt_token_ids": prompt, "cache_salt": salt}], BeamSearchParams(2, 2))
        cached.append(firsts[0][0])
    assert cached[:2] == [0, 0] and cached[2] >= 16  # the prompt's full blocks, salt "a"'s own


@pytest.mark.parametrize("seed", range(4))
def test_a_round_keeps_the_best_candidates_by_their_whole_sequence_score(seed: int) -> None:
    """One round over drawn dicts, eos among the candidates, against the score of each candidate's whole token
    list (as vLLM builds it): the kept beams, best first, and the completed ones. With ignore_eos an eos
    candidate lives on and its length leaves the eos out, so its rank against the others hangs on the lengths."""
    rng = random.Random(seed)
    for _ in range(200):
        width = rng.randint(1, 3)
        eos = frozenset(rng.sample(range(8), rng.randint(1, 2)))
        ignore, include = rng.random() < 0.5, rng.random() < 0.5
        penalty = rng.choice([0.0, 0.5, 1.0, 2.0, -1.0, rng.uniform(-3, 3)])
        length = rng.randint(1, 4)  # every beam of a prompt has the same length each round
        beams = [
            BeamSearchSequence([rng.randrange(8, 50) for _ in range(length)], [], rng.uniform(-9, 0))
            for _ in range(rng.randint(1, width))
        ]
        dicts = [
            {t: Logprob(rng.uniform(-6, -0.01)) for t in rng.sample(range(12), 2 * width)} for _ in beams
        ]
        params = BeamSearchParams(
            width, 5, ignore_eos=ignore, length_penalty=penalty, include_stop_str_in_output=include
        )
        inst = _Instance(beams[0].tokens, None, list(beams))
        _advance(inst, dicts, eos, params)
        live, done = [], []
        for beam, position in zip(beams, dicts, strict=True):
            for token, entry in position.items():
                cum = beam.cum_logprob + entry.logprob
                if token in eos and not ignore:
                    done.append((beam.tokens + [token] if include else beam.tokens, cum, token))
                else:
                    live.append((beam.tokens + [token], cum))
        live.sort(key=lambda c: score(c[0], c[1], eos, penalty), reverse=True)
        assert [(b.tokens, b.cum_logprob) for b in inst.beams] == live[:width]
        assert [(b.tokens, b.cum_logprob, b.stop_reason) for b in inst.completed] == done
        assert all(b.finish_reason == "stop" for b in inst.completed)

"""Stop strings and text at a sequence's end, beyond tests/engine/test_api_contract.py (gaps the mutation audit
found): of two stop strings completed by one token, the one that starts first ends the text; and a sequence that
finishes with two tokens taken at once (async scheduling) still shows whole characters."""

from __future__ import annotations

from types import SimpleNamespace

from roseinfer import LLM, SamplingParams
from roseinfer.engine.request_outputs import SequenceOutput
from roseinfer.request import Request, RequestStatus
from roseinfer.tokenizer import IncrementalDetokenizer, load_tokenizer
from tests.engine.test_min_tokens import prefer


def test_the_stop_string_that_starts_first_ends_the_text(model_with_tokenizer) -> None:
    llm = LLM(model_with_tokenizer, device="cpu", block_size=4, cpu_kv_tokens=256)
    token = llm.tokenizer.encode(" world", add_special_tokens=False)[0]
    text = llm.tokenizer.decode([token])
    assert len(text) >= 3  # " wo..." : both stop strings below complete with the first token
    prefer(llm, token)  # every step picks it
    early, late = text[0:2], text[1:3]
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, stop=[early, late])
    out = llm.generate([[5, 6, 7]], params, use_tqdm=False)[0].outputs[0]
    assert (out.text, out.stop_reason, out.finish_reason) == ("", early, "stop")
    assert out.token_ids == [token]


def test_two_tokens_taken_at_the_end_keep_a_character_whole(hf_tokenizer_dir) -> None:
    """With async scheduling one engine step can apply a sequence's last two tokens at once; the text is
    flushed only after the last of them, so a character split across them is not broken."""
    tokenizer = load_tokenizer(str(hf_tokenizer_dir))
    rocket = tokenizer.encode("🚀", add_special_tokens=False)
    assert len(rocket) == 2 and "\ufffd" in tokenizer.decode(rocket[:1])  # split across the two tokens
    prompt = tokenizer.encode("Hello", add_special_tokens=False)
    req = Request("a", prompt, SamplingParams(max_tokens=2, ignore_eos=True))
    for t in rocket:
        req.append_token(t)
    req.status = RequestStatus.FINISHED_LENGTH
    engine = SimpleNamespace(model_config=SimpleNamespace(vocab_size=len(tokenizer)), token_text=None)
    seq = SequenceOutput(req, IncrementalDetokenizer(tokenizer, prompt), engine)  # type: ignore[arg-type]
    seq.on_token(engine)  # type: ignore[arg-type]
    assert seq.text == "🚀" == tokenizer.decode(req.output_token_ids)
    assert seq.output().text == "🚀"

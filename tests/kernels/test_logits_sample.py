"""The lm_head with the sampler in its epilogue (`kernels/logits_sample.py`): logits against the fp32 product,
tokens against `sample_tokens` on the same logits (bit for bit) and its torch reference on the same noise."""

from __future__ import annotations

import pytest
import torch

from roseinfer.kernels._common import is_interpret
from roseinfer.kernels.logits_sample import default_tile, logits_and_sample
from roseinfer.kernels.sampling import gumbel_noise, sample_tokens, sample_tokens_ref
from roseinfer.kernels.skinny_gemm import MAX_ROWS, GemmTile
from tests.kernels.kernel_utils import DEVICE, DTYPE_IDS, TOL, generator, randn

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _inputs(rows: int, vocab: int, k: int, dtype: torch.dtype, *tag: object):
    gen = generator("logits-sample", rows, vocab, k, dtype, *tag)
    h = randn((rows, k), dtype, gen)
    w = (randn((vocab, k), dtype, gen).float() * (3 / k**0.5)).to(dtype)
    temperature = torch.rand(rows, generator=gen).to(DEVICE) + 0.2
    temperature[::3] = 0.0  # greedy rows among sampled ones
    seeds = torch.randint(0, 2**62, (rows,), generator=gen).to(DEVICE)
    return h, w, temperature, seeds


def _check(rows, vocab, k, dtype, tile=None, tokens_dtype=torch.int32, row_block=MAX_ROWS):
    h, w, temperature, seeds = _inputs(rows, vocab, k, dtype, tile)
    tokens = torch.full((rows,), -1, dtype=tokens_dtype, device=DEVICE)
    logits = logits_and_sample(h, w, temperature, seeds, tokens, tile=tile, row_block=row_block)
    assert logits.shape == (rows, vocab) and logits.dtype == dtype
    atol, rtol = TOL[dtype]
    if dtype == torch.bfloat16 and is_interpret():
        atol, rtol = 4e-2, 3e-2  # the interpreter truncates to bf16 where the GPU rounds to nearest
    torch.testing.assert_close(
        logits.float(), (h.float() @ w.float().t()).to(dtype).float(), atol=atol, rtol=rtol
    )
    # The draw is sample_tokens' on the logits as stored (test_sampling holds that one to its reference on
    # the GPU, where x / T may round apart from torch's), and under the interpreter the reference's itself.
    assert torch.equal(tokens.long(), sample_tokens(logits, temperature, seeds))
    if is_interpret():
        assert torch.equal(
            tokens.long().cpu(), sample_tokens_ref(logits, temperature, gumbel_noise(seeds, vocab)).cpu()
        )
    # Greedy only: the plain argmax, into int64 tokens as well.
    greedy = torch.full((rows,), -1, dtype=torch.int64, device=DEVICE)
    again = logits_and_sample(h, w, None, None, greedy, tile=tile, row_block=row_block)
    assert torch.equal(again, logits)
    assert torch.equal(greedy, logits.float().argmax(dim=-1))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
@pytest.mark.parametrize(
    ("rows", "vocab", "k"), [(1, 7, 16), (3, 257, 40), (17, 130, 96), (MAX_ROWS, 300, 32)]
)
def test_logits_and_tokens_match_the_references(rows, vocab, k, dtype):
    """Odd vocabularies (a last tile mostly past the edge), K not a multiple of the K step, 1-64 rows."""
    _check(rows, vocab, k, dtype)


@pytest.mark.parametrize("tile", [GemmTile(16, 16, 1, 4, 2), GemmTile(32, 64, 1, 4, 1)], ids=str)
def test_other_tiles_and_int64_tokens(tile):
    _check(5, 100, 80, torch.float32, tile, tokens_dtype=torch.int64)


@pytest.mark.parametrize(("rows", "row_block"), [(MAX_ROWS + 1, MAX_ROWS), (37, 16), (32, 16)])
def test_rows_past_one_program(rows, row_block):
    """More rows than a program takes: row blocks side by side, the last one partly past the edge (or not)."""
    _check(rows, 130, 48, torch.float16, row_block=row_block)


def test_ties_go_to_the_lowest_token_across_tiles():
    rows, vocab, k = 4, 150, 16
    h = torch.ones((rows, k), device=DEVICE)
    w = torch.zeros((vocab, k), device=DEVICE)
    w[[3, 70, 149]] = 1.0  # the same top logit in three column tiles (32 columns a tile on the CPU)
    tokens = torch.empty(rows, dtype=torch.int32, device=DEVICE)
    logits_and_sample(
        h, w, torch.zeros(rows, device=DEVICE), torch.zeros(rows, dtype=torch.int64, device=DEVICE), tokens
    )
    assert tokens.tolist() == [3] * rows
    w.zero_()
    logits_and_sample(h, w, None, None, tokens)  # every logit equal: token 0
    assert tokens.tolist() == [0] * rows


@pytest.mark.parametrize("vocab", [7, 130])
def test_columns_past_the_vocabulary_never_win(vocab):
    """Every logit negative: a column past the vocabulary (its product reads as 0) must not outscore them."""
    rows, k = 3, 16
    h = torch.ones((rows, k), device=DEVICE)
    w = -(1 + torch.rand((vocab, k), generator=generator("negative-logits", vocab))).to(DEVICE)
    tokens = torch.empty(rows, dtype=torch.int32, device=DEVICE)
    logits = logits_and_sample(h, w, None, None, tokens)
    assert torch.equal(tokens.long(), logits.argmax(dim=-1))
    temperature = torch.tensor([0.0, 0.5, 1.0], device=DEVICE)
    seeds = torch.arange(rows, dtype=torch.int64, device=DEVICE)
    logits_and_sample(h, w, temperature, seeds, tokens)
    assert torch.equal(tokens.long(), sample_tokens(logits, temperature, seeds))


def test_tiles_by_rows():
    assert default_tile(1) == default_tile(32) == GemmTile(64, 128, 1, 4, 5)
    assert default_tile(33) == default_tile(MAX_ROWS) == default_tile(200) == GemmTile(64, 64, 1, 4, 3)


def test_bad_input_is_refused():
    h = torch.zeros((2, 8), device=DEVICE)
    w = torch.zeros((10, 8), device=DEVICE)
    tokens = torch.empty(2, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match=r"h \[M, K\]"):
        logits_and_sample(h, torch.zeros((10, 9), device=DEVICE), None, None, tokens)
    with pytest.raises(ValueError, match="tokens must be"):
        logits_and_sample(h, w, None, None, torch.empty(2, dtype=torch.float32, device=DEVICE))
    with pytest.raises(ValueError, match="temperature and seeds"):
        logits_and_sample(h, w, torch.ones(2, device=DEVICE), None, tokens)
    empty = logits_and_sample(h[:0], w, None, None, tokens[:0])
    assert empty.shape == (0, 10)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("rows", "vocab", "k"),
    [(64, 151936, 896), (17, 151936, 1024), (16, 128256, 4096), (200, 151936, 896), (256, 128256, 4096)],
)
def test_real_sizes_on_the_gpu(rows, vocab, k):
    """Real lm_heads at the decode steps' row counts, and past them (row blocks), with the shipped tiles."""
    _check(rows, vocab, k, torch.bfloat16)

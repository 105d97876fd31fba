"""Logprobs as `roseinfer generate` prints them: one line a position, the token's logprob and rank, then the
other tokens of its dict, most likely first."""

from __future__ import annotations

from collections.abc import Sequence

from roseinfer.logprobs import Logprob


def _token(token_id: int, lp: Logprob) -> str:
    return repr(lp.decoded_token) if lp.decoded_token is not None else str(token_id)


def logprob_lines(
    title: str, token_ids: Sequence[int], entries: Sequence[dict[int, Logprob] | None]
) -> list[str]:
    """`title:`, then per position `index token logprob (rank r) | other logprob, ...`; a position with no
    entry (a prompt's first token) shows its id alone."""
    lines = [f"{title}:"]
    for i, (tid, entry) in enumerate(zip(token_ids, entries, strict=True)):
        if entry is None:
            lines.append(f"  {i} {tid} -")
            continue
        own = entry[tid]
        others = sorted((t for t in entry if t != tid), key=lambda t: entry[t].rank or 0)
        line = f"  {i} {_token(tid, own)} {own.logprob:.4f} (rank {own.rank})"
        if others:
            line += " | " + ", ".join(f"{_token(t, entry[t])} {entry[t].logprob:.4f}" for t in others)
        lines.append(line)
    return lines

"""The engine's invariants (numbered as in the project's ARCHITECTURE.md), checked by tests/conftest.py on
every scheduler and engine a test steps: after each `Scheduler.schedule()` (1-3, with the step's writers),
after each `EngineCore.step()` and `LLMEngine.step()` / `abort_request()` (1, 2 and 4: a finished request
holds nothing, an aborted one is queued no more, an idle engine holds nothing but its pins; penalty rows belong to
running requests and stay within max_num_seqs, the worst case start-up sizing counts)."""

from __future__ import annotations

from collections.abc import Iterable

from roseinfer.engine.core import EngineCore
from roseinfer.engine.llm_engine import LLMEngine
from roseinfer.request import Request, RequestStatus
from roseinfer.scheduler.scheduler import Scheduler, SchedulerOutput


def step_writers(out: SchedulerOutput, block_size: int) -> list[tuple[Request, int]]:
    """(request, first position it writes in a block) for every block a scheduled request writes."""
    writers = []
    for s in out.scheduled:
        start, end = s.start, s.start + s.num_new_tokens
        writers += [
            (s.request, max(start, i * block_size)) for i in range(start // block_size, -(-end // block_size))
        ]
    return writers


def check_scheduled(sched: Scheduler, out: SchedulerOutput) -> None:
    """Right after `schedule()`, before the runner writes: 1-2, and 3 for each block the step writes."""
    for s in out.scheduled:
        if s.request.status is not RequestStatus.RUNNING:
            raise AssertionError(f"scheduled {s.request} is not running")
    sched.kv.check_invariants(sched.running, step_writers(out, sched.kv.block_size))
    sched.check_invariants()
    srcs = {src for src, _ in out.blocks_to_copy}
    dsts = [dst for _, dst in out.blocks_to_copy]
    if len(set(dsts)) != len(dsts) or srcs & set(dsts):
        raise AssertionError(f"copies {out.blocks_to_copy}: a destination twice, or also a source")
    if srcs & sched.kv.fresh:  # its content does not exist yet when the step's copies run
        raise AssertionError(f"copies {out.blocks_to_copy}: a source is a block this step fills")


def check_holds_nothing(core: EngineCore, requests: Iterable[Request]) -> None:
    """Invariant 4 for requests in a terminal state: no blocks, no block-table row, no generator."""
    for r in requests:
        if not r.is_finished:
            raise AssertionError(f"{r} returned as finished")
        if r.block_ids or r.table_row >= 0:
            raise AssertionError(f"finished {r} holds blocks or a block-table row")
        if core.runner.sampling.generator_key(r) in core.runner.sampling.generators:
            raise AssertionError(f"finished {r} still has a sampling generator")


def check_core(core: EngineCore) -> None:
    """Between steps: 1-2; no terminal request is queued; an idle engine holds nothing but its pins."""
    sched, kv = core.scheduler, core.kv
    sched.check_invariants()
    for r in [*sched.running, *sched.waiting]:
        if r.is_finished:
            raise AssertionError(f"{r} is queued in a terminal state")
    table = core.runner.sampling.penalty_table
    if table is not None:  # rows of running requests only (none of a preempted one), within max_num_seqs
        stray = set(table.slot_of) - {r.uid for r in sched.running}
        if stray:
            raise AssertionError(f"penalty rows held by requests that are not running: uids {sorted(stray)}")
        if len(table.counts) > core.config.scheduler.max_num_seqs:
            raise AssertionError(f"a penalty table of {len(table.counts)} rows, past max_num_seqs")
    if not core.has_unfinished():
        if kv.num_free_blocks != kv.num_blocks - len(kv.pool.pinned):
            raise AssertionError(f"idle engine: {kv.num_free_blocks} of {kv.num_blocks} blocks free")
        if kv.tables.rows_in_use:
            raise AssertionError(f"idle engine: {kv.tables.rows_in_use} block-table rows in use")
        if core.runner.sampling.generators:
            raise AssertionError(f"idle engine keeps generators {list(core.runner.sampling.generators)}")


def check_aborted(engine: LLMEngine, roots: list[Request]) -> None:
    """After `abort_request`: no sequence of an aborted request (its n > 1 samples included) is queued."""
    if engine.dead is not None:
        return
    sched = engine.core.scheduler
    aborted = {id(r) for r in roots}
    for r in [*sched.running, *sched.waiting]:
        if id(r.parent or r) in aborted:
            raise AssertionError(f"{r} is still queued after its request was aborted")


def check_engine(engine: LLMEngine) -> None:
    """`check_core`, and an idle engine keeps no request group (nor, with them, any detokenizer)."""
    if engine.dead is not None:
        return  # a failed step left its state half updated: nothing more is served or checked
    check_core(engine.core)
    if not engine.core.has_unfinished() and engine.groups:
        raise AssertionError(f"idle engine keeps request groups {list(engine.groups)}")

"""`scripts/gpu_check.sh tests` deals each selection over K pytest processes a GPU: every collected test lands in
exactly one shard, each shard runs its share, and the kernel and engine runs keep separate logs. On a CPU
machine the `gpu` tests skip and the rest run under Triton's interpreter, which is enough to check the dealing."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.gpu_check_run import run_gpu_check


@pytest.mark.skipif(os.name != "posix", reason="bash script")
def test_tests_section_deals_every_test_to_one_shard(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    run = run_gpu_check(
        "tests",
        300,
        GPU_CHECK_LOGS=str(logs),
        KERNEL_PROCS="3",
        KERNEL_TESTS="tests/kernels/test_block_copy.py tests/kernels/test_kv_store.py",
        KERNEL_K="not many_heads",
        E2E_PROCS="2",
        E2E_K="bench or sampler_memory",
    )
    assert run.returncode == 0, run.stdout + run.stderr
    for tag, shards in (("kernels", 3), ("e2e", 2)):
        everything = (logs / f"{tag}.ids").read_text().split()
        assert len(everything) >= shards
        dealt = [(logs / f"{tag}.ids.{i}").read_text().split() for i in range(shards)]
        alone = (logs / f"{tag}.alone.ids").read_text().split()
        assert sorted(sum(dealt, []) + alone) == sorted(everything)
        assert all(dealt), "a shard got no tests"
        for i in range(shards):
            log = (logs / f"{tag}.shard{i}.log").read_text()
            ran = re.findall(r"(\d+) (passed|skipped)", log.strip().splitlines()[-1])
            assert sum(int(n) for n, _ in ran) == len(dealt[i]) and "failed" not in log
        assert not (logs / f"{tag}.ids.{shards}").exists()
        if alone:  # one pytest process each, one summary line each
            log = (logs / f"{tag}.alone.log").read_text()
            summaries = [line for line in log.splitlines() if re.search(r" in [\d.]+s\b", line)]
            assert len(summaries) == len(alone) and "failed" not in log
            assert all(re.fullmatch(r"1 (passed|skipped)\b.*", line) for line in summaries), summaries
    # The timer tests compare measured times, and the sampler-memory test sizes its engine at 0.9 of the GPU:
    # none shares the GPU with a shard.
    assert (logs / "e2e.alone.ids").read_text().split() == [
        f"tests/gpu/test_bench_kernels.py::{name}"
        for name in (
            "test_back_to_back_timer_is_per_launch",
            "test_kernel_bench_rows",
            "test_steady_timer_is_per_call",
        )
    ] + ["tests/gpu/test_gpu_sampler_memory.py::test_a_busy_sampler_stays_within_the_profiled_budget_on_gpu"]
    assert not (logs / "kernels.alone.ids").read_text().split()
    assert "tests over 1 GPU(s), 3 process(es) each" in run.stdout

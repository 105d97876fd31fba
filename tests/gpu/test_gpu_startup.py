"""The start-up report on a GPU: it counts the graphs the runner captured, and the device memory the KV cache and
the graph pools took (the drop in free memory over each stage)."""

from __future__ import annotations

import pytest

from roseinfer import LLM
from tests.gpu.conftest import free_gpu
from tests.models.tiny_models import save_hf_model

pytestmark = [pytest.mark.gpu, pytest.mark.alone]  # it reads the GPU's free memory


@pytest.mark.parametrize("enforce_eager", [False, True], ids=["graphs", "eager"])
def test_the_start_up_report_counts_graphs_and_memory_on_gpu(tmp_path, enforce_eager):
    save_hf_model("llama", tmp_path)
    free_gpu()
    llm = LLM(
        str(tmp_path),
        device="cuda",
        dtype="bfloat16",
        num_kv_blocks=4096,
        max_num_seqs=32,
        enforce_eager=enforce_eager,
    )
    runner = llm.engine.core.runner
    report = llm.engine.core.startup
    kv_bytes = runner.kv_cache.numel() * runner.kv_cache.element_size()
    assert report.num_blocks == 4096
    assert kv_bytes <= report.stage("KV cache").device_bytes < kv_bytes + 64 * 2**20
    graphs = report.stage("CUDA graphs")
    if enforce_eager:
        assert (report.num_decode_graphs, report.num_mixed_graphs) == (0, 0)
        assert report.line().endswith("no CUDA graphs")
    else:
        assert report.num_decode_graphs == len(runner.graphs.sizes) > 0
        mixed = len(runner.mixed_graphs.sizes) + len(runner.mixed_graphs.long_sizes)  # LONG_TILE's twins
        assert report.num_mixed_graphs == mixed > 0
        assert graphs.device_bytes > 0 and graphs.seconds > 0
        assert report.line().endswith(f"CUDA graphs: {len(runner.graphs.sizes)} decode, {mixed} mixed-step")

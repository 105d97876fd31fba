"""How close each serving path stays to HF in float32 with the KV cache in fp8 (GPU only).

For tiny random models (tests/models/tiny_models.py) in bf16, every path generates 4 greedy tokens for many
prompts. Two measures against HF float32 on the same weights: prompts whose 4 tokens equal HF's greedy ones,
and the regret, HF's top logit minus the logit of the token the path chose, summed over the path's own tokens
(near-ties cost little, a wrong token much). A path with a bug shows a regret well above the torch path's;
agreement counts alone swing by several prompts between paths that are equally right.

    python scripts/probe_fp8_agreement.py [--archs llama,mistral,qwen3] [--seeds 8]
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from roseinfer import LLM, SamplingParams  # noqa: E402
from tests.models.test_hf_parity import hf_greedy, hf_regret, random_prompts  # noqa: E402
from tests.models.tiny_models import save_hf_model  # noqa: E402

TOKENS = 4
PATHS = {  # name: LLM keyword arguments
    "torch eager": dict(attention_backend="torch", enforce_eager=True),
    "triton eager": dict(attention_backend="triton", enforce_eager=True),
    "triton graphs": dict(attention_backend="triton"),
    "triton graphs, no PDL chain": dict(attention_backend="triton", pdl_decode=False),
    "triton graphs, norms kept": dict(attention_backend="triton", fold_norms=False),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archs", default="llama,mistral,qwen3")
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--kv-cache-dtypes", default="auto,fp8")
    parser.add_argument("--paths", default=",".join(PATHS), help="comma-separated, of: " + ", ".join(PATHS))
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    params = SamplingParams(temperature=0.0, max_tokens=TOKENS, ignore_eos=True)
    print(f"{'arch':8} {'KV':5} {'path':28} {'agree':>9} {'regret':>8}")
    for arch in args.archs.split(","):
        with tempfile.TemporaryDirectory() as directory:
            model = save_hf_model(arch, Path(directory))
            vocab = model.config.vocab_size
            prompts = [p for s in range(args.seeds) for p in random_prompts(vocab, seed=100 + s)]
            exact = [hf_greedy(model, p, TOKENS) for p in prompts]
            for kv in args.kv_cache_dtypes.split(","):
                for name in args.paths.split(","):
                    llm = LLM(
                        directory,
                        device=args.device,
                        dtype="bfloat16",
                        kv_cache_dtype=kv,
                        block_size=16,
                        num_kv_blocks=1024,
                        max_num_seqs=32,
                        **PATHS[name],
                    )
                    outs = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
                    del llm
                    gc.collect()
                    if torch.cuda.is_available():
                        torch.cuda.empty_cache()
                    agree = sum(o == e for o, e in zip(outs, exact))
                    lost = sum(hf_regret(model, p, o) for p, o in zip(prompts, outs))
                    print(f"{arch:8} {kv:5} {name:28} {agree:4}/{len(prompts):<4} {lost:8.2f}")


if __name__ == "__main__":
    main()

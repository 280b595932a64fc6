import statistics
import time

import torch

from bebop.engine import generate
from bebop.model.checkpoint import build_model
from bebop.model.config import ModelConfig
from bebop.sampling import SamplingParams

cfg = ModelConfig(vocab_size=32000, hidden_size=1024, intermediate_size=3072, num_hidden_layers=8, num_attention_heads=16,
                  num_key_value_heads=8, head_dim=64, max_position_embeddings=512)
m32 = build_model(cfg).eval(); m16 = build_model(cfg, dtype=torch.bfloat16).eval()
g = torch.Generator().manual_seed(0)
for rows in (1, 64):
    prompts = [torch.randint(0, 32000, (32,), generator=g).tolist() for _ in range(rows)]
    def run(m):
        t = time.perf_counter(); generate(m, prompts, max_new_tokens=32, sampling=SamplingParams(1.0), generator=torch.Generator().manual_seed(0)); return rows * 32 / (time.perf_counter() - t)
    run(m32); run(m16)
    ratios = []
    for _ in range(5):
        a = run(m32); b = run(m16); ratios.append(b / a)
    print(rows, "rows: bf16/fp32 tokens/s", [round(r, 2) for r in ratios], "median", round(statistics.median(ratios), 2), "fp32 tok/s", round(a), "bf16", round(b))

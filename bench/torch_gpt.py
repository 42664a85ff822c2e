#!/usr/bin/env python3
"""PyTorch (eager, CPU, fp32) training steps of the GPT that planc compiles.

usage: torch_gpt.py VOCAB SEQ D HEADS LAYERS BATCH STEPS THREADS

The model is test/e2e/gpt_reference.py's GPT-2 (tied head, tanh GELU), here
in float32, trained with torch.optim.AdamW on random tokens (the speed does
not depend on the data). Prints the median step time of steps 3..STEPS in
milliseconds: "torch: median X ms"."""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "test", "e2e"))
import torch  # noqa: E402
import gpt_reference  # noqa: E402

vocab, seq, d, heads, layers, batch, steps, threads = map(int, sys.argv[1:9])
torch.set_num_threads(threads)
gpt_reference.DTYPE = torch.float32
torch.manual_seed(0)
model = gpt_reference.GPT(vocab, seq, d, heads, layers)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95),
                        eps=1e-8, weight_decay=0.1)
times = []
for step in range(steps):
    x = torch.randint(0, vocab, (batch, seq))
    y = torch.randint(0, vocab, (batch, seq))
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    _, loss = model(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    times.append((time.perf_counter() - t0) * 1e3)
print(f"torch: median {statistics.median(times[2:]):.2f} ms")

#!/usr/bin/env python3
"""PyTorch (eager) training steps of the GPT that planc compiles.

usage: torch_gpt.py VOCAB SEQ D HEADS LAYERS BATCH STEPS THREADS [DEVICE [DTYPE]]

DEVICE is cpu (default) or cuda; DTYPE float32 (default) or bfloat16 (cuda:
autocast to bf16 with fp32 weights, as mixed-precision training runs).
On cuda the line also gives tokens/s and the peak memory PyTorch allocated:
"torch: median X ms, Y tok/s, peak Z GB".

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
device = sys.argv[9] if len(sys.argv) > 9 else "cpu"
dtype = sys.argv[10] if len(sys.argv) > 10 else "float32"
torch.set_num_threads(threads)
gpt_reference.DTYPE = torch.float32
torch.manual_seed(0)
model = gpt_reference.GPT(vocab, seq, d, heads, layers).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95),
                        eps=1e-8, weight_decay=0.1)
cuda = device == "cuda"


def sync():
    if cuda:
        torch.cuda.synchronize()


times = []
for step in range(steps):
    x = torch.randint(0, vocab, (batch, seq), device=device)
    y = torch.randint(0, vocab, (batch, seq), device=device)
    sync()
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    with torch.autocast(device_type=device, dtype=torch.bfloat16,
                        enabled=dtype == "bfloat16"):
        _, loss = model(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sync()
    times.append((time.perf_counter() - t0) * 1e3)
median = statistics.median(times[2:])
if cuda:
    print(f"torch: median {median:.2f} ms, {batch * seq / median * 1e3:.0f} "
          f"tok/s, peak {torch.cuda.max_memory_allocated() / 1e9:.2f} GB")
else:
    print(f"torch: median {median:.2f} ms")

"""What a compute share costs a launch-bound program (issue 41's cost): a batch-1 decode-shaped loop, 24
layers of a 1x2048 by 2048x2048 fp16 matmul, relu and add (72 launches a step), eager or replayed as one
CUDA graph a step, run for SECONDS after a warm-up. Prints `RESULT <mode> <steps/s> <launch us> <best>
<median>` where the launch figure is the host time a step took to queue over its launches, and the last two
are the best and the median rate of the run's ~0.25 s windows. A benchmark, run by
tests/gpu/decode_cost.sh bare and under the library."""
import sys
import time

import torch

mode = sys.argv[1] if len(sys.argv) > 1 else "eager"
seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 8.0
layers = 24
dev = torch.device("cuda")
torch.manual_seed(0)
ws = [torch.randn(2048, 2048, device=dev, dtype=torch.float16) * 0.02 for _ in range(layers)]
x0 = torch.randn(1, 2048, device=dev, dtype=torch.float16)


def step(x):
    for w in ws:
        x = torch.relu(x @ w) + x
    return x


if mode == "graph":
    static_x = x0.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step(static_x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_y = step(static_x)

    def run():
        g.replay()
else:
    def run():
        step(x0)

# Warm-up: long enough for whatever the library learns at the start (its first NVML figures) to be past.
t_end = time.perf_counter() + 2.0
while time.perf_counter() < t_end:
    run()
torch.cuda.synchronize()

# Windows of ~0.25 s (64 steps each synchronised): the machine's other load comes and goes within a run,
# so the best window's rate is the loop's own, and the median says how steady it was.
steps = 0
queue_s = 0.0
windows = []
t0 = time.perf_counter()
t_end = t0 + seconds
w0, ws0 = t0, 0
while True:
    q0 = time.perf_counter()
    run()
    queue_s += time.perf_counter() - q0
    steps += 1
    if steps % 64 == 0:
        torch.cuda.synchronize()
        now = time.perf_counter()
        if now - w0 >= 0.25:
            windows.append((steps - ws0) / (now - w0))
            w0, ws0 = now, steps
        if now >= t_end:
            break
elapsed = time.perf_counter() - t0
per_step_launches = 1 if mode == "graph" else 3 * layers
windows.sort()
best = windows[-1] if windows else steps / elapsed
median = windows[len(windows) // 2] if windows else steps / elapsed
print(f"RESULT {mode} {steps / elapsed:.1f} {queue_s / steps / per_step_launches * 1e6:.2f} {best:.1f} {median:.1f}", flush=True)

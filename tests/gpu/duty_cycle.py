#!/usr/bin/env python3
"""Diagnostic for the compute share: does the length of a duty cycle's bursts change what a matmul costs?

    duty_cycle.py [--duty 0.3] [--seconds 8] [--bursts 1,4,16,64,256,640]

No library: the loop of compute_case.py (8192x8192 bf16 matmuls) runs unlimited, then paced by hand to a
duty cycle (`--duty` of the wall time busy) in bursts of k matmuls (synchronised, then asleep until the
burst's share of the wall time is spent). For each it prints the share of the unlimited throughput and the
mean time of one matmul inside the bursts: a saturated H100 is power-capped, a lightly loaded one runs at
its boost clock, and a cap on GPU time pays out what the bursts' matmuls cost. One line per case, then
`RESULT {json}`.
"""
import argparse
import json
import time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--duty", type=float, default=0.3)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--bursts", default="1,4,16,64,256,640")
    a = p.parse_args()
    import torch

    n = 8192
    x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    flop = 2.0 * n * n * n

    def run(k):
        for _ in range(k):
            torch.matmul(x, y, out=out)
        torch.cuda.synchronize()

    run(32)

    def case(burst, duty):
        t0 = time.perf_counter()
        done, busy = 0, 0.0
        while time.perf_counter() - t0 < a.seconds:
            b0 = time.perf_counter()
            run(burst)
            b = time.perf_counter() - b0
            done += burst
            busy += b
            if duty < 1.0:
                time.sleep(b * (1.0 / duty - 1.0))
        wall = time.perf_counter() - t0
        return done * flop / wall / 1e12, busy / done * 1e3

    cases = {}
    full, full_ms = case(32, 1.0)
    cases["unlimited"] = {"tflops": round(full, 1), "ms_per_matmul": round(full_ms, 3)}
    print(f"unlimited: {full:.1f} TFLOP/s, {full_ms:.3f} ms a matmul", flush=True)
    for burst in [int(s) for s in a.bursts.split(",")]:
        tf, ms = case(burst, a.duty)
        share = 100.0 * tf / full
        cases[f"burst{burst}"] = {"tflops": round(tf, 1), "share": round(share, 1), "ms_per_matmul": round(ms, 3)}
        print(f"duty {a.duty:.2f}, bursts of {burst} matmuls ({burst * ms:.0f} ms): {tf:.1f} TFLOP/s = "
              f"{share:.1f}% of unlimited, {ms:.3f} ms a matmul", flush=True)
    again, again_ms = case(32, 1.0)
    cases["unlimited_again"] = {"tflops": round(again, 1), "ms_per_matmul": round(again_ms, 3)}
    print(f"unlimited again: {again:.1f} TFLOP/s, {again_ms:.3f} ms a matmul", flush=True)
    print("RESULT " + json.dumps({"duty": a.duty, "cases": cases}), flush=True)


if __name__ == "__main__":
    main()

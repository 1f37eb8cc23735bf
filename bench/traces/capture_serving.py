#!/usr/bin/env python3
"""Captures a serving trace: GPT-2 small (transformers, random weights, fp16) generating with a KV
cache, one step per request, each request of its own batch size and prompt length, recorded with
PyTorch's memory history as capture.py records training steps.

Two kinds of trace:
  --shapes K (K > 0)  K distinct (batch, prompt) shapes, requested in turn (a replay that runs
                      the trace's steps again and again sees each shape recur every K steps)
  --shapes 0          every request a shape no other request of the trace has

Writes NAME.csv (step,event,index,bytes) and PyTorch's peaks of each request to NAME_peaks.json.
Needs a GPU with torch and transformers.
Usage: capture_serving.py OUT_DIR [--name NAME] [--requests N] [--shapes K] [--new-tokens T]
                          [--max-batch B] [--min-prompt P] [--max-prompt P] [--seed S]"""
import argparse
import json
import os
import random

import torch


def request_shapes(args):
    rng = random.Random(args.seed)
    every = [(b, p) for b in range(1, args.max_batch + 1) for p in range(args.min_prompt, args.max_prompt + 1)]
    if args.shapes == 0:
        if args.requests > len(every):
            raise SystemExit(f"--shapes 0: only {len(every)} distinct shapes for {args.requests} requests")
        return rng.sample(every, args.requests)
    distinct = rng.sample(every, args.shapes)
    return [distinct[k % args.shapes] for k in range(args.requests)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--name", default="gpt2_serving")
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--shapes", type=int, default=24)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--min-prompt", type=int, default=16)
    parser.add_argument("--max-prompt", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(args.seed)
    model = GPT2LMHeadModel(GPT2Config()).cuda().half().eval()
    shapes = request_shapes(args)

    @torch.no_grad()
    def serve(batch, prompt):
        ids = torch.randint(0, 50257, (batch, prompt), device="cuda")
        out = model(ids, use_cache=True)
        past, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        for _ in range(args.new_tokens - 1):
            out = model(token, past_key_values=past, use_cache=True)
            past, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        return token

    for batch, prompt in [(1, 16), (args.max_batch, args.max_prompt), (4, 64)]:  # warm-up: cuBLAS workspaces
        serve(batch, prompt)
    torch.cuda.synchronize()
    rows, peaks = [], []
    for k, (batch, prompt) in enumerate(shapes):
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        torch.cuda.memory._record_memory_history(max_entries=1_000_000)
        serve(batch, prompt)
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        peaks.append({"step": k, "batch": batch, "prompt": prompt,
                      "peak_allocated_above_start": torch.cuda.max_memory_allocated() - base,
                      "peak_reserved": torch.cuda.max_memory_reserved()})
        live, index = {}, 0
        for trace in snap["device_traces"]:
            for e in trace:
                if e["action"] == "alloc":
                    live[e["addr"]] = index
                    rows.append((k, "alloc", index, e["size"]))
                    index += 1
                elif e["action"] == "free_completed" and e["addr"] in live:
                    rows.append((k, "free", live.pop(e["addr"]), e["size"]))
    path = os.path.join(args.out, f"{args.name}.csv")
    with open(path, "w") as f:
        f.write("step,event,index,bytes\n")
        for k, event, index, size in rows:
            f.write(f"{k},{event},{index},{size}\n")
    with open(os.path.join(args.out, f"{args.name}_peaks.json"), "w") as f:
        json.dump(peaks, f, indent=1)
    distinct = len(set(shapes))
    print(f"{args.name}: {sum(r[1] == 'alloc' for r in rows)} allocations over {args.requests} requests, "
          f"{distinct} distinct shapes -> {path}")


if __name__ == "__main__":
    main()

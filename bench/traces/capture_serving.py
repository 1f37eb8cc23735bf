#!/usr/bin/env python3
"""Captures a serving trace: GPT-2 small (transformers, random weights, fp16) generating with a KV
cache for requests of random batch size (1-16) and prompt length (16-512), 24 new tokens each, one
step per request, recorded with PyTorch's memory history as capture.py records training steps.
Writes gpt2_serving.csv (step,event,index,bytes) and the requests' PyTorch peaks to
serving_peaks.json. Needs a GPU with torch and transformers. Usage: capture_serving.py OUT_DIR [REQUESTS]"""
import json
import os
import random
import sys

import torch


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    requests = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    os.makedirs(out, exist_ok=True)
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config()).cuda().half().eval()
    rng = random.Random(0)
    shapes = [(rng.randint(1, 16), rng.randint(16, 512)) for _ in range(requests)]

    @torch.no_grad()
    def serve(batch, prompt, new_tokens=24):
        ids = torch.randint(0, 50257, (batch, prompt), device="cuda")
        out = model(ids, use_cache=True)
        past, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        for _ in range(new_tokens - 1):
            out = model(token, past_key_values=past, use_cache=True)
            past, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        return token

    for batch, prompt in shapes[:3]:  # warm-up: cuBLAS workspaces
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
    path = os.path.join(out, "gpt2_serving.csv")
    with open(path, "w") as f:
        f.write("step,event,index,bytes\n")
        for k, event, index, size in rows:
            f.write(f"{k},{event},{index},{size}\n")
    with open(os.path.join(out, "serving_peaks.json"), "w") as f:
        json.dump(peaks, f, indent=1)
    print(f"gpt2_serving: {sum(r[1] == 'alloc' for r in rows)} allocations over {requests} requests -> {path}")


if __name__ == "__main__":
    main()

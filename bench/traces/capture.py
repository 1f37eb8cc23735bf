#!/usr/bin/env python3
"""Captures the allocation sequence of real training steps with PyTorch's memory history
(torch.cuda.memory._record_memory_history / _snapshot) and writes one small CSV per workload:
    event,index,bytes      (event: alloc or free; index: request number within the step)
plus PyTorch's own peaks for the same step (allocated = live bytes, reserved = held from CUDA)
in peaks.json. Needs a GPU with torch (and torchvision for the CNN). Usage: capture.py OUT_DIR"""
import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


def resnet18():
    import torchvision
    model = torchvision.models.resnet18(num_classes=1000).cuda()
    data = torch.randn(64, 3, 224, 224, device="cuda")
    target = torch.randint(0, 1000, (64,), device="cuda")
    return model, lambda seq=None: F.cross_entropy(model(data), target)


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        t = x.shape[1]
        mask = torch.triu(torch.ones(t, t, device=x.device, dtype=torch.bool), 1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """A GPT-2-shaped decoder (6 layers, width 384, vocabulary 8192), randomly initialised."""

    def __init__(self, vocab=8192, d=384, layers=6, heads=6, max_len=512):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(max_len, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def gpt(batch=16):
    model = TinyGPT().cuda()

    def loss(seq=256):
        idx = torch.randint(0, 8192, (batch, seq), device="cuda")
        logits = model(idx)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), idx.view(-1))
    return model, loss


def capture(name, make, seqs, out):
    model, loss_fn = make()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    def step(seq):
        opt.zero_grad(set_to_none=True)
        loss_fn(seq).backward()
        opt.step()
    for seq in seqs:  # warm-up: cuDNN/cuBLAS workspaces, optimizer state
        step(seq)
    torch.cuda.synchronize()
    rows, peaks = [], []
    for k, seq in enumerate(seqs):
        torch.cuda.reset_peak_memory_stats()
        base_alloc = torch.cuda.memory_allocated()
        torch.cuda.memory._record_memory_history(max_entries=1_000_000)
        step(seq)
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        peaks.append({"step": k, "seq": seq, "peak_allocated_above_start": torch.cuda.max_memory_allocated() - base_alloc,
                      "peak_reserved": torch.cuda.max_memory_reserved(), "peak_allocated": torch.cuda.max_memory_allocated()})
        live = {}
        index = 0
        for trace in snap["device_traces"]:
            for e in trace:
                if e["action"] == "alloc":
                    live[e["addr"]] = index
                    rows.append(("alloc", index, e["size"], k))
                    index += 1
                elif e["action"] == "free_completed" and e["addr"] in live:
                    rows.append(("free", live.pop(e["addr"]), e["size"], k))
    path = os.path.join(out, f"{name}.csv")
    with open(path, "w") as f:
        f.write("step,event,index,bytes\n")
        for event, index, size, k in rows:
            f.write(f"{k},{event},{index},{size}\n")
    print(f"{name}: {sum(r[0] == 'alloc' for r in rows)} allocations over {len(seqs)} steps -> {path}")
    del model, opt
    torch.cuda.empty_cache()
    return peaks


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    os.makedirs(out, exist_ok=True)
    peaks = {}
    try:
        peaks["resnet18"] = capture("resnet18", resnet18, [None], out)
    except ImportError as e:
        print(f"resnet18 skipped: {e}")
    peaks["gpt"] = capture("gpt", gpt, [256], out)
    peaks["gpt_varlen"] = capture("gpt_varlen", gpt, [128, 256, 384, 128, 256, 384], out)
    with open(os.path.join(out, "peaks.json"), "w") as f:
        json.dump(peaks, f, indent=1)


if __name__ == "__main__":
    main()

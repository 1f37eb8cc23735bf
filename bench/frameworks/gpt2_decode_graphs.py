#!/usr/bin/env python3
"""GPT-2 small greedy decoding captured as CUDA graphs, the serving-engine pattern: one graph per batch
size (64, 32, 8, 1, captured largest first), all sharing one memory pool, each graph one decode step
(embedding, 12 layers over a static KV cache, logits, argmax written back as the next token). The
weights are random (seeded); the model is written here in plain PyTorch, so nothing is downloaded.

Modes, one process each: own (PyTorch's allocator) and refpool (refpool.torch.install(), its private
pools). Figures per mode: replay time per decode step at each batch size (median of the rounds'
medians, CUDA events around 64 replays), and the pool's memory (reserved bytes after the captures
minus before them). Outputs are compared bitwise: the tokens every batch size generated.

    gpt2_decode_graphs.py --out RESULT.json [--rounds 2] [--library build/python/librefpool.so]
runs own and refpool in turn, `rounds` times each, and prints a table; --mode MODE runs one process."""
import argparse
import hashlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BATCHES = (64, 32, 8, 1)
CONTEXT = 128  # KV cache length; decoding starts at position 0
REPLAYS = 64   # decode steps timed per batch size and round
LAYERS, WIDTH, HEADS, VOCAB = 12, 768, 12, 50257
HERE = Path(__file__).resolve().parent


def build_model(torch, seed):
    generator = torch.Generator().manual_seed(seed)

    def weight(*shape, scale=0.02):
        return (torch.randn(*shape, generator=generator) * scale).half().cuda()

    layers = []
    for _ in range(LAYERS):
        layers.append({"ln1": (torch.ones(WIDTH).half().cuda(), torch.zeros(WIDTH).half().cuda()),
                       "qkv": (weight(3 * WIDTH, WIDTH), torch.zeros(3 * WIDTH).half().cuda()),
                       "proj": (weight(WIDTH, WIDTH), torch.zeros(WIDTH).half().cuda()),
                       "ln2": (torch.ones(WIDTH).half().cuda(), torch.zeros(WIDTH).half().cuda()),
                       "fc": (weight(4 * WIDTH, WIDTH), torch.zeros(4 * WIDTH).half().cuda()),
                       "fc2": (weight(WIDTH, 4 * WIDTH), torch.zeros(WIDTH).half().cuda())})
    return {"wte": weight(VOCAB, WIDTH), "wpe": weight(CONTEXT, WIDTH, scale=0.01), "layers": layers,
            "ln_f": (torch.ones(WIDTH).half().cuda(), torch.zeros(WIDTH).half().cuda())}


def decode_step(torch, model, state):
    """One greedy step for state's batch: reads tokens and position, appends to the KV cache, writes
    the next tokens and advances the position (all on the device, so replays chain)."""
    F = torch.nn.functional
    tokens, position, keys, values = state["tokens"], state["position"], state["keys"], state["values"]
    batch, head = tokens.shape[0], WIDTH // HEADS
    x = model["wte"][tokens] + model["wpe"][position].expand(batch, WIDTH)
    future = torch.arange(CONTEXT, device=tokens.device) > position  # positions not written yet
    for i, layer in enumerate(model["layers"]):
        h = F.layer_norm(x, (WIDTH,), *layer["ln1"])
        q, k, v = F.linear(h, *layer["qkv"]).view(batch, 3, HEADS, head).unbind(1)
        keys[i].index_copy_(2, position, k.unsqueeze(2))
        values[i].index_copy_(2, position, v.unsqueeze(2))
        scores = (q.unsqueeze(2) @ keys[i].transpose(-1, -2)) / math.sqrt(head)  # batch, heads, 1, context
        attention = scores.masked_fill(future, float("-inf")).softmax(-1) @ values[i]
        x = x + F.linear(attention.reshape(batch, WIDTH), *layer["proj"])
        h = F.layer_norm(x, (WIDTH,), *layer["ln2"])
        x = x + F.linear(F.gelu(F.linear(h, *layer["fc"])), *layer["fc2"])
    logits = F.layer_norm(x, (WIDTH,), *model["ln_f"]) @ model["wte"].t()
    tokens.copy_(logits.argmax(-1))
    position.add_(1)
    return logits


def new_state(torch, batch, seed):
    generator = torch.Generator().manual_seed(seed + batch)
    shape = (LAYERS, batch, HEADS, CONTEXT, WIDTH // HEADS)
    return {"tokens": torch.randint(0, VOCAB, (batch,), generator=generator).cuda(),
            "position": torch.zeros(1, dtype=torch.long, device="cuda"),
            "keys": torch.zeros(shape, dtype=torch.half, device="cuda"),
            "values": torch.zeros(shape, dtype=torch.half, device="cuda")}


def reserved(torch, mode):
    torch.cuda.synchronize()
    return torch.cuda.memory_stats()["reserved_bytes.all.current"]  # refpool's install() reports its own


def run_mode(args):
    sys.path.insert(0, str(HERE))
    from common import import_refpool
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch
    if args.mode == "refpool":
        import_refpool()
        import refpool.torch
        refpool.torch.install()
    torch.backends.cuda.matmul.allow_tf32 = False
    model = build_model(torch, args.seed)
    states = {batch: new_state(torch, batch, args.seed) for batch in BATCHES}
    with torch.no_grad():
        side = torch.cuda.Stream()  # warm-up off the default stream, as torch.cuda.graph's docs say
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for batch in BATCHES:
                decode_step(torch, model, states[batch])
        torch.cuda.current_stream().wait_stream(side)
        for state in states.values():
            state["position"].zero_()
        torch.cuda.empty_cache()
        before = reserved(torch, args.mode)
        pool = torch.cuda.graph_pool_handle()
        graphs = {}
        for batch in BATCHES:  # largest first: the smaller ones reuse its freed memory
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                decode_step(torch, model, states[batch])
            graphs[batch] = graph
        pool_bytes = reserved(torch, args.mode) - before
        for state in states.values():  # capture ran nothing: start decoding from position 0
            state["position"].zero_()
        generated = {batch: [] for batch in BATCHES}
        seconds = {batch: [] for batch in BATCHES}
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for batch in BATCHES:
            graph, state = graphs[batch], states[batch]
            for _ in range(CONTEXT // REPLAYS - 1):  # warm-up replays, also generating tokens
                graph.replay()
                generated[batch].append(state["tokens"].clone())
            start.record()
            for _ in range(REPLAYS):
                graph.replay()
            end.record()
            end.synchronize()
            seconds[batch].append(start.elapsed_time(end) / 1e3 / REPLAYS)
            generated[batch].append(state["tokens"].clone())
        digests = {str(batch): hashlib.sha256(torch.stack(generated[batch]).cpu().numpy().tobytes()).hexdigest()[:16]
                   for batch in BATCHES}
    result = {"mode": args.mode, "pool_bytes": pool_bytes, "step_seconds": {str(b): seconds[b][0] for b in BATCHES},
              "digests": digests, "torch": torch.__version__, "device": torch.cuda.get_device_name()}
    if args.mode == "refpool":
        result["refpool_private_pool_reserved_bytes"] = torch.cuda.memory_stats()["refpool.private_pool_reserved_bytes"]
    with open(args.out, "w") as out:
        json.dump(result, out, indent=1)
    print(json.dumps(result))


def compare(args):
    """own and refpool, alternating, `rounds` times each; a table and one JSON."""
    env = dict(os.environ)
    if args.library:
        env["REFPOOL_LIBRARY"] = str(Path(args.library).resolve())
    runs = {"own": [], "refpool": []}
    out = Path(args.out)
    with tempfile.TemporaryDirectory() as scratch:  # each run's JSON; all of them end up in `out`
        for round_ in range(args.rounds):
            for mode in runs:
                path = Path(scratch) / f"{mode}-{round_}.json"
                subprocess.run([sys.executable, __file__, "--mode", mode, "--out", str(path), "--seed",
                                str(args.seed)], env=env, check=True)
                runs[mode].append(json.loads(path.read_text()))
    table = {}
    for mode, results in runs.items():
        table[mode] = {"pool_bytes": max(r["pool_bytes"] for r in results),
                       "step_seconds": {str(b): statistics.median(r["step_seconds"][str(b)] for r in results)
                                        for b in BATCHES},
                       "digests": results[0]["digests"]}
    identical = all(r["digests"] == table["own"]["digests"] for results in runs.values() for r in results)
    print(f"GPT-2 small decode step as CUDA graphs, batches {BATCHES} sharing one pool, {args.rounds} rounds "
          f"(median), {runs['own'][0]['device']}, torch {runs['own'][0]['torch']}")
    print(f"{'batch':>6} {'own us':>10} {'refpool us':>11} {'ratio':>7}")
    for batch in BATCHES:
        own, ref = table["own"]["step_seconds"][str(batch)], table["refpool"]["step_seconds"][str(batch)]
        print(f"{batch:>6} {own * 1e6:>10.1f} {ref * 1e6:>11.1f} {ref / own:>7.3f}")
    own_pool, ref_pool = table["own"]["pool_bytes"], table["refpool"]["pool_bytes"]
    print(f"pool memory: own {own_pool / 2**20:.1f} MiB, refpool {ref_pool / 2**20:.1f} MiB, "
          f"ratio {ref_pool / own_pool if own_pool else float('nan'):.3f}")
    print(f"generated tokens bitwise identical: {identical}")
    json.dump({"benchmark": "gpt2_decode_graphs", "batches": BATCHES, "rounds": args.rounds, "table": table,
               "runs": runs, "bitwise_identical": identical}, open(out, "w"), indent=1)
    return 0 if identical else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=("own", "refpool"))
    parser.add_argument("--out", required=True)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--library", help="librefpool.so to use (REFPOOL_LIBRARY)")
    args = parser.parse_args()
    if args.mode:
        run_mode(args)
        return 0
    return compare(args)


if __name__ == "__main__":
    sys.exit(main())

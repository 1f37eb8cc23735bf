#!/usr/bin/env python3
"""GPT-2 small training whose sequence length changes every step (batch 8, 128-512 tokens in steps of
32, drawn from the seed: a data loader that buckets by length), one mode per process (see common.py).
In refpool mode the step has no key: automatic plans recognise the lengths' request sequences by
content; refpool-planned names one key for all of them. Losses compared bitwise.
Usage: gpt2_train_varlen.py --mode MODE --out RESULT.json"""
import random

from common import Loop, parse_args, skip
from gpt2_train import gpt2_model

BENCHMARK = "gpt2_train_varlen"
BATCH = 8
LENGTHS = tuple(range(128, 513, 32))  # 13 lengths


def main():
    args = parse_args(__doc__.split("\n")[0], default_warmup=2 * len(LENGTHS), default_steps=3 * len(LENGTHS))
    try:
        import torch
        import transformers
    except ImportError as e:
        skip(args, BENCHMARK, f"needs torch and transformers ({e})")
    if not torch.cuda.is_available():
        skip(args, BENCHMARK, "PyTorch sees no CUDA device")
    from torch_harness import TorchFramework, loss_hex

    framework = TorchFramework(args.mode, args.seed)
    loop = Loop(args, BENCHMARK, framework)
    model = gpt2_model(transformers, "eager").cuda()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator(device="cuda").manual_seed(args.seed)
    draw = random.Random(args.seed)
    lengths = [draw.choice(LENGTHS) for _ in range(args.warmup + args.steps)]
    vocabulary = model.config.vocab_size

    def iteration(i):
        optimizer.zero_grad(set_to_none=True)
        tokens = torch.randint(0, vocabulary, (BATCH, lengths[i]), device="cuda", generator=generator)
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        return loss_hex(loss)

    loop.run(iteration, key=lambda i: "train")
    loop.finish(versions=dict(framework.versions(), transformers=transformers.__version__), batch=BATCH,
                lengths=lengths, total_measured_seconds=sum(loop.step_seconds))


if __name__ == "__main__":
    main()

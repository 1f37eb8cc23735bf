#!/usr/bin/env python3
"""GPT-2 small training whose sequence length changes every step (batch 8, 128-512 tokens in steps of
32, drawn from the seed: a data loader that buckets by length), one mode per process (see common.py).
In refpool mode the step has no key: automatic plans recognise the lengths' request sequences by
content; refpool-planned names one key for all of them. Losses compared bitwise.
Usage: gpt2_train_varlen.py --mode MODE --out RESULT.json"""
import random

from common import parse_args
from gpt2_train import run_training

BENCHMARK = "gpt2_train_varlen"
LENGTHS = tuple(range(128, 513, 32))  # 13 lengths


def main():
    args = parse_args(__doc__.split("\n")[0], default_warmup=2 * len(LENGTHS), default_steps=3 * len(LENGTHS))
    draw = random.Random(args.seed)
    lengths = [draw.choice(LENGTHS) for _ in range(args.warmup + args.steps)]
    run_training(args, BENCHMARK, "eager", lambda i: lengths[i], lengths=lengths)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""GPT-2 small training from random initialisation (transformers, batch 8 x 256 tokens, AdamW), one
mode per process (see common.py). Eager attention by default, for bitwise-comparable losses.
Usage: gpt2_train.py --mode MODE --out RESULT.json [--attention eager|sdpa]"""
import sys

from common import parse_args, torch_setup

BENCHMARK = "gpt2_train"
BATCH, TOKENS = 8, 256


def attention_choice():
    # An extra option of this script, taken out before common's parser sees the arguments.
    if "--attention" in sys.argv:
        at = sys.argv.index("--attention")
        choice = sys.argv[at + 1]
        del sys.argv[at:at + 2]
        return choice
    return "eager"


def gpt2_model(transformers, attention):
    config = transformers.GPT2Config()  # GPT-2 small: 12 layers, 768 wide, 1024 positions
    try:
        return transformers.GPT2LMHeadModel._from_config(config, attn_implementation=attention)
    except (AttributeError, TypeError):  # an older transformers: eager attention only
        return transformers.GPT2LMHeadModel(config)


def run_training(args, benchmark, attention, tokens_of, **extra):
    """Trains GPT-2 small for the loop's iterations, iteration i on BATCH x tokens_of(i) tokens, and
    writes the result (`extra` added to it)."""
    torch, transformers, framework, loop = torch_setup(args, benchmark, "transformers")
    from torch_harness import loss_hex
    model = gpt2_model(transformers, attention).cuda()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator(device="cuda").manual_seed(args.seed)
    vocabulary = model.config.vocab_size

    def iteration(i):
        optimizer.zero_grad(set_to_none=True)
        tokens = torch.randint(0, vocabulary, (BATCH, tokens_of(i)), device="cuda", generator=generator)
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        return loss_hex(loss)

    loop.run(iteration, key=lambda i: "train")
    loop.finish(versions=dict(framework.versions(), transformers=transformers.__version__), batch=BATCH,
                attention=attention, **extra)


def main():
    attention = attention_choice()
    args = parse_args(__doc__.split("\n")[0])
    run_training(args, BENCHMARK, attention, lambda i: TOKENS, tokens=TOKENS)


if __name__ == "__main__":
    main()

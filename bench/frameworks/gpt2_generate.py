#!/usr/bin/env python3
"""GPT-2 small generation with a KV cache (transformers generate, greedy, 32 new tokens) at a random
batch (1-16) and prompt length (16-256 tokens) per request, drawn from the seed: serving, where
request shapes rarely repeat. One request per step, one mode per process (see common.py). Outputs
(the generated token ids) compared bitwise.
Usage: gpt2_generate.py --mode MODE --out RESULT.json"""
import random

from common import digest, parse_args, torch_setup
from gpt2_train import gpt2_model

BENCHMARK = "gpt2_generate"
NEW_TOKENS = 32


def main():
    args = parse_args(__doc__.split("\n")[0], default_warmup=8, default_steps=40)
    torch, transformers, framework, loop = torch_setup(args, BENCHMARK, "transformers")
    model = gpt2_model(transformers, "eager").cuda().eval()
    generator = torch.Generator(device="cuda").manual_seed(args.seed)
    draw = random.Random(args.seed)
    shapes = [(draw.randint(1, 16), draw.randint(16, 256)) for _ in range(args.warmup + args.steps)]
    vocabulary = model.config.vocab_size

    def iteration(i):
        batch, prompt = shapes[i]
        ids = torch.randint(0, vocabulary, (batch, prompt), device="cuda", generator=generator)
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                                 min_new_tokens=NEW_TOKENS, do_sample=False, use_cache=True,
                                 pad_token_id=model.config.eos_token_id)
        return digest(out.cpu().numpy().tobytes())

    loop.run(iteration, key=lambda i: "generate")
    loop.finish(versions=dict(framework.versions(), transformers=transformers.__version__), shapes=shapes,
                new_tokens=NEW_TOKENS, total_measured_seconds=sum(loop.step_seconds))


if __name__ == "__main__":
    main()

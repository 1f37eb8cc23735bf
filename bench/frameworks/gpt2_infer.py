#!/usr/bin/env python3
"""GPT-2 small inference (transformers, random initialisation, batch 8, no KV cache) at six sequence
lengths in turn, one mode per process (see common.py). One iteration = one forward pass at one
length; planned mode has one plan key per length. Outputs compared bitwise: a digest of the last
position's logits (which depend on every position of every layer) and of the sum of all logits.
Usage: gpt2_infer.py --mode MODE --out RESULT.json"""
import statistics

from common import digest, parse_args, torch_setup
from gpt2_train import gpt2_model

BENCHMARK = "gpt2_infer"
BATCH = 8
LENGTHS = (64, 128, 256, 384, 512, 1024)


def main():
    args = parse_args(__doc__.split("\n")[0], default_warmup=3 * len(LENGTHS), default_steps=8 * len(LENGTHS))
    torch, transformers, framework, loop = torch_setup(args, BENCHMARK, "transformers")
    model = gpt2_model(transformers, "eager").cuda().eval()
    generator = torch.Generator(device="cuda").manual_seed(args.seed)
    inputs = {n: torch.randint(0, model.config.vocab_size, (BATCH, n), device="cuda", generator=generator)
              for n in LENGTHS}

    def length(i):
        return LENGTHS[i % len(LENGTHS)]

    def iteration(i):
        with torch.no_grad():
            logits = model(input_ids=inputs[length(i)], use_cache=False).logits
            last = logits[:, -1, :].float().cpu().numpy().tobytes()
            total = logits.sum(dtype=torch.float64).item()  # on the device: 1.6 GB of logits at 1024
        return digest(last + float(total).hex().encode())

    loop.run(iteration, key=lambda i: f"infer-{length(i)}")
    per_length = {str(n): statistics.median(loop.step_seconds[j] for j in range(len(loop.step_seconds))
                                           if length(args.warmup + j) == n) for n in LENGTHS}
    loop.finish(versions=dict(framework.versions(), transformers=transformers.__version__), batch=BATCH,
                median_step_seconds_by_length=per_length)


if __name__ == "__main__":
    main()

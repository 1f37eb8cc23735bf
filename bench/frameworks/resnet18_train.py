#!/usr/bin/env python3
"""ResNet-18 training on synthetic images (torchvision, batch 64, 224x224, SGD with momentum), one
mode per process (see common.py). Usage: resnet18_train.py --mode MODE --out RESULT.json"""
from common import parse_args, torch_setup

BENCHMARK = "resnet18_train"
BATCH = 64


def main():
    args = parse_args(__doc__.split("\n")[0])
    torch, torchvision, framework, loop = torch_setup(args, BENCHMARK, "torchvision")
    from torch_harness import loss_hex
    model = torchvision.models.resnet18(num_classes=1000).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    generator = torch.Generator(device="cuda").manual_seed(args.seed)

    def iteration(i):
        optimizer.zero_grad(set_to_none=True)
        images = torch.randn(BATCH, 3, 224, 224, device="cuda", generator=generator)
        labels = torch.randint(0, 1000, (BATCH,), device="cuda", generator=generator)
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        return loss_hex(loss)

    loop.run(iteration, key=lambda i: "train")
    loop.finish(versions=framework.versions(), batch=BATCH)


if __name__ == "__main__":
    main()

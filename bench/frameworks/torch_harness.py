"""PyTorch side of the framework benchmarks: mode setup (before CUDA starts), determinism, and the
figures of each allocator."""
import contextlib
import os

from common import import_refpool, refpool_driver_calls, refpool_figures


class TorchFramework:
    def __init__(self, mode, seed):
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
        import torch
        self.torch = torch
        self.mode = mode
        if mode != "own":
            import_refpool()
            import refpool.torch
            self.refpool_torch = refpool.torch
            refpool.torch.install()  # before anything initialises CUDA
        torch.manual_seed(seed)
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False  # needs cacheInfo, which PyTorch's hook lacks
        torch.backends.cudnn.deterministic = True
        self.device = torch.device("cuda")

    def step_context(self, key):
        if self.mode == "own":
            return contextlib.nullcontext()
        return self.refpool_torch.step(plan=key if self.mode == "refpool-planned" else None)

    def synchronize(self):
        self.torch.cuda.synchronize()

    def used_bytes(self):
        free, total = self.torch.cuda.mem_get_info()
        return total - free

    def driver_calls(self):
        if self.mode == "own":
            return self.torch.cuda.memory_stats()["num_device_alloc"]
        return refpool_driver_calls()

    def allocator_figures(self):
        if self.mode == "own":
            stats = self.torch.cuda.memory_stats()
            return {"peak_live_bytes": stats["allocated_bytes.all.peak"],
                    "peak_held_bytes": stats["reserved_bytes.all.peak"],
                    "held_bytes": stats["reserved_bytes.all.current"],
                    "num_device_alloc": stats["num_device_alloc"]}
        return refpool_figures()

    def versions(self):
        torch = self.torch
        return {"torch": torch.__version__, "cuda": torch.version.cuda, "device": torch.cuda.get_device_name()}


def loss_hex(loss):
    """A loss as an exact string (float.hex), so modes compare bitwise."""
    return float(loss.detach().float().item()).hex()

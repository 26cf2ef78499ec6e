"""DDP communication hooks backed by cohort's codecs (compressed_all_reduce in C++).

    model.register_comm_hook(None, cohort_torch.hooks.bf16)
    model.register_comm_hook(None, cohort_torch.hooks.top_k(0.01))

Each averages the float32 gradient bucket across the ranks of the DDP model's process group
(which must be a cohort group, or None for the default one) and returns a future of it.
"""
import torch
import torch.distributed as dist

import _cohort_torch

__all__ = ["fp16", "bf16", "int8", "top_k"]


def _group(state):
    return state if state is not None else dist.distributed_c10d._get_default_group()


def _run(state, bucket, codec, ratio=0.01, error_feedback=False):
    buffer = bucket.buffer()
    if buffer.dtype != torch.float32:
        raise TypeError(f"cohort hooks compress float32 gradients, not {buffer.dtype}")
    work = _cohort_torch.compressed_allreduce(
        _group(state), buffer, codec, ratio, error_feedback, bucket.index())
    return work.get_future().then(lambda fut: fut.value()[0])


def fp16(state, bucket):
    """Averages the bucket with an fp16 ring (fp32 accumulation)."""
    return _run(state, bucket, "fp16")


def bf16(state, bucket):
    """Averages the bucket with a bf16 ring (fp32 accumulation)."""
    return _run(state, bucket, "bf16")


def int8(state, bucket):
    """Averages the bucket with int8 per-block quantization (reduce-scatter, then all-gather)."""
    return _run(state, bucket, "int8")


def top_k(ratio, error_feedback=True):
    """A hook sending the largest `ratio` of each bucket; with error feedback (one residual
    per bucket, kept across steps) what is dropped is sent later."""
    if not 0 < ratio <= 1:
        raise ValueError(f"top_k: ratio must be in (0, 1], not {ratio}")

    def hook(state, bucket):
        return _run(state, bucket, "top_k", ratio, error_feedback)

    hook.__name__ = f"top_k_{ratio}"
    return hook

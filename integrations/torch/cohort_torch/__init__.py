"""cohort as a torch.distributed backend.

Importing this package registers the backend "cohort"::

    import cohort_torch, torch.distributed as dist
    dist.init_process_group("cohort")          # under torchrun, mpirun or cohort-run

CPU tensors; shared memory when every rank is on this host, TCP otherwise
(COHORT_TRANSPORT=shm|tcp decides instead). DDP communication hooks: cohort_torch.hooks.
"""
import torch.distributed as dist

import _cohort_torch

from . import hooks  # noqa: F401

__all__ = ["hooks", "transport"]


def _create(store, rank, size, timeout):
    return _cohort_torch.create_process_group(store, rank, size, timeout)


def transport(group=None):
    """The transport of a cohort process group: "shm" or "tcp"."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    return _cohort_torch.transport(pg)


if "COHORT" not in dist.Backend._plugins:
    dist.Backend.register_backend("cohort", _create)

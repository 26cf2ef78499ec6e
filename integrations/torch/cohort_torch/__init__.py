"""cohort as a torch.distributed backend.

Importing this package registers the backend "cohort"::

    import cohort_torch, torch.distributed as dist
    dist.init_process_group("cohort")          # under torchrun, mpirun or cohort-run

CPU tensors; shared memory when every rank is on this host, TCP otherwise
(COHORT_TRANSPORT=shm|tcp decides instead). DDP communication hooks: cohort_torch.hooks.
"""
import os

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


# torch's env:// reads RANK and WORLD_SIZE (and MASTER_ADDR, MASTER_PORT); other launchers
# name them otherwise. Where RANK is unset, take them from cohort-run, Open MPI, PMI or Slurm.
_LAUNCHERS = [("COHORT_RANK", "COHORT_SIZE", "COHORT_LOCAL_RANK", "COHORT_LOCAL_SIZE"),
              ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
               "OMPI_COMM_WORLD_LOCAL_SIZE"),
              ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
              ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", None)]
if "RANK" not in os.environ:
    for _rank, _size, _local_rank, _local_size in _LAUNCHERS:
        if _rank in os.environ and _size in os.environ:
            os.environ["RANK"] = os.environ[_rank]
            os.environ["WORLD_SIZE"] = os.environ[_size]
            for _theirs, _ours in ((_local_rank, "LOCAL_RANK"), (_local_size, "LOCAL_WORLD_SIZE")):
                if _theirs and _theirs in os.environ:
                    os.environ.setdefault(_ours, os.environ[_theirs])
            break

if "COHORT" not in dist.Backend._plugins:
    dist.Backend.register_backend("cohort", _create)

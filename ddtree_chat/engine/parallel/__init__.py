"""Tensor parallelism on one machine: the group and its collectives (group.py), the per-tensor shard
table (shards.py), the worker processes (workers.py) and their command loop (serve.py). Never imports the
engine: a worker is handed the function that loads its rank."""

from .group import SINGLE, TPGroup, init_group, rank_device
from .serve import Rank, serve
from .shards import shard_dim
from .workers import Workers, abort_on_lost_rank, checkpoint_fingerprint, join_group

__all__ = ["SINGLE", "Rank", "TPGroup", "Workers", "abort_on_lost_rank", "checkpoint_fingerprint", "init_group",
           "join_group", "rank_device", "serve", "shard_dim"]

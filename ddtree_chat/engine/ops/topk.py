"""The drafter's per-position candidates (docs/architecture.md, the tree): the k most likely tokens of each row and their
log-probabilities, i.e. topk(log_softmax(x)). Fused on GPU (ops/triton_topk.py): the log-softmax over the
vocabulary and the selection in two launches instead of torch's log-softmax passes and its one-block-per-row
top-k (gatherTopK, the draft's largest kernel before this one)."""

from __future__ import annotations

import torch

from .registry import define


def topk_logprobs_ref(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [R, V] logits (or log-probs: log_softmax is idempotent) -> (values [R, k] float32 log-probs,
    descending; ids [R, k] int64)."""
    return torch.log_softmax(x.float(), dim=-1).topk(k, dim=-1)


TOPK_LOGPROBS = define("topk_logprobs", topk_logprobs_ref)


def topk_logprobs(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    return TOPK_LOGPROBS(x, k)

"""The target's choice at each node: the argmax at T = 0, else a sample from the tempered, top-p filtered
distribution whose randomness is a function of (seed, position, token) alone.

Why position-keyed: a tree node and the plain decoding step at the same position see the same logits bit for
bit (row-invariant kernels, docs/exactness.md); if they also see the same random draw they choose the same
token, so at T > 0 too every mode emits exactly plain decoding's tokens for a seed, not only its distribution.
A stream generator would not do: a tree consumes its draws by node count, an AR step one row at a time.

The draw is the exponential race: the argmax over candidates of w / E with E ~ Exp(1), here E = -log(u) and u a
32-bit hash of (seed, position, token), in float64 (a near tie of two ratios is then ~1e-16 away)."""

from __future__ import annotations

import torch

from .ops import row_cumsum

NUCLEUS_CANDIDATES = (64, 1024)  # top-p looks among this many likeliest tokens first, then a sort of all V
_M32 = 0xFFFFFFFF
_MIX = 0x45D9F3B  # the 32-bit hash's multiplier (< 2**31: a product with a 32-bit value stays inside int64)
_SPREAD = 0x9E3779B1  # a token id's multiplier before it meets the row's hash (ids < 2**31: stays inside int64)


def _mix32(h: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash of int64 tensors holding 32-bit values (each input bit moves ~half the output's)."""
    h = h ^ (h >> 16)
    h = (h * _MIX) & _M32
    h = h ^ (h >> 16)
    h = (h * _MIX) & _M32
    return h ^ (h >> 16)


def race_noise(seed: torch.Tensor, positions: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """seed [] int64 (>= 0), positions [N] (each row's position: the token it chooses goes there), ids [N, k] token
    ids -> [N, k] float64 Exp(1) draws, each a function of (seed, position, token) alone."""
    row = _mix32(_mix32((seed & _M32) ^ (seed >> 32)) ^ (positions.long() & _M32))
    h = _mix32(row[:, None] ^ ((ids.long() * _SPREAD) & _M32))
    return -torch.log((h.double() + 0.5) * 2.0**-32)  # NOTE: u in (0, 1): E > 0 always


def draw(weights: torch.Tensor, seed: torch.Tensor, positions: torch.Tensor,
         ids: torch.Tensor | None = None) -> torch.Tensor:
    """weights [N, k] >= 0 (unnormalised), ids [N, k] the tokens they weigh (None: column j is token j) -> [N]
    column indices drawn in proportion to the weights. No host sync: a round can still run ahead."""
    if ids is None:
        ids = torch.arange(weights.shape[-1], device=weights.device).expand_as(weights)
    return (weights.double() / race_noise(seed, positions, ids)).argmax(-1)


def nucleus(probs: torch.Tensor, top_p: torch.Tensor | float) -> tuple[torch.Tensor, torch.Tensor]:
    """probs [N, V] -> (kept [N, k], ids [N, k]): the likeliest tokens in descending order, each one's probability
    where the tokens likelier than it hold at most top_p of the mass, else 0 (ties at the edge all in or all out:
    which of two equal probabilities a sort puts first must not matter)."""
    # NOTE: the nucleus lies within the top k once the tokens likelier than the k-th hold more than top_p:
    # sorting k of V tokens, not V (a full sort cost a CPU 0.5 ms a row at V = 8192); on a GPU that check would
    # make the host wait (a round could not run ahead), and sorting V costs little there
    for k in NUCLEUS_CANDIDATES if probs.device.type == "cpu" else ():
        if k < probs.shape[-1]:
            sp, si = probs.topk(k, -1)
            above = _likelier_mass(sp)
            if bool((above[:, -1] > top_p).all()):
                break
    else:
        sp, si = probs.sort(-1, descending=True)
        above = _likelier_mass(sp)
    return sp.masked_fill(above > top_p, 0.0), si


def _likelier_mass(sp: torch.Tensor) -> torch.Tensor:
    """sp [N, k] descending -> [N, k]: the mass of the tokens strictly likelier than each (a tie's first's)."""
    before = row_cumsum(sp) - sp  # NOTE: not torch.cumsum: on CUDA its rounding follows the launch's row count
    first = torch.searchsorted(-sp, -sp)  # NOTE: -sp ascends; the leftmost equal value: the tie's first
    return before.gather(-1, first)


def kind(temperature: float, top_p: float) -> str:
    """Which choice a round's verify makes: "" the argmax (T = 0), "all" a draw over every token, "top_p" a draw
    over the nucleus (each a recorded program of its own: the branch cannot read device values)."""
    return "" if temperature <= 0 else "top_p" if top_p < 1 else "all"


def sample(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor | None, seed: torch.Tensor,
           positions: torch.Tensor) -> torch.Tensor:
    """logits [N, V] -> [N] tokens drawn from the tempered (temperature [1] float32), top-p filtered (top_p [1]
    float32; None: no filter) distribution, by (seed [] int64, positions [N]: where each node's token goes).
    Device tensors throughout: a recorded program reads this reply's values (NOTE: a tensor divisor, never a
    Python float: CUDA divides by a host scalar as a product with its reciprocal, which rounds differently)."""
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p is None:
        return draw(probs, seed, positions)
    kept, ids = nucleus(probs, top_p)
    return ids.gather(-1, draw(kept, seed, positions, ids)[:, None]).squeeze(-1)


def target_choice(logits: torch.Tensor, temperature: float, top_p: float, seed: torch.Tensor | None,
                  positions: torch.Tensor | None) -> torch.Tensor:
    """logits [N, V] -> the target's token at each node: the argmax at T = 0, else `sample` with these values (the
    choice a recorded verify makes, computed outside one: the reply's first token)."""
    if temperature <= 0:
        return logits.argmax(-1)
    value = lambda v: torch.tensor([v], dtype=torch.float32, device=logits.device)  # noqa: E731
    return sample(logits, value(temperature), value(top_p) if kind(temperature, top_p) == "top_p" else None, seed,
                  positions)

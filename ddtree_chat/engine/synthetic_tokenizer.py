"""A small but real Kimi-format tokenizer (tiktoken.model + tokenizer_config.json) for synthetic checkpoints."""

from __future__ import annotations

import base64
import json
import random
from collections import Counter
from pathlib import Path

import regex

from ddtree_chat.engine.tokenizer import KIMI_PATTERN_V1, kimi_special_names

# Training text: prose, code, numbers and several scripts, so merges cover multi-byte UTF-8 too.
SAMPLE_TEXT = """\
The quick brown fox jumps over the lazy dog. It's the dog's day; they're sure we'll see what I'd do.
Speculative decoding drafts several tokens and the target model verifies them in one forward pass.
A tree of drafts lets the verifier accept the longest prefix that matches what it would have sampled.
When the draft is right, the user sees many tokens per step; when it is wrong, nothing is lost but time.
Tokenizers split text into pieces, then merge byte pairs by rank until no known pair is left.

def encode(text: str, ranks: dict[bytes, int]) -> list[int]:
    parts = [bytes([b]) for b in text.encode("utf-8")]
    while len(parts) > 1:
        pairs = [(ranks.get(a + b, 1 << 30), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))]
        rank, i = min(pairs)
        if rank == 1 << 30:
            break
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    return [ranks[p] for p in parts]

class KVCache:
    def __init__(self, layers, heads, dim):
        self.k = [[0.0] * dim for _ in range(layers * heads)]
        self.length = 0  # tokens committed so far

for (int i = 0; i < n; ++i) { out[i] = a[i] * scale + b[i]; }  // fused multiply-add
{"role": "user", "content": "Hello, world!", "id": 12345, "ok": true, "score": 0.875}
SELECT name, COUNT(*) FROM messages WHERE role = 'assistant' GROUP BY name ORDER BY 2 DESC;

Numbers: 0 1 2 3 42 100 2024 3.14159 1,000,000 -7 1e-5 0xFF 255 65536 163840.
深度学习模型通过大量数据进行训练，推测解码可以显著提高生成速度。我们今天一起学习中文。
日本語のテキストも少し含めます。東京は日本の首都です。ひらがなとカタカナ、そして漢字。
한국어 문장도 포함합니다. 서울은 대한민국의 수도입니다.
Привет, мир! Это пример текста на русском языке для обучения токенизатора.
Ελληνικά: καλημέρα κόσμε. العربية: مرحبا بالعالم. עברית: שלום עולם. हिन्दी: नमस्ते दुनिया।
Emoji: 😀 😃 😄 🎉 🚀 👍🏽 👩‍💻 👨‍👩‍👧‍👦 🇯🇵 ❤️ ✨ — “quotes” and ‘apostrophes’ … café naïve façade résumé.
Math: ∑ᵢ xᵢ² ≤ ∞, α + β = γ, ∫₀¹ f(x) dx, √2 ≈ 1.414, π ≠ 3.
camelCaseIdentifier snake_case_name SCREAMING_CASE PascalCase kebab-case HTTPServerError getURLPath
\tindented\twith\ttabs
    four spaces    and    more      spaces
line one\r\nline two\r\n\r\nline four
"""


def _train(n_ranks: int, seed: int) -> list[bytes]:
    """Ranks 0..255 are the single bytes (order set by seed), then byte-pair-count merges."""
    rng = random.Random(seed)
    order = list(range(256))
    rng.shuffle(order)
    tokens = [bytes((b,)) for b in order]
    rank = {t: i for i, t in enumerate(tokens)}
    words = Counter(p.encode() for p in regex.findall(KIMI_PATTERN_V1, SAMPLE_TEXT, flags=regex.V1))
    split = {w: [w[i:i + 1] for i in range(len(w))] for w in words}
    while len(tokens) < n_ranks:
        counts: Counter = Counter()
        for w, parts in split.items():
            for pair in zip(parts, parts[1:]):
                counts[pair] += words[w]
        if not counts:
            break
        # NOTE: ties broken by rank, so the result depends only on the seed
        a, b = max(counts, key=lambda p: (counts[p], -rank[p[0]], -rank[p[1]]))
        if a + b not in rank:
            rank[a + b] = len(tokens)
            tokens.append(a + b)
        for w, parts in split.items():
            i, out = 0, []
            while i < len(parts):
                if i + 1 < len(parts) and parts[i] == a and parts[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(parts[i])
                    i += 1
            split[w] = out
    while len(tokens) < n_ranks:  # the sample is exhausted: pad with concatenations of known tokens
        new = rng.choice(tokens) + rng.choice(tokens)
        if new not in rank and len(new) <= 16:
            rank[new] = len(tokens)
            tokens.append(new)
    return tokens


def write_tiktoken_tokenizer(out_dir, n_ranks: int = 512, seed: int = 0) -> None:
    """Write tiktoken.model and tokenizer_config.json (Kimi's layout; specials at n_ranks..n_ranks+255)."""
    if n_ranks < 256:
        raise ValueError(f"n_ranks must be at least 256 (the single bytes), got {n_ranks}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokens = _train(n_ranks, seed)
    (out / "tiktoken.model").write_text(
        "".join(f"{base64.b64encode(t).decode()} {r}\n" for r, t in enumerate(tokens)), encoding="ascii")
    added = {
        str(i): {"content": name, "lstrip": False, "normalized": False, "rstrip": False,
                 "single_word": False, "special": True}
        for i, name in kimi_special_names(n_ranks).items()
    }
    config = {
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>",
                                      "<|im_middle|>"],
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
        "clean_up_tokenization_spaces": False,
        "model_max_length": 262144,
        "tokenizer_class": "TikTokenTokenizer",
        # NOTE: Kimi's configs point at their Python tokenizer; we keep the field and never run it.
        "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n",
                                               encoding="utf-8")

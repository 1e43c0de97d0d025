"""Data: the Python standard library of the interpreter running this script (PSF licence), split by file
into train / val / test; raw source files plus chat pairs (docstring -> function) built with `ast`;
a byte-level BPE trained on the train split with Kimi's special tokens by name.

With a distilled dataset (distil_data.py, issue 31) the chat pairs are the teacher's kept answers instead
(split by prompt id), the docstring->code pairs are left out, the stdlib source is cut to a share of the
train tokens, and a loss mask per token (0 on the user's turn) rides along each token stream; the
requested function's name on the answer's `def` line can weigh more there (name_weight)."""

from __future__ import annotations

import ast
import bisect
import hashlib
import itertools
import json
import operator
import random
import re
import shutil
import sys
import sysconfig
import textwrap
from pathlib import Path

import numpy as np
import torch

from ...engine.tokenizer import KIMI_PATTERN
from ...engine.tokenizer import kimi_special_names as special_names
from .common import BPE_VOCAB, CHAT_TEMPLATE, SEED, write_json
from .rename import DEFAULT_POOL, rename_copies

MAX_FILE_BYTES = 200_000


def stdlib_files(limit: int | None = None) -> tuple[Path, list[str]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root).as_posix()
        if rel.startswith(("site-packages/", "dist-packages/")) or "/__pycache__/" in rel:
            continue
        try:
            if p.stat().st_size > MAX_FILE_BYTES:
                continue
        except OSError:
            continue
        files.append(rel)
    if limit:
        files = files[:: max(1, len(files) // limit)][:limit]
    return root, files


def split_of(rel: str) -> str:
    h = int(hashlib.sha256(rel.encode()).hexdigest()[:8], 16) % 100
    return "val" if h < 3 else ("test" if h < 6 else "train")


def chat_pairs(source: str) -> list[tuple[str, str]]:
    """(user, assistant) pairs: user = signature + docstring, assistant = the function's code."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        doc = ast.get_docstring(node)
        if not doc or len(doc) < 20:
            continue
        seg = ast.get_source_segment(source, node)
        if not seg or seg.count("\n") < 2 or len(seg) > 4000:
            continue
        # Include decorators? No: the function statement alone, dedented from its first line's indent.
        first = source.splitlines()[node.lineno - 1]
        indent = len(first) - len(first.lstrip())
        code = textwrap.dedent(" " * indent + seg)
        try:
            args = ast.unparse(node.args)
        except Exception:
            continue
        prefix = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
        user = f"Write a Python function `{prefix} {node.name}({args})`.\n\n{doc.strip()}"
        out.append((user, code))
    return out


def read_sources(limit: int | None = None, with_pairs: bool = True) -> dict:
    """The stdlib's files and, with_pairs, their docstring -> function chat pairs (a distilled data set replaces
    them: not built then, the slowest part of the reading)."""
    root, files = stdlib_files(limit)
    docs = {"train": [], "val": [], "test": []}
    pairs = {"train": [], "val": [], "test": []}
    kept = []
    for rel in files:
        try:
            text = (root / rel).read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if "\x00" in text:
            continue
        kept.append(rel)
        s = split_of(rel)
        docs[s].append(text)
        if with_pairs:
            pairs[s].extend((rel, u, a) for u, a in chat_pairs(text))
    meta = {"python": sys.version, "stdlib": str(root), "n_files": len(kept),
            "file_list_sha256": hashlib.sha256("\n".join(kept).encode()).hexdigest(),
            "split_files": {k: len(v) for k, v in docs.items()},
            "split_chat_pairs": {k: len(v) for k, v in pairs.items()} if with_pairs else None,
            "split_chars": {k: sum(map(len, v)) for k, v in docs.items()}}
    return {"docs": docs, "pairs": pairs, "meta": meta, "files": kept}


def train_tokenizer(texts: list[str], out_dir: Path, vocab: int = BPE_VOCAB) -> None:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(KIMI_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[], show_progress=False, min_frequency=2)
    tok.train_from_iterator(texts, trainer=trainer)
    n_ranks = tok.get_vocab_size()
    names = special_names(n_ranks)
    tok.add_special_tokens([AddedToken(names[i], special=True, normalized=False) for i in sorted(names)])
    assert all(tok.token_to_id(n) == i for i, n in names.items())
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    write_tokenizer_config(out_dir, n_ranks)


def write_tokenizer_config(out_dir: Path, n_ranks: int) -> None:
    names = special_names(n_ranks)
    write_json(out_dir / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "[BOS]", "eos_token": "[EOS]",
        "unk_token": "[UNK]", "pad_token": "[PAD]", "model_max_length": 32768,
        "added_tokens_decoder": {str(i): {"content": n, "special": True, "lstrip": False, "rstrip": False,
                                          "normalized": False, "single_word": False} for i, n in names.items()}})
    (out_dir / "chat_template.jinja").write_text(CHAT_TEMPLATE)


DEF_NAME = re.compile(r"\bdef\s+(\w+)\s*\(")  # one pattern for every requested name: compiled once, not per pair


def span_weights(offsets: list[tuple[int, int]], spans: list[tuple[int, int]], weight: int) -> list[int]:
    """Per token, weight where its characters [lo, hi) overlap a span [start, end), else 1. The tokenizer's
    offsets ascend (lo and hi each), so the overlapping tokens are one run, found by bisection."""
    out = [1] * len(offsets)
    for start, end in spans:
        lo = bisect.bisect_right(offsets, start, key=operator.itemgetter(1))
        for i in range(lo, bisect.bisect_left(offsets, end, lo, key=operator.itemgetter(0))):
            out[i] = weight
    return out


class Encoder:
    """Encodes text pieces with the trained BPE; specials are inserted by id (as the engine's render_chat)."""

    def __init__(self, tok_dir: Path):
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
        self.tok.encode_special_tokens = True
        self.sp = {n: self.tok.token_to_id(n) for n in ("[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>",
                                                        "<|im_middle|>", "<think>", "</think>", "[UNK]")}
        self.n_ranks = self.tok.token_to_id("[BOS]")
        self.vocab = self.tok.get_vocab_size()
        self.role = {r: self.plain([r])[0] for r in ("user", "assistant")}  # the chat template's role names

    def plain(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=False)]

    def chat_prompt(self, user_ids: list[int]) -> list[int]:
        s, role = self.sp, self.role
        return ([s["<|im_user|>"]] + role["user"] + [s["<|im_middle|>"]] + user_ids + [s["<|im_end|>"],
                s["<|im_assistant|>"]] + role["assistant"] + [s["<|im_middle|>"], s["<think>"]])

    def requests(self, texts: list[str]) -> list[list[int]]:
        """Each user text as a one-turn chat prompt (the held-out requests' form)."""
        return [self.chat_prompt(ids) for ids in self.plain(texts)]

    def encode_split(self, docs: list[str], pairs: list[tuple[str, str, str]], with_masks: bool = False,
                     name_weight: int = 1):
        """(sequences, prompts) or, with_masks, (sequences, prompts, masks): a mask is the weight of each
        token's prediction (source files whole; a chat's reply, from </think> on, not its prompt): 1, or
        name_weight on the tokens of the requested function's name where the answer defines it."""
        from .copy_probe import REQUESTED

        s = self.sp
        seqs = [ids + [s["[EOS]"]] for ids in self.plain(docs)]
        masks = [[1] * len(q) for q in seqs]
        users = self.plain([u for _, u, _ in pairs])
        codes = self.tok.encode_batch([a for _, _, a in pairs], add_special_tokens=False)
        prompts = []
        for (rel, u, a), ui, code in zip(pairs, users, codes):
            prompt = self.chat_prompt(ui)
            reply = [s["</think>"]] + code.ids + [s["<|im_end|>"]]
            seqs.append(prompt + reply)
            asked = REQUESTED.search(u) if name_weight != 1 else None
            names = [m.span(1) for m in DEF_NAME.finditer(a) if m.group(1) == asked.group(1)] if asked else []
            weights = span_weights(code.offsets, names, name_weight) if names else [1] * len(code.ids)
            masks.append([0] * len(prompt) + [1] + weights + [1])
            prompts.append((rel, u, a, prompt))
        return (seqs, prompts, masks) if with_masks else (seqs, prompts)


def concat(lists: list[list[int]], dtype) -> torch.Tensor:
    """The lists joined into one tensor of dtype (a numpy dtype): numpy reads the ints, not a Python loop."""
    return torch.from_numpy(np.fromiter(itertools.chain.from_iterable(lists), dtype, sum(map(len, lists))))


def reuse_tokenizer(src_dir: Path, out_dir: Path) -> None:
    """Copy an existing model's tokenizer files (e.g. the shipped target's) instead of training one."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(src_dir / f, out_dir / f)


def distil_sources(src: dict, distil: Path | list[Path], code_share: float, log=print, renames: int = 0,
                   rename_pool: str = DEFAULT_POOL) -> dict:
    """src with its chat pairs replaced by the distilled answers of one or several distil_data.py dirs (of one
    teacher file; split by prompt id), `renames` name-swapped copies of each train function answer added
    (rename.py, new names from rename_pool), and each split's source files cut (a seeded choice of whole
    files, at least one) to about code_share of that split's characters."""
    from .distil_data import PROMPTS, load_dataset, read_jsonl

    dirs = [Path(d) for d in (distil if isinstance(distil, (list, tuple)) else [distil])]
    sets = [load_dataset(d) for d in dirs]
    teachers = {m["teacher_sha256"] for m, _ in sets}
    if len(teachers) > 1:
        raise ValueError(f"the distilled data sets {[str(d) for d in dirs]} come from different teacher files")
    meta, recs = sets[0][0], [r for _, rs in sets for r in rs]
    pairs = {"train": [], "val": [], "test": []}
    for r in recs:
        pairs[split_of(r["id"])].append((r["id"], r["user"], r["answer"]))
    names = {p["id"]: p.get("name") for d in dirs for p in read_jsonl(d / PROMPTS) if p["kind"] == "function"}
    copies = rename_copies(pairs["train"], names, renames, SEED, rename_pool)
    pairs["train"] += copies
    docs, cut = {}, {}
    for split in ("train", "val", "test"):
        # Each split keeps source in the same proportion, so that val loss weighs chat and code as train does.
        chat_chars = sum(len(u) + len(a) for _, u, a in pairs[split])
        budget = code_share / max(1e-9, 1 - code_share) * chat_chars
        files = list(src["docs"][split])
        random.Random(SEED).shuffle(files)
        kept, n = [], 0
        for text in files:
            if kept and n >= budget:
                break
            kept.append(text)
            n += len(text)
        docs[split], cut[split] = kept, (len(kept), len(files), n)
    dmeta = dict(src["meta"], split_chat_pairs={k: len(v) for k, v in pairs.items()},
                 split_chars={k: sum(map(len, v)) for k, v in docs.items()},
                 distil={"dir": " ".join(map(str, dirs)), "teacher": meta.get("teacher"), "teacher_sha256": meta["teacher_sha256"],
                         "seed": meta["seed"], "answers": len(recs), "code_share": code_share,
                         "renames": renames, "rename_pool": rename_pool, "renamed_copies": len(copies),
                         "source_files": {k: v[0] for k, v in cut.items()}})
    log(f"data: distilled chat pairs {dmeta['split_chat_pairs']} from {' + '.join(map(str, dirs))} (train: {len(copies)} name-swapped "
        f"copies); source files kept (of all, chars): {cut} at share {code_share}")
    return dict(src, docs=docs, pairs=pairs, meta=dmeta)


def prepare(out: Path, limit: int | None = None, log=print, tokenizer_from: Path | None = None,
            distil: Path | list[Path] | None = None, code_share: float = 0.25, renames: int = 0, name_weight: int = 1,
            rename_pool: str = DEFAULT_POOL) -> dict:
    """Writes out/tokenizer/ and out/data.pt (token streams per split, held-out prompts, metadata).
    tokenizer_from: a model dir whose tokenizer is reused (drafter-only retraining against an existing
    target); otherwise a BPE is trained on the train split. distil: distil_data.py output dir(s) whose kept
    answers are the chat pairs (see the module docstring). name_weight: the train split's weight of the
    requested name's tokens on a `def` line (validation stays unweighted, comparable across runs)."""
    src = read_sources(limit, with_pairs=distil is None)
    log(f"data: {json.dumps(src['meta'])}")
    if distil is not None:
        src = distil_sources(src, distil, code_share, log, renames, rename_pool)
    if tokenizer_from is not None:
        reuse_tokenizer(Path(tokenizer_from), out / "tokenizer")
        log(f"data: tokenizer reused from {tokenizer_from}")
    else:
        train_text = src["docs"]["train"] + [u + "\n" + a for _, u, a in src["pairs"]["train"]]
        train_tokenizer(train_text, out / "tokenizer")
    enc = Encoder(out / "tokenizer")
    rng = random.Random(SEED)
    streams, masks, prompts = {}, {}, {}
    for split in ("train", "val", "test"):
        seqs, pr, ms = enc.encode_split(src["docs"][split], src["pairs"][split], with_masks=True,
                                        name_weight=name_weight if split == "train" else 1)
        order = list(range(len(seqs)))
        rng.shuffle(order)
        streams[split] = concat([seqs[i] for i in order], np.int16 if enc.vocab < 32768 else np.int32)
        masks[split] = concat([ms[i] for i in order], np.uint8)
        prompts[split] = pr
        heavy = int((masks[split] > 1).sum())
        weighted = f", {heavy} weighted {name_weight}x" if heavy else ""
        trained = f" ({int((masks[split] > 0).sum())} in the loss{weighted})" if distil is not None else ""
        log(f"data: {split}: {len(seqs)} sequences, {streams[split].numel()} tokens{trained}, {len(pr)} chat prompts")
    meta = dict(src["meta"], n_ranks=enc.n_ranks, vocab=enc.vocab, tokens={k: v.numel() for k, v in streams.items()},
                name_weight=name_weight)
    if tokenizer_from is not None:
        meta["tokenizer_from"] = str(tokenizer_from)
    # The train-split chat prompts are kept for the drafter's data (ids, and the pairs' text for the
    # drafter's synthetic prompts), val/test prompts in full.
    extra = {"masks": masks} if distil is not None else {}  # without: every token is trained, as before
    torch.save({**extra, "streams": streams, "train_prompts": [p[3] for p in prompts["train"]],
                "train_pairs": [(u, a) for _, u, a, _ in prompts["train"]],
                "val_prompts": prompts["val"], "test_prompts": prompts["test"], "meta": meta,
                "files": src["files"]}, out / "data.pt")
    write_json(out / "data_meta.json", meta)
    heldout = {split: [{"file": r, "user": u, "code": c, "prompt_ids": ids}
                       for r, u, c, ids in prompts[split]] for split in ("val", "test")}
    if distil is not None:
        from .prompts import HELDOUT

        # Same fields as the splits' entries, so the list can serve as assets/demo/heldout_prompts.json.
        heldout["requests"] = [{"file": f"heldout:{h.name}", "user": h.prompt, "code": "", "prompt_ids": ids}
                               for h, ids in zip(HELDOUT, enc.requests([h.prompt for h in HELDOUT]))]
    write_json(out / "heldout.json", heldout)
    write_json(out / "file_list.json", src["files"])
    return meta


# The files prepare() writes; a cached data stage needs all of them.
OUTPUTS = ("data.pt", "data_meta.json", "heldout.json", "file_list.json", "tokenizer/tokenizer.json",
           "tokenizer/tokenizer_config.json", "tokenizer/chat_template.jinja")
KEY_FILE = "data_key.json"


def input_key(limit: int | None = None, tokenizer_from: Path | None = None,
              distil: Path | list[Path] | None = None, **settings) -> str:
    """sha256 of what prepare()'s outputs depend on: its settings, every input file (the stdlib's, the distilled
    sets', a reused tokenizer's) by path, size and mtime, the demo code that builds them, and the versions."""
    import tokenizers

    h = hashlib.sha256()

    def add(obj) -> None:
        h.update(json.dumps(obj, sort_keys=True, default=str).encode() + b"\n")

    dirs = [Path(d) for d in (distil if isinstance(distil, (list, tuple)) else [distil] if distil else [])]
    add({"limit": limit, "tokenizer_from": tokenizer_from, "distil": dirs, **settings, "python": sys.version,
         "tokenizers": tokenizers.__version__, "torch": torch.__version__})
    root, files = stdlib_files(limit)
    inputs = [(root, files)] + [(d, sorted(p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file()))
                                for d in dirs]
    if tokenizer_from is not None:
        inputs.append((Path(tokenizer_from), ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]))
    for base, rels in inputs:
        for rel in rels:
            try:
                st = (base / rel).stat()
                add([str(base), rel, st.st_size, st.st_mtime_ns])
            except OSError:
                add([str(base), rel, None])
    here = Path(__file__).resolve().parent
    for src in sorted(here.glob("*.py")) + [here.parents[1] / "engine" / "tokenizer.py"]:
        if src.name != "train.py":  # the training loop does not shape the data
            h.update(src.read_bytes())
    return h.hexdigest()


def cached_key(out: Path) -> str | None:
    """The input_key that out's data stage was built under, None when out holds no complete one."""
    try:
        key = json.loads((out / KEY_FILE).read_text()).get("key")
    except (OSError, ValueError, AttributeError):
        return None
    return key if all((out / f).exists() for f in OUTPUTS) else None


def prepare_cached(out: Path, limit: int | None = None, log=print, data_from: Path | None = None, **kwargs) -> dict:
    """prepare(), skipped when out/ holds its outputs for the same input_key (data_key.json; the tokenising
    alone is ~1 minute of the full GPU data set), or copied from data_from/ when that holds them (another run's
    out: targets of the same data settings tokenise once); a changed key rebuilds them."""
    key = input_key(limit, **kwargs)
    key_file = out / KEY_FILE
    old = cached_key(out)
    if old == key:
        log(f"data: cached in {out} (same settings and input files, key {key[:12]}): data stage skipped")
        return json.loads((out / "data_meta.json").read_text())
    if old is not None:
        log(f"data: settings or input files changed since the cached data (key {old[:12]} -> {key[:12]}): "
            "rebuilding")
    key_file.unlink(missing_ok=True)  # a rebuild cut short leaves no key that vouches for it
    if data_from is not None and cached_key(data_from) == key:
        for f in OUTPUTS:  # copies, not links: a later rebuild here writes its files in place
            (out / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(data_from / f, out / f)
        log(f"data: copied from {data_from} (same settings and input files, key {key[:12]}): data stage skipped")
        meta = json.loads((out / "data_meta.json").read_text())
    else:
        meta = prepare(out, limit, log=log, **kwargs)
    write_json(key_file, {"key": key})
    return meta

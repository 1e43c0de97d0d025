"""Train the demo pair end to end (issue 7), seeded:

    python -m ddtree_chat.demo.train --out DIR                      # all stages, sized for one H200
    python -m ddtree_chat.demo.train --out DIR --stages draft       # re-run one stage (needs the earlier ones)
    python -m ddtree_chat.demo.train --out /tmp/toy --toy           # a 1-minute CPU smoke run

Stages: data (stdlib -> splits, tokenizer, token streams), target (train, QAT, INT4 export to DIR/target),
draft (target greedy continuations + hidden states -> DFlash drafter, export to DIR/draft).
Training length is set by wall-clock budgets (--target-seconds, --draft-seconds): the step count is fixed
after timing the first steps and logged, so a run can be repeated exactly with --target-steps/--draft-steps."""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from .common import SEED, target_text_config

T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:7.1f}s] {msg}", flush=True)


def _lr(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def _windows(stream: torch.Tensor, n: int, t: int, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, stream.numel() - t - 1, (n,), generator=gen)
    return torch.stack([stream[s : s + t + 1] for s in starts.tolist()]).long()


@torch.no_grad()
def val_loss(forward_logits, stream: torch.Tensor, t: int, n: int, batch: int, device) -> float:
    """Mean next-token loss over n fixed windows of the stream (evenly spaced)."""
    step = max(1, (stream.numel() - t - 1) // n)
    starts = list(range(0, stream.numel() - t - 1, step))[:n]
    tot, cnt = 0.0, 0
    for i in range(0, len(starts), batch):
        x = torch.stack([stream[s : s + t + 1] for s in starts[i : i + batch]]).long().to(device)
        logits = forward_logits(x[:, :-1])
        tot += F.cross_entropy(logits.flatten(0, 1).float(), x[:, 1:].flatten(), reduction="sum").item()
        cnt += x[:, 1:].numel()
    return tot / cnt


# ----------------------------------------------------------------------------- target

def train_target(out: Path, a, device) -> dict:
    from ddtree_chat.engine.config import TargetConfig
    from ddtree_chat.engine.loader import load_target
    from ddtree_chat.engine.model import causal_mask

    from .export import export_target
    from .qmoe import TrainTarget, enable_sdpa_training

    data = torch.load(out / "data.pt")
    meta = data["meta"]
    vocab, n_ranks = meta["vocab"], meta["n_ranks"]
    cfg = TargetConfig.from_json(target_text_config(vocab, n_ranks))
    tt = TrainTarget(cfg, SEED).to(device)
    n_params = sum(p.numel() for p in tt.parameters())
    log(f"target: {n_params / 1e6:.2f}M parameters, vocab {vocab}")
    cuda = device.type == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        enable_sdpa_training(True)
    train, val = data["streams"]["train"], data["streams"]["val"]
    decay = [p for n, p in tt.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in tt.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.target_lr, betas=(0.9, 0.95), fused=cuda)
    gen = torch.Generator().manual_seed(SEED)
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda)

    def fwd_logits(x):
        with amp:
            return tt.model.logits(tt(x))

    total = a.target_steps or 10**9
    step, t_start, hist = 0, time.time(), []
    qat_from = None
    best = (float("inf"), -1, None)
    while step < total:
        if a.target_steps is None and step in (10, 30):
            if cuda:
                torch.cuda.synchronize()
            if step == 10:
                t10 = time.time()
            else:
                per = (time.time() - t10) / 20
                total = max(40, 30 + int((a.target_seconds - (time.time() - t_start)) / per))
            log(f"target: {per * 1000:.0f} ms/step -> {total} steps (reproduce with --target-steps {total})")
        if qat_from is None and step >= int(total * (1 - a.qat_frac)):
            qat_from = step
            tt.set_qat(True)
            log(f"target: QAT (INT4 fake-quant experts) from step {step}")
        for g in opt.param_groups:
            g["lr"] = _lr(step, total, a.target_lr, min(200, total // 10))
        x = _windows(train, a.batch, a.seq, gen).to(device, non_blocking=True)
        logits = fwd_logits(x[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), x[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(tt.parameters(), 1.0)
        opt.step()
        imb = tt.update_bias(a.bias_rate)
        if step % 100 == 0 or step == total - 1:
            tt.eval()
            vl = val_loss(fwd_logits, val, a.seq, 48, a.batch, device)
            tt.train()
            hist.append((step, loss.item(), vl))
            if vl < best[0]:
                best = (vl, step, {k: v.detach().clone() for k, v in tt.state_dict().items()})
            log(f"target: step {step}/{total} loss {loss.item():.3f} val {vl:.3f} lr {opt.param_groups[0]['lr']:.2e} "
                f"max-load/mean {max(imb):.2f}")
        step += 1
    train_s = time.time() - t_start
    log(f"target: keeping the weights of step {best[1]} (best val {best[0]:.4f})")
    tt.load_state_dict(best[2])
    tt.eval()
    vn = a.val_windows
    tt.set_qat(False)
    loss_fp = val_loss(fwd_logits, val, a.seq, vn, a.batch, device)
    tt.set_qat(True)
    loss_qat = val_loss(fwd_logits, val, a.seq, vn, a.batch, device)
    log(f"target: val loss bf16-experts {loss_fp:.4f}, fake-INT4 experts {loss_qat:.4f} ({train_s:.0f}s training)")
    export_target(tt, out / "tokenizer", out / "target", vocab, n_ranks)
    enable_sdpa_training(False) if cuda else None
    # The real check: load the exported checkpoint with the engine's loader (float32, experts dequantised
    # from INT4 exactly as on CPU) and score the validation windows again.
    tcfg, model = load_target(out / "target", torch.device("cpu"), torch.float32)
    model = _to_device(model, device)

    def eng_logits(x):
        t = x.shape[-1]
        h, _ = model(x, torch.arange(t, device=device), causal_mask(t, device))
        return model.logits(h)

    torch.backends.cuda.matmul.allow_tf32 = False
    loss_int4 = val_loss(eng_logits, val, a.seq, min(vn, 64), 16, device)
    log(f"target: val loss of the exported INT4 checkpoint (engine loader, fp32): {loss_int4:.4f}")
    res = {"params": n_params, "steps": total, "kept_step": best[1], "qat_from_step": qat_from, "train_seconds": round(train_s, 1),
           "batch": a.batch, "seq": a.seq, "lr": a.target_lr, "val_loss_bf16": loss_fp,
           "val_loss_fakeint4": loss_qat, "val_loss_int4_export_fp32": loss_int4, "loss_curve": hist,
           "tokens_seen": total * a.batch * a.seq}
    (out / "target_train.json").write_text(json.dumps(res, indent=1))
    return res


def _to_device(model, device):
    from ddtree_chat.engine.model import MoE
    from ddtree_chat.engine.ops.moe import ExpertWeights

    model = model.to(device)
    for layer in model.layers:
        if isinstance(layer.mlp, MoE):
            e = layer.mlp.experts
            layer.mlp.experts = ExpertWeights(e.gate.to(device), e.up.to(device), e.down.to(device))
    return model


# ----------------------------------------------------------------------------- drafter

class BatchCache:
    """Batched latent cache for greedy generation with one shared length (LatentCache protocol)."""

    def __init__(self, layers: int, b: int, s: int, r: int, p: int, dtype, device):
        self.ckv = torch.zeros(layers, b, s, r, dtype=dtype, device=device)
        self.kpe = torch.zeros(layers, b, s, p, dtype=dtype, device=device)
        self.length = 0

    def write(self, layer, ckv, kpe):
        t = ckv.shape[-2]
        self.ckv[layer, :, self.length : self.length + t] = ckv
        self.kpe[layer, :, self.length : self.length + t] = kpe
        return self.ckv[layer], self.kpe[layer]


@torch.no_grad()
def greedy_with_features(model, prompts: torch.Tensor, gen_len: int, capture) -> tuple[torch.Tensor, torch.Tensor]:
    """prompts [N, P] -> (tokens [N, P + gen_len], features [N, P + gen_len, len(capture) * H]) where the
    continuation is the target's greedy output and features[i] are the captured layer outputs at token i.
    (The last token's features are never needed as context, but are computed for uniformity.)"""
    from ddtree_chat.engine.model import causal_mask

    cfg = model.cfg
    n, p = prompts.shape
    dev = prompts.device
    cache = BatchCache(cfg.num_layers, n, p + gen_len, cfg.kv_lora_rank, cfg.qk_rope_head_dim, torch.float32, dev)
    h, f = model(prompts, torch.arange(p, device=dev), causal_mask(p, dev), cache, capture)
    cache.length = p
    toks, feats = [prompts], [f.to(torch.bfloat16)]
    nxt = model.logits(h[:, -1]).argmax(-1)
    one = torch.ones(1, 1, dtype=torch.bool, device=dev)
    for i in range(gen_len):
        toks.append(nxt[:, None])
        h, f = model(nxt[:, None], torch.tensor([p + i], device=dev), one, cache, capture)
        cache.length += 1
        feats.append(f.to(torch.bfloat16))
        nxt = model.logits(h[:, -1]).argmax(-1)
    return torch.cat(toks, 1), torch.cat(feats, 1)


def make_prompts(data, n: int, p: int, gen: torch.Generator, chat_frac: float = 0.8) -> torch.Tensor:
    """n prompts of exactly p tokens: mostly train-split chat prompts (ending in `<think>`), left-filled
    with a random stretch of the training stream (as in the packed training data); the rest raw code."""
    stream, chats = data["streams"]["train"], [c for c in data["train_prompts"] if len(c) <= p]
    rows = []
    for _ in range(n):
        s = int(torch.randint(0, stream.numel() - p - 1, (1,), generator=gen))
        window = stream[s : s + p].long().tolist()
        if chats and torch.rand(1, generator=gen).item() < chat_frac:
            c = chats[int(torch.randint(0, len(chats), (1,), generator=gen))]
            window = window[len(c):] + c if len(c) < p else c
        rows.append(window)
    return torch.tensor(rows)


def train_draft(out: Path, a, device) -> dict:
    from ddtree_chat.engine.config import DraftConfig
    from ddtree_chat.engine.drafter import DFlashDrafter
    from ddtree_chat.engine.loader import load_target

    from .common import draft_config
    from .export import export_drafter

    data = torch.load(out / "data.pt")
    vocab, n_ranks = data["meta"]["vocab"], data["meta"]["n_ranks"]
    dcfg_json = draft_config(vocab, n_ranks)
    dcfg = DraftConfig.from_json(dcfg_json)
    tcfg, model = load_target(out / "target", torch.device("cpu"), torch.float32)
    model = _to_device(model, device)
    torch.backends.cuda.matmul.allow_tf32 = False  # greedy continuations as the float32 CPU engine makes them
    capture = tuple(dcfg.target_layer_ids)
    gen = torch.Generator().manual_seed(SEED + 1)
    # 1. The target's own greedy continuations and hidden states.
    t_start = time.time()
    buckets = []
    b = 0
    while (a.draft_gen_batches and b < a.draft_gen_batches) or \
            (not a.draft_gen_batches and time.time() - t_start < a.draft_gen_seconds):
        p = a.prompt_lens[b % len(a.prompt_lens)]
        prompts = make_prompts(data, a.gen_batch, p, gen).to(device)
        toks, feats = greedy_with_features(model, prompts, a.gen_len, capture)
        buckets.append((p, toks, feats))
        b += 1
        log(f"draft: generated batch {b} (prompt {p}, {toks.shape[0]}x{a.gen_len} tokens) "
            f"at {time.time() - t_start:.0f}s")
    sample = buckets[0][1][0].tolist()
    # 2. Train the drafter: many blocks per sequence, anchored in the generated part.
    torch.manual_seed(SEED + 2)
    drafter = DFlashDrafter(dcfg).to(device)
    drafter.reset_rope(device)
    embed, head = model.embed_tokens, model.lm_head  # frozen, shared with the target
    cuda = device.type == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
    opt = torch.optim.AdamW(drafter.parameters(), lr=a.draft_lr, betas=(0.9, 0.95), weight_decay=0.01, fused=cuda)
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda)
    B = dcfg.block_size
    slot_w = torch.tensor([0.0] + [math.exp(-(k - 1) / a.slot_decay) for k in range(1, B)], device=device)
    rng = random.Random(SEED + 3)

    def batch_loss(p, toks, feats, rows, anchors):
        L = toks.shape[1]
        k = len(anchors)
        anc = torch.tensor(anchors, device=device)
        qpos = (anc[:, None] + torch.arange(B, device=device)).flatten()  # [K*B]
        tk = toks[rows]
        blk = tk[:, qpos].clone().view(-1, k, B)
        labels = blk[:, :, 1:].clone()
        blk[:, :, 1:] = dcfg.mask_token_id
        ctx_pos = torch.arange(L, device=device)
        mask_ctx = ctx_pos[None, :] < anc.repeat_interleave(B)[:, None]  # [Q, L]
        blk_id = torch.arange(k, device=device).repeat_interleave(B)
        mask_blk = blk_id[:, None] == blk_id[None, :]
        mask = torch.cat([mask_ctx, mask_blk], 1)
        with amp:
            ctx_kv = drafter.context_kv(feats[rows].float(), ctx_pos)
            hid = drafter(embed(blk.flatten(1)), qpos, ctx_kv, mask)
            logits = head(hid).float().view(-1, k, B, vocab)[:, :, 1:]
        ce = F.cross_entropy(logits.flatten(0, 2), labels.flatten(), reduction="none").view(labels.shape)
        w = slot_w[1:].expand_as(ce)
        acc = (logits.argmax(-1) == labels).float()
        return (ce * w).sum() / w.sum(), acc.mean(0).mean(0)

    def sample_batch(bs):
        p, toks, feats = buckets[rng.randrange(len(buckets))]
        rows = torch.tensor(rng.sample(range(toks.shape[0]), bs), device=device)
        lo, hi = p, toks.shape[1] - B
        anchors = sorted(rng.sample(range(lo, hi + 1), min(a.anchors, hi - lo + 1)))
        return p, toks, feats, rows, anchors

    total = a.draft_steps or 10**9
    step, t_train = 0, time.time()
    while step < total:
        if a.draft_steps is None and step == 10:
            if cuda:
                torch.cuda.synchronize()
            t10 = time.time()
        if a.draft_steps is None and step == 30:
            if cuda:
                torch.cuda.synchronize()
            per = (time.time() - t10) / 20
            left = a.draft_seconds - (time.time() - t_train)
            if a.deadline:
                left = min(left, a.deadline - (time.time() - T0))
            total = max(40, 30 + int(left / per))
            log(f"draft: {per * 1000:.0f} ms/step -> {total} steps (reproduce with --draft-steps {total})")
        for g in opt.param_groups:
            g["lr"] = _lr(step, total, a.draft_lr, min(200, total // 10))
        loss, acc = batch_loss(*sample_batch(a.draft_batch))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        if step % 200 == 0 or step == total - 1:
            log(f"draft: step {step}/{total} loss {loss.item():.3f} acc/slot "
                + " ".join(f"{v:.2f}" for v in acc.tolist()))
        step += 1
    train_s = time.time() - t_train
    drafter.eval()
    export_drafter(drafter, out / "draft", vocab, n_ranks)
    # Held-out check on the GPU: validation chat prompts, the same block loss/accuracy.
    with torch.no_grad():
        vprompts = [p[3] for p in data["val_prompts"]]
        p = a.prompt_lens[-1]
        vp = [c for c in vprompts if len(c) <= p][: a.gen_batch]
        stream = data["streams"]["val"]
        rows = [stream[: p - len(c)].long().tolist() + c for c in vp]
        vt, vf = greedy_with_features(model, torch.tensor(rows, device=device), a.gen_len, capture)
        lo, hi = p, vt.shape[1] - B
        anchors = list(range(lo, hi + 1, max(1, (hi - lo) // a.anchors)))[: a.anchors]
        vl, vacc = batch_loss(p, vt, vf, torch.arange(vt.shape[0], device=device), anchors)
    tau = sum(float(torch.prod(vacc[:k + 1])) for k in range(B - 1)) + 1  # rough chain estimate (independent slots)
    log(f"draft: val block loss {vl.item():.3f}, acc/slot " + " ".join(f"{v:.2f}" for v in vacc.tolist()))
    res = {"steps": total, "train_seconds": round(train_s, 1), "gen_batches": len(buckets),
           "gen_sequences": sum(t.shape[0] for _, t, _ in buckets), "gen_len": a.gen_len,
           "val_block_loss": vl.item(), "val_acc_per_slot": vacc.tolist(), "chain_tau_estimate": tau,
           "sample_tokens": sample[:64]}
    (out / "draft_train.json").write_text(json.dumps(res, indent=1))
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--stages", default="data,target,draft")
    ap.add_argument("--toy", action="store_true", help="tiny CPU smoke run (150 files, seconds of training)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--limit-files", type=int, default=None)
    ap.add_argument("--target-seconds", type=float, default=40)
    ap.add_argument("--target-steps", type=int, default=None)
    ap.add_argument("--target-lr", type=float, default=3e-3)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--qat-frac", type=float, default=0.12)
    ap.add_argument("--bias-rate", type=float, default=1e-3)
    ap.add_argument("--val-windows", type=int, default=192)
    ap.add_argument("--draft-seconds", type=float, default=200)
    ap.add_argument("--draft-steps", type=int, default=None)
    ap.add_argument("--draft-gen-seconds", type=float, default=80)
    ap.add_argument("--draft-gen-batches", type=int, default=None)
    ap.add_argument("--deadline", type=float, default=None, help="stop drafter training by this many seconds after start")
    ap.add_argument("--gen-batch", type=int, default=1024)
    ap.add_argument("--gen-len", type=int, default=192)
    ap.add_argument("--prompt-lens", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--draft-lr", type=float, default=2e-3)
    ap.add_argument("--draft-batch", type=int, default=128)
    ap.add_argument("--anchors", type=int, default=32)
    ap.add_argument("--slot-decay", type=float, default=5.0)
    a = ap.parse_args(argv)
    if a.toy:
        a.limit_files = a.limit_files or 150
        a.target_steps = a.target_steps or 30
        a.batch, a.seq, a.val_windows = 4, 128, 8
        a.draft_steps, a.draft_gen_batches = a.draft_steps or 20, 1
        a.gen_batch, a.gen_len, a.prompt_lens, a.draft_batch, a.anchors = 8, 24, [64], 4, 4
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.manual_seed(SEED)
    a.out.mkdir(parents=True, exist_ok=True)
    stages = a.stages.split(",")
    log(f"demo train: stages {stages}, device {device}, torch {torch.__version__}")
    if "data" in stages:
        from .data import prepare

        prepare(a.out, a.limit_files, log=log)
    if "target" in stages:
        train_target(a.out, a, device)
    if "draft" in stages:
        train_draft(a.out, a, device)
    log("done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

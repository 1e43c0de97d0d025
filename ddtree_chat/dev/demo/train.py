"""Train the demo pair end to end (issue 7), seeded:

    python -m ddtree_chat.dev.demo.train --out DIR                      # all stages, sized for one H200
    python -m ddtree_chat.dev.demo.train --out DIR --stages draft       # re-run one stage (needs the earlier ones)
    python -m ddtree_chat.dev.demo.train --out DIR --target-from ddtree_chat/assets/demo/target   # drafter only
    python -m ddtree_chat.dev.demo.train --out /tmp/toy --toy           # a 1-minute CPU smoke run
    python -m ddtree_chat.dev.demo.train --out DIR --distil DATA        # chat distilled from a teacher (issue 31)
    python -m ddtree_chat.dev.demo.train --out DIR --distil DATA EVERYDAY   # with everyday.py's answers too
    python -m ddtree_chat.dev.demo.train --out DIR --distil DATA EVERYDAY EVERYDAY2   # and everyday2.py's
    python -m ddtree_chat.dev.demo.train --out /tmp/tiny --tiny --distil DATA   # the same, as a CPU smoke run
    python -m ddtree_chat.dev.demo.train --out DIR --distil DATA --target-arch heads=8,kv_lora=128  # a wider attention

Stages: data (stdlib -> splits, tokenizer, token streams), target (train, QAT, INT4 export to DIR/target),
draft (target greedy continuations + hidden states -> DFlash drafter, export to DIR/draft).
With --target-from TARGET_DIR the data stage reuses that target's tokenizer (so the token streams are the
ones it was trained on) and the draft stage trains against it; the target stage is skipped.
With --distil DATA (a distil_data.py output dir) the target learns the teacher's kept answers (sequence-level
distillation: the loss covers the replies, not the user's turns; --code-share of stdlib source stays in), and
the drafter's prompts are fresh generated requests (prompts.py, another seed) answered by the new target.
--draft-arch trains several drafter shapes side by side on the same batches (each to DIR/draft-LxI).
Training length is set by wall-clock budgets (--target-seconds, --draft-gen-seconds, --draft-seconds,
--deadline): the step/batch counts are fixed after timing the first ones and logged, so a run can be
repeated exactly with --target-steps / --draft-gen-batches / --draft-steps.
Target training longer than one call: --target-deadline SECONDS (and/or --target-steps-per-call N) stops at a
step boundary, saves OUT/target_ckpt.pt (weights, optimizer, step and step count, RNGs, kept weights, curve)
and exits 0 without exporting; the same command with --resume continues it (bitwise as one run on the CPU)
and exports at the end. The data stage is cached in OUT (data_key.json: settings + input files + code); --data-from
DIR copies DIR's when it was built under the same key (several targets, one tokenising)."""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from .common import DRAFT, SEED, target_text_config

T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:7.1f}s] {msg}", flush=True)


def _lr(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def _windows(stream: torch.Tensor, n: int, t: int, gen: torch.Generator, mask: torch.Tensor | None = None):
    """[n, t+1] token windows at random starts; with a loss mask stream, (windows, their masks)."""
    starts = torch.randint(0, stream.numel() - t - 1, (n,), generator=gen).tolist()
    x = torch.stack([stream[s : s + t + 1] for s in starts]).long()
    return x if mask is None else (x, torch.stack([mask[s : s + t + 1] for s in starts]))


def keeps(best: tuple[float, bool], loss: float, qat: bool) -> bool:
    """Whether a validation step's weights replace the kept ones (best = (loss, trained under QAT)): the export
    is INT4, so weights trained under fake quantisation beat any from before it, then the lower loss wins."""
    return (qat, -loss) > (best[1], -best[0])


def masked_ce(logits: torch.Tensor, x: torch.Tensor, m: torch.Tensor | None, reduction: str = "mean"):
    """Next-token loss of logits [B, T, V] against x[:, 1:], over the positions whose mask m[:, 1:] is set."""
    ce = F.cross_entropy(logits.flatten(0, 1).float(), x[:, 1:].flatten(), reduction="none")
    if m is None:
        return ce.mean() if reduction == "mean" else (ce.sum(), ce.numel())
    w = m[:, 1:].flatten().to(ce.dtype)
    return (ce * w).sum() / w.sum().clamp(min=1) if reduction == "mean" else ((ce * w).sum(), int(w.sum()))


@torch.no_grad()
def val_loss(forward_logits, stream: torch.Tensor, t: int, n: int, batch: int, device,
             mask: torch.Tensor | None = None) -> float:
    """Mean next-token loss over n fixed windows of the stream (evenly spaced), over masked-in tokens."""
    step = max(1, (stream.numel() - t - 1) // n)
    starts = list(range(0, stream.numel() - t - 1, step))[:n]
    tot, cnt = 0.0, 0
    for i in range(0, len(starts), batch):
        x = torch.stack([stream[s : s + t + 1] for s in starts[i : i + batch]]).long().to(device)
        m = None if mask is None else torch.stack([mask[s : s + t + 1] for s in starts[i : i + batch]]).to(device)
        s_, c_ = masked_ce(forward_logits(x[:, :-1]), x, m, reduction="sum")
        tot += s_.item()
        cnt += c_
    return tot / max(cnt, 1)


# ----------------------------------------------------------------------------- target

CKPT, DONE = "target_ckpt.pt", "target_done.json"  # in --out: a paused run's state; a finished run's settings
CKPT_FORMAT = 1


class ResumeError(Exception):
    """A checkpoint that cannot be continued (unreadable, or saved under other settings): one line for the user."""


def fingerprint(a, meta: dict, out: Path) -> dict:
    """The settings a checkpoint's run shares with the run that continues it: sizes, schedule and data."""
    from .common import TARGET

    data = hashlib.sha256(json.dumps(meta, sort_keys=True).encode())
    data.update((out / "tokenizer" / "tokenizer.json").read_bytes())
    fp = {"arch": dict(TARGET), "batch": a.batch, "seq": a.seq, "lr": a.target_lr, "qat_frac": a.qat_frac,
          "bias_rate": a.bias_rate, "val_every": a.target_val_every, "target_steps": a.target_steps,
          "target_seconds": a.target_seconds if a.target_steps is None else None, "data": data.hexdigest()}
    return json.loads(json.dumps(fp))  # as a JSON round trip reads it back (the done marker's copy)


def _one_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:160] if text else ''}"


def load_checkpoint(path: Path, device, fp: dict) -> dict:
    """The checkpoint at path, or ResumeError when it is unreadable or its run had other settings than fp."""
    try:
        ck = torch.load(path, map_location=device, weights_only=True)
        if not isinstance(ck, dict) or ck.get("format") != CKPT_FORMAT:
            raise ValueError(f"not a format-{CKPT_FORMAT} target training checkpoint")
    except Exception as e:  # torch.load raises many kinds on a torn or foreign file
        raise ResumeError(f"cannot resume from {path}: unreadable ({_one_line(e)}); "
                          "delete it, or run without --resume to start afresh") from None
    saved = ck.get("fingerprint") or {}
    diff = [f"{k} {saved.get(k)!r} -> {fp.get(k)!r}" for k in sorted(set(fp) | set(saved)) if saved.get(k) != fp.get(k)]
    if diff:
        raise ResumeError(f"cannot resume from {path}: it was saved with other settings ({'; '.join(diff)}); "
                          "rerun with its flags, or without --resume to start afresh")
    return ck


def train_target(out: Path, a, device) -> dict | None:
    """Train, keep the best QAT weights, export to out/target; None when paused (checkpoint in out/CKPT)."""
    from ddtree_chat.engine.config import TargetConfig
    from ddtree_chat.engine.loader import load_target
    from ddtree_chat.engine.model import causal_mask
    from ddtree_chat.engine.tokenizer import load_tokenizer

    from .copy_probe import copy_rate, function_requests, heldout_rate
    from .data import Encoder
    from .export import export_target
    from .qmoe import TrainTarget, enable_sdpa_training

    data = torch.load(out / "data.pt")
    meta = data["meta"]
    vocab, n_ranks = meta["vocab"], meta["n_ranks"]
    ck_path, done_path = out / CKPT, out / DONE
    fp = fingerprint(a, meta, out)
    if a.resume and not ck_path.exists() and done_path.exists() and (out / "target" / "config.json").exists():
        try:
            done = json.loads(done_path.read_text())
        except ValueError:
            done = {}
        if done.get("fingerprint") == fp and (out / "target_train.json").exists():
            log(f"target: already trained and exported with these settings ({done_path}): nothing to resume")
            return json.loads((out / "target_train.json").read_text())
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
    masks = data.get("masks") or {}
    m_train, m_val = masks.get("train"), masks.get("val")
    if m_train is not None:
        log(f"target: loss on {int((m_train > 0).sum())} of {m_train.numel()} train tokens (user turns left out)")
    decay = [p for n, p in tt.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in tt.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.target_lr, betas=(0.9, 0.95), fused=cuda)
    gen = torch.Generator().manual_seed(SEED)
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda)

    def fwd_logits(x):
        with amp:
            return tt.model.logits(tt(x))

    enc = Encoder(out / "tokenizer")
    requests = function_requests(data["val_prompts"], a.copy_probe, [enc.sp["</think>"]])

    def copies() -> int:  # validation requests answered with a `def NAME(` line (copy_probe.py)
        return copy_rate(fwd_logits, requests, enc.tok.decode, (enc.sp["[EOS]"], enc.sp["<|im_end|>"]),
                         enc.sp["[EOS]"], device)

    chat_tok = load_tokenizer(out / "tokenizer")  # the engine's tokenizer: held-out prompts as eval_heldout.py's

    def heldout() -> dict:  # the 20 held-out requests answered and scored as eval_heldout.py does (copy_probe.py)
        if not a.heldout_probe:
            return {}
        return heldout_rate(fwd_logits, chat_tok, enc.sp["[EOS]"], device, new=a.heldout_probe)

    def heldout_text(h: dict) -> str:
        return f" heldout define {h['defines']}/{h['n']} def-line {h['def_line']}/{h['n']}" if h else ""

    total, fixed = a.target_steps or 10**9, a.target_steps is not None  # fixed: given, or timed and logged
    step, hist, trained_s, resumes = 0, [], 0.0, []
    qat_from = None
    best = (float("inf"), -1, None, False)  # validation loss, step, weights, trained under QAT
    if a.resume and ck_path.exists():
        ck = load_checkpoint(ck_path, device, fp)
        try:
            tt.load_state_dict(ck["model"])
            opt.load_state_dict(ck["opt"])
            rng = ck["rng"]
            gen.set_state(rng["gen"].cpu())
            torch.set_rng_state(rng["torch"].cpu())
            if cuda and rng["cuda"] is not None and len(rng["cuda"]) == torch.cuda.device_count():
                torch.cuda.set_rng_state_all([r.cpu() for r in rng["cuda"]])
            random.setstate(rng["python"])
            step, total, fixed, hist, best = ck["step"], ck["total"], ck["fixed"], list(ck["hist"]), tuple(ck["best"])
            qat_from, trained_s, resumes = ck["qat_from"], ck["train_seconds"], list(ck["resumes"])
        except (KeyError, RuntimeError, TypeError, ValueError) as e:
            raise ResumeError(f"cannot resume from {ck_path}: it does not fit this model ({_one_line(e)}); "
                              "delete it, or run without --resume to start afresh") from None
        if qat_from is not None:
            tt.set_qat(True)
        resumes.append(step)
        log(f"target: resuming at step {step} of {total if fixed else '? (not timed yet)'} from {ck_path} "
            f"({trained_s:.0f}s trained before)")
    else:
        if a.resume:
            log(f"target: no checkpoint {ck_path}: starting afresh")
        elif ck_path.exists():
            log(f"target: starting afresh (without --resume): the earlier checkpoint {ck_path} is removed")
        ck_path.unlink(missing_ok=True)
    done_path.unlink(missing_ok=True)  # out/target is about to change
    keep_ckpt = bool(a.resume or a.target_deadline is not None or a.target_steps_per_call or a.target_checkpoint_every)

    def save_checkpoint() -> None:  # written aside, then renamed: a kill mid-write leaves the last one whole
        # numpy draws nothing here; the global torch and python ones are kept in case a forward ever draws
        rng = {"gen": gen.get_state(), "torch": torch.get_rng_state(), "python": random.getstate(),
               "cuda": torch.cuda.get_rng_state_all() if cuda else None}
        ck = {"format": CKPT_FORMAT, "fingerprint": fp, "step": step, "total": total, "fixed": fixed,
              "model": tt.state_dict(), "opt": opt.state_dict(), "rng": rng, "best": best, "hist": hist,
              "qat_from": qat_from, "train_seconds": trained_s + time.time() - t_start, "resumes": resumes}
        tmp = ck_path.with_name(ck_path.name + ".tmp")
        torch.save(ck, tmp)
        os.replace(tmp, ck_path)

    def past_deadline() -> bool:
        return a.target_deadline is not None and time.time() - T0 >= a.target_deadline

    start, t_start, why = step, time.time(), None
    t_lo, t_hi = start + 10, start + 30  # a resumed call that still has to time its steps warms up again
    while step < total:
        if step > start:  # every call trains at least one step
            if a.target_steps_per_call and step - start >= a.target_steps_per_call:
                why = f"{a.target_steps_per_call} steps this call"
            elif past_deadline():
                why = f"the {a.target_deadline:.0f}s deadline passed"
            if why:
                break
        if not fixed and step in (t_lo, t_hi):
            if cuda:
                torch.cuda.synchronize()
            if step == t_lo:
                t_mark = time.time()
            else:
                per = (time.time() - t_mark) / (t_hi - t_lo)
                total = max(step + 10, step + int((a.target_seconds - trained_s - (time.time() - t_start)) / per))
                fixed = True
                log(f"target: {per * 1000:.0f} ms/step -> {total} steps (reproduce with --target-steps {total})")
        if qat_from is None and step >= int(total * (1 - a.qat_frac)):
            qat_from = step
            tt.set_qat(True)
            log(f"target: QAT (INT4 fake-quant experts) from step {step}")
        for g in opt.param_groups:
            g["lr"] = _lr(step, total, a.target_lr, min(200, total // 10))
        if m_train is None:
            x, m = _windows(train, a.batch, a.seq, gen).to(device, non_blocking=True), None
        else:
            x, m = (v.to(device, non_blocking=True) for v in _windows(train, a.batch, a.seq, gen, m_train))
        loss = masked_ce(fwd_logits(x[:, :-1]), x, m)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(tt.parameters(), 1.0)
        opt.step()
        imb = tt.update_bias(a.bias_rate)
        if step % a.target_val_every == 0 or step == total - 1:
            tt.eval()
            vl = val_loss(fwd_logits, val, a.seq, 48, a.batch, device, m_val)
            # step 0 of a fresh run (a resumed one starts past it): untrained weights answer nothing yet
            copied, held = (None, {}) if step == 0 else (copies(), heldout())
            tt.train()
            hist.append((step, loss.item(), vl, copied, held))
            if keeps((best[0], best[3]), vl, qat_from is not None):
                best = (vl, step, {k: v.detach().clone() for k, v in tt.state_dict().items()}, qat_from is not None)
            probes = "probes from the next validation step" if copied is None else \
                f"copy {copied}/{len(requests)}{heldout_text(held)}"
            log(f"target: step {step}/{total} loss {loss.item():.3f} val {vl:.3f} lr {opt.param_groups[0]['lr']:.2e} "
                f"max-load/mean {max(imb):.2f} {probes}")
        step += 1
        if a.target_checkpoint_every and step % a.target_checkpoint_every == 0 and step < total:
            save_checkpoint()
            log(f"target: checkpoint at step {step} ({ck_path})")
    if why is None and step > start and past_deadline():  # the export waits for the next call
        why = f"the {a.target_deadline:.0f}s deadline passed before the export"
    if why is not None:
        save_checkpoint()
        if cuda:
            enable_sdpa_training(False)
        log(f"target: paused at step {step} of {total if fixed else '? (not timed yet)'} ({why}), not exported: "
            f"continue with the same command{'' if a.resume else ' and --resume'} (checkpoint {ck_path})")
        return None
    if keep_ckpt and step > start:
        save_checkpoint()  # a kill during the export resumes straight into it
    train_s = trained_s + time.time() - t_start
    log(f"target: keeping the weights of step {best[1]} (best val {best[0]:.4f})")
    tt.load_state_dict(best[2])
    tt.eval()
    vn = a.val_windows
    tt.set_qat(False)
    loss_fp = val_loss(fwd_logits, val, a.seq, vn, a.batch, device, m_val)
    tt.set_qat(True)
    loss_qat = val_loss(fwd_logits, val, a.seq, vn, a.batch, device, m_val)
    copied, held = copies(), heldout()
    log(f"target: val loss bf16-experts {loss_fp:.4f}, fake-INT4 experts {loss_qat:.4f} ({train_s:.0f}s training); "
        f"copy {copied}/{len(requests)}{heldout_text(held)}")
    export_target(tt, out / "tokenizer", out / "target", vocab, n_ranks)
    if cuda:
        enable_sdpa_training(False)
    # The real check: load the exported checkpoint with the engine's loader (float32, experts dequantised
    # from INT4 exactly as on CPU) and score the validation windows again.
    tcfg, model = load_target(out / "target", torch.device("cpu"), torch.float32)
    model = _to_device(model, device)

    def eng_logits(x):
        t = x.shape[-1]
        h, _ = model(x, torch.arange(t, device=device), causal_mask(t, device))
        return model.logits(h)

    torch.backends.cuda.matmul.allow_tf32 = False
    loss_int4 = val_loss(eng_logits, val, a.seq, min(vn, 64), 16, device, m_val)
    log(f"target: val loss of the exported INT4 checkpoint (engine loader, fp32): {loss_int4:.4f}")
    res = {"params": n_params, "steps": total, "kept_step": best[1], "qat_from_step": qat_from, "train_seconds": round(train_s, 1),
           "batch": a.batch, "seq": a.seq, "lr": a.target_lr, "val_loss_bf16": loss_fp,
           "val_loss_fakeint4": loss_qat, "val_loss_int4_export_fp32": loss_int4, "loss_curve": hist,
           "copy": {"requests": len(requests), "named": copied}, "heldout": held,
           "tokens_seen": total * a.batch * a.seq, "resumed_at_steps": resumes}
    (out / "target_train.json").write_text(json.dumps(res, indent=1))
    ck_path.unlink(missing_ok=True)
    (out / DONE).write_text(json.dumps({"fingerprint": fp, "steps": total, "kept_step": best[1]}, indent=1) + "\n")
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

def parse_arch(text: str) -> dict:
    """'3x1024' -> {layers: 3, inter: 1024} (drafter depth x MLP width; hidden = the target's)."""
    layers, inter = text.lower().split("x")
    return {"layers": int(layers), "inter": int(inter)}


def _block_rope(drafter, qpos: torch.Tensor, dtype):
    """cos/sin [R, Q, d/2] for per-row block positions qpos [R, Q]."""
    cos, sin = drafter.rope(qpos.flatten(), dtype)
    return cos.view(*qpos.shape, -1), sin.view(*qpos.shape, -1)


def tasks_dir_ok(path: Path | None) -> bool:
    """A self_instruct.py run directory (its proposals.jsonl) given."""
    from .self_instruct import PROPOSALS

    return path is not None and (path / PROPOSALS).is_file()


def first_stop(toks: torch.Tensor, lens: torch.Tensor, stop_ids) -> torch.Tensor:
    """[N]: the position of each row's first stop token after its prompt (T when it never stops)."""
    pos = torch.arange(toks.shape[1], device=toks.device)
    is_stop = torch.isin(toks, torch.tensor(sorted(stop_ids), device=toks.device)) & (pos[None] >= lens[:, None])
    return torch.where(is_stop, pos[None], toks.shape[1]).min(1).values


def anchor_range(toks, lens, stops, B):
    """Per row, the roots a decoding round can have: [prompt length, min(first stop - 1, T - B)] (a round
    never starts at or after a stop token; labels past the stop are ignored)."""
    return lens, torch.minimum(stops - 1, torch.full_like(stops, toks.shape[1] - B))


def block_logits(drafter, embed, head, toks, feats, rows, anchors, mask_id, block, amp):
    """Drafter logits [R, K, B-1, V] and labels [R, K, B-1] for blocks at per-row anchors [R, K]: slot 0
    holds the real token, slots 1..B-1 the mask token; each block sees the context features before its
    anchor and itself bidirectionally (DFlashDrafter.forward in the engine, with one position set per row)."""
    B = block
    R, K = anchors.shape
    dev = toks.device
    qpos = (anchors[:, :, None] + torch.arange(B, device=dev)).flatten(1)  # [R, K*B]
    tk = toks[rows]
    L = tk.shape[1]
    blk = torch.gather(tk, 1, qpos).view(R, K, B)
    labels = blk[:, :, 1:].clone()
    blk[:, :, 1:] = mask_id
    ctx_pos = torch.arange(L, device=dev)
    mask_ctx = ctx_pos[None, None, :] < anchors.repeat_interleave(B, dim=1)[:, :, None]  # [R, Q, L]
    blk_id = torch.arange(K, device=dev).repeat_interleave(B)
    mask_blk = (blk_id[:, None] == blk_id[None, :]).expand(R, -1, -1)
    mask = torch.cat([mask_ctx, mask_blk], 2)[:, None]  # [R, 1, Q, L + Q]
    with amp:
        ctx_kv = drafter.context_kv(feats[rows].float(), ctx_pos)
        x = embed(blk.flatten(1))
        cos, sin = _block_rope(drafter, qpos, x.dtype)
        logits = head(drafter.hidden(x, cos, sin, ctx_kv, mask)).float().view(R, K, B, -1)[:, :, 1:]
    return logits, labels


def block_loss(drafter, embed, head, toks, feats, stops, rows, anchors, mask_id, slot_w, amp):
    """DFlash block loss (block_logits); labels after the row's first stop token (stops [N]) are ignored:
    decoding ends there. Returns (weighted CE, per-slot accuracy [B-1], per-anchor accepted length
    [R*K] = 1 + correct prefix, as a dflash round at that root would emit)."""
    B = slot_w.numel()
    logits, labels = block_logits(drafter, embed, head, toks, feats, rows, anchors, mask_id, B, amp)
    offs = torch.arange(1, B, device=toks.device)
    valid = anchors[:, :, None] + offs <= stops[rows][:, None, None]  # [R, K, B-1]
    ce = F.cross_entropy(logits.flatten(0, 2), labels.flatten(), reduction="none").view(labels.shape)
    w = slot_w[1:] * valid
    hit = (logits.argmax(-1) == labels) & valid
    accepted = 1 + hit.long().cumprod(-1).sum(-1)
    acc = hit.float().sum((0, 1)) / valid.float().sum((0, 1)).clamp(min=1)
    return (ce * w).sum() / w.sum(), acc, accepted.flatten()


def _anchors(lo: torch.Tensor, hi: torch.Tensor, k: int, gen: torch.Generator) -> torch.Tensor:
    """[R, k] uniform positions in [lo, hi] per row (with repeats when the range is short)."""
    span = (hi - lo + 1).cpu()
    return lo[:, None] + (torch.rand(lo.numel(), k, generator=gen) * span[:, None]).long().to(lo.device)


def train_draft(out: Path, a, device) -> dict:
    from ddtree_chat.engine.config import DraftConfig
    from ddtree_chat.engine.drafter import DFlashDrafter
    from ddtree_chat.engine.loader import load_target

    from .common import draft_config
    from .data import Encoder
    from .draft_data import PromptSynth, greedy_forced
    from .export import export_drafter

    data = torch.load(out / "data.pt")
    vocab, n_ranks = data["meta"]["vocab"], data["meta"]["n_ranks"]
    target_dir = Path(a.target_from) if a.target_from else out / "target"
    tcfg, model = load_target(target_dir, torch.device("cpu"), torch.float32)
    model = _to_device(model, device)
    log(f"draft: target {target_dir}")
    torch.backends.cuda.matmul.allow_tf32 = False  # greedy continuations as the float32 CPU engine makes them
    archs = [parse_arch(s) for s in a.draft_arch]
    cfg_jsons = [draft_config(vocab, n_ranks, tcfg.hidden_size, block=a.draft_block, **arch) for arch in archs]
    dcfgs = [DraftConfig.from_json(c) for c in cfg_jsons]
    feature_layers, B, mask_id = tuple(dcfgs[0].target_layer_ids), dcfgs[0].block_size, dcfgs[0].mask_token_id
    enc = Encoder(out / "tokenizer")
    stop_ids = (enc.sp["[EOS]"], enc.sp["<|im_end|>"])  # the engine's stop tokens
    cuda = device.type == "cuda"
    # 1. The target's own greedy continuations and hidden states, on prompts it has not memorised.
    users, probe_users, n_novel = None, [], 0
    if data["meta"].get("distil"):
        from .draft_requests import CALLED, draft_requests
        from .prompts import prompt_id

        # Requests the target was not trained on and the drafter is not validated on (train and val prompts
        # excluded): the generator under another seed and a share of the held-out kind
        seen = {prompt_id(u) for u, _ in data["train_pairs"]} | {prompt_id(p[1]) for p in data["val_prompts"]}
        n_users = min(a.gen_batch * a.gen_pool_batches, a.draft_prompts)
        novel = ()
        if tasks_dir_ok(a.draft_novel_tasks):  # NOTE: tasks new to the target: its replies are harder to guess
            from .draft_requests import novel_tasks, split_probe
            from .prompts import FUNCTION_TEMPLATES, request_text
            from .self_instruct import kept_tasks

            proposed = kept_tasks(a.draft_novel_tasks)
            # the last new ones are held out of the drafter's requests: its validation on new tasks
            novel, probe = split_probe(novel_tasks(proposed, [u for u, _ in data["train_pairs"]]))
            probe_users = [request_text(FUNCTION_TEMPLATES[0], *t) for t in probe]
            log(f"draft: {len(novel) + len(probe)} of the {len(proposed)} tasks in {a.draft_novel_tasks} are new to "
                f"the target, {len(probe)} of them held out to validate on")
        users = draft_requests(n_users, data["meta"]["distil"]["seed"] + 1, seen, a.draft_everyday, novel=novel,
                               novel_share=a.draft_novel)
        new_names = {t[0] for t in novel}
        n_novel = sum(any(m in new_names for m in CALLED.findall(u)) for u in users)
        log(f"draft: {len(users)} fresh requests for the drafter's prompts, {a.draft_everyday:.0%} of them everyday "
            f"functions, {n_novel} asking for new tasks")
    # Distilled: the fresh requests are fewer than the pool, so more two-turn prompts (a random earlier
    # exchange first) keep repeated requests from repeating whole prompts.
    synth = PromptSynth(data, enc, SEED + 1, max_prompt=a.max_prompt, users=users,
                        p_code=0.05 if users else 0.15, p_multi=0.4 if users else 0.15)
    t_start = time.time()
    pool = sorted(synth.sample(a.gen_batch * a.gen_pool_batches), key=len)  # similar lengths batch together
    order = list(range(-(-len(pool) // a.gen_batch)))  # distinct prompts only: the pool may come out short
    random.Random(SEED + 4).shuffle(order)
    log(f"draft: {len(pool)} prompts synthesised in {time.time() - t_start:.1f}s "
        f"(lengths {len(pool[0])}..{len(pool[-1])}, median {len(pool[len(pool) // 2])})")
    # over every fill; each fill takes the next prompt batches of `order`, so no continuation is generated twice
    made = {"next": 0, "batches": 0, "sequences": 0, "roundable": 0, "seconds": 0.0}

    def fill(k: int, t0: float) -> list[tuple]:
        """The k-th pool of continuations (1-based): the target's greedy continuations and features of the next
        prompt batches, up to --draft-gen-seconds from t0 (or --draft-gen-batches) and the feature memory cap."""
        got, feat_bytes = [], 0
        while not (len(got) >= a.draft_gen_batches if a.draft_gen_batches is not None
                   else time.time() - t0 >= a.draft_gen_seconds):
            if feat_bytes > a.max_feature_gb * 1e9:
                log("draft: feature memory cap reached")
                break
            if made["next"] == len(order):
                log("draft: every synthesised prompt batch is used (raise --gen-pool-batches)")
                break
            i = order[made["next"]]
            made["next"] += 1
            prompts = pool[i * a.gen_batch : (i + 1) * a.gen_batch]
            toks, feats, lens = greedy_forced(model, prompts, a.gen_len, feature_layers, device)
            stops = first_stop(toks, lens, stop_ids)
            lo, hi = anchor_range(toks, lens, stops, B)
            ok = (hi >= lo).nonzero().flatten()  # rows that stop at once have no round
            got.append((toks, feats, stops, lo, hi, ok))
            stopped = int((stops < toks.shape[1]).sum())
            feat_bytes += feats.numel() * feats.element_size()
            log(f"draft: fill {k}: generated batch {len(got)} ({toks.shape[0]} x {toks.shape[1]} tokens, prompts "
                f"{int(lens.min())}..{int(lens.max())}, {stopped} stopped, mean round-able span "
                f"{float((hi - lo + 1).clamp(min=0).float().mean()):.0f}) at {time.time() - t0:.0f}s, "
                f"features {feat_bytes / 1e9:.1f} GB")
        n_seq = sum(b[0].shape[0] for b in got)
        made["batches"] += len(got)
        made["sequences"] += n_seq
        made["roundable"] += sum(int((b[4] - b[3] + 1).clamp(min=0).sum()) for b in got)
        made["seconds"] += time.time() - t0
        log(f"draft: fill {k}: {n_seq} sequences generated in {time.time() - t0:.0f}s (reproduce with "
            f"--draft-gen-batches {len(got)})")
        return got

    buckets = fill(1, t_start)
    gen_s = time.time() - t_start  # NOTE: the prompt synthesis and the first fill: what a later fill is expected to take
    if not buckets:
        raise SystemExit("draft: no continuation was generated (raise --draft-gen-seconds or --gen-pool-batches)")
    sample = buckets[0][0][0].tolist()
    # Held-out check: the validation split's real chat prompts (at position 0, as in a chat).
    vprompts = sorted((p[3] for p in data["val_prompts"] if len(p[3]) <= a.max_prompt), key=len)
    if not vprompts and (out / "heldout.json").exists():  # a tiny distilled set may have no val split
        vprompts = sorted((r["prompt_ids"] for r in json.loads((out / "heldout.json").read_text()).get("requests", [])),
                          key=len)

    def val_set(prompts: list[list[int]]) -> tuple:
        """The target's continuations of prompts, as block_loss reads them: (toks, feats, stops, rows, anchors)."""
        t, f, lens = greedy_forced(model, prompts, a.gen_len, feature_layers, device)
        stops = first_stop(t, lens, stop_ids)
        lo, hi = anchor_range(t, lens, stops, B)
        rows = (hi >= lo).nonzero().flatten()
        return t, f, stops, rows, _anchors(lo[rows], hi[rows], a.anchors, torch.Generator().manual_seed(SEED + 5))

    vals = {"val": val_set(vprompts)}
    if probe_users:  # the held-out new tasks, in the held-out requests' chat prompt
        vals["new tasks"] = val_set(enc.requests(probe_users))
    # 2. Train the drafter(s): every variant sees the same batches (a variant trained alone repeats exactly).
    embed, head = model.embed_tokens, model.lm_head  # frozen, shared with the target
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda)
    slot_w = torch.tensor([0.0] + [math.exp(-(k - 1) / a.slot_decay) for k in range(1, B)], device=device)
    variants = []
    for arch, cj, dc in zip(a.draft_arch, cfg_jsons, dcfgs):
        torch.manual_seed(SEED + 2)
        d = DFlashDrafter(dc).to(device)
        d.reset_rope(device)
        opt = torch.optim.AdamW(d.parameters(), lr=a.draft_lr, betas=(0.9, 0.95), weight_decay=0.01, fused=cuda)
        variants.append({"arch": arch, "config": cj, "drafter": d, "opt": opt,
                         "params": sum(p.numel() for p in d.parameters())})
        log(f"draft: variant {arch}: {variants[-1]['params'] / 1e6:.2f}M parameters")
    rng = random.Random(SEED + 3)
    agen = torch.Generator().manual_seed(SEED + 6)
    sizes = [b[5].numel() for b in buckets]
    fills, refills, refill_s = 1, a.draft_refills, 0.0  # fills done, fills wanted, seconds of the later fills

    def sample_batch(bs):
        bi = rng.choices(range(len(buckets)), weights=sizes)[0]
        toks, feats, stops, lo, hi, ok = buckets[bi]
        n = ok.numel()
        pick = rng.sample(range(n), bs) if n >= bs else [rng.randrange(n) for _ in range(bs)]
        rows = ok[torch.tensor(pick, device=device)]
        return toks, feats, stops, rows, _anchors(lo[rows], hi[rows], a.anchors, agen)

    def evaluate(v, which="val"):
        d = v["drafter"]
        d.eval()
        with torch.no_grad():
            vl, vacc, vtau = block_loss(d, embed, head, *vals[which], mask_id, slot_w, amp)
        d.train()
        return vl.item(), vacc.tolist(), vtau.float().mean().item()

    def probe_text(v) -> tuple[str, dict]:
        """The other validation sets' dflash tau: (log text, fields)."""
        taus = {w: evaluate(v, w)[2] for w in vals if w != "val"}
        return "".join(f" | {w} tau {t:.2f}" for w, t in taus.items()), \
            {f"{w.replace(' ', '_')}_tau": t for w, t in taus.items()}

    total = a.draft_steps or 10**9
    step, t_train, hist = 0, time.time(), []
    # NOTE: steps are timed from step 50 to 150: the first ones allocate memory for each new bucket shape
    # (a first estimate over steps 10-30 came out twice the steady rate).
    t_lo, t_hi = 50, 150
    while step < total:
        if a.draft_steps is None and step in (t_lo, t_hi):
            if cuda:
                torch.cuda.synchronize()
            if step == t_lo:
                t_mark = time.time()
            else:
                per = (time.time() - t_mark) / (t_hi - t_lo)
                left = a.draft_seconds - (time.time() - t_train)
                if a.deadline:
                    left = min(left, a.deadline - (time.time() - T0))
                left -= (a.draft_refills - 1) * gen_s  # the later fills, each expected to take as long as the first
                total = max(t_hi + 10, t_hi + int(left / per))
                log(f"draft: {per * 1000:.0f} ms/step ({len(variants)} variants) -> {total} steps "
                    f"(reproduce with --draft-steps {total})")
        if a.draft_steps is None and a.deadline and step > t_hi and step < total - 1 \
                and time.time() - T0 > a.deadline + 20:
            log(f"draft: past the deadline: stopping at step {step} of {total}")
            total = step + 1
        if fills < refills and step >= fills * total // a.draft_refills:
            if made["next"] == len(order):
                log("draft: no unused prompt batch left for another fill: training goes on with the last (raise "
                    "--gen-pool-batches)")
                refills = fills
            else:  # NOTE: new continuations replace the pool: R fills show the drafter R x the distinct continuations
                # under one feature memory cap (trained on one pool for ~15 epochs, it overfitted: docs/demo-training.md)
                t_fill = time.time()
                buckets.clear()
                if cuda:
                    torch.cuda.empty_cache()
                fills += 1
                buckets.extend(fill(fills, time.time()))
                sizes[:] = [b[5].numel() for b in buckets]
                refill_s += time.time() - t_fill
        batch = sample_batch(a.draft_batch)
        lr = _lr(step, total, a.draft_lr, min(200, total // 10))
        report = step % 500 == 0 or step == total - 1
        for v in variants:
            for g in v["opt"].param_groups:
                g["lr"] = lr
            loss, acc, _ = block_loss(v["drafter"], embed, head, *batch, mask_id, slot_w, amp)
            v["opt"].zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(v["drafter"].parameters(), 1.0)
            v["opt"].step()
            if report:
                vl, vacc, vtau = evaluate(v)
                text, fields = probe_text(v)
                hist.append({"arch": v["arch"], "step": step, "loss": loss.item(), "val_loss": vl, "val_tau": vtau,
                             **fields})
                log(f"draft {v['arch']}: step {step}/{total} loss {loss.item():.3f} acc/slot "
                    + " ".join(f"{x:.2f}" for x in acc.tolist())
                    + f" | val loss {vl:.3f} dflash-tau {vtau:.2f} acc/slot " + " ".join(f"{x:.2f}" for x in vacc)
                    + text)
        step += 1
    train_s = time.time() - t_train - refill_s
    res = {"steps": total, "train_seconds": round(train_s, 1), "gen_seconds": round(made["seconds"], 1),
           "fills": fills, "gen_batches": made["batches"], "gen_sequences": made["sequences"], "gen_len": a.gen_len,
           "gen_roundable_tokens": made["roundable"],
           "draft_batch": a.draft_batch, "block": a.draft_block, "anchors": a.anchors, "lr": a.draft_lr,
           "target": str(target_dir), "val_prompts": len(vprompts), "new_task_requests": n_novel,
           "new_task_prompts": len(probe_users),
           "variants": {}, "curve": hist,
           "sample_tokens": sample[:64]}
    for i, v in enumerate(variants):
        v["drafter"].eval()
        vl, vacc, vtau = evaluate(v)
        text, fields = probe_text(v)
        dirs = [out / f"draft-{v['arch']}"] + ([out / "draft"] if i == 0 else [])
        for d in dirs:
            export_drafter(v["drafter"], d, v["config"])
        log(f"draft {v['arch']}: val block loss {vl:.3f}, dflash-tau (per anchor) {vtau:.2f}, acc/slot "
            + " ".join(f"{x:.2f}" for x in vacc) + text + f" -> {', '.join(map(str, dirs))}")
        res["variants"][v["arch"]] = {"params": v["params"], "val_block_loss": vl, "val_acc_per_slot": vacc,
                                      "val_dflash_tau_per_anchor": vtau, **fields}
    (out / "draft_train.json").write_text(json.dumps(res, indent=1))
    return res


def main(argv=None) -> int:
    from .rename import DEFAULT_POOL, POOLS

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--stages", default=None, help="default: data,target,draft (data,draft with --target-from)")
    ap.add_argument("--target-from", type=Path, default=None,
                    help="an existing target dir (e.g. ddtree_chat/assets/demo/target): reuse its tokenizer in the data "
                         "stage and train only the drafter against it")
    ap.add_argument("--toy", "--tiny", action="store_true", help="tiny CPU smoke run (150 files, seconds of training)")
    ap.add_argument("--distil", type=Path, nargs="+", default=None,
                    help="distil_data.py output dir(s) of one teacher: the target learns their answers (issue 31)")
    ap.add_argument("--code-share", type=float, default=0.25,
                    help="with --distil: the share of stdlib source in the target's train characters")
    ap.add_argument("--renames", type=int, default=3,
                    help="with --distil: name-swapped copies of each train function answer (dev/demo/rename.py)")
    ap.add_argument("--rename-pool", choices=POOLS, default=DEFAULT_POOL,
                    help="with --renames: the new names' words (dev/demo/rename.py)")
    ap.add_argument("--name-weight", type=int, default=1,
                    help="with --distil: the train loss weight of the requested name's tokens on a def line")
    ap.add_argument("--draft-prompts", type=int, default=20000,
                    help="with --distil: fresh generated requests for the drafter's prompts (at most)")
    ap.add_argument("--draft-everyday", type=float, default=0.5,
                    help="with --distil: the share of those requests of the held-out kind (everyday functions in "
                         "phrasings the target was not trained on; draft_requests.py)")
    ap.add_argument("--draft-novel", type=float, default=0.0,
                    help="with --distil and --draft-novel-tasks: the share of the drafter's requests asking for tasks "
                         "the target never trained on, each in every phrasing (draft_requests.py)")
    ap.add_argument("--draft-novel-tasks", type=Path, default=None,
                    help="a self_instruct.py run directory: its kept proposals, less those the target's training "
                         "requests name, are the tasks --draft-novel asks for; the last 64 (half at most) are held "
                         "out of the drafter's requests and validate it on new tasks ('new tasks tau')")
    ap.add_argument("--data-from", type=Path, default=None,
                    help="another OUT (or a --stages data run's): copy its cached data stage when it was built with "
                         "the same settings and input files, instead of tokenising again")
    ap.add_argument("--device", default=None)
    ap.add_argument("--limit-files", type=int, default=None)
    ap.add_argument("--target-seconds", type=float, default=40)
    ap.add_argument("--target-steps", type=int, default=None)
    ap.add_argument("--target-deadline", type=float, default=None,
                    help="seconds after start: past them, stop the target at the next step boundary, save a checkpoint "
                         "in OUT and exit without exporting (continue with --resume)")
    ap.add_argument("--target-steps-per-call", type=int, default=None,
                    help="train at most this many target steps in this call, then stop as at --target-deadline")
    ap.add_argument("--target-checkpoint-every", type=int, default=None,
                    help="also save the target's checkpoint every N steps (what a kill before the deadline keeps)")
    ap.add_argument("--resume", action="store_true",
                    help=f"continue the target from OUT/{CKPT} when there is one (same flags), else start afresh; "
                         "skip it when OUT holds its finished export")
    ap.add_argument("--target-val-every", type=int, default=100, help="validate (and maybe keep) every N target steps")
    ap.add_argument("--target-arch", default=None,
                    help="key=int,... over the target's sizes (common.TARGET), e.g. heads=8,kv_lora=128")
    ap.add_argument("--target-lr", type=float, default=3e-3)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--qat-frac", type=float, default=0.12)
    ap.add_argument("--bias-rate", type=float, default=1e-3)
    ap.add_argument("--val-windows", type=int, default=192)
    ap.add_argument("--copy-probe", type=int, default=32,
                    help="validation function requests whose greedy answers are checked for `def NAME(` (copy_probe.py)")
    ap.add_argument("--heldout-probe", type=int, default=160,
                    help="at each validation step, greedy tokens per answer to the 20 held-out requests, scored as "
                         "eval_heldout.py scores them and logged (copy_probe.py); 0: no held-out probe")
    ap.add_argument("--draft-arch", nargs="+", default=[f"{DRAFT['layers']}x{DRAFT['inter']}"],
                    help="drafter variants LAYERSxINTERMEDIATE, trained side by side on the same batches; "
                         "the first is also written to OUT/draft")
    ap.add_argument("--draft-block", type=int, default=DRAFT["block"], help="block size: drafted tokens + 1")
    ap.add_argument("--draft-seconds", type=float, default=200)
    ap.add_argument("--draft-steps", type=int, default=None)
    ap.add_argument("--draft-gen-seconds", type=float, default=40)
    ap.add_argument("--draft-gen-batches", type=int, default=None)
    ap.add_argument("--draft-refills", type=int, default=1,
                    help="fills of continuations, each replacing the last at an equal share of the steps (each as "
                         "--draft-gen-seconds / --draft-gen-batches and the memory cap say): R times the distinct "
                         "continuations under one memory cap")
    ap.add_argument("--gen-pool-batches", type=int, default=64, help="prompt batches synthesised (an upper bound)")
    ap.add_argument("--max-feature-gb", type=float, default=70.0, help="stop generating past this many GB of features")
    ap.add_argument("--deadline", type=float, default=None, help="stop drafter training by this many seconds after start")
    ap.add_argument("--gen-batch", type=int, default=4096)
    ap.add_argument("--gen-len", type=int, default=160)
    ap.add_argument("--max-prompt", type=int, default=256)
    ap.add_argument("--draft-lr", type=float, default=3e-3)
    ap.add_argument("--draft-batch", type=int, default=256)
    ap.add_argument("--anchors", type=int, default=32)
    ap.add_argument("--slot-decay", type=float, default=5.0)
    a = ap.parse_args(argv)
    for flag in ("target_steps_per_call", "target_checkpoint_every", "target_val_every"):
        if getattr(a, flag) is not None and getattr(a, flag) < 1:
            ap.error(f"--{flag.replace('_', '-')} must be at least 1")
    if a.draft_refills < 1:
        ap.error("--draft-refills must be at least 1")
    if not 0 <= a.draft_novel <= 1 - a.draft_everyday:
        ap.error("--draft-novel and --draft-everyday are shares of the drafter's requests: each >= 0, together <= 1")
    if a.draft_novel > 0 and not tasks_dir_ok(a.draft_novel_tasks):
        ap.error(f"--draft-novel needs --draft-novel-tasks: a self_instruct.py run directory with proposals.jsonl "
                 f"(given: {a.draft_novel_tasks})")
    if a.toy:
        a.limit_files = a.limit_files or 150
        a.target_steps = a.target_steps or 30
        a.batch, a.seq, a.val_windows, a.copy_probe = 4, 128, 8, min(a.copy_probe, 4)
        a.heldout_probe = min(a.heldout_probe, 16)
        a.draft_steps, a.draft_gen_batches = a.draft_steps or 20, a.draft_gen_batches or 1
        a.gen_batch, a.gen_len, a.gen_pool_batches, a.draft_batch, a.anchors = 8, 24, 2, 4, 4
    if a.target_arch:
        from .common import set_target

        try:
            log(f"target sizes: {set_target(a.target_arch)}")
        except ValueError as e:
            ap.error(str(e))
    stages = (a.stages or ("data,draft" if a.target_from else "data,target,draft")).split(",")
    if a.target_from and "target" in stages:
        ap.error("--target-from keeps the given target: leave the target stage out")
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.manual_seed(SEED)
    a.out.mkdir(parents=True, exist_ok=True)
    log(f"demo train: stages {stages}, device {device}, torch {torch.__version__}")
    try:
        return _run_stages(a, stages, device)
    except ResumeError as e:
        print(f"demo train: {e}", file=sys.stderr, flush=True)
        return 1


def _run_stages(a, stages: list[str], device) -> int:
    if "data" in stages:
        from .data import prepare_cached

        meta = prepare_cached(a.out, a.limit_files, log=log, data_from=a.data_from, tokenizer_from=a.target_from,
                              distil=a.distil, code_share=a.code_share, renames=a.renames, name_weight=a.name_weight,
                              rename_pool=a.rename_pool)
        shipped = a.target_from.parent / "data_meta.json" if a.target_from else None
        if shipped is not None and shipped.exists():
            ref = json.loads(shipped.read_text())
            same = ref.get("file_list_sha256") == meta["file_list_sha256"] and ref.get("tokens") == meta["tokens"]
            log("data: same files and token counts as the target's training data" if same else
                f"data: WARNING: differs from the target's training data ({shipped}): "
                f"files {meta['file_list_sha256'][:12]} vs {ref.get('file_list_sha256', '?')[:12]}, "
                f"tokens {meta['tokens']} vs {ref.get('tokens')}")
    if "target" in stages and train_target(a.out, a, device) is None:
        log("paused: the later stages wait for the exported target")
        return 0
    if "draft" in stages:
        train_draft(a.out, a, device)
    log("done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

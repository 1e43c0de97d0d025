"""What is shown under a finished reply and stored with it."""

from __future__ import annotations

STOP_NOTES = {"stopped": "stopped", "quit": "stopped at quit", "max_new_tokens": "max tokens reached",
              "context": "context full", "error": "error"}


def footer_for(done: dict, saved: bool = False) -> str:
    parts = []
    tokens = done.get("tokens", len(done.get("token_ids") or ()))
    if tokens:
        parts.append(f"{tokens} tokens")
    if done.get("rounds"):
        parts.append(f"{done['rounds']} rounds")
    if done.get("mean_accepted_length") is not None:
        parts.append(f"{float(done['mean_accepted_length']):.2f} tokens/forward")
    if done.get("tokens_per_second") is not None:
        parts.append(f"{float(done['tokens_per_second']):.1f} tok/s")
    if done.get("mode"):
        parts.append(str(done["mode"]))
    if (done.get("temperature") or 0) > 0 and done.get("seed") is not None:  # NOTE: /seed N (or --seed) repeats it
        parts.append(f"seed {done['seed']}")
    note = STOP_NOTES.get(done.get("stop_reason", ""))
    if note:
        parts.append(note)
    return " · ".join(parts)


def meta_for(done: dict, settings) -> dict:
    """Numbers kept with an assistant message (the footer is rebuilt from them on reopen)."""
    keep = ("stop_reason", "rounds", "target_forwards", "mean_accepted_length", "tokens_per_second")
    meta = {k: done[k] for k in keep if done.get(k) is not None}
    meta["tokens"] = len(done.get("token_ids") or ())
    # The engine reports the mode it really ran (e.g. ar when there is no drafter).
    meta.update(mode=done.get("mode") or settings.mode, budget=done.get("budget", settings.budget),
                temperature=settings.temperature, seed=settings.seed)
    return meta

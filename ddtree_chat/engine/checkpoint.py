"""Safetensors checkpoints: sharded (index json) or single file, read tensor by tensor (memory-mapped),
with errors that name the file and tensor. Never reads pickled weights."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from .errors import CheckpointError

_PICKLED = ("*.bin", "*.pt", "*.pth", "*.ckpt")
_INDEX = "model.safetensors.index.json"


class CheckpointReader:
    """Maps tensor names to shards; opens each shard lazily and keeps it memory-mapped."""

    def __init__(self, directory: str | Path):
        self.dir = Path(directory)
        self._handles: dict[str, object] = {}
        if not self.dir.is_dir():
            raise CheckpointError(f"{self.dir} is not a directory; pass the folder that holds the checkpoint.")
        index = self.dir / _INDEX
        if index.is_file():
            self.weight_map = self._read_index(index)
        else:
            files = sorted(self.dir.glob("*.safetensors"))
            if not files:
                pickled = [p.name for pat in _PICKLED for p in self.dir.glob(pat)]
                if pickled:
                    raise CheckpointError(
                        f"{self.dir} holds only pickled weights ({pickled[0]}); pickles can run code, so only "
                        "safetensors checkpoints are loaded — convert it to safetensors first.")
                raise CheckpointError(f"{self.dir} has no {_INDEX} and no .safetensors file.")
            if len(files) > 1:
                raise CheckpointError(f"{self.dir} has {len(files)} .safetensors files but no {_INDEX} to map them.")
            self.weight_map = {name: files[0].name for name in self._open(files[0].name).keys()}
        missing = sorted({f for f in self.weight_map.values() if not (self.dir / f).is_file()})
        if missing:
            raise CheckpointError(
                f"shard {missing[0]} is listed in {_INDEX} but missing from {self.dir}"
                + (f" ({len(missing)} shards missing)" if len(missing) > 1 else "") + "; finish the download.")

    def _read_index(self, path: Path) -> dict[str, str]:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            wm = data["weight_map"]
            if not isinstance(wm, dict):
                raise TypeError("weight_map is not an object")
            return {str(k): str(v) for k, v in wm.items()}
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"{path} is unreadable ({e}); re-download the index file.") from None

    def _open(self, fname: str):
        h = self._handles.get(fname)
        if h is None:
            try:
                h = safe_open(str(self.dir / fname), framework="pt", device="cpu")
            except Exception as e:  # safetensors raises its own error type for truncated/corrupt headers
                raise CheckpointError(f"{self.dir / fname} is truncated or corrupt ({e}); re-download it.") from None
            self._handles[fname] = h
        return h

    def __contains__(self, name: str) -> bool:
        return name in self.weight_map

    def get(self, name: str, shape: tuple[int, ...] | None = None, dtype: torch.dtype | None = None,
            rows: slice | None = None, cols: slice | None = None) -> torch.Tensor:
        """One tensor (optionally a row/column slice, read without materialising the rest)."""
        fname = self.weight_map.get(name)
        if fname is None:
            raise CheckpointError(f"tensor {name} is missing from the checkpoint in {self.dir}.")
        h = self._open(fname)
        try:
            if rows is None and cols is None:
                t = h.get_tensor(name)
            else:
                sl = h.get_slice(name)
                t = sl[rows or slice(None), cols or slice(None)] if len(sl.get_shape()) > 1 else sl[rows or slice(None)]
        except Exception as e:
            raise CheckpointError(f"tensor {name} in {fname} could not be read ({e}); the file may be corrupt.") from None
        if shape is not None and tuple(t.shape) != tuple(shape):
            raise CheckpointError(f"tensor {name} in {fname} has shape {list(t.shape)}, expected {list(shape)}; "
                                  "the checkpoint does not match its config.json.")
        if dtype is not None and t.dtype != dtype:
            raise CheckpointError(f"tensor {name} in {fname} has dtype {t.dtype}, expected {dtype}.")
        return t

    def close(self) -> None:
        self._handles.clear()

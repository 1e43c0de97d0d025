"""Safetensors checkpoints: sharded (index json) or single file, read tensor by tensor, with errors that name
the file and tensor. Never reads pickled weights.

Each read is one request for the bytes it needs (a tensor, or the rows of a row slice; a column slice
reads its rows whole and keeps the columns): a tensor-parallel rank reading its slices through a memory map
faulted in nearly every page of the files at under half the disk's sequential rate (BENCHMARKS.md)."""

from __future__ import annotations

import io
import json
import math
import struct
from pathlib import Path

import torch

from .errors import CheckpointError

_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}

_PICKLED = ("*.bin", "*.pt", "*.pth", "*.ckpt")
_INDEX = "model.safetensors.index.json"


class CheckpointReader:
    """Maps tensor names to shards; opens each shard lazily (its header parsed, its file kept open)."""

    def __init__(self, directory: str | Path):
        self.dir = Path(directory)
        self._handles: dict[str, tuple[io.FileIO, int, dict]] = {}  # file -> (file, data start, name -> header entry)
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
            self.weight_map = {name: files[0].name for name in self._open(files[0].name)[2]}
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

    def _open(self, fname: str) -> tuple[io.FileIO, int, dict]:
        """(file, where the data starts, the header's tensors) of a shard, its header checked against its size."""
        h = self._handles.get(fname)
        if h is None:
            path = self.dir / fname
            f = io.FileIO(path, "r")
            try:
                size = path.stat().st_size
                n = struct.unpack("<Q", f.read(8))[0] if size >= 8 else -1
                if not 0 < n <= size - 8:
                    raise ValueError("its header length runs past the file")
                header = json.loads(f.read(n))
                header.pop("__metadata__", None)
                for name, e in header.items():
                    if not (isinstance(e, dict) and e.get("dtype") in _DTYPES and len(e.get("data_offsets", ())) == 2):
                        raise ValueError(f"tensor {name}: a header entry this reader does not know")
                    if 8 + n + e["data_offsets"][1] > size:
                        raise ValueError(f"tensor {name} runs past the end of the file")
            except (OSError, ValueError, struct.error) as e:
                f.close()
                raise CheckpointError(f"{path} is truncated or corrupt ({e}); re-download it.") from None
            h = self._handles[fname] = (f, 8 + n, header)
        return h

    def __contains__(self, name: str) -> bool:
        return name in self.weight_map

    def get(self, name: str, shape: tuple[int, ...] | None = None, dtype: torch.dtype | None = None,
            rows: slice | None = None, cols: slice | None = None) -> torch.Tensor:
        """One tensor, or a row/column slice of it (unit steps), read without the rest of the file."""
        fname = self.weight_map.get(name)
        if fname is None:
            raise CheckpointError(f"tensor {name} is missing from the checkpoint in {self.dir}.")
        f, start, header = self._open(fname)
        e = header.get(name)
        if e is None:
            raise CheckpointError(f"tensor {name} is missing from {self.dir / fname}, which the index names for it.")
        full, kind = [int(d) for d in e["shape"]], _DTYPES[e["dtype"]]
        r0, r1, step = (rows or slice(None)).indices(full[0] if full else 1)
        if step != 1 or (cols is not None and cols.step not in (None, 1)):
            raise ValueError(f"{name}: slices with steps are not read")
        row = kind.itemsize * math.prod(full[1:])
        begin, end = (int(v) for v in e["data_offsets"])
        if end - begin != row * (full[0] if full else 1):
            raise CheckpointError(f"tensor {name} in {fname} has {end - begin} bytes for shape {full}; the file is corrupt.")
        buf = torch.empty(max(r1 - r0, 0) * row, dtype=torch.uint8)
        view, at = memoryview(buf.numpy()), start + begin + r0 * row
        while view.nbytes:  # NOTE: a read may return less than asked: read on from there
            got = _read_at(f, view, at)
            if not got:
                raise CheckpointError(f"tensor {name} in {fname} could not be read (the file ends early); "
                                      "the file may be corrupt.")
            view, at = view[got:], at + got
        t = buf.view(kind).view(max(r1 - r0, 0), *full[1:]) if full else buf.view(kind).view(())
        if cols is not None and len(full) > 1:
            t = t[:, cols].clone()  # NOTE: its rows were read whole; only this slice stays
        if shape is not None and tuple(t.shape) != tuple(shape):
            raise CheckpointError(f"tensor {name} in {fname} has shape {list(t.shape)}, expected {list(shape)}; "
                                  "the checkpoint does not match its config.json.")
        if dtype is not None and t.dtype != dtype:
            raise CheckpointError(f"tensor {name} in {fname} has dtype {t.dtype}, expected {dtype}.")
        return t

    def close(self) -> None:
        for f, _, _ in self._handles.values():
            f.close()
        self._handles.clear()


def _read_at(f: io.FileIO, view: memoryview, at: int) -> int:
    """One read request into view from the file's offset `at`: the bytes it gave (fewer at the file's end)."""
    f.seek(at)
    return f.readinto(view)

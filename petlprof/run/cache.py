"""Hidden-state cache: the side-tuning fast path (opt-in, ``--cache-hidden-states``).

A side-tuning model (READ, LST) runs its frozen backbone without autograd in eval mode, so the
hidden states of a given training example never change.  The first time an example is seen its
states are kept (half precision by default), keyed by the example's index in the training split;
once every example of a batch is cached, the step runs only the side network
(``model.side_forward``) on states assembled from the cache, and the backbone is skipped.

The model provides the interface of :class:`petlprof.side_tuning.SideTunedModel`:
``backbone_states(input_ids, attention_mask) -> {name: [batch, tokens, ...]}``,
``state_masks(attention_mask) -> {name: bool [batch, tokens]}`` (the real token positions) and
``side_forward(states, input_ids, attention_mask) -> logits``.  A language-modelling batch's inputs
also hold ``labels`` (teacher forcing: fixed per example, so its states are too); they are passed to
all three (``state_masks(attention_mask, labels=...)``: an encoder-decoder's decoder states are real at
the target positions), and a batch without labels calls them exactly as before.

Only real token positions are kept, so an example fits any batch it is shuffled into: the cache
scatters them into the batch's padded layout and leaves zeros at padding positions, which a side
network never reads into a real position.  A model whose real positions per example depended on
the batch would be served the first positions of a longer entry, and a shorter entry is a miss
that is refreshed; the built-in families do not do that (the T5 decoder reads the unshifted input
mask).  Entries live on the model's device (on CUDA they count in the train phase's peak memory)
and go to memory until ``budget_bytes`` is used, then to a memory-mapped file in
``spill_dir`` (deleted by :meth:`HiddenStateCache.close`).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

from petlprof.results.records import CacheSummary

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
SPILL_FILE = "hidden-state-cache.bin"
DEFAULT_BUDGET_BYTES = 2**30  # in memory; the rest spills to disk


class HiddenStateCache:
    """Per-example backbone states of one training split, in memory up to a budget, then on disk."""

    def __init__(self, budget_bytes: int, spill_dir: str | Path | None = None, dtype: str = "float16"):
        if dtype not in DTYPES:
            raise ValueError(f"cache dtype '{dtype}' is not one of {', '.join(DTYPES)}")
        self.budget_bytes = int(budget_bytes)
        self.dtype_name, self.dtype = dtype, DTYPES[dtype]
        self._own_dir: tempfile.TemporaryDirectory[str] | None = None
        if spill_dir is None:
            self._own_dir = tempfile.TemporaryDirectory(prefix="petlprof-cache-")
            spill_dir = self._own_dir.name
        self.spill_path = Path(spill_dir) / SPILL_FILE
        self._file: BinaryIO | None = None
        self._made_dir = False
        self._mapped: np.memmap | None = None
        # index -> {name: tensor in memory, or (byte offset, shape) in the spill file}
        self._entries: dict[int, dict[str, Any]] = {}
        self.memory_bytes = self.disk_bytes = 0
        self.hits = self.misses = 0

    def logits(self, model, inputs: dict[str, torch.Tensor], indices) -> torch.Tensor:
        """The model's logits for a batch, from cached states when every example of it is cached."""
        indices = [int(i) for i in indices]
        labels = {"labels": inputs["labels"]} if inputs.get("labels") is not None else {}
        masks = model.state_masks(inputs["attention_mask"], **labels)
        states = self._assemble(indices, masks, inputs["attention_mask"].device)
        if states is None:
            self.misses += len(indices)
            states = model.backbone_states(**inputs)
            self._store(indices, states, masks)
        else:
            self.hits += len(indices)
        return model.side_forward(states, **inputs)

    def _assemble(self, indices, masks, device) -> dict[str, torch.Tensor] | None:
        counts = {name: mask.sum(1).tolist() for name, mask in masks.items()}
        rows: dict[str, list[torch.Tensor]] = {name: [] for name in masks}
        for row, index in enumerate(indices):
            entry = self._entries.get(index)
            if entry is None or set(entry) != set(masks):
                return None
            for name in masks:
                stored = self._read(entry[name])
                if stored.shape[0] < counts[name][row]:
                    return None
                rows[name].append(stored[: counts[name][row]])
        states = {}
        for name, mask in masks.items():
            real = torch.cat(rows[name]).to(device, non_blocking=True)
            out = torch.zeros(*mask.shape, *real.shape[1:], dtype=self.dtype, device=device)
            out[mask] = real
            states[name] = out
        return states

    def _store(self, indices, states, masks) -> None:
        for row, index in enumerate(indices):
            old = self._entries.get(index, {})
            entry = {}
            for name, mask in masks.items():
                real = states[name][row][mask[row]].to(self.dtype)
                if name in old and self._shape(old[name])[0] >= real.shape[0]:
                    entry[name] = old[name]  # the stored entry covers this one (see the module notes)
                    continue
                nbytes = real.numel() * real.element_size()
                if name in old and torch.is_tensor(old[name]):
                    self.memory_bytes -= old[name].numel() * old[name].element_size()
                if self.memory_bytes + nbytes <= self.budget_bytes:
                    entry[name] = real.clone()
                    self.memory_bytes += nbytes
                else:
                    entry[name] = self._spill(real)
            self._entries[index] = entry

    @staticmethod
    def _shape(item) -> tuple:
        return tuple(item.shape) if torch.is_tensor(item) else item[1]

    def _spill(self, tensor: torch.Tensor) -> tuple[int, tuple]:
        if self._file is None:
            self._made_dir = not self.spill_path.parent.exists()
            self.spill_path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.spill_path, "wb")
        raw = tensor.detach().cpu().contiguous().view(torch.uint8).numpy()
        offset = self.disk_bytes
        self._file.write(raw.tobytes())
        self._file.flush()
        self.disk_bytes += raw.size
        return offset, tuple(tensor.shape)

    def _read(self, item) -> torch.Tensor:
        if torch.is_tensor(item):
            return item
        offset, shape = item
        if self._mapped is None or self._mapped.shape[0] < self.disk_bytes:  # map again once the file grew
            self._mapped = np.memmap(self.spill_path, dtype=np.uint8, mode="c", shape=(self.disk_bytes,))
        nbytes = int(np.prod(shape)) * torch.empty((), dtype=self.dtype).element_size()
        raw = torch.from_numpy(self._mapped[offset : offset + nbytes])
        return raw.view(self.dtype).reshape(shape)

    def summary(self) -> CacheSummary:
        """Figures for the run record's train phase."""
        looked_up = self.hits + self.misses
        return {
            "cache_bytes": self.memory_bytes + self.disk_bytes,
            "cache_memory_bytes": self.memory_bytes,
            "cache_disk_bytes": self.disk_bytes,
            "cache_budget_bytes": self.budget_bytes,
            "cache_dtype": self.dtype_name,
            "cache_examples": len(self._entries),
            "cache_hit_rate": self.hits / looked_up if looked_up else None,
        }

    def close(self) -> None:
        """Drop the entries and delete the spill file."""
        self._entries.clear()
        self._mapped = None
        if self._file is not None:
            self._file.close()
            self._file = None
        self.spill_path.unlink(missing_ok=True)
        if self._made_dir:
            self.spill_path.parent.rmdir()
        if self._own_dir is not None:
            self._own_dir.cleanup()

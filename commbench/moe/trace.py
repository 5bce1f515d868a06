"""Captured routing: top-k expert ids (and optionally weights) per token per step, read from
a file and replayed as the benchmark's routing.

A trace is ``topk`` int64 [steps, tokens, topk]: ``tokens`` is a step's tokens over all the
source ranks it was recorded on, in order. Replayed at world W, a step's tokens are split in
W contiguous chunks (rank r gets tokens [r N/W, (r+1) N/W)) and the experts are spread
evenly over the W ranks, as every generated routing's are, whatever EP size the trace was
recorded at (``recorded_world``): a trace recorded at EP 8 and replayed at EP 2 is re-sharded.

Files (docs/moe.md, "Replaying captured routing"):

- ``.npy``: an integer array [steps, tokens, topk] or [tokens, topk] (one step);
- ``.npz``: ``topk_idx`` (as .npy), optional ``weights`` (same shape, float), optional
  scalars ``num_experts`` and ``ep_size``;
- ``.jsonl``: an optional header line ``{"num_experts": E, "ep_size": P}``, then one line
  per token ``{"step": s, "experts": [...], "weights": [...]}`` (step and weights optional);
- ``.csv``: optional comment lines ``# num_experts=E ep_size=P``, the column names
  ``step,experts,weights`` (step and weights optional), one row per token, the ids and the
  weights separated by spaces inside their field.

Anything else is refused with one ValueError line naming the problem, before more than the
file's size is looked at for a file over the limit. Every reader keeps pickles off.
"""
from __future__ import annotations

import csv
import hashlib
import io
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from commbench.core.errors import UsageError
from commbench.core.user_files import check_user_file

from .routing import Routing
from .trace_text import HEADER_KEYS as _HEADER_KEYS
from .trace_text import read_csv, read_jsonl

MAX_TRACE_NBYTES = 1 << 30
# Per-expert counts are arrays of this length: an absurd id must not size them.
MAX_EXPERTS = 1 << 20
FORMATS = (".npy", ".npz", ".jsonl", ".csv")
_NPZ_KEYS = ("topk_idx", "weights", "num_experts", "ep_size", "source_name", "source_sha256")
# The EP size `commbench routing` reads a trace at when neither the file nor the flag says one.
DEFAULT_STATS_WORLD = 8


@dataclass(frozen=True, eq=False)
class Trace:
    """A loaded trace: topk int64 [steps, tokens, topk], weights float32 of that shape or None
    (equal weights 1/K then), the expert count (the file's, or the largest id + 1), the EP
    size it was recorded at (or None), and where it came from."""

    topk: np.ndarray
    weights: np.ndarray | None
    num_experts: int
    recorded_world: int | None
    path: str
    sha256: str
    # The file it was first read from, where this is a run's copy of it (compact_bytes).
    source_name: str = ""
    source_sha256: str = ""

    @property
    def steps(self) -> int:
        return int(self.topk.shape[0])

    @property
    def tokens(self) -> int:
        return int(self.topk.shape[1])

    @property
    def top_k(self) -> int:
        return int(self.topk.shape[2])

    @property
    def name(self) -> str:
        return Path(self.path).name

    @property
    def label(self) -> str:
        """The file's name and its content's sha256 prefix: what rows carry as `trace`."""
        return f"{self.source_name or self.name}@{(self.source_sha256 or self.sha256)[:16]}"

    @property
    def source(self) -> str:
        return f"{self.path} (sha256 {self.sha256})" + (
            f", a copy of {self.source_name} (sha256 {self.source_sha256})" if self.source_name else "")

    def check_world(self, world: int) -> None:
        """ValueError unless the trace splits over world ranks: its tokens in equal chunks,
        its experts evenly."""
        self._check_tokens(world)
        if self.num_experts % world:
            raise ValueError(f"trace {self.name}: {self.num_experts} experts do not spread evenly over {world} ranks")

    def _check_tokens(self, world: int) -> None:
        if world < 1 or self.tokens % world:
            raise ValueError(f"trace {self.name}: {self.tokens} tokens a step do not split over {world} ranks "
                             f"(tokens a step must be a multiple of the world)")

    def routing(self, rank: int, world: int, step: int = 0) -> Routing:
        """Rank's tokens of step `step` (taken mod steps: a point cycles through the trace),
        the world's contiguous chunk in order."""
        self._check_tokens(world)
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} is not in a world of {world}")
        n = self.tokens // world
        s = int(step) % self.steps
        topk = self.topk[s, rank * n:(rank + 1) * n]
        if self.weights is None:
            w = np.full(topk.shape, 1.0 / self.top_k, np.float32)
        else:
            w = self.weights[s, rank * n:(rank + 1) * n]
        return Routing(np.ascontiguousarray(topk, np.int64), np.ascontiguousarray(w, np.float32))

    def expert_rank(self, world: int) -> np.ndarray:
        """[steps, tokens, topk] the rank hosting each pick's expert at world."""
        self.check_world(world)
        return self.topk // (self.num_experts // world)

    def rank_loads(self, world: int) -> np.ndarray:
        """[steps, world] rows each rank receives: the (token, expert) picks landing on it."""
        dest = self.expert_rank(world).reshape(self.steps, -1)
        return np.stack([np.bincount(d, minlength=world) for d in dest]).astype(np.int64)

    def expert_loads(self) -> np.ndarray:
        """[steps, num_experts] picks of each expert."""
        flat = self.topk.reshape(self.steps, -1)
        return np.stack([np.bincount(f, minlength=self.num_experts) for f in flat]).astype(np.int64)

    def local_picks(self, world: int) -> np.ndarray:
        """[steps] picks whose expert sits on the token's own rank (tokens split in order)."""
        src = (np.arange(self.tokens) // (self.tokens // world))[None, :, None]
        return (self.expert_rank(world) == src).sum(axis=(1, 2)).astype(np.int64)

    def reshard_note(self, world: int) -> str | None:
        """What replaying at `world` does to a trace recorded at another EP size; None when
        the sizes agree or the file does not say one."""
        if self.recorded_world is None or self.recorded_world == world:
            return None
        return (f"recorded at EP {self.recorded_world}, replayed at EP {world}: experts re-sharded over {world} "
                f"ranks (E/{world} each), tokens split in order")


def _ratio(load: np.ndarray) -> float:
    mean = float(load.mean())
    return float(load.max()) / mean if mean > 0 else 0.0


def trace_stats(trace: Trace, world: int) -> dict:
    """The trace's load at world: over all steps together ("all") and per step ("per_step",
    a list), each with rank_load_max_over_mean, hottest_rank, expert_load_max_over_mean,
    hottest_expert and local_pick_share."""
    ranks, experts, local = trace.rank_loads(world), trace.expert_loads(), trace.local_picks(world)
    picks = trace.tokens * trace.top_k

    def one(r, e, loc, n):
        return {"rank_load_max_over_mean": _ratio(r), "hottest_rank": int(np.argmax(r)),
                "expert_load_max_over_mean": _ratio(e), "hottest_expert": int(np.argmax(e)),
                "local_pick_share": float(loc) / n if n else 0.0}
    return {"all": one(ranks.sum(0), experts.sum(0), local.sum(), picks * trace.steps),
            "per_step": [one(ranks[s], experts[s], local[s], picks) for s in range(trace.steps)]}


# --- reading -------------------------------------------------------------------------------

def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _scalar(value, key: str, where: str) -> int:
    a = np.asarray(value)
    if a.ndim != 0 or a.dtype.kind not in "iu" or int(a) < 1:
        raise ValueError(f"{where}: {key} must be one integer >= 1, got {a.tolist()!r}")
    return int(a)


def _checked(topk, weights, num_experts, where: str) -> tuple[np.ndarray, np.ndarray | None, int]:
    """The arrays in their replayed form, or ValueError naming what is wrong."""
    topk = np.asarray(topk)
    if topk.dtype.kind not in "iu":
        raise ValueError(f"{where}: expert ids must be integers, got dtype {topk.dtype}")
    if topk.ndim == 2:
        topk = topk[None]
    if topk.ndim != 3:
        raise ValueError(f"{where}: expert ids must be shaped [steps, tokens, topk] or [tokens, topk], "
                         f"got {list(topk.shape)}")
    if topk.size == 0:
        raise ValueError(f"{where}: empty trace (shape {list(topk.shape)})")
    if topk.min() < 0:
        raise ValueError(f"{where}: negative expert id {int(topk.min())}")
    top = int(topk.max())
    if (num_experts or top + 1) > MAX_EXPERTS:
        raise ValueError(f"{where}: {num_experts or top + 1} experts (largest id {top}), over the {MAX_EXPERTS} "
                         f"a trace may have")
    if num_experts is not None and top >= num_experts:
        raise ValueError(f"{where}: expert id {top} is out of range for num_experts {num_experts}")
    topk = topk.astype(np.int64)
    srt = np.sort(topk, axis=2)
    dup = np.argwhere(srt[:, :, 1:] == srt[:, :, :-1])
    if len(dup):
        s, t, _ = dup[0]
        raise ValueError(f"{where}: step {s} token {t} picks expert {int(srt[s, t][dup[0][2]])} twice")
    if weights is not None:
        weights = np.asarray(weights)
        if weights.dtype.kind not in "fiu":
            raise ValueError(f"{where}: weights must be numbers, got dtype {weights.dtype}")
        if weights.ndim == 2:
            weights = weights[None]
        if weights.shape != topk.shape:
            raise ValueError(f"{where}: weights shaped {list(weights.shape)}, expert ids {list(topk.shape)}")
        weights = weights.astype(np.float32)
        if not np.isfinite(weights).all():
            raise ValueError(f"{where}: weights hold NaN or infinity")
        if (weights < 0).any():
            raise ValueError(f"{where}: negative weight {float(weights.min())}")
    return topk, weights, num_experts if num_experts is not None else top + 1


def _read_npy(path: Path, where: str, max_nbytes: int):
    a = np.load(path, allow_pickle=False)  # reads by the file's magic: a zip here is an .npz
    if not isinstance(a, np.ndarray):
        a.close()
        raise ValueError(f"{where}: not an .npy array (an .npz archive? name it .npz)")
    return a, None, {}


def _read_npz(path: Path, where: str, max_nbytes: int):
    with zipfile.ZipFile(path) as z:  # its members' unpacked size, before any is unpacked
        unpacked = sum(i.file_size for i in z.infolist())
    if unpacked > max_nbytes:
        raise ValueError(f"{where}: unpacks to {unpacked} bytes, over the {max_nbytes}-byte limit")
    with np.load(path, allow_pickle=False) as z:
        keys = list(z.keys())
        unknown = [k for k in keys if k not in _NPZ_KEYS]
        if unknown:
            raise ValueError(f"{where}: unknown array {unknown[0]!r} (known: {', '.join(_NPZ_KEYS)})")
        if "topk_idx" not in keys:
            raise ValueError(f"{where}: no array 'topk_idx'")
        header = {k: _scalar(z[k], k, where) for k in _HEADER_KEYS if k in keys}
        for k in ("source_name", "source_sha256"):
            if k in keys:
                v = z[k]
                if v.ndim != 0 or v.dtype.kind != "U":
                    raise ValueError(f"{where}: {k} must be one string")
                header[k] = str(v)
        return z["topk_idx"], (z["weights"] if "weights" in keys else None), header


_READERS = {".npy": _read_npy, ".npz": _read_npz, ".jsonl": read_jsonl, ".csv": read_csv}


def load_trace(path, max_nbytes: int = MAX_TRACE_NBYTES) -> Trace:
    """Read and check a trace file (see the module's text for the formats). ValueError, one
    line naming the file and the problem, for anything that is not a good trace; a file over
    max_nbytes is refused from its size alone, before it is opened."""
    path = Path(path)
    where = f"trace {path}"
    ext = path.suffix.lower()
    if ext not in _READERS:
        raise ValueError(f"{where}: unknown extension {ext or '(none)'!r} (known: {', '.join(FORMATS)})")
    try:  # a directory, a FIFO or a device is refused from its kind, before it is opened
        check_user_file(path, "trace", max_nbytes=1 << 62)
    except UsageError as e:
        raise ValueError(str(e)) from None
    st = path.stat()
    if st.st_size > max_nbytes:
        raise ValueError(f"{where}: {st.st_size} bytes, over the {max_nbytes}-byte limit for a trace")
    if st.st_size == 0:
        raise ValueError(f"{where}: empty file")
    try:
        topk, weights, header = _READERS[ext](path, where, max_nbytes)
        num_experts, ep_size = header.get("num_experts"), header.get("ep_size")
        topk, weights, num_experts = _checked(topk, weights, num_experts, where)
    except ValueError as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(msg if msg.startswith(where) else f"{where}: unreadable ({msg})") from None
    except (OSError, EOFError, zipfile.BadZipFile, UnicodeDecodeError, csv.Error) as e:
        # A truncated .npy reads short (EOF/ValueError), a cut .npz is no zip any more.
        first = str(e).splitlines()[0] if str(e) else ""
        raise ValueError(f"{where}: unreadable, truncated or corrupt ({type(e).__name__}"
                         f"{': ' + first if first else ''})") from None
    return Trace(topk, weights, num_experts, ep_size, str(path), _sha256(path),
                 header.get("source_name", ""), header.get("source_sha256", ""))


_CACHE: dict[tuple, Trace] = {}


def cached_trace(path, max_nbytes: int = MAX_TRACE_NBYTES) -> Trace:
    """load_trace once per process for a file that has not changed (keyed by its real path,
    size and modification time): the sweep asks for it at every point and every rank."""
    p = Path(path)
    try:
        st = p.stat()
        key = (str(p.resolve()), st.st_size, st.st_mtime_ns, max_nbytes)
    except OSError:
        return load_trace(p, max_nbytes)  # says why in one line
    if key not in _CACHE:
        _CACHE[key] = load_trace(p, max_nbytes)
    return _CACHE[key]


# --- writing -------------------------------------------------------------------------------

def trace_npz_bytes(topk: np.ndarray, weights: np.ndarray | None, num_experts: int,
                    ep_size: int | None = None, source: tuple[str, str] | None = None) -> bytes:
    """A trace as the bytes of a compressed .npz that load_trace reads back; source: the
    (name, sha256) of the file it was read from, kept in a copy."""
    arrays = {"topk_idx": np.asarray(topk, np.int64), "num_experts": np.int64(num_experts)}
    if source is not None:
        arrays["source_name"], arrays["source_sha256"] = np.str_(source[0]), np.str_(source[1])
    if weights is not None:
        arrays["weights"] = np.asarray(weights, np.float32)
    if ep_size is not None:
        arrays["ep_size"] = np.int64(ep_size)
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    return buf.getvalue()


def compact_bytes(trace: Trace) -> bytes:
    """The trace as a compressed .npz (the copy a run keeps beside its rows)."""
    return trace_npz_bytes(trace.topk, trace.weights, trace.num_experts, trace.recorded_world,
                           (trace.source_name or trace.name, trace.source_sha256 or trace.sha256))


def save_trace(path, routings_by_step_rank, num_experts: int) -> Path:
    """Write generated routing as a trace (.npz): routings_by_step_rank[step][rank] is a
    Routing; each step's ranks are concatenated in rank order, so replaying at the same world
    gives every rank its own routing back. The world is recorded as ep_size."""
    steps = [list(ranks) for ranks in routings_by_step_rank]
    if not steps or not steps[0]:
        raise ValueError("save_trace: no routing to save")
    world = len(steps[0])
    if any(len(r) != world for r in steps):
        raise ValueError("save_trace: steps have different rank counts")
    per_rank = {r.num_tokens for ranks in steps for r in ranks}
    if len(per_rank) != 1:
        raise ValueError(f"save_trace: ranks hold different token counts ({sorted(per_rank)}): a trace splits a "
                         f"step's tokens equally over the ranks")
    topk = np.stack([np.concatenate([r.topk_idx for r in ranks]) for ranks in steps])
    weights = np.stack([np.concatenate([r.weights for r in ranks]) for ranks in steps])
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(trace_npz_bytes(topk, weights, num_experts, world))
    os.replace(tmp, path)
    return path

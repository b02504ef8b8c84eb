"""A run's checkpoint on disk: written atomically, resumed only when verified.

`checkpoint.pt` (the run's state, `torch.save`) has a sidecar, `checkpoint.pt.json`: the run it
belongs to (`run`: the cell and its config, as the cell's config.yaml has them) and the size and
sha256 of the checkpoint files it vouches for. A run's checkpoint names it by what its numbers
depend on (stamped.cell_identity, via celldir.run_identity): a change of anything else (its trackers,
its paths) resumes it. A save writes the new state under a temporary name
(flushed, fsynced), then the sidecar listing the new file and the one on disk, then renames the new
file into place. So at every moment of a save the file named `checkpoint.pt` is one the sidecar
lists: a kill anywhere leaves a checkpoint that verifies.

A checkpoint that does not verify — bytes the sidecar does not list (truncated, damaged), no sidecar,
or a sidecar of another run (another cell, another config) — is never resumed: `set_aside` renames
it (and its sidecar) beside itself, and the cell starts again from step 0, saying so.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..core.procs import pause_point
from .stamped import mismatch, normal
from ..core.util import atomic_save_stream, atomic_write_text, file_digest

SIDECAR_SUFFIX = ".json"


class BadCheckpoint(Exception):
    """A checkpoint that must not be resumed: `kind` is damaged, unverified or other-run."""

    def __init__(self, path: Path, kind: str, why: str):
        super().__init__(f"checkpoint {path} {why}")
        self.path, self.kind = Path(path), kind


def sidecar(path: Path) -> Path:
    return Path(path).with_name(Path(path).name + SIDECAR_SUFFIX)


def save(path: Path, blob: dict, run, step: int, on_disk: dict | None) -> dict:
    """Write `blob` at `path` (see the module's docstring); `on_disk`: the sidecar entry of the
    file now at `path` (None: none, or none verified). Returns the new file's entry."""
    import torch

    entry = {}

    def vouch(digest: dict) -> None:
        pause_point("checkpoint_written")  # a test's kill mid-save (procs.py): the new file whole, not yet vouched for
        entry.update(digest, step=step)
        files = [entry] + ([on_disk] if on_disk else [])
        atomic_write_text(sidecar(path), json.dumps({"run": normal(run), "files": files}, indent=1))

    atomic_save_stream(Path(path), lambda f: torch.save(blob, f), before_commit=vouch)
    return entry


def verify(path: Path, run=None) -> dict:
    """The sidecar's entry for the file at `path`, or BadCheckpoint saying why it is not to be
    resumed. `run` given: the checkpoint must be of that run."""
    path, side = Path(path), sidecar(path)
    try:
        meta = json.loads(side.read_text())
        files = meta["files"]
    except FileNotFoundError:
        raise BadCheckpoint(path, "unverified", f"has no {side.name} beside it: nothing vouches for its bytes") from None
    except (ValueError, KeyError, TypeError, OSError) as e:
        raise BadCheckpoint(path, "unverified", f"has an unreadable {side.name} ({e})") from None
    diff = [] if run is None else mismatch(meta.get("run"), run)
    if diff:
        raise BadCheckpoint(path, "other-run", f"is of another run ({'; '.join(diff)})")
    got = file_digest(path)
    for f in files:
        if (f.get("bytes"), f.get("sha256")) == (got["bytes"], got["sha256"]):
            return f
    want = files[0] if files else {}
    short = "truncated: " if got["bytes"] < want.get("bytes", 0) else ""
    raise BadCheckpoint(path, "damaged", f"is damaged ({short}{got['bytes']:,} bytes, sha256 {got['sha256'][:12]}; {side.name} "
                                         f"records step {want.get('step')}: {want.get('bytes', 0):,} bytes, sha256 "
                                         f"{str(want.get('sha256'))[:12]})")


def load(path: Path, run=None, map_location=None) -> tuple[dict, dict]:
    """(the state, its sidecar entry) of a verified checkpoint (`verify`), else BadCheckpoint."""
    import torch

    entry = verify(path, run)
    try:
        blob = torch.load(path, map_location=map_location, weights_only=False)
    except Exception as e:  # noqa: BLE001 - bytes as written, yet unreadable: damaged all the same
        raise BadCheckpoint(path, "damaged", f"does not load ({type(e).__name__}: {e})") from None
    return blob, entry


def verified_step(path: Path) -> int | None:
    """The step of the checkpoint at `path` if its bytes verify, else None (none there, or not yet whole)."""
    try:
        return int(verify(path)["step"]) if Path(path).exists() else None
    except (BadCheckpoint, OSError):
        return None


def set_aside(path: Path, kind: str) -> Path:
    """Rename the checkpoint to `<name>.<kind>` and its sidecar to `<name>.<kind>.json` (replacing
    any earlier ones of that kind); the new name."""
    path = Path(path)
    dest = path.with_name(f"{path.name}.{kind}")
    os.replace(path, dest)
    if sidecar(path).exists():
        os.replace(sidecar(path), sidecar(dest))
    return dest


def remove(path: Path) -> None:
    """Remove a checkpoint and then its sidecar."""
    Path(path).unlink(missing_ok=True)
    sidecar(path).unlink(missing_ok=True)

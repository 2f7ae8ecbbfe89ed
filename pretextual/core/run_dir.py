"""The run directory (trainer.output_dir): what a run writes there, that one process at
a time writes it, that a new run never mixes with what is already there, and metrics.jsonl."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import time
from pathlib import Path

from omegaconf import OmegaConf
from tokenizers import Tokenizer

from pretextual.core.checkpoint import STATE_FILE, check_tokenizer, list_checkpoints
from pretextual.core.files import atomic_write_text
from pretextual.core.tokenizer import TOKENIZER_FILE, read_tokenizer, vocab_of
from pretextual.errors import CheckpointError, ConfigError

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
RUN_PLOT = "metrics.png"
"""The plot of the run's metrics (drawn at the end by the built-in plot plugin)."""
RUN_OUTPUTS = ("checkpoints", METRICS_FILE, "export", RUN_PLOT)
"""What trainer.overwrite_output_dir deletes (the tensorboard plugin hides an earlier
run's events itself); nothing else in the directory is ever deleted."""


RUNS = Path("runs")
"""Where runs go when trainer.output_dir is unset: runs/<recipe>-<date>-<time>."""
LATEST = RUNS / "latest"
"""A link to the newest run started in runs/ (what --resume continues without trainer.output_dir)."""


def new_run_path(name: str) -> Path:
    """runs/<name>-<YYYYmmdd-HHMMSS>, with -2, -3, ... when a run started in the same second."""
    base = RUNS / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def latest_run() -> Path:
    """The run runs/latest points at (--resume without trainer.output_dir)."""
    if LATEST.is_symlink():
        return RUNS / os.readlink(LATEST)
    if LATEST.is_dir():  # a run named runs/latest itself
        return LATEST
    raise ConfigError(f"--resume: {LATEST} does not exist, so there is no newest run here to "
                      f"continue; name the run with trainer.output_dir=DIR")


def point_latest(run: Path, log=print) -> None:
    """Make runs/latest a link to ``run`` when ``run`` is in runs/ (a run elsewhere leaves
    it alone). A runs/latest that is not a link is a user's own directory: kept, and said."""
    run = Path(run)
    if run.resolve().parent != RUNS.resolve() or run.name == LATEST.name:
        return
    if LATEST.exists() and not LATEST.is_symlink():
        log(f"note: {LATEST} is a directory, not a link, so it is kept and does not point "
            f"at this run")
        return
    tmp = RUNS / f".latest-{os.getpid()}"
    try:
        if tmp.is_symlink():
            tmp.unlink()
        tmp.symlink_to(run.name)
        os.replace(tmp, LATEST)  # atomic: a reader sees the old link or the new one
    except OSError as exc:  # a filesystem without symlinks: the run itself is unaffected
        log(f"warning: cannot point {LATEST} at {run} ({exc.strerror or exc})")


def _lock_holder(path: Path) -> str:
    """' (pid N)' for the process holding the flock on ``path``, read from /proc/locks
    where the system has it; '' otherwise."""
    st = path.stat()
    where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        for line in Path("/proc/locks").read_text().splitlines():
            fields = line.split()
            if "FLOCK" in fields and where in fields:
                return f" (pid {fields[fields.index(where) - 1]})"
    except OSError:
        pass
    return ""


class RunDirectory:
    """trainer.output_dir of one run. ``main``: this process writes it (the main process
    under torchrun; the others only read it)."""

    def __init__(self, path: Path, main: bool = True, log=print):
        self.path, self.main, self.log = Path(path), main, log
        self._lock_fd: int | None = None

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def metrics(self) -> Path:
        return self.path / METRICS_FILE

    def check_writable(self) -> None:
        """ConfigError naming trainer.output_dir when it cannot be made: a part of the
        path is a file, or the nearest existing folder is not writable."""
        out = self.path
        for part in (out, *out.parents):
            if part.exists():
                if not part.is_dir():
                    raise ConfigError(f"trainer.output_dir={out}: {part} exists and is not a directory")
                if not os.access(part, os.W_OK | os.X_OK):
                    raise ConfigError(f"trainer.output_dir={out}: {part} is not writable")
                return

    def claim(self) -> None:
        """Make the directory and hold it for this process: an exclusive flock on the
        directory itself, which the system releases when the process ends however it ends
        (kill -9 leaves no stale lock, and no lock file). A second writer gets one
        ConfigError line naming the process that holds it."""
        if not self.main or self._lock_fd is not None:
            return
        self.check_writable()
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            raise ConfigError(f"trainer.output_dir={self.path}: cannot create it "
                              f"({exc.strerror or exc})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                # a filesystem without flock (some network mounts): train, but say so
                self.log(f"warning: trainer.output_dir={self.path}: cannot lock it "
                         f"({exc.strerror or exc}); make sure no other run writes there")
                return
            raise ConfigError(f"trainer.output_dir={self.path}: another process"
                              f"{_lock_holder(self.path)} is training in it; wait for it to end "
                              f"or choose another trainer.output_dir") from None
        self._lock_fd = fd

    def check_free(self) -> None:
        """The ConfigError of :meth:`claim` now, when another process holds the directory,
        so a run fails before any work; the directory is not held (nor made) by this."""
        if self.main and self.path.is_dir():
            self.claim()
            self.release()

    def release(self) -> None:
        """Let go of the lock."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def __del__(self):
        if getattr(self, "_lock_fd", None) is not None:
            os.close(self._lock_fd)

    def earlier_run(self) -> str:
        """Why a new run may not start here without trainer.overwrite_output_dir, and what
        to do instead ('' when nothing is in the way): an earlier run's checkpoints or
        export, or files that are not a run's at all (a directory a user or transformers
        wrote)."""
        overwrite = "set trainer.overwrite_output_dir=true"
        earlier = list_checkpoints(self.checkpoints)
        export = self.path / "export"
        if earlier or (export.is_dir() and any(export.iterdir())):
            what = (f"the checkpoints of an earlier run (newest {earlier[-1].name})" if earlier
                    else "an earlier run's export/")
            return (f"holds {what}; continue it with --resume, choose another "
                    f"trainer.output_dir, or {overwrite} to delete the earlier run's outputs and "
                    f"start afresh")
        if self.path.is_dir() and not self._is_run():
            names = sorted(p.name for p in self.path.iterdir() if not p.name.startswith("."))
            if names:
                shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
                return (f"holds files that are not a pretextual run's ({shown}); choose another "
                        f"trainer.output_dir, or {overwrite} to train there anyway (a run writes "
                        f"{', '.join((CONFIG_FILE, TOKENIZER_FILE) + RUN_OUTPUTS)} and replaces "
                        f"whatever has those names; it deletes nothing else)")
        return ""

    def _is_run(self) -> bool:
        """Whether config.yaml is a pretextual run's (what every run writes first)."""
        try:
            saved = OmegaConf.load(self.path / CONFIG_FILE)
        except Exception:  # missing, unreadable or not YAML: not a run's
            return False
        return all(key in saved for key in ("model", "data", "trainer", "objectives"))

    def resumed_tokenizer(self) -> Tokenizer | None:
        """The tokenizer of the run to resume (its tokenizer.json), checked against its
        newest checkpoint before any text is tokenized with it; None when it has no
        checkpoint (the run then starts from scratch)."""
        checkpoints = list_checkpoints(self.checkpoints)
        if not checkpoints:
            return None
        file = self.path / TOKENIZER_FILE
        if not file.is_file():
            raise CheckpointError(f"{file}: missing; a run resumes with the tokenizer it was "
                                  f"trained with")
        tokenizer = read_tokenizer(file)
        vocab_of(tokenizer, str(file))  # DataError naming the file when a special token is missing
        try:  # the full verification is the resume's; this reads what the checkpoint recorded
            meta = json.loads((checkpoints[-1] / STATE_FILE).read_text())
        except (OSError, ValueError):
            meta = {}
        check_tokenizer(checkpoints[-1], meta, tokenizer, file)
        return tokenizer

    def start(self, config_yaml: str, tokenizer: Tokenizer, overwrite: bool,
              resumed_step: int | None) -> float:
        """Write config.yaml and tokenizer.json; for a new run (``resumed_step`` None) clear
        an earlier run's outputs when ``overwrite``, and metrics.jsonl; for a resumed one drop
        the metrics logged after its checkpoint. Returns the run's time so far (seconds)."""
        if not self.main:
            return 0.0
        if resumed_step is None and overwrite:
            for name in RUN_OUTPUTS:
                path = self.path / name
                if path.is_dir():
                    shutil.rmtree(path)
                elif path.exists():
                    path.unlink()
        atomic_write_text(self.path / CONFIG_FILE, config_yaml)
        atomic_write_text(self.path / TOKENIZER_FILE, tokenizer.to_str())
        if not self.metrics.exists():
            return 0.0
        if resumed_step is None:  # a run that never wrote a checkpoint
            self.metrics.unlink()
            return 0.0
        records = self._read_metrics()
        kept = [r for r in records if r.get("step", 0) <= resumed_step]
        atomic_write_text(self.metrics, "".join(json.dumps(r) + "\n" for r in kept))
        return max((r.get("time", 0.0) for r in kept), default=0.0)

    def _read_metrics(self) -> list[dict]:
        """metrics.jsonl's records, without a line that is not a JSON object (the partial
        last line a full disk or a power cut leaves), said in a warning."""
        records = []
        lines = self.metrics.read_text(encoding="utf-8", errors="replace").splitlines()
        for number, line in enumerate(lines, 1):
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            if isinstance(record, dict):
                records.append(record)
            elif line.strip():
                what = "its partial last line" if number == len(lines) else f"line {number}"
                self.log(f"warning: {self.metrics}: dropping {what}, which is not a JSON record "
                         f"(a write cut short)")
        return records

    def append_metrics(self, record: dict) -> None:
        """Add one record to metrics.jsonl."""
        with open(self.metrics, "a") as f:
            f.write(json.dumps(record) + "\n")

"""Peak memory of ``pretextual prepare`` and of a short ``pretextual train
data.prepared=...`` on generated corpora of growing size: it should not
grow with the corpus.

    python benchmarks/memory.py                       # 10 MB and 200 MB, in ./runs/memory
    python benchmarks/memory.py --sizes 10 50 --workers 2 --work /tmp/memory

Each command runs in a fresh process under a small wrapper that reports its peak
RSS (``getrusage(RUSAGE_SELF).ru_maxrss``) and the largest peak RSS of its worker
processes (``RUSAGE_CHILDREN``). Training memory-maps the shards: the RSS it
reports counts the shard pages it has touched, which the kernel may drop at any
time. Prints a markdown table and writes it, with the raw numbers, to
``WORK/memory.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MEASURE = """
import json, os, resource, sys, time
from pretextual.cli import main
start = time.perf_counter()
status = main(sys.argv[1:])
usage = {"status": status, "seconds": time.perf_counter() - start,
         "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
         "workers_peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}
with open(os.environ["PRETEXTUAL_MEMORY_OUT"], "w") as f:
    json.dump(usage, f)
"""


def _words(rng: np.random.Generator, count: int) -> np.ndarray:
    """Pronounceable made-up words (so the tokenizer has sub-words to learn)."""
    syllables = [a + b for a in "bdfgklmnprstvz" for b in ("a", "e", "i", "o", "u", "ai", "ou")]
    lengths = rng.integers(1, 4, count)
    picks = rng.integers(len(syllables), size=(count, 3))
    return np.array(["".join(syllables[p] for p in row[:n]) for row, n in zip(picks, lengths)])


def generate_corpus(path: Path, megabytes: float, seed: int = 0) -> Path:
    """Documents of 3-30 sentences of 5-24 words (Zipf-distributed), blank lines between."""
    size = int(megabytes * (1 << 20))
    if path.is_file() and path.stat().st_size >= size:
        return path
    rng = np.random.default_rng(seed)
    vocabulary = _words(rng, 30_000)
    ranks = 1.0 / np.arange(1, len(vocabulary) + 1) ** 1.1
    probabilities = ranks / ranks.sum()
    tmp = path.with_suffix(".partial")
    written = 0
    with open(tmp, "w", encoding="utf-8") as f:
        while written < size:
            words = vocabulary[rng.choice(len(vocabulary), 50_000, p=probabilities)].tolist()
            lengths = rng.integers(5, 25, len(words) // 5)
            ends = np.cumsum(lengths)
            ends = ends[ends <= len(words)]
            lines, start, sentences_left = [], 0, int(rng.integers(3, 31))
            for end in ends:
                lines.append(" ".join(words[start:end]).capitalize() + ".")
                start, sentences_left = end, sentences_left - 1
                if sentences_left == 0:
                    lines.append("")
                    sentences_left = int(rng.integers(3, 31))
            text = "\n".join(lines) + "\n"
            f.write(text)
            written += len(text.encode("utf-8"))
        f.write("\n")
    os.replace(tmp, path)
    return path


def measure(argv: list[str], log: Path) -> dict:
    """Run ``pretextual ARGV`` in a fresh process; its peak RSS and that of its workers."""
    out = log.with_suffix(".json")
    env = {**os.environ, "PRETEXTUAL_MEMORY_OUT": str(out),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    with open(log, "w") as f:
        subprocess.run([sys.executable, "-c", MEASURE, *argv], stdout=f, stderr=subprocess.STDOUT,
                       env=env, check=True)
    usage = json.loads(out.read_text())
    if usage["status"] != 0:
        raise SystemExit(f"pretextual {' '.join(argv)} failed; see {log}")
    return usage


def run_size(megabytes: float, work: Path, workers: int | None, steps: int) -> dict:
    corpus = generate_corpus(work / f"corpus-{megabytes:g}mb.txt", megabytes)
    prepared, run = work / f"prepared-{megabytes:g}mb", work / f"run-{megabytes:g}mb"
    prepare = ["prepare", str(corpus), "--out", str(prepared)]
    if workers:
        prepare += ["--workers", str(workers)]
    print(f"{megabytes:g} MB: prepare ...", flush=True)
    prepared_usage = measure(prepare, work / f"prepare-{megabytes:g}mb.log")
    train = ["train", "bert", f"data.prepared={prepared}", "model.preset=tiny",
             f"trainer.max_steps={steps}", "trainer.warmup_steps=1", "trainer.eval_every=0",
             "trainer.eval_batches=2", f"trainer.checkpoint_every={steps}", "trainer.progress=false",
             "trainer.export=", "trainer.plot=false", "trainer.device=cpu", f"trainer.output_dir={run}"]
    print(f"{megabytes:g} MB: train ...", flush=True)
    train_usage = measure(train, work / f"train-{megabytes:g}mb.log")
    manifest = json.loads((prepared / "manifest.json").read_text())
    return {"megabytes": megabytes, "corpus_bytes": corpus.stat().st_size,
            "documents": manifest["documents"], "tokens": manifest["tokens"],
            "shards": len(manifest["shards"]), "prepare": prepared_usage, "train": train_usage,
            "prepare_command": "pretextual " + " ".join(prepare),
            "train_command": "pretextual " + " ".join(train)}


def table(rows: list[dict]) -> str:
    lines = ["| corpus | documents | tokens | shards | prepare: peak RSS (largest worker) | "
             "prepare time | train: peak RSS | train time |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        p, t = r["prepare"], r["train"]
        lines.append(f"| {r['corpus_bytes'] / 2**20:.0f} MB | {r['documents']:,} | {r['tokens']:,} "
                     f"| {r['shards']} | {p['peak_rss_mb']:.0f} MB ({p['workers_peak_rss_mb']:.0f} MB) "
                     f"| {p['seconds']:.0f} s | {t['peak_rss_mb']:.0f} MB | {t['seconds']:.0f} s |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[10, 200], metavar="MB")
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "memory")
    parser.add_argument("--workers", type=int, help="prepare's processes (default: one per CPU)")
    parser.add_argument("--steps", type=int, default=20, help="training steps")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    rows = [run_size(mb, args.work, args.workers, args.steps) for mb in args.sizes]
    print(table(rows))
    (args.work / "memory.json").write_text(json.dumps(
        {"started": started, "cpus": os.cpu_count(), "rows": rows, "table": table(rows)}, indent=1))


if __name__ == "__main__":
    main()

"""Comparison 3: inference latency of the exported ONNX model in onnxruntime
against the same encoder in torch eager, batch 1 and batch 32.

The model is exported with pretextual's ONNX exporter (``export_graph``, the
code behind ``pretextual export --format onnx``). Three onnxruntime variants:

* as exported (onnxruntime's own graph optimizations, level ORT_ENABLE_ALL);
* with onnxruntime's transformer fusions (``onnxruntime.transformers.optimizer``,
  model_type "bert": fused Attention, BiasGelu), but not SkipLayerNormalization,
  neither in the optimizer nor in the session (``disabled_optimizers``): its CPU
  kernel took 81 us for one 128 x 256 residual + bias + LayerNorm where Add and
  LayerNormalization took 36 us, and the fused model ran 1.14x faster at batch 1
  (4.08 -> 3.59 ms) and 1.16x at batch 32 without it (onnxruntime 1.32, 2 threads); the
  exporter writes the attention mask as one two-axis Unsqueeze, which the
  fusion's pattern reads as two, so it is split first (same computation);
* dynamic int8 (``quantize_dynamic``, int8 weights) of the fused model, with
  its cosine similarity to torch's fp32 output on real text.

Every variant is checked against torch before it is timed. Inputs are real
text from the embedded corpus, all positions real (no padding).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import torch

from benchmarks import flops as F
from benchmarks.isolated import Isolated
from benchmarks.report import Report, Row, fmt_ratio
from benchmarks.timing import interleave
from benchmarks.workloads import Workspace

MAX_ABS_DIFF = 1e-4


def split_mask_unsqueeze(src: Path, dst: Path) -> int:
    """Rewrite Unsqueeze(attention_mask, axes=[a, b]) as two one-axis Unsqueeze
    nodes (what onnxruntime's BERT attention fusion matches). Returns how many
    it rewrote."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(src))
    graph = model.graph
    constants = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    nodes, rewritten = [], 0
    for node in graph.node:
        axes = constants.get(node.input[1]) if node.op_type == "Unsqueeze" and len(node.input) > 1 else None
        if node.op_type == "Unsqueeze" and node.input[0] == "attention_mask" and axes is not None \
                and axes.size == 2:
            first, second = sorted(int(a) for a in axes.reshape(-1))
            out = node.output[0]
            nodes += [
                helper.make_node("Constant", [], [f"{out}_axis0"],
                                 value=numpy_helper.from_array(np.array([first], np.int64))),
                helper.make_node("Constant", [], [f"{out}_axis1"],
                                 value=numpy_helper.from_array(np.array([second], np.int64))),
                helper.make_node("Unsqueeze", [node.input[0], f"{out}_axis0"], [f"{out}_first"],
                                 name=f"{node.name}_first"),
                helper.make_node("Unsqueeze", [f"{out}_first", f"{out}_axis1"], [out],
                                 name=f"{node.name}_second"),
            ]
            rewritten += 1
        else:
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    onnx.save(model, str(dst))
    return rewritten


KEEP_LAYER_NORM = ("SkipLayerNormFusion",)
"""The session optimizer that would re-fuse Add + LayerNormalization, which :func:`fuse` keeps apart."""


def fuse(src: Path, dst: Path, heads: int, hidden: int) -> dict[str, int]:
    """onnxruntime's transformer fusions for BERT; returns the fused operator counts."""
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    from pretextual.exporters.onnx import quiet

    prepared = dst.with_name(dst.stem + ".unsqueeze.onnx")
    split_mask_unsqueeze(src, prepared)
    options = FusionOptions("bert")
    options.enable_skip_layer_norm = False  # slower than what it replaces: see the module docstring
    with quiet("onnxruntime"):
        optimized = optimize_model(str(prepared), model_type="bert", num_heads=heads,
                                   hidden_size=hidden, optimization_options=options)
    optimized.save_model_to_file(str(dst))
    return {k: v for k, v in optimized.get_fused_operator_statistics().items() if v}


def session(path: Path, threads: int, disabled: tuple[str, ...] = ()):
    """A CPU session; ``disabled``: onnxruntime graph optimizers it must not apply."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"],
                                disabled_optimizers=list(disabled))


def text_feed(ws: Workspace, batch: int) -> dict[str, np.ndarray]:
    """``batch`` rows of ``seq`` real tokens of the embedded corpus."""
    s = ws.sizes
    ids = np.array([i for line in ws.lines[:4 * batch * s.seq]
                    for i in ws.tokenizer.encode(line, add_special_tokens=False).ids], dtype=np.int64)
    need = batch * (s.seq - 2)
    ids = np.resize(ids, need).reshape(batch, s.seq - 2)  # repeats the text if it is short
    rows = np.concatenate([np.full((batch, 1), ws.vocab.cls_id), ids,
                           np.full((batch, 1), ws.vocab.sep_id)], axis=1)
    return {"input_ids": rows.astype(np.int64), "attention_mask": np.ones_like(rows),
            "token_type_ids": np.zeros_like(rows)}


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1) + 1e-12)


def onnx_inference(ws: Workspace, report: Report) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from pretextual.architectures.bert import BertModel
    from pretextual.core.trainer import encoder_config
    from pretextual.exporters.onnx import export_graph, quiet

    s = ws.sizes
    threads = torch.get_num_threads()
    config = encoder_config(ws.config("roberta"), ws.vocab.size, ws.vocab.pad_id)
    torch.manual_seed(0)
    encoder = BertModel(config).eval()
    out = ws.root / "onnx"
    out.mkdir(exist_ok=True)
    plain, fused, int8 = out / "model.onnx", out / "model.fused.onnx", out / "model.fused.int8.onnx"
    export_graph(encoder, plain, external_data=False)
    fused_ops = fuse(plain, fused, s.heads, s.hidden)
    with quiet(""):
        quantize_dynamic(fused, int8, weight_type=QuantType.QInt8)
    feeds = {batch: text_feed(ws, batch) for batch in (1, s.batch)}
    calls = {1: s.latency_calls_b1, s.batch: 1}
    with contextlib.ExitStack() as stack:
        # One process per session: none shares its cores' spinning threads or caches with
        # torch or with another session, as in a service that runs one model.
        # The fused variants keep Add + LayerNormalization apart (module docstring).
        variants = {"onnx": (plain, ()), "onnx fused": (fused, KEEP_LAYER_NORM),
                    "onnx int8": (int8, KEEP_LAYER_NORM)}
        sessions = {name: stack.enter_context(Isolated("benchmarks.inference:onnx_side", str(path),
                                                       disabled, feeds, calls, threads=threads))
                    for name, (path, disabled) in variants.items()}
        checks, int8_cosine = check_sessions(encoder, sessions, feeds)
        time_latencies(s, ws.peaks, encoder, sessions, feeds, calls, int8_cosine, report)
    report.details.append(
        "ONNX: exported by pretextual.exporters.onnx.export_graph (opset "
        f"{__import__('pretextual.exporters.onnx', fromlist=['OPSET']).OPSET}); fusions applied: "
        + (", ".join(f"{k} x{v}" for k, v in fused_ops.items()) or "none")
        + f"; onnxruntime intra-op threads {threads}, each session in a process of its own "
        f"(benchmarks/isolated.py), torch eager in the benchmark's; checks against torch: " + "; ".join(checks) + ".")


def onnx_side(path: str, disabled: tuple[str, ...], feeds: dict[int, dict[str, np.ndarray]],
              calls: dict[int, int]) -> dict:
    """One onnxruntime session (``disabled``: graph optimizers it skips), built in a process
    of its own (benchmarks.isolated): ``run B`` makes ``calls[B]`` calls on the batch-B feed;
    ``output B`` returns its output."""
    sess = session(Path(path), torch.get_num_threads(), disabled)
    cases = {}
    for batch, feed in feeds.items():
        def run(feed=feed, n=calls[batch]):
            for _ in range(n):
                sess.run(["last_hidden_state"], feed)
            return n
        cases[f"run {batch}"] = run
        cases[f"output {batch}"] = lambda feed=feed: sess.run(["last_hidden_state"], feed)[0]
    return cases


def check_sessions(encoder, sessions, feeds) -> tuple[list[str], dict[int, np.ndarray]]:
    """Every fp32 session within MAX_ABS_DIFF of torch; the int8 one's cosine to torch."""
    checks, int8_cosine = [], {}
    for batch, feed in feeds.items():
        with torch.inference_mode():
            expected = encoder(**{k: torch.from_numpy(v) for k, v in feed.items()}).last_hidden_state.numpy()
        for name, side in sessions.items():
            got = side.call(f"output {batch}")
            if name == "onnx int8":
                int8_cosine[batch] = cosine(got, expected)
                continue
            diff = float(np.abs(got - expected).max())
            checks.append(f"{name} batch {batch}: max abs diff {diff:.1e}")
            if diff > MAX_ABS_DIFF:
                raise RuntimeError(f"{name} differs from torch by {diff:.3e} at batch {batch}")
    return checks, int8_cosine


def time_latencies(s, ws_peaks, encoder, sessions, feeds, calls, int8_cosine, report: Report) -> None:
    """Each session against pretextual's encoder in torch eager."""
    for batch, feed in feeds.items():
        tensors = {k: torch.from_numpy(v) for k, v in feed.items()}
        n = calls[batch]

        def eager(model, tensors=tensors, n=n):
            with torch.inference_mode():
                for _ in range(n):
                    model(**tensors)
            return n

        cases = {"torch": lambda: eager(encoder),
                 **{name: side.case(f"run {batch}") for name, side in sessions.items()}}
        samples = interleave(cases, s.repeats, s.warmup, settle=s.settle)
        base = 1.0 / samples["torch"].rate  # seconds per call
        if "fp32" in ws_peaks:  # what the fp32 goal asks against what the GEMMs alone take
            matmuls = F.encoder_forward_flops(s.layers, s.hidden, s.intermediate, batch, s.seq)
            floor = matmuls / ws_peaks["fp32"].flops_per_s
            goal = 2.5 if batch == 1 else 2.0
            report.details.append(
                f"ONNX fp32 goal at batch {batch}: {goal}x torch eager means at most "
                f"{base / goal * 1e3:,.2f} ms a call; the encoder's matmuls alone "
                f"({matmuls / 1e9:,.2f} GFLOP) take {floor * 1e3:,.2f} ms at this run's fp32 matmul peak "
                f"({ws_peaks['fp32'].flops_per_s / 1e9:,.0f} GFLOP/s, the best of the GEMMs "
                f"measured), so at that peak the goal "
                + ("leaves no time for anything but the matmuls and is still missed."
                   if floor > base / goal else "leaves room for the rest of the model."))
        goals = {"onnx": (None, ""),
                 "onnx fused": ((2.5, ">= 2.5x") if batch == 1 else (2.0, ">= 2x")),
                 "onnx int8": ((4.0, ">= 4x") if batch == 1 else (None, ""))}
        for name in sessions:
            latency = 1.0 / samples[name].rate
            label = {"onnx": "ONNX as exported, fp32", "onnx fused": "ONNX + transformer fusions, fp32",
                     "onnx int8": "ONNX fused, dynamic int8"}[name]
            extra = ""
            if name == "onnx int8":
                c = int8_cosine[batch]
                extra = f"; cosine to fp32 mean {c.mean():.4f}, min {c.min():.4f}"
            goal, goal_text = goals[name]
            report.add(Row("3", f"inference latency, batch {batch} x {s.seq}: {label} "
                                f"(speed-up over torch eager{extra})",
                           f"{latency * 1e3:,.2f} ms", f"torch eager {base * 1e3:,.2f} ms",
                           base / latency, fmt_ratio(base / latency), goal, goal_text))

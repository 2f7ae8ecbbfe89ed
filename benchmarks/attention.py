"""Comparison 8: document-masked attention on the device, the kernel choice behind
data.document_attention: F.scaled_dot_product_attention with a dense block-diagonal
mask (boolean, and additive as the model folds it) against FlexAttention with a
BlockMask (torch.compile'd, and eager), on packed rows of about four documents.

Times the attention call alone, forward, and forward + backward where the kernel
has a backward; and the per-batch cost of building each mask from document ids
(a packed batch's documents change every step).
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from benchmarks.report import Report, Row, fmt_ratio
from benchmarks.timing import for_at_least, interleave
from benchmarks.workloads import Workspace

HEADS, HEAD_DIM, DOCUMENTS = 4, 64, 4


def document_ids(batch: int, length: int, documents: int, seed: int = 0) -> torch.Tensor:
    """[batch, length] ids of ``documents`` documents per row, cut at random places."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.zeros(batch, length, dtype=torch.long)
    for row in range(batch):
        cuts = torch.randperm(length - 1, generator=g)[:documents - 1] + 1
        ids[row, cuts] = 1
    return ids.cumsum(1)


def dense_mask(docs: torch.Tensor) -> torch.Tensor:
    """[batch, 1, n, n] True where query and key are in the same document."""
    return (docs[:, :, None] == docs[:, None, :])[:, None]


def additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(mask.shape, dtype=dtype).masked_fill_(~mask, torch.finfo(dtype).min)


def block_mask(docs: torch.Tensor, device: torch.device):
    from torch.nn.attention.flex_attention import create_block_mask

    def same_document(b, h, q, k):
        return docs[b, q] == docs[b, k]

    b, n = docs.shape
    return create_block_mask(same_document, b, None, n, n, device=str(device))


def flex_backward_error(q, k, v, mask, flex) -> str | None:
    """Why FlexAttention cannot train here (its error's message), or None if it can."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    try:
        flex(q, k, v, block_mask=mask).sum().backward()
    except Exception as exc:  # the kernel says so in its own words
        return f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    return None


def document_attention(ws: Workspace, report: Report) -> None:
    from torch.nn.attention.flex_attention import flex_attention

    s, device = ws.sizes, ws.device
    batch = s.batch
    lengths = (32, 64) if s.smoke else (128, 512)
    # Compiling takes tens of seconds per shape on a small CPU: not at the smoke sizes.
    compiled = None if s.smoke else torch.compile(flex_attention)
    cases, meta, notes = {}, {}, []
    g = torch.Generator().manual_seed(0)
    for n in lengths:
        docs = document_ids(batch, n, DOCUMENTS).to(device)
        q, k, v = (torch.randn(batch, HEADS, n, HEAD_DIM, generator=g).to(device) for _ in range(3))
        masks = {"sdpa boolean": dense_mask(docs)}
        masks["sdpa additive"] = additive(masks["sdpa boolean"], q.dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            bm = block_mask(docs, device)
        kernels = {"sdpa boolean": lambda q, k, v, m=masks["sdpa boolean"]: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
                   "sdpa additive": lambda q, k, v, m=masks["sdpa additive"]: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
                   "flex eager": lambda q, k, v, m=bm: flex_attention(q, k, v, block_mask=m)}
        if compiled is not None:
            kernels["flex compiled"] = lambda q, k, v, m=bm: compiled(q, k, v, block_mask=m)
        reference = kernels["sdpa boolean"](q, k, v)
        for name, kernel in kernels.items():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                error = (kernel(q, k, v) - reference).abs().max().item()
            notes.append(f"{name} at {n}: max |difference| to sdpa boolean {error:.1e}")

            def forward(kernel=kernel, q=q, k=k, v=v):
                with torch.no_grad(), warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    kernel(q, k, v)
                return 1
            cases[f"{name} forward {n}"] = for_at_least(forward, s.round_seconds)
            meta[f"{name} forward {n}"] = (name, "forward", n)
            if name.startswith("sdpa"):
                leaves = [t.detach().requires_grad_() for t in (q, k, v)]

                def train(kernel=kernel, leaves=leaves):
                    kernel(*leaves).sum().backward()
                    for t in leaves:
                        t.grad = None
                    return 1
                cases[f"{name} forward + backward {n}"] = for_at_least(train, s.round_seconds)
                meta[f"{name} forward + backward {n}"] = (name, "forward + backward", n)

        def build_dense(docs=docs, dtype=q.dtype):
            additive(dense_mask(docs), dtype)
            return 1

        def build_block(docs=docs):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                block_mask(docs, device)
            return 1
        cases[f"sdpa additive mask build {n}"] = for_at_least(build_dense, s.round_seconds)
        cases[f"flex eager mask build {n}"] = for_at_least(build_block, s.round_seconds)
        meta[f"sdpa additive mask build {n}"] = ("sdpa additive", "mask build", n)
        meta[f"flex eager mask build {n}"] = ("flex", "mask build", n)
        if n == lengths[0]:
            backward = flex_backward_error(q, k, v, bm, flex_attention)
    samples = interleave(cases, s.repeats, s.warmup, device, settle=s.settle)
    ms = {name: 1e3 / samples[name].rate for name in cases}  # median milliseconds a call

    def row(what, ours, theirs):
        ratio = ms[theirs] / ms[ours]
        report.add(Row("8", what, f"{ms[ours]:,.2f} ms", f"{ms[theirs]:,.2f} ms", ratio,
                       fmt_ratio(ratio)))

    for n in lengths:
        tag = f"batch {batch} x {HEADS} heads x {n} x {HEAD_DIM}, {DOCUMENTS} documents a row"
        for kernel in ("flex compiled", "flex eager"):
            if f"{kernel} forward {n}" in ms:
                row(f"document attention, forward, {tag}: FlexAttention "
                    f"({'torch.compile' if kernel == 'flex compiled' else 'eager'}) against SDPA with "
                    f"a boolean mask (speed-up of FlexAttention)", f"{kernel} forward {n}",
                    f"sdpa boolean forward {n}")
        row(f"document attention, forward, {tag}: SDPA with the additive mask (the model's) "
            f"against SDPA with a boolean mask (speed-up of the additive mask)",
            f"sdpa additive forward {n}", f"sdpa boolean forward {n}")
        row(f"document attention, forward + backward, {tag}: SDPA additive against boolean "
            f"(speed-up of the additive mask; FlexAttention has no backward here)",
            f"sdpa additive forward + backward {n}", f"sdpa boolean forward + backward {n}")
        row(f"document attention, building the mask from document ids, {tag}: the dense "
            f"additive mask against a BlockMask (create_block_mask; speed-up of the dense mask)",
            f"sdpa additive mask build {n}", f"flex eager mask build {n}")
    report.details += [
        "Document attention (8): " + ", ".join(f"{k} {ms[k]:,.2f} ms" for k in ms)
        + " (medians a call); spread over the rounds (calls/s): " + ", ".join(
            f"{k} {samples[k].spread()[0]:,.1f}-{samples[k].spread()[1]:,.1f}" for k in ms) + ".",
        "Document attention (8), agreement and training: " + "; ".join(notes)
        + f". FlexAttention forward + backward on {device.type}: "
        + (backward or "runs") + ".",
    ]

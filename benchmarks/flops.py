"""Useful model FLOPs of a training step, and the machine's measured matmul peak.

Counted as the scaling-law literature counts them (Kaplan et al. 2020; the
"6N" rule), and only where the work is useful:

* 6 x the parameters of the transformer layers, per real token (forward 2,
  backward 4);
* attention scores and their use: 2 matmuls of 2 x context x hidden FLOPs per
  token and layer forward, times 3 for forward and backward;
* the MLM head (transform + vocabulary projection) only at the predicted
  positions: 6 x its parameters per prediction;
* the pooler and a 2-way sentence head once per sequence.

Embedding lookups, LayerNorm, softmax, dropout and the optimizer are not
counted (they are not matmuls); neither is any work on padding, nor the MLM
projection at positions without a label (what Hugging Face's
BertForPreTraining spends most of its time on).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from benchmarks.timing import Samples


def layer_parameters(hidden: int, intermediate: int) -> int:
    """One post-LN BERT layer: Q, K, V, output projection, 2 LayerNorms, the feed-forward."""
    attention = 4 * (hidden * hidden + hidden)
    feed_forward = hidden * intermediate + intermediate + intermediate * hidden + hidden
    layer_norms = 2 * 2 * hidden
    return attention + feed_forward + layer_norms


def mlm_head_parameters(hidden: int, vocab: int) -> int:
    """Transform (dense + LayerNorm) and the (tied) vocabulary projection with its bias."""
    return hidden * hidden + hidden + 2 * hidden + hidden * vocab + vocab


def sentence_head_parameters(hidden: int) -> int:
    """Pooler (dense) and the 2-way classifier."""
    return hidden * hidden + hidden + 2 * hidden + 2


@dataclass(frozen=True)
class StepWork:
    """What one training step computed usefully."""

    layers: int
    hidden: int
    intermediate: int
    vocab: int
    sequence_lengths: tuple[int, ...]  # real tokens of each sequence
    predictions: int  # MLM-labelled positions
    sentence_head: bool

    @property
    def tokens(self) -> int:
        return sum(self.sequence_lengths)

    def flops(self) -> float:
        per_token = 6 * self.layers * layer_parameters(self.hidden, self.intermediate)
        dense = per_token * self.tokens
        # Each token attends to the real tokens of its own sequence.
        attention = sum(12 * self.layers * self.hidden * n * n for n in self.sequence_lengths)
        mlm = 6 * mlm_head_parameters(self.hidden, self.vocab) * self.predictions
        sentence = (6 * sentence_head_parameters(self.hidden) * len(self.sequence_lengths)
                    if self.sentence_head else 0)
        return float(dense + attention + mlm + sentence)


def encoder_forward_flops(layers: int, hidden: int, intermediate: int, batch: int, seq: int) -> float:
    """Matmul FLOPs of one encoder forward pass over ``batch`` full sequences (inference):
    2 x layer parameters per token, and the attention scores and their use."""
    dense = 2 * layers * layer_parameters(hidden, intermediate) * batch * seq
    attention = 4 * layers * hidden * seq * seq * batch
    return float(dense + attention)


# --- matmul peak ---------------------------------------------------------------------------------

def peak_shapes(tokens: int, hidden: int, intermediate: int, smoke: bool,
                device: torch.device = torch.device("cpu")) -> list[tuple[int, int, int]]:
    """(m, k, n) GEMMs whose best rate is taken as the machine's peak: large
    squares (larger on a GPU, which needs them to reach its peak), and the
    model's own feed-forward shapes."""
    if smoke:
        return [(256, 256, 256), (tokens, hidden, intermediate)]
    squares = [4096, 8192] if device.type == "cuda" else [1024, 2048]
    return [(n, n, n) for n in squares] + [(tokens, hidden, intermediate),
                                           (tokens, intermediate, hidden)]


def gemm_cases(shapes: list[tuple[int, int, int]], device: torch.device, min_flops: float = 0.0
               ) -> tuple[dict[str, callable], dict[str, tuple[str, str, tuple[int, int, int]]]]:
    """Timed cases, one per (precision, library, shape): fp32 through torch.matmul
    (MKL on x86 CPUs), fp32 through oneDNN where torch has it (CPU), and bf16
    through torch.matmul. Each case runs its GEMM back to back until it has done
    ``min_flops`` (a peak is a steady rate: one sub-millisecond call after an idle
    pause measured bf16 4096x256x1024 at 569 and 983 GFLOP/s in two runs, repeated
    calls at 1,969-2,029) and returns the FLOPs it did."""
    cases, meta = {}, {}
    dnn = onednn_linear_op() if device.type == "cpu" else None
    for m, k, n in shapes:
        calls = max(1, math.ceil(min_flops / (2.0 * m * k * n)))
        flops = 2.0 * m * k * n * calls
        a32 = torch.randn(m, k, device=device)
        w32 = torch.randn(n, k, device=device)  # [out, in], as nn.Linear stores it
        a16, w16 = a32.bfloat16(), w32.bfloat16()

        def mm(a=a32, w=w32, f=flops, calls=calls):
            for _ in range(calls):
                torch.matmul(a, w.t())
            return f

        def mm16(a=a16, w=w16, f=flops, calls=calls):
            for _ in range(calls):
                torch.matmul(a, w.t())
            return f

        name = f"{m}x{k}x{n}"
        cases[f"gemm fp32 torch {name}"], meta[f"gemm fp32 torch {name}"] = mm, ("fp32", "torch.matmul", (m, k, n))
        cases[f"gemm bf16 torch {name}"], meta[f"gemm bf16 torch {name}"] = mm16, ("bf16", "torch.matmul", (m, k, n))
        if dnn is not None:
            def onednn(a=a32, w=w32, f=flops, calls=calls):
                for _ in range(calls):
                    dnn(a, w, None, "none", [], "")
                return f
            cases[f"gemm fp32 onednn {name}"], meta[f"gemm fp32 onednn {name}"] = onednn, ("fp32", "oneDNN", (m, k, n))
    return cases, meta


@dataclass
class Peak:
    flops_per_s: float
    library: str
    shape: tuple[int, int, int]

    def describe(self) -> str:
        m, k, n = self.shape
        return f"{self.flops_per_s / 1e9:,.0f} GFLOP/s ({self.library}, {m}x{k} @ {k}x{n})"


def peaks(samples: dict[str, Samples], meta: dict) -> dict[str, Peak]:
    """The best median rate per precision over the measured GEMMs."""
    best: dict[str, Peak] = {}
    for name, (precision, library, shape) in meta.items():
        rate = samples[name].rate
        if precision not in best or rate > best[precision].flops_per_s:
            best[precision] = Peak(rate, library, shape)
    return best


# --- the step's matmuls alone ---------------------------------------------------------------------

def onednn_linear_op():
    """oneDNN's linear (``torch.ops.mkldnn._linear_pointwise``) where this torch has it,
    else None: one more fp32 library whose best rate counts towards the machine's peak."""
    op = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)
    return op if op is not None and torch.backends.mkldnn.is_available() else None


def linear_gemms(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor) -> list:
    """The three GEMMs of a linear layer as autograd runs them: forward ``x @ W.T``,
    backward ``g @ W`` and ``g.T @ x``."""
    return [lambda: torch.mm(x, w.t()), lambda: torch.mm(g, w), lambda: torch.mm(g.t(), x)]


def step_gemms(layers: int, hidden: int, heads: int, intermediate: int, vocab: int, batch: int,
               seq: int, predictions: int, dtype: torch.dtype, device: torch.device):
    """A case that runs every matmul of one pretextual training step (MLM + NSP) and
    nothing else, with the step's shapes and operand layouts (torch's default GEMM, as
    the model's nn.Linear layers run): for each linear layer the forward and both backward products, attention's four
    batched matmuls forward and backward, and the MLM head at the predicted rows
    only. Returns the FLOPs it ran. Its time is the step's time if everything else
    (elementwise work, casts, softmax, LayerNorm, dropout, the optimizer) took
    none: the ceiling of the step's MFU on this machine."""
    tokens, head_dim = batch * seq, hidden // heads
    # per layer: query, key, value and the attention output; the feed-forward pair
    linears = ([(tokens, hidden, hidden)] * 4 + [(tokens, hidden, intermediate),
                                                 (tokens, intermediate, hidden)]) * layers
    linears += [(predictions, hidden, hidden), (predictions, hidden, vocab), (batch, hidden, hidden),
                (batch, hidden, 2)]
    make = lambda *shape: torch.randn(*shape, device=device).to(dtype)
    gemms = [mm for m, k, n in linears for mm in linear_gemms(make(m, k), make(n, k), make(m, n))]
    q, k, v, p, go = (make(batch * heads, seq, d) for d in (head_dim, head_dim, head_dim, seq, head_dim))
    flops = sum(6.0 * m * k * n for m, k, n in linears) + layers * 12.0 * batch * heads * seq * seq * head_dim

    def run():
        for mm in gemms:
            mm()
        for _ in range(layers):
            torch.bmm(q, k.transpose(1, 2))  # scores
            torch.bmm(p, v)  # probabilities times values
            torch.bmm(go, v.transpose(1, 2))  # d probabilities
            torch.bmm(p.transpose(1, 2), go)  # d values
            torch.bmm(p, k)  # d queries (p stands in for d scores: same shape)
            torch.bmm(p.transpose(1, 2), q)  # d keys
        return flops
    return run


# --- ModernBERT ------------------------------------------------------------------------------------

def modernbert_layer_parameters(hidden: int, intermediate: int) -> int:
    """One ModernBERT layer without biases: Wqkv and Wo, GeGLU's Wi (input and gate) and Wo,
    2 LayerNorm weights (layer 0 has no attn_norm; counted anyway, a rounding error)."""
    return 4 * hidden * hidden + 3 * hidden * intermediate + 2 * hidden


def modernbert_head_parameters(hidden: int, vocab: int) -> int:
    """ModernBERT's MLM head: dense (no bias), LayerNorm weight, the tied decoder with its bias."""
    return hidden * hidden + hidden + hidden * vocab + vocab


def attended_keys(length: int, window: int | None) -> int:
    """Query-key pairs of a sequence of ``length`` with every key (window None) or the
    keys at most ``window`` positions away (a local layer's)."""
    if window is None or window >= length - 1:
        return length * length
    return sum(min(length, q + window + 1) - max(0, q - window) for q in range(length))


@dataclass(frozen=True)
class ModernBertStepWork:
    """What one ModernBERT MLM training step computed usefully: as StepWork counts it,
    with each local layer's attention over its window only and ``predictions`` rows
    through the head (every position for a dense head)."""

    layers: int
    hidden: int
    intermediate: int
    vocab: int
    sequence_lengths: tuple[int, ...]
    predictions: int
    global_every: int = 3
    local_attention: int = 128

    @property
    def tokens(self) -> int:
        return sum(self.sequence_lengths)

    def flops(self) -> float:
        dense = 6 * self.layers * modernbert_layer_parameters(self.hidden, self.intermediate) * self.tokens
        attention = 0
        for layer in range(self.layers):
            window = None if layer % self.global_every == 0 else self.local_attention // 2
            attention += sum(12 * self.hidden * attended_keys(n, window) for n in self.sequence_lengths)
        head = 6 * modernbert_head_parameters(self.hidden, self.vocab) * self.predictions
        return float(dense + attention + head)

"""Draw the book's architecture figures with matplotlib and write them as SVG into book/figures/.

The figures are code, not copied images: the encoder-decoder Transformer of the paper's Figure 1 with every box
labelled by the chapter and the transformer_lib class that builds it, one copy per chapter from 5 to 15 that
shows where the chapter works, three wiring diagrams (post-LN vs pre-LN, the encoder memory feeding
every decoder layer, the key/value cache) and four pictures of ideas (queries, keys and values through attention;
splitting into heads and merging back; teacher forcing; a beam search tree). The SVG output is byte-identical from run to run (fixed hash salt, no
date), and tests/test_figures.py regenerates it and compares it with the committed files.

    python tools/architecture.py            # rewrite book/figures/*.svg
    python tools/architecture.py --png DIR  # also write PNG previews into DIR
"""
from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("svg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Circle, FancyArrowPatch, FancyBboxPatch, Rectangle  # noqa: E402

FIGURES = Path(__file__).resolve().parents[1] / "book" / "figures"
RC = {"svg.hashsalt": "transformer-book", "svg.fonttype": "path", "font.family": "DejaVu Sans"}

# Colours by kind of part (our own palette; the paper's figure uses similar families).
FILL = {
    "embed": "#f6c9d3",  # embeddings and positions
    "attn": "#fbd5a5",  # attention
    "norm": "#f4f0a8",  # add & norm
    "ffn": "#bcdcf3",  # feed-forward
    "out": "#c9e8c1",  # generator
    "io": "#ffffff",
    "layer": "#dde5ee",  # a whole layer, drawn as one box
}
INK = "#222222"
GREY_FILL, GREY_EDGE, GREY_INK = "#f2f2f2", "#c4c4c4", "#a3a3a3"
HIGHLIGHT = "#c0392b"  # the edge of the parts a chapter builds, and its "you are here" tag
FRAME_EDGE = "#555555"

TITLE_SIZE = 10
SUB_SIZE = 8


@dataclass
class Part:
    """A box of the model: what it computes, the chapter that builds it and the class (or function) that does."""

    x: float  # centre
    y: float  # bottom
    w: float
    h: float
    title: str
    chapter: int
    name: str
    kind: str


@dataclass
class Frame:
    """A rounded frame around parts that one class groups, e.g. N x EncoderLayer."""

    x0: float
    y0: float
    x1: float
    y1: float
    label: str
    chapter: int
    note: str = ""  # right-aligned on the top edge, e.g. the chapter


def _new_axes(width: float, height: float) -> tuple[Figure, plt.Axes]:
    """A figure whose data coordinates are inches: (0, 0) bottom left, (width, height) top right."""
    fig = plt.figure(figsize=(width, height))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.set_axis_off()
    return fig, ax


def _box(ax: plt.Axes, part: Part, active: bool, highlighted: bool) -> None:
    fill = FILL[part.kind] if active else GREY_FILL
    edge = HIGHLIGHT if highlighted else (INK if active else GREY_EDGE)
    ax.add_patch(FancyBboxPatch((part.x - part.w / 2, part.y), part.w, part.h, boxstyle="round,pad=0,rounding_size=0.08",
                                facecolor=fill, edgecolor=edge, linewidth=2.2 if highlighted else 1.0, zorder=3))
    ink = INK if active else GREY_INK
    if part.name:
        ax.text(part.x, part.y + part.h * 0.64, part.title, ha="center", va="center", fontsize=TITLE_SIZE, color=ink,
                zorder=4)
        ax.text(part.x, part.y + part.h * 0.26, f"ch. {part.chapter} · {part.name}", ha="center", va="center",
                fontsize=SUB_SIZE, color=ink, style="italic", zorder=4)
    else:
        ax.text(part.x, part.y + part.h / 2, part.title, ha="center", va="center", fontsize=TITLE_SIZE, color=ink,
                zorder=4)


def _frame(ax: plt.Axes, frame: Frame, active: bool, highlighted: bool, dashed: bool = False) -> None:
    edge = HIGHLIGHT if highlighted else (FRAME_EDGE if active else GREY_EDGE)
    ax.add_patch(FancyBboxPatch((frame.x0, frame.y0), frame.x1 - frame.x0, frame.y1 - frame.y0,
                                boxstyle="round,pad=0,rounding_size=0.15", facecolor="none", edgecolor=edge,
                                linewidth=2.2 if highlighted else 1.1, linestyle="--" if dashed else "-", zorder=1))
    ink = INK if active else GREY_INK
    ax.text(frame.x0 + 0.12, frame.y1 - 0.2, frame.label, ha="left", va="center", fontsize=SUB_SIZE + 1,
            color=ink, fontweight="bold", zorder=4)
    if frame.note:
        ax.text(frame.x1 - 0.12, frame.y1 - 0.2, frame.note, ha="right", va="center", fontsize=SUB_SIZE + 1,
                color=ink, style="italic", zorder=4)


def _arrow(ax: plt.Axes, points: list[tuple[float, float]], active: bool = True, color: str | None = None,
           width: float = 1.1) -> None:
    """A polyline with an arrow head at its last point."""
    color = color or (INK if active else GREY_EDGE)
    for (x0, y0), (x1, y1) in zip(points[:-2], points[1:-1]):
        ax.plot([x0, x1], [y0, y1], color=color, linewidth=width, solid_capstyle="butt", zorder=2)
    ax.add_patch(FancyArrowPatch(points[-2], points[-1], arrowstyle="-|>", mutation_scale=11, color=color,
                                 linewidth=width, shrinkA=0, shrinkB=0, zorder=2))


def _tag(ax: plt.Axes, x: float, y: float, text: str, target: tuple[float, float] | None = None,
         ha: str = "left", bend: float = -0.2) -> None:
    """The red "you are here" label, with an arrow to the part when given."""
    ax.text(x, y, text, ha=ha, va="center", fontsize=TITLE_SIZE, color="white", fontweight="bold", zorder=6,
            bbox=dict(boxstyle="round,pad=0.35", facecolor=HIGHLIGHT, edgecolor="none"))
    if target is not None:
        ax.add_patch(FancyArrowPatch((x, y), target, arrowstyle="-|>", mutation_scale=14, color=HIGHLIGHT,
                                     linewidth=1.8, shrinkA=14, shrinkB=2, connectionstyle=f"arc3,rad={bend}", zorder=5))


# ----------------------------------------------------------------------------------------------------------------
# Figure 1: the whole model

W, H = 9.0, 10.3  # inches
XL, XR, BW, BH, GAP = 2.35, 6.45, 2.9, 0.56, 0.26  # column centres, box size, vertical gap


def _column(x: float, y: float, spec: list[tuple[str, int, str, str]]) -> list[Part]:
    parts = []
    for title, chapter, name, kind in spec:
        parts.append(Part(x, y, BW, BH, title, chapter, name, kind))
        y += BH + GAP
    return parts



def architecture(chapter: int | None = None) -> Figure:
    """The encoder-decoder Transformer; with `chapter`, what that chapter builds is highlighted and the rest greyed.

    Chapters 5 and 6 build what is inside the attention boxes; chapter 10 the generator and the whole model."""
    fig, ax = _new_axes(W, H)
    y_embed = 0.85
    embed_l = Part(XL, y_embed, BW, BH, "Token embedding × √D", 3, "TokenEmbedding", "embed")
    embed_r = Part(XR, y_embed, BW, BH, "Token embedding × √D", 3, "TokenEmbedding", "embed")
    pos_l = Part(XL, y_embed + BH + GAP, BW, BH, "+ positional encoding", 4, "SinusoidalPositionalEncoding", "embed")
    pos_r = Part(XR, y_embed + BH + GAP, BW, BH, "+ positional encoding", 4, "SinusoidalPositionalEncoding", "embed")
    y_layer = pos_l.y + BH + 0.95  # the first sub-layer inside the stacks
    norm = ("Add & norm", 7, "SublayerConnection", "norm")
    enc = _column(XL, y_layer, [("Multi-head self-attention", 6, "MultiHeadAttention", "attn"), norm,
                                ("Feed-forward", 7, "PositionwiseFeedForward", "ffn"), norm])
    dec = _column(XR, y_layer, [("Masked multi-head self-attention", 6, "MultiHeadAttention", "attn"), norm,
                                ("Multi-head cross-attention", 6, "MultiHeadAttention", "attn"), norm,
                                ("Feed-forward", 7, "PositionwiseFeedForward", "ffn"), norm])
    top_dec = dec[-1].y + BH
    gen = Part(XR, top_dec + 0.95, BW, BH, "Linear + log-softmax", 10, "Generator", "out")
    pad, res = 0.16, 0.32  # frame padding; room for the residual lines on the outer side
    enc_layer = Frame(XL - BW / 2 - res - pad, y_layer - 0.2, XL + BW / 2 + pad, enc[-1].y + BH + 0.45,
                      "N × EncoderLayer", 8, "ch. 8")
    enc_stack = Frame(enc_layer.x0 - 0.12, enc_layer.y0 - 0.12, enc_layer.x1 + 0.12, enc_layer.y1 + 0.42,
                      "Encoder", 8, "ch. 8")
    dec_layer = Frame(XR - BW / 2 - pad, y_layer - 0.2, XR + BW / 2 + res + pad, top_dec + 0.45,
                      "N × DecoderLayer", 9, "ch. 9")
    dec_stack = Frame(dec_layer.x0 - 0.12, dec_layer.y0 - 0.12, dec_layer.x1 + 0.12, dec_layer.y1 + 0.42,
                      "Decoder", 9, "ch. 9")
    model = Frame(0.12, 0.6, W - 0.12, gen.y + BH + 0.8, "Transformer", 10,
                  "ch. 10 · sizes from TransformerConfig")

    # What each chapter builds: its own boxes, and for 8 and 9 the stack they assemble around ch. 6-7 parts.
    focus = 6 if chapter == 5 else chapter  # chapter 5's attention function is what chapter 6's boxes compute
    def built_in(c: int) -> bool:
        return chapter is None or c == focus

    def part_active(p: Part, frames: list[Frame]) -> bool:
        return built_in(p.chapter) or any(built_in(f.chapter) and f.chapter in (8, 9) for f in frames)

    def mark(p: Part, frames: list[Frame]) -> bool:
        return chapter is not None and p.chapter == focus

    for frame in (model, enc_stack, enc_layer, dec_stack, dec_layer):
        _frame(ax, frame, built_in(frame.chapter), chapter is not None and frame.chapter == focus)
    for p in (embed_l, embed_r, pos_l, pos_r, gen):
        _box(ax, p, part_active(p, []), mark(p, []))
    for p in enc:
        _box(ax, p, part_active(p, [enc_layer]), mark(p, [enc_layer]))
    for p in dec:
        _box(ax, p, part_active(p, [dec_layer]), mark(p, [dec_layer]))

    # Data flow, bottom to top. The wiring around the stacks is chapter 10's; inside them, chapters 8 and 9's.
    outer_on, enc_on, dec_on = built_in(10), built_in(8), built_in(9)
    memory_on = chapter in (None, 8, 9, 10)
    outer_ink = INK if outer_on else GREY_INK
    ax.text(XL, 0.3, "source ids (B, S)", ha="center", va="center", fontsize=TITLE_SIZE, color=outer_ink)
    ax.text(XR, 0.3, "target ids, shifted right (B, T)", ha="center", va="center", fontsize=TITLE_SIZE,
            color=outer_ink)
    for x in (XL, XR):
        _arrow(ax, [(x, 0.45), (x, y_embed)], outer_on)
        _arrow(ax, [(x, y_embed + BH), (x, pos_l.y)], outer_on)
        _arrow(ax, [(x, pos_l.y + BH), (x, y_layer)], outer_on)
    for column, on, side in ((enc, enc_on, -1), (dec, dec_on, +1)):
        for lower, upper in zip(column[:-1], column[1:]):
            _arrow(ax, [(lower.x, lower.y + lower.h), (upper.x, upper.y)], on)
        # Residual connections: from below each sub-layer, around it, into its add & norm.
        rx = column[0].x + side * (BW / 2 + res / 2 + 0.02)
        for sub, add in zip(column[0::2], column[1::2]):
            y_in = sub.y - GAP / 2 if sub is not column[0] else sub.y - 0.12
            _arrow(ax, [(sub.x, y_in), (rx, y_in), (rx, add.y + BH / 2), (add.x + side * BW / 2, add.y + BH / 2)],
                   on or chapter == 7, width=0.9)
    memory_y = enc_stack.y1 + 0.35
    cross = dec[2]
    mid = (XL + BW / 2 + XR - BW / 2) / 2 + 0.05
    memory_ink = INK if memory_on else GREY_INK
    ax.text((XL + mid) / 2, memory_y + 0.2, "memory (B, S, D)", ha="center", va="center", fontsize=SUB_SIZE + 1,
            color=memory_ink, fontweight="bold")
    _arrow(ax, [(XL, enc[-1].y + BH), (XL, memory_y), (mid, memory_y), (mid, cross.y + BH / 2),
                (cross.x - BW / 2, cross.y + BH / 2)], memory_on, width=1.6)
    ax.text(mid + 0.08, cross.y + BH / 2 + 0.45, "keys,\nvalues", ha="left", va="center", fontsize=SUB_SIZE,
            color=memory_ink, style="italic")
    _arrow(ax, [(XR, dec[-1].y + BH), (XR, gen.y)], outer_on)
    ax.text(XR, gen.y + BH + 0.2, "log p(next token)  (B, T, V)", ha="center", va="center", fontsize=TITLE_SIZE,
            color=outer_ink)

    # The free space above the encoder: a key to the labels, or the chapter's tag.
    top = model.y1 - 0.5
    if chapter is None:
        ax.text(0.45, top, "In each box: what it computes, and", ha="left", va="top", fontsize=SUB_SIZE + 1,
                color=INK)
        ax.text(0.45, top - 0.3, "ch. n · the transformer_lib class", ha="left", va="top", fontsize=SUB_SIZE + 1,
                color=INK, style="italic")
        ax.text(0.45, top - 0.6, "that chapter n builds.", ha="left", va="top", fontsize=SUB_SIZE + 1, color=INK)
        ax.text(0.45, top - 1.05, "N = 6 layers per stack in the paper's\nbase model, each with its own weights.",
                ha="left", va="top", fontsize=SUB_SIZE + 1, color=INK, linespacing=1.4)
    else:
        output = (gen.x - BW / 2, gen.y + BH / 2)
        targets = {5: (enc[0].x - BW / 2 + 0.4, enc[0].y + BH), 6: (enc[0].x - BW / 2 + 0.4, enc[0].y + BH),
                   7: (enc[2].x - BW / 2 + 0.4, enc[-1].y + BH + 0.02), 8: (enc_stack.x0 + 1.2, enc_stack.y1),
                   9: (dec_stack.x0, dec_stack.y1 - 0.9), 10: output}
        texts = {5: "chapter 5: attention, the\nfunction in these boxes", 6: "chapter 6: multi-head\nattention",
                 7: "chapter 7: feed-forward,\nresiduals, add & norm", 8: "chapter 8: the encoder",
                 9: "chapter 9: the decoder", 10: "chapter 10: the generator\nand the whole model"}
        ax.text(0.45, top, "You are here", ha="left", va="top", fontsize=TITLE_SIZE + 1, color=HIGHLIGHT,
                fontweight="bold")
        ax.text(0.45, top - 0.32, "(grey: built in other chapters)",
                ha="left", va="top", fontsize=SUB_SIZE + 1, color=GREY_INK)
        _tag(ax, 0.55, top - 1.05, texts[chapter], targets[chapter], bend=0.15 if chapter >= 10 else -0.2)
    return fig


# ----------------------------------------------------------------------------------------------------------------
# Chapter 7: post-LN and pre-LN


def _small(ax: plt.Axes, x: float, y: float, w: float, title: str, kind: str, h: float = 0.42) -> Part:
    part = Part(x, y, w, h, title, 7, "", kind)
    _box(ax, part, True, False)
    return part


def _plus(ax: plt.Axes, x: float, y: float) -> None:
    ax.add_patch(Circle((x, y), 0.15, facecolor="white", edgecolor=INK, linewidth=1.1, zorder=3))
    ax.text(x, y - 0.005, "+", ha="center", va="center", fontsize=13, color=INK, zorder=4)


def post_pre_ln() -> Figure:
    """SublayerConnection both ways: post-LN (the paper) and pre-LN (norm_first=True)."""
    fig, ax = _new_axes(8.6, 5.9)
    bw, step = 2.1, 0.75
    for x, norm_first in ((2.35, False), (6.45, True)):
        title = "post-LN (the paper, Sec. 3.1)" if not norm_first else "pre-LN (GPT-2 onward)"
        ax.text(x, 5.62, title, ha="center", va="center", fontsize=TITLE_SIZE + 1, fontweight="bold", color=INK)
        ax.text(x, 5.3, f"SublayerConnection(norm_first={norm_first})", ha="center", va="center", fontsize=SUB_SIZE,
                color=INK, style="italic")
        ax.text(x, 0.25, "x  (B, T, D)", ha="center", va="center", fontsize=TITLE_SIZE, color=INK)
        order = ["sub", "drop", "plus", "norm"] if not norm_first else ["norm", "sub", "drop", "plus"]
        y, prev_top, plus_y = 0.85, 0.42, None
        for item in order:
            if item == "plus":
                cy = y + 0.15
                _arrow(ax, [(x, prev_top), (x, cy - 0.15)])
                _plus(ax, x, cy)
                plus_y, prev_top = cy, cy + 0.15
                y += step - 0.1
                continue
            title, kind = {"sub": ("Sublayer (attention or FFN)", "attn"), "drop": ("Dropout", "io"),
                           "norm": ("LayerNorm", "norm")}[item]
            part = _small(ax, x, y, bw, title, kind)
            _arrow(ax, [(x, prev_top), (x, y)])
            prev_top, y = y + part.h, y + step
        out_y = prev_top + 0.35
        _arrow(ax, [(x, prev_top), (x, out_y)])
        ax.text(x, out_y + 0.17, "output  (B, T, D)", ha="center", va="center", fontsize=TITLE_SIZE, color=INK)
        # The residual: from x, around everything before the sum, into it.
        rx = x - bw / 2 - 0.35
        _arrow(ax, [(x, 0.6), (rx, 0.6), (rx, plus_y), (x - 0.15, plus_y)], width=1.4)
        ax.text(rx - 0.08, (0.6 + plus_y) / 2, "residual", ha="right", va="center", fontsize=SUB_SIZE, color=INK,
                rotation=90)
        formula = ("x ← LayerNorm(x + Dropout(Sublayer(x)))" if not norm_first
                   else "x ← x + Dropout(Sublayer(LayerNorm(x)))")
        note = ("every layer's output is normalised" if not norm_first
                else "the stream x is never normalised:\nthe stack ends with one final LayerNorm")
        ax.text(x, 4.93, formula, ha="center", va="center", fontsize=SUB_SIZE + 1, color=INK)
        ax.text(x, 4.5, note, ha="center", va="center", fontsize=SUB_SIZE, color="#666666", style="italic")
    ax.plot([4.4, 4.4], [0.15, 5.75], color=GREY_EDGE, linewidth=0.8)
    return fig


# ----------------------------------------------------------------------------------------------------------------
# Chapter 9: the memory flows into every decoder layer


def memory_flow() -> Figure:
    """The encoder's final output is the only tensor that reaches the decoder, and every decoder layer reads it."""
    fig, ax = _new_axes(8.8, 7.0)
    n, xl, xr, bw = 3, 1.9, 5.9, 2.6
    purple = "#7d3c98"
    sub_w, sub_h, sub_gap = bw - 0.5, 0.36, 0.1
    ax.text(xl, 0.8, "embedded source  (B, S, D)", ha="center", va="center", fontsize=SUB_SIZE + 1, color=INK)
    ax.text(xr, 0.8, "embedded target  (B, T, D)", ha="center", va="center", fontsize=SUB_SIZE + 1, color=INK)
    ax.text(4.4, 0.3, "Drawn with N = 3 layers (the paper's base model has 6); add & norm left out.\n"
            "No line joins encoder layer i to decoder layer i: every decoder layer reads the final memory.",
            ha="center", va="center", fontsize=SUB_SIZE, color="#555555", style="italic", linespacing=1.5)
    y, prev_enc, prev_dec, cross_mids = 1.2, 0.95, 0.95, []
    for i in range(n):
        frame_y0 = y
        sy = y + 0.1
        for title, kind in (("masked self-attention", "attn"), ("cross-attention", "attn"), ("feed-forward", "ffn")):
            _box(ax, Part(xr + 0.15, sy, sub_w, sub_h, title, 9, "", kind), True, False)
            if title != "masked self-attention":
                _arrow(ax, [(xr + 0.15, sy - sub_gap), (xr + 0.15, sy)], width=0.9)
            if title == "cross-attention":
                cross_mids.append(sy + sub_h / 2)
            sy += sub_h + sub_gap
        frame_y1 = sy + 0.05
        ax.add_patch(FancyBboxPatch((xr - bw / 2, frame_y0), bw, frame_y1 - frame_y0,
                                    boxstyle="round,pad=0,rounding_size=0.1", facecolor="none", edgecolor=FRAME_EDGE,
                                    linewidth=1.1, zorder=1))
        ax.text(xr + bw / 2 + 0.12, (frame_y0 + frame_y1) / 2, f"DecoderLayer {i + 1}\nits own $W^K$, $W^V$",
                ha="left", va="center", fontsize=SUB_SIZE, color=INK, linespacing=1.4)
        _arrow(ax, [(xr + 0.15, prev_dec), (xr + 0.15, frame_y0 + 0.1)])
        prev_dec = frame_y1
        # The encoder layer of the same depth, beside it, with no line between them.
        enc = Part(xl, frame_y0 + 0.35, bw, 0.6, f"EncoderLayer {i + 1}", 8, "", "layer")
        _box(ax, enc, True, False)
        _arrow(ax, [(xl, prev_enc), (xl, enc.y)])
        prev_enc = enc.y + enc.h
        y = frame_y1 + 0.3
    memory_y = prev_enc + 0.45  # bottom of the memory box
    _arrow(ax, [(xl, prev_enc), (xl, memory_y)])
    ax.add_patch(FancyBboxPatch((xl - 0.95, memory_y), 1.9, 0.5, boxstyle="round,pad=0,rounding_size=0.08",
                                facecolor="#e8d5f2", edgecolor=INK, linewidth=1.4, zorder=3))
    ax.text(xl, memory_y + 0.25, "memory  (B, S, D)", ha="center", va="center", fontsize=TITLE_SIZE, color=INK,
            fontweight="bold", zorder=4)
    ax.text(xl, memory_y + 0.85, "with the source padding mask\n(B, 1, 1, S)", ha="center", va="center",
            fontsize=SUB_SIZE, color=INK, linespacing=1.4)
    # The memory: out to a trunk, and from the trunk into every decoder layer's cross-attention.
    trunk, out_y = xl + bw / 2 + 0.35, memory_y + 0.25
    ax.plot([xl + 0.95, trunk], [out_y, out_y], color=purple, linewidth=1.8, zorder=2)
    ax.plot([trunk, trunk], [min(cross_mids), max(max(cross_mids), out_y)], color=purple, linewidth=1.8, zorder=2)
    for mid in cross_mids:
        _arrow(ax, [(trunk, mid), (xr + 0.15 - sub_w / 2, mid)], color=purple, width=1.8)
    ax.text(trunk + 0.1, max(cross_mids) + 0.12, "keys, values", ha="left", va="bottom", fontsize=SUB_SIZE,
            color=purple, style="italic")
    _arrow(ax, [(xr + 0.15, prev_dec), (xr + 0.15, prev_dec + 0.3)])
    ax.text(xr + 0.15, prev_dec + 0.48, "to the generator  (B, T, D)", ha="center", va="center",
            fontsize=SUB_SIZE + 1, color=INK)
    height = max(memory_y + 1.2, prev_dec + 0.7) + 0.5
    ax.text(xl, height - 0.3, "Encoder", ha="center", fontsize=TITLE_SIZE + 1, fontweight="bold", color=INK,
            va="center")
    ax.text(xr, height - 0.3, "Decoder", ha="center", fontsize=TITLE_SIZE + 1, fontweight="bold", color=INK,
            va="center")
    fig.set_size_inches(8.8, height)
    ax.set_ylim(0, height)
    return fig


# ----------------------------------------------------------------------------------------------------------------
# The key/value cache (placed in chapter 12)


def kv_cache() -> Figure:
    """Which keys and values each decoding step computes and which it reads from the cache."""
    fig, ax = _new_axes(9.9, 4.9)
    steps, s_len, c = 5, 4, 0.5  # decoding steps, source length, cell size
    new, cached, future = "#f39c4a", "#9cc3e6", "#ffffff"

    def grid(x0: float, title: str, subtitle: str, n_cols: int, col_label: str, colour: Callable[[int, int], str]):
        ax.text(x0 + n_cols * c / 2, 4.55, title, ha="center", va="center", fontsize=TITLE_SIZE + 1,
                fontweight="bold", color=INK)
        ax.text(x0 + n_cols * c / 2, 4.22, subtitle, ha="center", va="center", fontsize=SUB_SIZE, color=INK,
                style="italic")
        top = 3.75
        for t in range(steps):
            y = top - (t + 1) * c
            if x0 < 2:
                ax.text(x0 - 0.15, y + c / 2, f"step {t + 1}", ha="right", va="center", fontsize=SUB_SIZE + 1,
                        color=INK)
            for j in range(n_cols):
                ax.add_patch(Rectangle((x0 + j * c, y), c, c, facecolor=colour(t, j), edgecolor="#777777",
                                       linewidth=0.8))
        for j in range(n_cols):
            ax.text(x0 + j * c + c / 2, top + 0.15, str(j), ha="center", va="center", fontsize=SUB_SIZE + 1,
                    color=INK)
        ax.text(x0 + n_cols * c / 2, top - steps * c - 0.3, col_label, ha="center", va="center",
                fontsize=SUB_SIZE + 1, color=INK)

    def self_colour(t: int, j: int) -> str:
        return new if j == t else cached if j < t else future

    def cross_colour(t: int, j: int) -> str:
        return new if t == 0 else cached

    grid(1.3, "Self-attention cache", "KVCache: appends one position per step", steps, "target position (key)",
         self_colour)
    grid(4.9, "Cross-attention cache", "KVCache(static=True): filled at step 1", s_len, "source position (key)",
         cross_colour)
    lx, ly = 7.25, 3.45
    for i, (colour, text) in enumerate([(new, "keys and values computed\nat this step"),
                                        (cached, "read from the cache"), (future, "not generated yet")]):
        y = ly - i * 0.62
        ax.add_patch(Rectangle((lx, y - 0.17), 0.34, 0.34, facecolor=colour, edgecolor="#777777", linewidth=0.8))
        ax.text(lx + 0.48, y, text, ha="left", va="center", fontsize=SUB_SIZE + 1, color=INK)
    ax.text(0.25, 0.35, "Step t runs only the newest target token (position t − 1) through the decoder; in each "
            "attention module its one query attends to every key in its row.\nOne LayerCache per decoder layer "
            "holds both caches (ch. 9); Transformer.decode(..., cache, offset) fills them (ch. 10).", ha="left",
            va="center", fontsize=SUB_SIZE + 0.5, color="#444444", linespacing=1.5)
    return fig


# ----------------------------------------------------------------------------------------------------------------

# ----------------------------------------------------------------------------------------------------------------
# Chapter 11: teacher forcing


def _token(ax: plt.Axes, x: float, y: float, text: str, kind: str, w: float = 0.82, h: float = 0.42) -> None:
    """One token in a small box."""
    ax.add_patch(FancyBboxPatch((x - w / 2, y), w, h, boxstyle="round,pad=0,rounding_size=0.06", facecolor=FILL[kind],
                                edgecolor=INK, linewidth=0.9, zorder=3))
    ax.text(x, y + h / 2, text, ha="center", va="center", fontsize=SUB_SIZE + 1, color=INK, zorder=4)


def teacher_forcing() -> Figure:
    """One target sentence as the decoder's input (shifted right) and as its labels (shifted left), in one pass."""
    fig, ax = _new_axes(9.2, 4.9)
    words = ["A", "man", "rides", "a", "horse", "."]
    inputs, labels = ["<bos>", *words], [*words, "<eos>"]
    x0, dx = 1.9, 1.0
    xs = [x0 + i * dx for i in range(len(inputs))]
    ax.text(0.25, 0.62, "tgt_in  (B, T)", ha="left", va="center", fontsize=SUB_SIZE + 1, color=INK, style="italic")
    ax.text(0.25, 0.34, "decoder input", ha="left", va="center", fontsize=SUB_SIZE, color="#555555")
    ax.text(0.25, 3.92, "tgt_out  (B, T)", ha="left", va="center", fontsize=SUB_SIZE + 1, color=INK, style="italic")
    ax.text(0.25, 3.64, "labels", ha="left", va="center", fontsize=SUB_SIZE, color="#555555")
    for i, (x, token_in, token_out) in enumerate(zip(xs, inputs, labels, strict=True)):
        _token(ax, x, 0.4, token_in, "embed")
        _token(ax, x, 3.57, token_out, "out")
        _arrow(ax, [(x, 0.82), (x, 1.3)], width=0.9)
        _arrow(ax, [(x, 2.55), (x, 3.57)], width=0.9)
        ax.text(x + 0.06, 3.06, f"p(y{i + 1} | y<{i + 1})" if i < len(words) else "p(<eos> | y)", ha="left",
                va="center", fontsize=SUB_SIZE - 1, color="#555555", rotation=90)
    ax.add_patch(FancyBboxPatch((xs[0] - 0.5, 1.3), xs[-1] - xs[0] + 1.0, 1.25, boxstyle="round,pad=0,rounding_size=0.1",
                                facecolor=FILL["layer"], edgecolor=INK, linewidth=1.0, zorder=1))
    ax.text((xs[0] + xs[-1]) / 2, 2.12, "decoder + generator, all T positions in one pass", ha="center",
            va="center", fontsize=TITLE_SIZE, color=INK)
    ax.text((xs[0] + xs[-1]) / 2, 1.7, "causal mask: position t reads tgt_in[0..t] only", ha="center",
            va="center", fontsize=SUB_SIZE + 1, color=INK, style="italic")
    ax.text(4.6, 4.6, "the same sentence twice: shifted right as input, shifted left as labels",
            ha="center", va="center", fontsize=TITLE_SIZE, color=INK, fontweight="bold")
    return fig


# ----------------------------------------------------------------------------------------------------------------
# Chapter 6: splitting into heads and merging back


def heads_split_merge() -> Figure:
    """The width D cut into H slices of Dh, attention per slice, the slices put side by side again, then W^O."""
    fig, ax = _new_axes(9.6, 4.9)
    colors = ["#fbd5a5", "#bcdcf3", "#c9e8c1", "#f6c9d3"]
    H, slice_w, bar_h, head_h = 4, 0.5, 0.9, 0.5
    mid_y = 2.45  # the vertical middle of the bars

    def bar(x: float, label: str) -> None:
        for h in range(H):
            ax.add_patch(Rectangle((x + h * slice_w, mid_y - bar_h / 2), slice_w, bar_h, facecolor=colors[h],
                                   edgecolor=INK, linewidth=0.9))
            ax.text(x + (h + 0.5) * slice_w, mid_y, "Dh", ha="center", va="center", fontsize=SUB_SIZE, color=INK)
        ax.text(x + H * slice_w / 2, mid_y + bar_h / 2 + 0.3, label, ha="center", va="center", fontsize=TITLE_SIZE,
                color=INK)

    left, heads_x, right = 0.35, 3.35, 7.35
    bar(left, "q_proj(x)  (B, T, D)")
    ax.text(left + H * slice_w / 2, mid_y - bar_h / 2 - 0.25, "D = H · Dh", ha="center", va="center",
            fontsize=SUB_SIZE + 1, color=INK)
    ax.text((heads_x + 0.25 + 6.6) / 2, 4.55, "(B, H, T, Dh): one attention per head", ha="center", va="center",
            fontsize=TITLE_SIZE, color=INK)
    for h in range(H):
        y = 3.7 - h * 0.85  # bottom of head h's row
        for x in (heads_x, 6.35):
            ax.add_patch(Rectangle((x, y), slice_w, head_h, facecolor=colors[h], edgecolor=INK, linewidth=0.9))
        ax.text(heads_x + slice_w + 0.12, y + head_h / 2 + 0.02, f"head {h + 1}: softmax(q kᵀ / √Dh) v", ha="left",
                va="center", fontsize=SUB_SIZE, color=INK)
        _arrow(ax, [(left + H * slice_w + 0.05, mid_y), (heads_x - 0.05, y + head_h / 2)], width=0.8)
        _arrow(ax, [(6.35 + slice_w + 0.05, y + head_h / 2), (right - 0.05, mid_y)], width=0.8)
    bar(right, "merged  (B, T, D)")
    ax.text(1.5, 1.35, "split", ha="center", va="center", fontsize=TITLE_SIZE, color=INK, style="italic")
    ax.text(right + H * slice_w / 2, 1.35, "merge, then out_proj:", ha="center", va="center", fontsize=TITLE_SIZE,
            color=INK, style="italic")
    ax.text(right + H * slice_w / 2, 1.05, "$W^O$ mixes the heads", ha="center", va="center", fontsize=SUB_SIZE + 1,
            color=INK, style="italic")
    ax.text(0.35, 0.6, 'split: rearrange(q, "b t (h d) -> b h t d", h=H), the same for keys and values', ha="left",
            va="center", fontsize=SUB_SIZE, color="#555555", family="monospace")
    ax.text(0.35, 0.3, 'merge: rearrange(o, "b h t d -> b t (h d)"); neither adds a weight', ha="left",
            va="center", fontsize=SUB_SIZE, color="#555555", family="monospace")
    return fig


# ----------------------------------------------------------------------------------------------------------------
# Chapter 12: a beam search tree


def beam_tree() -> Figure:
    """Beam search with K = 2: each kept prefix is extended, the K best prefixes overall survive, the rest are pruned."""
    fig, ax = _new_axes(9.8, 5.6)
    # (step, token, cumulative log p, parent index in the previous step's list, kept)
    steps = [
        [("A", -0.4, 0, True), ("The", -1.3, 0, True), ("Two", -2.5, 0, False)],
        [("man", -0.9, 0, True), ("woman", -1.6, 0, True), ("dog", -2.0, 0, False),
         ("man", -1.8, 1, False), ("boy", -2.2, 1, False), ("dog", -2.6, 1, False)],
        [("rides", -1.5, 0, True), ("is", -1.7, 0, True), ("<eos>", -3.0, 0, False),
         ("rides", -2.4, 1, False), ("is", -2.6, 1, False), ("sits", -3.1, 1, False)],
    ]
    xs, top, bottom = [2.55, 4.75, 6.95], 4.7, 0.75
    root = (0.75, (top + bottom) / 2)
    _token(ax, root[0], root[1] - 0.21, "<bos>", "embed")
    positions: list[list[tuple[float, float]]] = [[root]]
    kept_before = [0]  # which nodes of the previous step were kept, in order: a child's parent index counts those
    for step, (x, nodes) in enumerate(zip(xs, steps, strict=True)):
        ys = [top - i * (top - bottom) / max(len(nodes) - 1, 1) for i in range(len(nodes))]
        here = []
        for (token, score, parent, kept), y in zip(nodes, ys, strict=True):
            px, py = positions[-1][kept_before[parent]]
            edge_on = kept
            ax.plot([px + 0.41, x - 0.41], [py, y], color=INK if edge_on else GREY_EDGE, linewidth=1.0 if edge_on else 0.8,
                    linestyle="-" if edge_on else "--", zorder=2)
            ax.add_patch(FancyBboxPatch((x - 0.41, y - 0.21), 0.82, 0.42, boxstyle="round,pad=0,rounding_size=0.06",
                                        facecolor=FILL["attn"] if kept else GREY_FILL, edgecolor=INK if kept else GREY_EDGE,
                                        linewidth=1.6 if kept else 0.8, zorder=3))
            ax.text(x, y, token, ha="center", va="center", fontsize=SUB_SIZE + 1, color=INK if kept else GREY_INK,
                    zorder=4)
            ax.text(x, y - 0.33, f"{score:.1f}", ha="center", va="center", fontsize=SUB_SIZE,
                    color=INK if kept else GREY_INK, zorder=4)
            here.append((x, y))
        kept_before = [i for i, node in enumerate(nodes) if node[3]]
        positions.append(here)
        ax.text(x, top + 0.55, f"step {step + 1}", ha="center", va="center", fontsize=TITLE_SIZE, color=INK,
                fontweight="bold")
    ax.text(8.0, 4.7, "kept: the K = 2 best\nprefixes of the step", ha="left", va="center", fontsize=SUB_SIZE + 1,
            color=INK, linespacing=1.4)
    ax.text(8.0, 3.75, "grey: pruned", ha="left", va="center", fontsize=SUB_SIZE + 1, color=GREY_INK)
    ax.text(8.0, 3.1, "under each: log p\nof the whole prefix", ha="left", va="center", fontsize=SUB_SIZE + 1,
            color=INK, linespacing=1.4)
    ax.text(4.7, 0.2, "Each kept prefix is extended by every token (three drawn here); all K · V candidates compete, and the "
            "best K go on.", ha="center", va="center", fontsize=SUB_SIZE, color="#555555", style="italic")
    return fig


# ----------------------------------------------------------------------------------------------------------------
# Chapter 5: queries, keys and values through attention


def _step(ax: plt.Axes, x: float, y: float, w: float, title: str, shape: str, kind: str, h: float = 0.8) -> Part:
    """A box with what it holds on top and its shape below."""
    part = Part(x, y, w, h, title, 5, "", kind)
    ax.add_patch(FancyBboxPatch((x - w / 2, y), w, h, boxstyle="round,pad=0,rounding_size=0.08", facecolor=FILL[kind],
                                edgecolor=INK, linewidth=1.0, zorder=3))
    ax.text(x, y + h * 0.66, title, ha="center", va="center", fontsize=TITLE_SIZE - 1, color=INK, zorder=4)
    ax.text(x, y + h * 0.28, shape, ha="center", va="center", fontsize=SUB_SIZE, color=INK, style="italic", zorder=4)
    return part


def qkv_attention() -> Figure:
    """Eq. 1 as a flow of tensors: queries meet keys in the scores, the mask and softmax make weights, weights mix values."""
    fig, ax = _new_axes(9.8, 4.4)
    q = _step(ax, 0.95, 2.9, 1.5, "queries Q", "(..., T, Dk)", "embed")
    k = _step(ax, 0.95, 1.65, 1.5, "keys K", "(..., S, Dk)", "embed")
    v = _step(ax, 0.95, 0.4, 1.5, "values V", "(..., S, Dv)", "embed")
    scores = _step(ax, 3.05, 2.3, 1.9, "Q Kᵀ / √Dk", "scores (..., T, S)", "attn")
    masked = _step(ax, 5.1, 2.3, 1.6, "mask: −∞ where", "not allowed", "norm")
    weights = _step(ax, 7.05, 2.3, 1.7, "softmax over S", "weights (..., T, S)", "attn")
    out = _step(ax, 8.85, 0.4, 1.6, "weights · V", "output (..., T, Dv)", "out")
    _arrow(ax, [(q.x + q.w / 2, q.y + q.h / 2), (1.95, q.y + q.h / 2), (1.95, scores.y + 0.55),
                (scores.x - scores.w / 2, scores.y + 0.55)])
    _arrow(ax, [(k.x + k.w / 2, k.y + k.h / 2), (1.95, k.y + k.h / 2), (1.95, scores.y + 0.25),
                (scores.x - scores.w / 2, scores.y + 0.25)])
    _arrow(ax, [(scores.x + scores.w / 2, scores.y + 0.4), (masked.x - masked.w / 2, masked.y + 0.4)])
    _arrow(ax, [(masked.x + masked.w / 2, masked.y + 0.4), (weights.x - weights.w / 2, weights.y + 0.4)])
    _arrow(ax, [(weights.x + weights.w / 2 - 0.2, weights.y), (weights.x + weights.w / 2 - 0.2, 1.45),
                (out.x - 0.3, 1.45), (out.x - 0.3, out.y + out.h)])
    _arrow(ax, [(v.x + v.w / 2, v.y + v.h / 2), (out.x - out.w / 2, out.y + out.h / 2)])
    ax.text(3.05, 3.4, "one score for each query-key pair", ha="center", va="center", fontsize=SUB_SIZE,
            color="#555555", style="italic")
    ax.text(7.05, 3.4, "each row sums to 1", ha="center", va="center", fontsize=SUB_SIZE, color="#555555",
            style="italic")
    ax.text(4.6, 1.05, "each output row: a weighted average of the value rows", ha="center", va="center",
            fontsize=SUB_SIZE, color="#555555", style="italic")
    ax.text(4.9, 4.1, "softmax(Q Kᵀ / √Dk) V  (Eq. 1): T queries read S keys and values", ha="center", va="center",
            fontsize=TITLE_SIZE, color=INK, fontweight="bold")
    return fig


FIGURE_BUILDERS: dict[str, Callable[[], Figure]] = {
    "architecture": architecture,
    "architecture_ch05": lambda: architecture(5),
    "architecture_ch06": lambda: architecture(6),
    "architecture_ch07": lambda: architecture(7),
    "architecture_ch08": lambda: architecture(8),
    "architecture_ch09": lambda: architecture(9),
    "architecture_ch10": lambda: architecture(10),
    "post_pre_ln": post_pre_ln,
    "memory_flow": memory_flow,
    "kv_cache": kv_cache,
    "teacher_forcing": teacher_forcing,
    "heads_split_merge": heads_split_merge,
    "beam_tree": beam_tree,
    "qkv_attention": qkv_attention,
}


def write_figures(out_dir: Path = FIGURES, fmt: str = "svg") -> list[Path]:
    """Draw every figure into out_dir as name.svg (byte-identical each run) or name.png; returns the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    with plt.rc_context(RC):
        for name, build in FIGURE_BUILDERS.items():
            fig = build()
            path = out_dir / f"{name}.{fmt}"
            metadata = {"Date": None, "Creator": "tools/architecture.py"} if fmt == "svg" else {}
            fig.savefig(path, format=fmt, metadata=metadata, dpi=110 if fmt == "png" else None)
            plt.close(fig)
            paths.append(path)
    return paths


def text_overlaps(fig: Figure) -> list[tuple[str, str]]:
    """Pairs of visible texts of a figure whose drawn extents overlap (there should be none)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    texts = [t for t in fig.findobj(matplotlib.text.Text) if t.get_visible() and t.get_text().strip()]
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts]
    return [(a, b) for i, (a, ea) in enumerate(boxes) for b, eb in boxes[i + 1:] if ea.overlaps(eb)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", nargs="?", type=Path, default=FIGURES)
    parser.add_argument("--png", type=Path, help="also write PNG previews into this folder")
    args = parser.parse_args()
    for path in write_figures(args.out_dir):
        print(path)
    if args.png:
        for path in write_figures(args.png, fmt="png"):
            print(path)


if __name__ == "__main__":
    main()

"""The explain report as one self-contained HTML page: the graph, with each substituted
region coloured by pattern and labelled with its kernel, near misses marked with their reason,
and a summary table (patterns, matches, share of FLOPs offloaded).

    report = pdlkit.explain(model, x)
    report.to_html("report.html")          # or: pdlkit explain model.py --html report.html

The graph is laid out here (no JavaScript, no external CSS or fonts): one row per
dependency level, inputs and weights just above their first user, edges as SVG curves.
FLOPs are estimates: 2*M*N*K for GEMMs (linear, mm, addmm, bmm, matmul), 4*B*H*L*S*D for
scaled-dot-product attention, one per output element for every other op.
"""

from __future__ import annotations

import html
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pdlkit.runtime_abi.triton_binding import size_hint

if TYPE_CHECKING:  # report.py imports this module (Report.to_html)
    from pdlkit.matcher.report import GraphReport, Report


@dataclass(frozen=True)
class NodeInfo:
    """One FX node of the graph before substitution (for the HTML picture)."""

    name: str
    op: str  # "aten.linear", "placeholder", ...
    inputs: tuple[str, ...]
    shape: str = ""  # "f32[8, 64, 256]"
    flops: int = 0  # estimated: 2*M*N*K for GEMMs, one per output element otherwise


# saturated, distinct, readable with black text; a near miss is drawn in _MISS
PALETTE = [
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#9467bd",
    "#17becf",
    "#e377c2",
    "#bcbd22",
    "#8c564b",
    "#7f7f7f",
    "#aec7e8",
]
_MISS = "#d62728"
_PLAIN = "#f2f2f2"
_INPUT = "#ffffff"

_GEMMS = {"aten.linear", "aten.mm", "aten.addmm", "aten.bmm", "aten.matmul", "aten.baddbmm"}


# -- nodes and FLOPs ----------------------------------------------------------------------------


def _int(x: Any) -> int:
    """A size for the FLOP count: a symbolic one by its hint (no guard on it), 0 where a
    data-dependent one has none."""
    try:
        return size_hint(x)
    except Exception:  # an unbacked symbolic size without a hint
        return 0


def _numel(v: Any) -> int:
    shape = getattr(v, "shape", None)
    return _numel_of(shape) if shape is not None else 0


def _numel_of(shape: Any) -> int:
    return math.prod(_int(s) for s in shape)


def _op_name(node: Any) -> str:
    if node.op != "call_function":
        return str(node.op)
    if node.target is operator.getitem:
        return "getitem"
    name = str(getattr(node.target, "name", lambda: node.target)())
    name = name.replace("::", ".").removesuffix(".default")
    return name


def _flops(node: Any, op: str) -> int:
    out = node.meta.get("val")
    ins = [a.meta.get("val") for a in node.args if hasattr(a, "meta")]
    shapes: list[Any] = [getattr(v, "shape", None) for v in ins]
    try:
        if any(op.startswith(g) for g in _GEMMS) and shapes:
            a = shapes[1] if op.startswith(("aten.addmm", "aten.baddbmm")) else shapes[0]
            return 2 * _numel(out) * _int(a[-1])
        if op.startswith("aten.scaled_dot_product_attention") and len(shapes) >= 2:
            q, k = shapes[0], shapes[1]
            return 4 * _numel_of(q) * _int(k[-2])
    except (IndexError, TypeError):
        return 0
    if isinstance(out, tuple | list):
        return sum(_numel(v) for v in out)
    return _numel(out) if node.op == "call_function" else 0


def _shape(v: Any) -> str:
    if hasattr(v, "shape") and hasattr(v, "dtype"):
        dt = str(v.dtype).removeprefix("torch.")
        short = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "uint8": "u8"}
        return f"{short.get(dt, dt)}[{', '.join(str(s) for s in v.shape)}]"
    return ""


def node_infos(gm: Any) -> list[NodeInfo]:
    """The nodes of a pre-dispatch graph, with estimated FLOPs (before substitution)."""
    out = []
    for n in gm.graph.nodes:
        if n.op == "output":
            continue
        op = _op_name(n)
        out.append(
            NodeInfo(
                name=n.name,
                op=op,
                inputs=tuple(a.name for a in n.all_input_nodes),
                shape=_shape(n.meta.get("val")),
                flops=_flops(n, op),
            )
        )
    return out


# -- layout -------------------------------------------------------------------------------------

W, H, GX, GY, PAD = 170, 54, 24, 40, 30


def _levels(nodes: Sequence[NodeInfo], users: dict[str, list[str]]) -> dict[str, int]:
    """Rows: data flow as early as possible; weights and what only depends on weights
    (a weight's dequantize) as late as possible, just above their first user."""
    level: dict[str, int] = {}
    weightish: set[str] = set()
    for n in nodes:
        known = [level[i] for i in n.inputs if i in level]
        level[n.name] = 1 + max(known) if known else 0
        if n.op in ("get_attr", "placeholder") or (
            n.inputs and all(i in weightish for i in n.inputs)
        ):
            weightish.add(n.name)
    for n in reversed(nodes):
        if n.name in weightish and users.get(n.name):
            level[n.name] = max(0, min(level[u] for u in users[n.name]) - 1)
    return level


def _layout(nodes: Sequence[NodeInfo]) -> tuple[dict[str, tuple[int, int]], int, int]:
    users: dict[str, list[str]] = {}
    for n in nodes:
        for i in n.inputs:
            users.setdefault(i, []).append(n.name)
    level = _levels(nodes, users)
    rows: dict[int, list[str]] = {}
    for n in nodes:
        rows.setdefault(level[n.name], []).append(n.name)
    inputs = {n.name: n.inputs for n in nodes}
    col: dict[str, float] = {}
    # order each row by where its neighbours sit (barycentres), down, up, then down again:
    # few crossing edges, and a pattern's nodes end up stacked above each other
    order = sorted(rows)
    for sweep, neighbours in ((order, inputs), (order[::-1], users), (order, inputs)):
        for r in sweep:
            names = rows[r]

            def centre(name: str, i: int, nb: Any = neighbours) -> tuple[float, int]:
                xs = [col[m] for m in nb.get(name, ()) if m in col]
                if xs:  # on a tie, a node placed by its neighbours goes first
                    return sum(xs) / len(xs), 0
                return col.get(name, float(i)), 1

            before = {nm: i for i, nm in enumerate(names)}
            names.sort(key=lambda nm: centre(nm, before[nm]))
            for c, name in enumerate(names):
                col[name] = float(c)
    pos = {}
    width = 0
    for r, names in sorted(rows.items()):
        for c, name in enumerate(names):
            pos[name] = (PAD + c * (W + GX), PAD + r * (H + GY))
        width = max(width, PAD * 2 + len(names) * (W + GX))
    height = PAD * 2 + (max(rows, default=0) + 1) * (H + GY)
    return pos, width, height


# -- rendering ----------------------------------------------------------------------------------


def _short(op: str) -> str:
    return op.replace("quantized_decomposed.", "qd.")


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


_UNUSED = "#dddddd"


def pattern_colors(report: Report) -> dict[str, str]:
    """A colour per pattern that substituted something (in order of first match)."""
    names = list(dict.fromkeys(s.pattern for s in report.substitutions))
    return {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(names)}


def _candidate_roots(g: GraphReport, at: Sequence[str], root_op: str | None) -> list[str]:
    """The nodes a near miss is about: its root-op node near the values it names.

    A failed constraint names the values it looked at (an operand, or ``kernel#0`` for
    the output of an earlier substitution); the candidate root is the first node with the
    pattern's root op among those values' users."""
    nodes = {n.name: n for n in g.fx_nodes}
    start = []
    for name in at:
        if name in nodes:
            start.append(name)
        elif "#" in name:  # kernel#i: the output of an earlier substitution
            start += [s.root for s in g.substitutions if s.kernel == name.split("#")[0]]
    if root_op is None:
        return start
    want = root_op.removeprefix("torch.")
    users: dict[str, list[str]] = {}
    for n in g.fx_nodes:
        for i in n.inputs:
            users.setdefault(i, []).append(n.name)
    frontier, seen = list(start), set(start)
    for _ in range(4):
        hits = [n for n in frontier if nodes[n].op == want]
        if hits:
            return hits
        frontier = [u for n in frontier for u in users.get(n, []) if u not in seen]
        seen.update(frontier)
    return start


def _svg(g: GraphReport, colors: dict[str, str], roots: dict[str, str | None]) -> str:
    nodes = g.fx_nodes
    pos, width, height = _layout(nodes)
    region: dict[str, Any] = {}
    for s in g.substitutions:
        for name in [*s.replaced, s.root]:
            region.setdefault(name, s)
    missed: dict[str, list[str]] = {}
    for m in g.near_misses:
        for name in _candidate_roots(g, m.at, roots.get(m.pattern)):
            if name in pos and name not in region:
                missed.setdefault(name, []).append(f"{m.pattern}: {m.reason}")
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">'
    ]
    placed = [(n, *pos[n.name]) for n in nodes if n.name in pos]
    for n, x, y in placed:
        for i in n.inputs:
            if i in pos:
                sx, sy = pos[i][0] + W // 2, pos[i][1] + H
                tx, ty = x + W // 2, y
                my = (sy + ty) // 2
                inside = region.get(i) is not None and region.get(i) is region.get(n.name)
                stroke = colors.get(region[i].pattern, PALETTE[0]) if inside else "#999"
                parts.append(
                    f'<path d="M{sx},{sy} C{sx},{my} {tx},{my} {tx},{ty}" fill="none" '
                    f'stroke="{stroke}" stroke-width="{4 if inside else 1}"/>'
                )
    for n, x, y in placed:
        sub = region.get(n.name)
        fill = (
            colors.get(sub.pattern, PALETTE[0])
            if sub
            else (_INPUT if n.op in ("placeholder", "get_attr") else _PLAIN)
        )
        stroke, dash, extra = "#555", "", ""
        tip = [f"{n.name} = {n.op}", n.shape, f"{n.flops:,} FLOPs" if n.flops else ""]
        if sub:
            tip.append(f"substituted by {sub.pattern} -> {sub.kernel}")
        if n.name in missed:
            stroke, dash = _MISS, ' stroke-dasharray="5,3"'
            extra = f' data-near-miss="{_e(" | ".join(missed[n.name]))}"'
            tip += ["near miss: " + r for r in missed[n.name]]
        cls = "node sub" if sub else ("node miss" if n.name in missed else "node")
        if sub:
            extra += f' data-pattern="{_e(sub.pattern)}" data-kernel="{_e(sub.kernel)}"'
        second = _short(n.op)
        bold = ""
        if sub and n.name == sub.root:  # the region's label: its kernel, on its root
            second, bold = f"\u2192 {sub.kernel}", ' font-weight="bold"'
        parts.append(
            f'<g class="{cls}" data-node="{_e(n.name)}"{extra}>'
            f"<title>{_e(chr(10).join(t for t in tip if t))}</title>"
            f'<rect x="{x}" y="{y}" width="{W}" height="{H}" rx="5" fill="{fill}" '
            f'stroke="{stroke}" stroke-width="{3 if n.name in missed else 1}"{dash}/>'
            f'<text x="{x + 6}" y="{y + 15}" font-weight="bold">{_e(n.name[:24])}</text>'
            f'<text x="{x + 6}" y="{y + 30}"{bold}>{_e(second[:28])}</text>'
            f'<text x="{x + 6}" y="{y + 45}" fill="#333">{_e(n.shape[:28])}</text></g>'
        )
        if n.name in missed:  # a badge inside the box: labels outside would cover neighbours
            parts.append(
                f'<text x="{x + W - 6}" y="{y + 45}" text-anchor="end" fill="{_MISS}" '
                f'font-weight="bold">near miss</text>'
            )
    parts.append("</svg>")
    return "\n".join(parts)


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], cls: str) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def flops_offloaded(report: Report) -> tuple[int, int]:
    """(FLOPs inside substituted regions, FLOPs of all graphs), as estimated per node."""
    total = done = 0
    for g in report.graphs:
        by_name = {n.name: n for n in g.fx_nodes}
        total += sum(n.flops for n in g.fx_nodes)
        replaced = {name for s in g.substitutions for name in [*s.replaced, s.root]}
        done += sum(by_name[n].flops for n in replaced if n in by_name)
    return done, total


def _graph_section(g: GraphReport, colors: dict[str, str], roots: dict[str, str | None]) -> str:
    """One graph's heading, picture and table of substitutions."""
    subs = _table(
        ["pattern", "kernel", "root", "replaced", "args"],
        [
            [
                f'<span class="swatch" style="background:{colors.get(s.pattern, PALETTE[0])}">'
                f"</span>{_e(s.pattern)}",
                _e(s.kernel),
                _e(s.root),
                _e(", ".join(s.replaced)),
                _e(", ".join(s.args)),
            ]
            for s in g.substitutions
        ],
        "subs",
    )
    skipped = f"<p class='skipped'>{_e(g.skipped)}</p>" if g.skipped else ""
    picture = _svg(g, colors, roots) if g.fx_nodes else "<p>(no node data for this graph)</p>"
    return (
        f"<h2>graph {g.index}: {g.nodes} nodes, "
        f"{len(g.substitutions)} substitution(s)</h2>{skipped}"
        f'<div class="graph">{picture}</div>{subs}'
    )


def render(report: Report) -> str:
    colors = pattern_colors(report)
    roots = {p.name: p.root for p in report.patterns}
    counts = report.counts()
    kernels: dict[str, dict[str, None]] = {}  # pattern -> its kernels, in first-use order
    for s in report.substitutions:
        kernels.setdefault(s.pattern, {})[s.kernel] = None
    done, total = flops_offloaded(report)
    share = f"{100 * done / total:.1f}%" if total else "n/a"
    silent = report.silent_patterns()
    rows = []
    for p in sorted(report.patterns, key=lambda p: -counts.get(p.name, 0)):
        swatch = f'<span class="swatch" style="background:{colors.get(p.name, _UNUSED)}"></span>'
        rows.append(
            [
                swatch + _e(p.name),
                _e(p.benefit),
                _e(p.root or "?"),
                str(counts.get(p.name, 0)),
                _e(", ".join(kernels.get(p.name, {})) or "-"),
                _e(silent.get(p.name, "") if not counts.get(p.name) else ""),
                _e(p.where),
            ]
        )
    summary = _table(
        ["pattern", "benefit", "root", "matches", "kernels", "why no match", "file"],
        rows,
        "patterns",
    )
    misses = _table(
        ["pattern", "at", "reason"],
        [[_e(m.pattern), _e(", ".join(m.at)), _e(m.reason)] for m in report.near_misses],
        "misses",
    )
    graphs = [_graph_section(g, colors, roots) for g in report.graphs]
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>pdlkit explain</title>
<style>
body {{ font-family: sans-serif; margin: 16px; color: #111; }}
table {{ border-collapse: collapse; margin: 8px 0 16px; font-size: 13px; }}
th, td {{ border: 1px solid #ccc; padding: 3px 8px; text-align: left; vertical-align: top; }}
th {{ background: #eee; }}
.swatch {{ display: inline-block; width: 14px; height: 14px; margin-right: 6px;
          vertical-align: middle; border: 1px solid #555; }}
.graph {{ overflow: auto; border: 1px solid #ddd; }}
.skipped {{ color: {_MISS}; }}
</style></head><body>
<h1>pdlkit explain</h1>
<table class="summary"><tbody>
<tr><th>target</th><td>{_e(report.target)}</td></tr>
<tr><th>graphs</th><td>{len(report.graphs)}</td></tr>
<tr><th>substitutions</th><td>{len(report.substitutions)}</td></tr>
<tr><th>FLOPs offloaded</th><td id="flops">{done:,} of {total:,} ({share})</td></tr>
<tr><th>near misses</th><td>{len(report.near_misses)}</td></tr>
</tbody></table>
{"".join(graphs)}
<h2>patterns</h2>{summary}
<h2>near misses</h2>{misses}
</body></html>
"""


def write_html(report: Report, path: str | Path) -> Path:
    p = Path(path)
    p.write_text(render(report), encoding="utf-8")
    return p

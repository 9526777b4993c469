"""Charts of evolution runs drawn as inline SVG on the server (no JavaScript, no CDN), like
workflows/graph.py and evals/charts.py.

- ``fitness_svg(generations, base_fitness=)``: the best, average and worst fitness of each generation as
  three lines with a point per generation (each point's tooltip gives its value), the base version's
  fitness as a dashed reference line, labelled axes ("generation", "fitness", from 0 to a round value
  above the highest point) and a legend. A generation without a value leaves a gap in its line.
- ``genealogy_svg(nodes, ...)``: the versions that took part in a run, placed in columns by generation
  (left to right; ancestors from outside the run in "earlier" columns before generation 0), each a
  link to its version's page. Colour is fitness on a viridis scale over the run's range (a legend
  shows it), shape is how the version was made (circle: mutation or initial, diamond: crossover,
  square: immigrant), grey when the run did not evaluate it. Edges go from parent to child: solid
  grey for a mutation, dashed purple for each parent of a crossover, none for an immigrant. The base
  and the best version carry a ring and a label, and the best version's line of descent back to the
  base is drawn dark over the rest.

  It stays readable with a few hundred versions: nodes are small, a generation taller than
  ``MAX_ROWS`` wraps into sub-columns (filled row by row, so the top stays the top), and the page puts
  the drawing in a scrolling container. Within a column, nodes sit at the mean height of their parents
  (one barycenter pass, which removes most crossings), ties and parentless nodes by fitness.

The drawings are deterministic (the same data give the same SVG). Every piece of text that comes from a
user (notes, kinds, labels, links) goes through ``escape``; numbers are formatted here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import pairwise

from django.utils.html import escape
from django.utils.safestring import SafeString

from config.svg import (
    AXIS,
    BLUE,
    GREEN,
    GRID,
    INK,
    MUTED,
    OUTLINE,
    RED,
    SLATE,
    clip,
    number,
    svg,
    two_places,
    x_axis,
    y_axis,
)

SERIES = (("best", "best", GREEN), ("avg", "average", BLUE), ("worst", "worst", RED))
BASE_LINE = SLATE


def nice_ticks(peak: float, count: int = 5) -> list[float]:
    """Round ticks from 0 to at least `peak` (1, 2, 2.5 or 5 times a power of ten apart)."""
    if peak <= 0 or not math.isfinite(peak):
        return [0.0, 0.25, 0.5, 0.75, 1.0]
    raw = peak / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    top = math.ceil(peak / step - 1e-9) * step
    return [round(i * step, 10) for i in range(round(top / step) + 1)]


# ------------------------------------------------------------------------------------- fitness chart

FIT_W, FIT_H = 680, 320
FIT_LEFT, FIT_RIGHT, FIT_TOP, FIT_BOTTOM = 62, 22, 20, 78
MAX_X_LABELS = 12


def fitness_svg(generations: list[dict], *, base_fitness: float | None = None,
                title: str = "Fitness over generations") -> SafeString:
    """Lines of `generations` ([{"number", "best", "avg", "worst"}], in order; a value may be None)."""
    plot_w = FIT_W - FIT_LEFT - FIT_RIGHT
    plot_h = FIT_H - FIT_TOP - FIT_BOTTOM
    bottom = FIT_TOP + plot_h
    values = [g[key] for g in generations for key, _, _ in SERIES if g.get(key) is not None]
    if base_fitness is not None:
        values.append(base_fitness)
    ticks = nice_ticks(max(values, default=0.0))
    top = ticks[-1]
    count = len(generations)

    def x(index: int) -> float:
        return FIT_LEFT + (plot_w * index / (count - 1) if count > 1 else plot_w / 2)

    def y(value: float) -> float:
        return bottom - plot_h * max(0.0, min(value, top)) / top

    parts = [y_axis("evo", [(y(tick), number(tick)) for tick in ticks], left=FIT_LEFT, right=FIT_LEFT + plot_w,
                    middle=FIT_TOP + plot_h / 2, title="fitness", tick_class="evo-tick")]
    every = max(1, math.ceil(count / MAX_X_LABELS))
    labelled = [(x(index), str(int(generation["number"]))) for index, generation in enumerate(generations)
                if not index % every or index == count - 1]
    parts.append(x_axis("evo", labelled, left=FIT_LEFT, right=FIT_LEFT + plot_w, bottom=bottom, title="generation",
                        title_y=bottom + 36))
    if base_fitness is not None:
        parts.append(f'<g class="evo-base-line"><title>{escape(f"base version: fitness {base_fitness:.2f}")}'
                     f'</title><line x1="{FIT_LEFT}" y1="{y(base_fitness):.1f}" x2="{FIT_LEFT + plot_w}" '
                     f'y2="{y(base_fitness):.1f}" stroke="{BASE_LINE}" stroke-width="1.4" '
                     f'stroke-dasharray="6 4"/></g>')
    for key, label, colour in SERIES:
        segments: list[list[str]] = [[]]
        points = []
        for index, generation in enumerate(generations):
            value = generation.get(key)
            if value is None:
                segments.append([])
                continue
            segments[-1].append(f"{x(index):.1f},{y(value):.1f}")
            tooltip = f"generation {int(generation['number'])}: {label} fitness {two_places(value)}"
            points.append(f'<circle class="evo-point evo-point-{key}" data-series="{key}" '
                          f'data-generation="{int(generation["number"])}" data-value="{value:.4f}" '
                          f'cx="{x(index):.1f}" cy="{y(value):.1f}" r="3.6" fill="{colour}" stroke="#fff" '
                          f'stroke-width="1"><title>{escape(tooltip)}</title></circle>')
        lines = "".join(f'<polyline points="{" ".join(s)}" fill="none" stroke="{colour}" stroke-width="2" '
                        f'stroke-linejoin="round"/>' for s in segments if len(s) > 1)
        parts.append(f'<g class="evo-series evo-series-{key}" data-series="{key}">{lines}{"".join(points)}</g>')
    legend_y = FIT_H - 14
    legend = [f'<g class="evo-legend" font-size="11" fill="{AXIS}">']
    lx = FIT_LEFT
    for key, label, colour in SERIES:
        legend.append(f'<line x1="{lx}" y1="{legend_y - 4}" x2="{lx + 24}" y2="{legend_y - 4}" stroke="{colour}" '
                      f'stroke-width="2"/><circle cx="{lx + 12}" cy="{legend_y - 4}" r="3.6" fill="{colour}"/>'
                      f'<text class="evo-legend-{key}" x="{lx + 30}" y="{legend_y}">{label}</text>')
        lx += 44 + 7 * len(label)
    if base_fitness is not None:
        legend.append(f'<line x1="{lx}" y1="{legend_y - 4}" x2="{lx + 24}" y2="{legend_y - 4}" stroke="{BASE_LINE}" '
                      f'stroke-width="1.4" stroke-dasharray="6 4"/><text class="evo-legend-base" x="{lx + 30}" '
                      f'y="{legend_y}">base ({two_places(base_fitness)})</text>')
    legend.append("</g>")
    parts.extend(legend)
    if not count:
        parts.append(f'<text x="{FIT_LEFT + plot_w / 2:.1f}" y="{FIT_TOP + plot_h / 2:.1f}" text-anchor="middle" '
                     f'font-size="13" fill="{MUTED}">no generation recorded yet</text>')
    return svg("evo-fitness", FIT_W, FIT_H,
                f"{title}: {count} generation{'s' if count != 1 else ''}", "".join(parts))


# ----------------------------------------------------------------------------------------- genealogy

# viridis, low to high: readable for colour-blind eyes and in greyscale
SCALE = ((0.0, (68, 1, 84)), (0.25, (59, 82, 139)), (0.5, (33, 145, 140)), (0.75, (94, 201, 98)),
         (1.0, (253, 231, 37)))
UNSCORED = "#d5d9dd"
MAX_ROWS = 36  # a taller generation wraps into sub-columns
ROOMY_UP_TO = 60  # versions drawn with roomy spacing; more are drawn compact
G_LEFT, G_RIGHT, G_BOTTOM = 44, 44, 20
LEGEND_H = 78  # the legend's three rows
HEAD_H = 40  # a column's name and count
EDGE = {
    "mutation": {"stroke": "#8a949e", "width": 1.0, "dash": ""},
    "crossover": {"stroke": "#8e44ad", "width": 1.0, "dash": "4 3"},
    "other": {"stroke": "#b4b9bf", "width": 1.0, "dash": "1 3"},
}
LINEAGE = INK
BASE_RING, BEST_RING = "#111111", "#d4a017"


@dataclass(frozen=True)
class Spacing:
    r: float  # node radius
    row_h: float  # a node's row
    sub_w: float  # a sub-column
    col_gap: float  # between generations: room for the edges


ROOMY = Spacing(r=8, row_h=28, sub_w=30, col_gap=110)
COMPACT = Spacing(r=6, row_h=17, sub_w=19, col_gap=64)


def fitness_colour(fitness: float | None, low: float, high: float) -> str:
    """The scale's colour of `fitness` within [low, high] (the top colour when they are equal)."""
    if fitness is None:
        return UNSCORED
    t = 1.0 if high <= low else max(0.0, min(1.0, (fitness - low) / (high - low)))
    for (t0, c0), (t1, c1) in pairwise(SCALE):
        if t <= t1:
            f = 0 if t1 == t0 else (t - t0) / (t1 - t0)
            return "#" + "".join(f"{round(a + (b - a) * f):02x}" for a, b in zip(c0, c1, strict=True))
    return "#" + "".join(f"{c:02x}" for c in SCALE[-1][1])


@dataclass
class Placed:
    node: dict
    column: int
    x: float = 0.0
    y: float = 0.0
    parents: list = field(default_factory=list)


@dataclass
class Genealogy:
    placed: dict  # id -> Placed
    columns: dict  # column -> (x, width, count)
    width: float
    height: float
    top: float  # y of the first row
    spacing: Spacing


def _shape(kind: str, x: float, y: float, r: float, fill: str, stroke: str, width: float, dash: str = "") -> str:
    dash = f' stroke-dasharray="{dash}"' if dash else ""
    common = f'fill="{fill}" stroke="{stroke}" stroke-width="{width}"{dash}'
    if kind == "crossover":
        d = r + 1.5
        return (f'<path d="M{x:.1f},{y - d:.1f} L{x + d:.1f},{y:.1f} L{x:.1f},{y + d:.1f} L{x - d:.1f},{y:.1f} Z" '
                f'{common}/>')
    if kind == "immigrant":
        return (f'<rect x="{x - r + 0.5:.1f}" y="{y - r + 0.5:.1f}" width="{2 * r - 1:.0f}" height="{2 * r - 1:.0f}" '
                f'{common}/>')
    return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r:.0f}" {common}/>'


def _column_label(column: int) -> str:
    return f"generation {column}" if column >= 0 else "earlier"


def genealogy_layout(nodes: list[dict]) -> Genealogy:
    """Where each of `nodes` (see genealogy_svg) goes: columns by generation, rows by parents' height."""
    spacing = ROOMY if len(nodes) <= ROOMY_UP_TO else COMPACT
    top = LEGEND_H + HEAD_H + spacing.r + 6  # room above the first row for a base or best label
    placed = {node["id"]: Placed(node, int(node["column"])) for node in nodes}
    for item in placed.values():
        item.parents = [p for p in dict.fromkeys(item.node.get("parents") or [])
                        if p in placed and p != item.node["id"]]
    columns: dict[int, list[Placed]] = {}
    for item in placed.values():
        columns.setdefault(item.column, []).append(item)
    geometry: dict[int, tuple[float, float, int]] = {}
    x, tallest = float(G_LEFT), 1
    for column in sorted(columns):
        members = columns[column]

        def order(item: Placed, column=column) -> tuple:
            earlier = [placed[p].y for p in item.parents if placed[p].column < column]
            fitness = item.node.get("fitness")
            return (not item.node.get("base"), sum(earlier) / len(earlier) if earlier else math.inf,
                    -(fitness if fitness is not None else -math.inf), item.node["id"])

        members.sort(key=order)
        subs = max(1, math.ceil(len(members) / MAX_ROWS))
        rows = math.ceil(len(members) / subs)
        tallest = max(tallest, rows)
        for index, item in enumerate(members):  # row by row, so the order reads top to bottom
            row, sub = divmod(index, subs)
            item.x = x + spacing.sub_w * sub + spacing.sub_w / 2
            item.y = top + spacing.row_h * row + spacing.row_h / 2
        width = spacing.sub_w * subs
        geometry[column] = (x, width, len(members))
        x += width + spacing.col_gap
    width = max(x - spacing.col_gap + G_RIGHT, 640.0)
    height = top + spacing.row_h * tallest + G_BOTTOM
    return Genealogy(placed, geometry, width, height, top, spacing)


def _lineage(placed: dict, best) -> set:
    """The best version and its ancestors in the drawing."""
    seen, stack = set(), [best] if best in placed else []
    while stack:
        key = stack.pop()
        if key in seen:
            continue
        seen.add(key)
        stack.extend(placed[key].parents)
    return seen


def _edge_path(parent: Placed, child: Placed, r: float) -> str:
    if parent.column < child.column:
        a, b = (parent.x + r, parent.y), (child.x - r, child.y)
        bend = (b[0] - a[0]) / 2
        return (f"M{a[0]:.1f},{a[1]:.1f} C{a[0] + bend:.1f},{a[1]:.1f} {b[0] - bend:.1f},{b[1]:.1f} "
                f"{b[0]:.1f},{b[1]:.1f}")
    # the same column (a version bred from one of its own generation): a loop out to the right
    a, b = (parent.x + r, parent.y), (child.x + r, child.y)
    reach = max(a[0], b[0]) + 18 + min(abs(b[1] - a[1]) / 4, 30)
    return f"M{a[0]:.1f},{a[1]:.1f} C{reach:.1f},{a[1]:.1f} {reach:.1f},{b[1]:.1f} {b[0]:.1f},{b[1]:.1f}"


def _legend(low: float | None, high: float | None) -> str:
    """Three rows: the fitness scale and the markers; the shapes; the edges."""
    parts = [f'<g class="evo-legend" font-size="11" fill="{AXIS}">', f'<text x="{G_LEFT}" y="18" font-weight="bold">'
             'fitness</text>']
    x = G_LEFT + 50
    if low is None:
        parts.append(f'<text x="{x}" y="18" fill="{MUTED}">no version scored yet</text>')
        x += 150
    else:
        parts.append(f'<text class="evo-scale-low" x="{x + 34}" y="18" text-anchor="end">{two_places(low)}</text>'
                     f'<rect class="evo-scale" x="{x + 40}" y="7" width="150" height="14" '
                     f'fill="url(#evo-fitness-scale)" stroke="{GRID}"/>'
                     f'<text class="evo-scale-high" x="{x + 196}" y="18">{two_places(high)}</text>')
        x += 250
    parts.append(_shape("mutation", x, 14, 6, UNSCORED, OUTLINE, 1, "2 2")
                 + f'<text x="{x + 11}" y="18">not scored in this run</text>')
    x += 150
    parts.append(f'<circle cx="{x}" cy="14" r="8" fill="none" stroke="{BASE_RING}" stroke-width="2.2"/>'
                 f'<text x="{x + 13}" y="18">base</text>')
    x += 52
    parts.append(f'<circle cx="{x}" cy="14" r="8" fill="none" stroke="{BEST_RING}" stroke-width="3"/>'
                 f'<text x="{x + 13}" y="18">best</text>')
    x = G_LEFT
    for kind, label in (("mutation", "mutation or initial"), ("crossover", "crossover"), ("immigrant", "immigrant")):
        parts.append(_shape(kind, x + 6, 40, 6, "#ffffff", OUTLINE, 1.2)
                     + f'<text x="{x + 17}" y="44">{label}</text>')
        x += 34 + 6.5 * len(label)
    x = G_LEFT
    for kind, label in (("mutation", "parent → child"), ("crossover", "crossover parents → child")):
        style = EDGE[kind]
        dash = f' stroke-dasharray="{style["dash"]}"' if style["dash"] else ""
        parts.append(f'<line x1="{x}" y1="62" x2="{x + 26}" y2="62" stroke="{style["stroke"]}" stroke-width="1.4"'
                     f'{dash}/><text x="{x + 32}" y="66">{label}</text>')
        x += 46 + 6.5 * len(label)
    parts.append(f'<line x1="{x}" y1="62" x2="{x + 26}" y2="62" stroke="{LINEAGE}" stroke-width="2.4"/>'
                 f'<text x="{x + 32}" y="66">the best version\'s descent</text>')
    parts.append("</g>")
    return "".join(parts)


def genealogy_svg(nodes: list[dict], *, title: str = "Genealogy") -> SafeString:
    """The genealogy of `nodes`: [{"id", "column" (generation, < 0 for earlier ancestors), "label", "url",
    "fitness" (None: not scored in this run), "kind", "note", "operation", "parents" (ids), "base",
    "best"}]. Parents that are not among the nodes draw no edge; an immigrant draws none."""
    plan = genealogy_layout(nodes)
    placed, r = plan.placed, plan.spacing.r
    scored = [item.node["fitness"] for item in placed.values() if item.node.get("fitness") is not None]
    low, high = (min(scored), max(scored)) if scored else (None, None)
    best = next((key for key, item in placed.items() if item.node.get("best")), None)
    lineage = _lineage(placed, best)

    defs = ['<defs><linearGradient id="evo-fitness-scale" x1="0" x2="1" y1="0" y2="0">']
    defs += [f'<stop offset="{t:.2f}" stop-color="#{red:02x}{green:02x}{blue:02x}"/>'
             for t, (red, green, blue) in SCALE]
    defs.append("</linearGradient></defs>")

    heads = [f'<g class="evo-columns" font-size="11" fill="{AXIS}">']
    head_y = plan.top - HEAD_H
    for column, (x, col_w, count) in sorted(plan.columns.items()):
        heads.append(f'<g class="evo-column" data-column="{column}"><rect x="{x - 4:.1f}" y="{head_y}" '
                     f'width="{col_w + 8:.1f}" height="{plan.height - head_y - G_BOTTOM / 2:.1f}" rx="4" '
                     f'fill="{"#f6f7f8" if column >= 0 else "#fbfbfb"}"/>'
                     f'<text x="{x + col_w / 2:.1f}" y="{head_y + 14}" text-anchor="middle" font-weight="bold">'
                     f'{"gen " + str(column) if column >= 0 else "earlier"}</text>'
                     f'<text x="{x + col_w / 2:.1f}" y="{head_y + 27}" text-anchor="middle" fill="{MUTED}" '
                     f'font-size="10">{count}</text></g>')
    heads.append("</g>")

    plain, strong = [], []
    for key, child in placed.items():
        operation = child.node.get("operation") or ""
        if operation == "immigrant":
            continue
        style = EDGE.get(operation, EDGE["other"])
        for parent_key in child.parents:
            parent = placed[parent_key]
            on_line = key in lineage and parent_key in lineage
            title_text = f"{parent.node.get('label', parent_key)} → {child.node.get('label', key)} ({operation or '?'})"
            dash = f' stroke-dasharray="{style["dash"]}"' if style["dash"] else ""
            stroke, width = (LINEAGE, 2.4) if on_line else (style["stroke"], style["width"])
            classes = f"evo-edge evo-edge-{escape(operation or 'other')}" + (" evo-edge-lineage" if on_line else "")
            path = (f'<path class="{classes}" data-from="{escape(parent_key)}" data-to="{escape(key)}" '
                    f'd="{_edge_path(parent, child, r)}" fill="none" stroke="{stroke}" stroke-width="{width}"{dash} '
                    f'stroke-opacity="{0.95 if on_line else 0.55}"><title>{escape(title_text)}</title></path>')
            (strong if on_line else plain).append(path)

    marks, shapes = [], []
    labelled: list[tuple[float, float]] = []
    for key, item in sorted(placed.items(), key=lambda kv: (kv[1].column, kv[1].y, kv[1].x)):
        node = item.node
        fitness = node.get("fitness")
        operation = node.get("operation") or ""
        shape_kind = operation if operation in ("crossover", "immigrant") else "mutation"
        colour = fitness_colour(fitness, low if low is not None else 0, high if high is not None else 0)
        classes = ["evo-node", f"evo-node-{escape(operation or 'other')}"]
        classes += ["evo-node-base"] * bool(node.get("base")) + ["evo-node-best"] * bool(node.get("best"))
        classes += ["evo-node-lineage"] * (key in lineage) + ["evo-node-unscored"] * (fitness is None)
        lines = [f"{node.get('label', key)} · {_column_label(item.column)} · {operation or '?'}"
                 + (" · base version" if node.get("base") else "") + (" · best version" if node.get("best") else ""),
                 f"kind: {node.get('kind') or '-'}",
                 f"fitness: {two_places(fitness)}" + ("" if fitness is not None else " (not scored in this run)")]
        if node.get("note"):
            lines.append(f"note: {clip(node['note'], 200)}")
        ring = ""
        if node.get("base"):
            ring += (f'<circle cx="{item.x:.1f}" cy="{item.y:.1f}" r="{r + 3:.0f}" fill="none" stroke="{BASE_RING}" '
                     f'stroke-width="2.2"/>')
        if node.get("best"):
            ring += (f'<circle cx="{item.x:.1f}" cy="{item.y:.1f}" r="{r + 3 + 3 * bool(node.get("base")):.0f}" '
                     f'fill="none" stroke="{BEST_RING}" stroke-width="3"/>')
        stroke = INK if key in lineage else OUTLINE
        shapes.append(
            f'<a class="{" ".join(classes)}" href="{escape(node.get("url") or "")}" data-version="{escape(key)}" '
            f'data-column="{item.column}" data-fitness="{"" if fitness is None else f"{fitness:.4f}"}">'
            f'<title>{escape(chr(10).join(lines))}</title>{ring}'
            f'{_shape(shape_kind, item.x, item.y, r, colour, stroke, 1.2, "" if fitness is not None else "2 2")}</a>')
        for flag in ("base", "best"):
            if not node.get(flag):
                continue
            y = item.y - r - 6
            if any(abs(y - seen_y) < 12 and abs(item.x - seen_x) < 34 for seen_x, seen_y in labelled):
                y = item.y + r + 15  # the base's label sits above a best next to it: this one goes below
            labelled.append((item.x, y))
            marks.append(f'<text class="evo-mark evo-mark-{flag}" x="{item.x:.1f}" y="{y:.1f}" text-anchor="middle" '
                         f'font-size="10" font-weight="bold" fill="{"#111" if flag == "base" else "#8a6500"}" '
                         f'paint-order="stroke" stroke="#fff" stroke-width="3">{flag}</text>')

    body = (_legend(low, high) + "".join(heads) + f'<g class="evo-edges">{"".join(plain)}</g>'
            f'<g class="evo-edges evo-lineage">{"".join(strong)}</g><g class="evo-nodes">{"".join(shapes)}</g>'
            f'<g class="evo-marks">{"".join(marks)}</g>')
    generations = sum(1 for column in plan.columns if column >= 0)
    summary = (f"{title}: {len(placed)} version{'s' if len(placed) != 1 else ''} over {generations} "
               f"generation{'s' if generations != 1 else ''}")
    return svg("evo-genealogy", plan.width, plan.height, summary, body, "".join(defs))

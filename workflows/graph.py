"""A workflow version's graph drawn as inline SVG on the server (no JavaScript, no CDN).

The layout is deterministic (the same DSL always gives the same drawing) and layered:

- Layers start as BFS distances from the entry node over the hand-offs; then every edge that does
  not close a cycle (hand-offs and waitFor alike) is made to point down by pushing its target below
  its source (a longest-path pass over the acyclic part), so a node that waits for another sits
  under it. A node the entry never reaches starts on the first layer, drawn dashed.
- Edges that close a cycle (found by a depth-first walk from the entry, in DSL order) are back
  edges: they leave a node's right side and climb a lane to the right of the graph. A node that
  hands off to itself gets a small loop.
- Within a layer, nodes are ordered by the mean position of the nodes pointing at them (one
  downward barycenter pass, ties in DSL order), which removes most crossings of small graphs.
- The terminal `end` sits alone under the last layer; a node with no hand-offs ends its branch and
  gets a thin grey edge to it.

Edge styles: sequential solid, parallel a blue double line, conditional dashed orange with a
"choice" label, waitFor dotted grey. Every piece of text (node ids, models, tool names, prompts) is
user input and is escaped; node ids never become element ids.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from itertools import pairwise

from django.utils.html import escape
from django.utils.safestring import SafeString

from config.svg import AXIS, GREY, INK, OUTLINE, SLATE, clip, svg
from workflows.dsl import END

BOX_W, BOX_H = 210, 66
END_W, END_H = 84, 30
H_GAP, V_GAP = 34, 74
MARGIN, TOP = 24, 40
LANE_GAP = 14
VIA_W = 16  # the width a long edge takes in each layer it crosses
LEGEND_H = 44

STYLE = {
    "sequential": {"stroke": AXIS, "width": 1.6, "dash": "", "marker": "wfg-arrow"},
    "parallel": {"stroke": "#2b7bb9", "width": 5, "dash": "", "marker": "wfg-arrow-parallel"},
    "conditional": {"stroke": "#c26a00", "width": 1.6, "dash": "7 5", "marker": "wfg-arrow-conditional"},
    "waitfor": {"stroke": SLATE, "width": 1.4, "dash": "2 4", "marker": "wfg-arrow-waitfor"},
    "implicit": {"stroke": "#b4b9bf", "width": 1.2, "dash": "", "marker": "wfg-arrow-waitfor"},
}


@dataclass
class Box:
    key: object  # a node id, END, or ("via", edge number, layer): where a long edge crosses a layer
    index: tuple  # tie-breaker: DSL position (END last; a waypoint right after its source)
    layer: int = 0
    x: float = 0
    y: float = 0
    w: float = BOX_W
    h: float = BOX_H
    reachable: bool = True

    @property
    def cx(self) -> float:
        return self.x + self.w / 2


@dataclass
class Edge:
    source: str
    target: str
    kind: str  # sequential | parallel | conditional | waitfor | implicit
    back: bool = False
    via: list = field(default_factory=list)  # waypoint keys, one per layer a long forward edge crosses
    path: str = ""
    label_at: tuple[float, float] = (0.0, 0.0)


@dataclass
class Layout:
    boxes: dict
    edges: list[Edge]
    layers: list[list]  # keys per layer, left to right (waypoints included)
    width: float
    height: float
    entry: str

    def node_layers(self) -> list[list[str]]:
        """The nodes (and `end`) of each layer, left to right, without the waypoints."""
        return [[key for key in row if isinstance(key, str)] for row in self.layers]


def name_list(value) -> list[str]:
    return [item for item in value if isinstance(item, str)] if isinstance(value, list) else []


def dsl_nodes(dsl: dict) -> list[dict]:
    """The DSL's nodes with a usable id, the first of each id (a stored DSL is validated; the drawing
    still never fails on a malformed one)."""
    seen: set[str] = set()
    nodes = []
    for node in dsl.get("nodes") or []:
        if isinstance(node, dict) and isinstance(node.get("nodeId"), str) and node["nodeId"] not in ("", END) \
                and node["nodeId"] not in seen:
            seen.add(node["nodeId"])
            nodes.append(node)
    return nodes


def _edges(nodes: list[dict], ids: set[str]) -> list[Edge]:
    edges: list[Edge] = []
    for node in nodes:
        kind = node.get("handOffType")
        kind = kind if kind in ("sequential", "parallel", "conditional") else "sequential"
        targets: list[str] = []
        for target in name_list(node.get("handOffs")):
            if (target == END or target in ids) and target not in targets:
                targets.append(target)
                edges.append(Edge(node["nodeId"], target, kind))
        if not targets:
            edges.append(Edge(node["nodeId"], END, "implicit"))
    for node in nodes:
        for source in dict.fromkeys(name_list(node.get("waitFor"))):
            if source in ids and source != node["nodeId"]:
                edges.append(Edge(source, node["nodeId"], "waitfor"))
    return edges


def _mark_back_edges(order: list[str], entry: str, edges: list[Edge]) -> None:
    """Depth-first from the entry (then from every node it missed, in DSL order): an edge into a node
    still on the walk's stack closes a cycle."""
    out: dict[str, list[Edge]] = {key: [] for key in order}
    for edge in edges:
        if edge.target != END:
            out[edge.source].append(edge)
    state = dict.fromkeys(order, 0)  # 0 unseen, 1 on the stack, 2 done
    for root in [entry, *order]:
        if state[root]:
            continue
        state[root] = 1
        stack = [(root, iter(out[root]))]
        while stack:
            key, pending = stack[-1]
            edge = next(pending, None)
            if edge is None:
                state[key] = 2
                stack.pop()
            elif state[edge.target] == 1:
                edge.back = True
            elif state[edge.target] == 0:
                state[edge.target] = 1
                stack.append((edge.target, iter(out[edge.target])))


def _assign_layers(order: list[str], entry: str, edges: list[Edge], boxes: dict) -> int:
    """BFS distances over the hand-offs, then every forward edge made to point down; returns the
    number of layers."""
    distance = {entry: 0}
    queue = deque([entry])
    while queue:
        key = queue.popleft()
        for edge in edges:
            if edge.source == key and edge.kind != "waitfor" and edge.target != END and edge.target not in distance:
                distance[edge.target] = distance[key] + 1
                queue.append(edge.target)
    for key in order:
        boxes[key].reachable = key in distance
        boxes[key].layer = distance.get(key, 0)
    forward = [edge for edge in edges if not edge.back and edge.target != END]
    for _ in range(len(order)):  # longest paths over a DAG settle within as many rounds as it has nodes
        moved = False
        for edge in forward:
            if boxes[edge.target].layer <= boxes[edge.source].layer:
                boxes[edge.target].layer = boxes[edge.source].layer + 1
                moved = True
        if not moved:
            break
    renumber = {layer: index for index, layer in enumerate(sorted({boxes[key].layer for key in order}))}
    for key in order:
        boxes[key].layer = renumber[boxes[key].layer]
    return len(renumber)


def _barycenter(key, layer: int, boxes: dict, predecessors: dict) -> tuple:
    placed = [boxes[source].cx for source in predecessors[key] if boxes[source].layer < layer]
    return (sum(placed) / len(placed) if placed else float("inf"), boxes[key].index)


def _curve(a: tuple[float, float], b: tuple[float, float]) -> str:
    bend = (b[1] - a[1]) / 2
    return f"C{a[0]:.1f},{a[1] + bend:.1f} {b[0]:.1f},{b[1] - bend:.1f} {b[0]:.1f},{b[1]:.1f}"


def _rounded(points: list[tuple[float, float]], radius: float = 7) -> str:
    """An orthogonal polyline with rounded corners."""
    d = [f"M{points[0][0]:.1f},{points[0][1]:.1f}"]
    for previous, corner, following in zip(points, points[1:], points[2:], strict=False):
        ends = []
        for point in (previous, following):
            dx, dy = point[0] - corner[0], point[1] - corner[1]
            length = max(abs(dx) + abs(dy), 1e-9)
            r = min(radius, length / 2)
            ends.append((corner[0] + dx / length * r, corner[1] + dy / length * r))
        (ax, ay), (bx, by) = ends
        d.append(f"L{ax:.1f},{ay:.1f} Q{corner[0]:.1f},{corner[1]:.1f} {bx:.1f},{by:.1f}")
    d.append(f"L{points[-1][0]:.1f},{points[-1][1]:.1f}")
    return " ".join(d)


def layout(dsl: dict) -> Layout:
    """Place a DSL's nodes, its `end` and its edges (see the module docstring)."""
    nodes = dsl_nodes(dsl)
    order = [node["nodeId"] for node in nodes]
    if not order:
        return Layout(boxes={}, edges=[], layers=[], width=640, height=TOP + LEGEND_H, entry="")
    entry = dsl.get("entryNodeId") if dsl.get("entryNodeId") in order else order[0]
    boxes: dict = {key: Box(key, (index, -1)) for index, key in enumerate(order)}
    edges = _edges(nodes, set(order))
    _mark_back_edges(order, entry, edges)
    layer_count = _assign_layers(order, entry, edges, boxes)
    if any(edge.target == END for edge in edges):
        boxes[END] = Box(END, (len(order), -1), layer=layer_count, w=END_W, h=END_H)
        layer_count += 1

    # a long forward edge gets a waypoint in every layer it crosses: it runs between boxes, not under them
    predecessors: dict = {key: [] for key in boxes}
    for number, edge in enumerate(edges):
        if edge.back:
            continue
        for layer in range(boxes[edge.source].layer + 1, boxes[edge.target].layer):
            key = ("via", number, layer)
            boxes[key] = Box(key, (boxes[edge.source].index[0], number), layer=layer, w=VIA_W)
            predecessors[key] = []
            edge.via.append(key)
        hops = [edge.source, *edge.via, edge.target]
        for a, b in pairwise(hops):
            predecessors[b].append(a)

    rows: list[list] = [[] for _ in range(layer_count)]
    for key, box in boxes.items():
        rows[box.layer].append(key)
    content_w = max(sum(boxes[key].w for key in row) + H_GAP * (len(row) - 1) for row in rows)
    for layer, row in enumerate(rows):
        if layer == 0:
            row.sort(key=lambda key: (key != entry, boxes[key].index))
        else:
            row.sort(key=lambda key, layer=layer: _barycenter(key, layer, boxes, predecessors))
        x = MARGIN + (content_w - sum(boxes[key].w for key in row) - H_GAP * (len(row) - 1)) / 2
        y = TOP + layer * (BOX_H + V_GAP)
        for key in row:
            box = boxes[key]
            box.x, box.y = x, (y + (BOX_H - box.h) / 2 if key == END else y)
            x += box.w + H_GAP

    # ports: a box spreads its edges along its bottom (out) and its top (in), in the order of their
    # other ends, edges closing a cycle rightmost; a waypoint passes straight through
    outgoing: dict = {key: [] for key in boxes}
    incoming: dict = {key: [] for key in boxes}
    for number, edge in enumerate(edges):
        if edge.source != edge.target:
            hops = [edge.source, *edge.via, edge.target]
            outgoing[edge.source].append((edge.back, boxes[hops[1]].cx, boxes[hops[1]].index, number))
            incoming[edge.target].append((edge.back, boxes[hops[-2]].cx, boxes[hops[-2]].index, number))
    out_x: dict[int, float] = {}
    in_x: dict[int, float] = {}
    for ports, sides in ((out_x, outgoing), (in_x, incoming)):
        for key, items in sides.items():
            items.sort()
            for position, item in enumerate(items):
                ports[item[3]] = boxes[key].x + boxes[key].w * (position + 1) / (len(items) + 1)

    right = MARGIN + content_w
    back = [number for number, edge in enumerate(edges) if edge.back and edge.source != edge.target]
    for number, edge in enumerate(edges):
        source, target = boxes[edge.source], boxes[edge.target]
        if edge.source == edge.target:
            x, y1, y2 = source.x + source.w, source.y + source.h * 0.3, source.y + source.h * 0.7
            edge.path = (f"M{x:.1f},{y1:.1f} C{x + 38:.1f},{y1 - 14:.1f} {x + 38:.1f},{y2 + 14:.1f} "
                         f"{x + 2:.1f},{y2:.1f}")
            edge.label_at = (x + 30, (y1 + y2) / 2)
        elif edge.back:
            lane = back.index(number)
            lane_x = right + LANE_GAP * (lane + 1)
            step = 12 + (lane % 4) * 5
            start, end = (out_x[number], source.y + source.h), (in_x[number], target.y - 1)
            edge.path = _rounded([start, (start[0], start[1] + step), (lane_x, start[1] + step),
                                  (lane_x, end[1] - step), (end[0], end[1] - step), end])
            edge.label_at = (lane_x, (start[1] + end[1]) / 2)
        else:
            points = [(out_x[number], source.y + source.h)]
            for key in edge.via:
                points += [(boxes[key].cx, boxes[key].y), (boxes[key].cx, boxes[key].y + boxes[key].h)]
            points.append((in_x[number], target.y - 1))
            d = [f"M{points[0][0]:.1f},{points[0][1]:.1f}"]
            for step, (a, b) in enumerate(pairwise(points)):
                d.append(_curve(a, b) if step % 2 == 0 else f"L{b[0]:.1f},{b[1]:.1f}")
            edge.path = " ".join(d)
            (ax, ay), (bx, by) = points[0], points[1]
            edge.label_at = ((ax + bx) / 2, (ay + by) / 2)

    lanes_w = LANE_GAP * (len(back) + 1) if back else 0
    loop_w = 44 if any(edge.source == edge.target for edge in edges) else 0
    width = max(2 * MARGIN + content_w + max(lanes_w, loop_w), 640)
    height = TOP + layer_count * (BOX_H + V_GAP) - V_GAP + MARGIN + LEGEND_H
    return Layout(boxes=boxes, edges=edges, layers=rows, width=width, height=height, entry=entry)


def _markers() -> str:
    parts = []
    for kind, style in STYLE.items():
        if kind == "implicit":
            continue
        parts.append(
            f'<marker id="{style["marker"]}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="9" '
            f'markerHeight="9" markerUnits="userSpaceOnUse" orient="auto-start-reverse">'
            f'<path d="M0,0 L10,5 L0,10 z" fill="{style["stroke"]}"/></marker>')
    return "<defs>" + "".join(parts) + "</defs>"


def _edge_svg(edge: Edge, label_out: list[str]) -> str:
    style = STYLE[edge.kind]
    d, (mx, my) = edge.path, edge.label_at
    direction = "back" if edge.back else "forward"
    title = escape(f"{edge.source} → {edge.target} ({'waitFor' if edge.kind == 'waitfor' else edge.kind}"
                   f"{', closes a cycle' if edge.back else ''})")
    dash = f' stroke-dasharray="{style["dash"]}"' if style["dash"] else ""
    parts = [f'<g class="wfg-edge-group">'
             f'<path class="edge edge-{edge.kind} edge-{direction}" data-from="{escape(edge.source)}" '
             f'data-to="{escape(edge.target)}" d="{d}" fill="none" stroke="{style["stroke"]}" '
             f'stroke-width="{style["width"]}"{dash} marker-end="url(#{style["marker"]})"><title>{title}</title>'
             f'</path>']
    if edge.kind == "parallel":
        parts.append(f'<path class="edge-parallel-inner" d="{d}" fill="none" stroke="#ffffff" stroke-width="1.6"/>')
    parts.append("</g>")
    if edge.kind == "conditional":
        label_out.append(
            f'<g class="edge-label"><rect x="{mx - 22:.1f}" y="{my - 9:.1f}" width="44" height="16" rx="3" '
            f'fill="#fff7ec" stroke="#c26a00" stroke-width="0.8"/><text x="{mx:.1f}" y="{my + 3:.1f}" '
            f'text-anchor="middle" font-size="10" font-style="italic" fill="#8a4b00">choice</text></g>')
    return "".join(parts)


def _tools_line(node: dict, unresolved: set[str]) -> tuple[str, bool]:
    code, mcp = name_list(node.get("codeTools")), name_list(node.get("mcpTools"))
    names = [*code, *(f"mcp:{name}" for name in mcp)]
    missing = any(f"{node['nodeId']}.{name}" in unresolved for name in [*code, *mcp])
    return (", ".join(names) if names else "no tools"), missing


def _node_svg(node: dict, box: Box, *, entry: bool, unresolved: set[str]) -> str:
    node_id = node["nodeId"]
    tools, missing = _tools_line(node, unresolved)
    prompt = node.get("systemPrompt") or node.get("description") or ""
    tooltip = "\n".join(line for line in [
        node_id, f"model: {node.get('gatewayModelId') or '?'}", f"tools: {tools}",
        f"hand-offs ({node.get('handOffType') or 'sequential'}): {', '.join(node.get('handOffs') or []) or '-'}",
        f"waits for: {', '.join(node.get('waitFor') or [])}" if node.get("waitFor") else "",
        f"prompt: {clip(prompt, 300)}" if prompt else "",
    ] if line)
    classes = ["node"] + (["node-entry"] if entry else []) + ([] if box.reachable else ["node-unreachable"])
    stroke, width = ("#1d7a3a", 2.6) if entry else (OUTLINE, 1.2)
    dash = ' stroke-dasharray="5 4"' if not box.reachable else ""
    x, y = box.x, box.y
    parts = [
        f'<g class="{" ".join(classes)}" data-node-id="{escape(node_id)}"><title>{escape(tooltip)}</title>',
        f'<rect x="{x:.1f}" y="{y:.1f}" width="{box.w}" height="{box.h}" rx="6" fill="#f8fafc" stroke="{stroke}" '
        f'stroke-width="{width}"{dash}/>',
        f'<text class="node-id" x="{x + 10:.1f}" y="{y + 19:.1f}" font-size="13" font-weight="bold" '
        f'fill="{INK}">{escape(clip(node_id, 22 if node.get("requiresApproval") else 27))}</text>',
        f'<text class="node-model" x="{x + 10:.1f}" y="{y + 37:.1f}" font-size="11" fill="{OUTLINE}">'
        f'{escape(clip(node.get("gatewayModelId") or "", 32))}</text>',
        f'<text class="node-tools" x="{x + 10:.1f}" y="{y + 55:.1f}" font-size="11" '
        f'fill="{"#ba2121" if missing else (GREY if tools == "no tools" else "#2a5d84")}">'
        f'{"⚒ " if tools != "no tools" else ""}{escape(clip(tools, 32))}</text>',
    ]
    if node.get("requiresApproval"):
        parts.append(f'<g class="node-approval"><rect x="{x + box.w - 58:.1f}" y="{y + 6:.1f}" width="52" height="16" '
                     f'rx="8" fill="#fdecea" stroke="#ba2121" stroke-width="0.8"/><text x="{x + box.w - 32:.1f}" '
                     f'y="{y + 18:.1f}" text-anchor="middle" font-size="9.5" fill="#ba2121">approval</text></g>')
    if entry:
        parts.append(f'<g class="node-start"><circle cx="{box.cx:.1f}" cy="{y - 22:.1f}" r="6" fill="#1d7a3a"/>'
                     f'<line x1="{box.cx:.1f}" y1="{y - 16:.1f}" x2="{box.cx:.1f}" y2="{y - 2:.1f}" stroke="#1d7a3a" '
                     f'stroke-width="2" marker-end="url(#wfg-arrow)"/></g>')
    parts.append("</g>")
    return "".join(parts)


def _legend(y: float) -> str:
    items = [("sequential", "sequential"), ("parallel", "parallel"), ("conditional", "conditional"),
             ("waitfor", "waits for"), ("back", "cycle (back edge)")]
    parts = [f'<g class="wfg-legend" font-size="11" fill="{AXIS}">']
    x = MARGIN
    for kind, label in items:
        style = STYLE["sequential" if kind == "back" else kind]
        dash = f' stroke-dasharray="{style["dash"]}"' if style["dash"] else ""
        if kind == "back":
            parts.append(f'<path d="M{x},{y + 6} H{x + 22} Q{x + 30},{y + 6} {x + 30},{y - 2} V{y - 6}" fill="none" '
                         f'stroke="{style["stroke"]}" stroke-width="1.4"/>')
        else:
            parts.append(f'<line x1="{x}" y1="{y}" x2="{x + 30}" y2="{y}" stroke="{style["stroke"]}" '
                         f'stroke-width="{style["width"]}"{dash}/>')
            if kind == "parallel":
                parts.append(f'<line x1="{x}" y1="{y}" x2="{x + 30}" y2="{y}" stroke="#fff" stroke-width="1.6"/>')
        parts.append(f'<text x="{x + 36}" y="{y + 4}">{label}</text>')
        x += 48 + 7 * len(label)
    parts.append("</g>")
    return "".join(parts)


def dsl_svg(dsl: dict, *, unresolved=()) -> SafeString:
    """The graph of a (stored) DSL as an inline <svg> element; `unresolved` ("node.tool" names)
    colours the tool line of the nodes that name a missing tool."""
    plan = layout(dsl)
    missing = set(unresolved)
    nodes = {node["nodeId"]: node for node in dsl_nodes(dsl)}
    labels: list[str] = []
    edges = "".join(_edge_svg(edge, labels) for edge in plan.edges)
    boxes = []
    for key in [key for row in plan.node_layers() for key in row]:
        box = plan.boxes[key]
        if key == END:
            boxes.append(
                f'<g class="node-end" data-node-id="end"><title>end: the invocation finishes</title>'
                f'<rect x="{box.x:.1f}" y="{box.y:.1f}" width="{box.w}" height="{box.h}" rx="{box.h / 2:.1f}" '
                f'fill="{INK}"/><text x="{box.cx:.1f}" y="{box.y + 19:.1f}" text-anchor="middle" font-size="12" '
                f'font-weight="bold" fill="#ffffff">end</text></g>')
        else:
            boxes.append(_node_svg(nodes[key], box, entry=key == plan.entry, unresolved=missing))
    body = (f'<g class="wfg-edges">{edges}</g><g class="wfg-nodes">{"".join(boxes)}</g>'
            f'<g class="wfg-labels">{"".join(labels)}</g>{_legend(plan.height - LEGEND_H / 2)}')
    return svg("workflow-graph", plan.width, plan.height, f"Graph of {len(nodes)} node(s), entry {plan.entry or '-'}",
               body, _markers())

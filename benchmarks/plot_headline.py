"""Draws the README's headline chart (an SVG bar chart, no plotting library) from a results file.

    python benchmarks/plot_headline.py [benchmarks/results/headline.json] [-o docs/images/headline.svg]

The results file holds the benchmark's title, machine, command and one bar per system and setting
(``{"system", "setting", "value"}``); the chart names the machine and the command under the bars, so the
picture never leaves its provenance behind.
"""

from __future__ import annotations

import argparse
import json
from html import escape
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COLORS = {"radixlang": "#d9622b"}
OTHER = "#7a8797"
BAR_H, GAP, LEFT, RIGHT, TOP = 26, 10, 250, 90, 56


def bar_rows(bars: list[dict], width: int) -> list[str]:
    top = max(b["value"] for b in bars)
    rows = []
    for i, b in enumerate(bars):
        y = TOP + i * (BAR_H + GAP)
        w = max(2.0, (width - LEFT - RIGHT) * b["value"] / top)
        label = escape(f'{b["system"]} — {b["setting"]}')
        rows.append(f'<text x="{LEFT - 10}" y="{y + 18}" text-anchor="end">{label}</text>')
        rows.append(f'<rect x="{LEFT}" y="{y}" width="{w:.1f}" height="{BAR_H}" rx="3" '
                    f'fill="{COLORS.get(b["system"], OTHER)}"/>')
        rows.append(f'<text x="{LEFT + w + 8:.1f}" y="{y + 18}">{b["value"]:g}</text>')
    return rows


def render(results: dict, width: int = 760) -> str:
    bars = results["bars"]
    if not bars:
        raise ValueError("results file has no bars")
    height = TOP + len(bars) * (BAR_H + GAP) + 56
    foot = TOP + len(bars) * (BAR_H + GAP) + 16
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="Helvetica, Arial, sans-serif" font-size="14">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="16" y="30" font-size="17" font-weight="bold">{escape(results["title"])}</text>',
        *bar_rows(bars, width),
        f'<text x="16" y="{foot}" font-size="12" fill="#555">{escape(results["machine"])}</text>',
        f'<text x="16" y="{foot + 18}" font-size="12" fill="#555" font-family="monospace">'
        f'{escape(results["command"])}</text>',
        "</svg>",
    ]
    return "\n".join(parts) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="?", default=str(ROOT / "benchmarks/results/headline.json"))
    ap.add_argument("-o", "--out", default=str(ROOT / "docs/images/headline.svg"))
    a = ap.parse_args()
    results = json.loads(Path(a.results).read_text())
    Path(a.out).write_text(render(results))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()

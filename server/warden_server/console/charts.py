"""Charts of ``audit stats``, drawn on the server as SVG: no script, no
charting library, nothing fetched by the browser.

Each chart carries a title and a description for screen readers, and the
page shows the same figures as a table beside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape

PALETTE = ("#2f6db5", "#c2562b", "#3b8f4a", "#8a4fb0", "#b58a1f", "#4a8f8f", "#a23a5f", "#666")
BAR_HEIGHT = 22
LABEL_WIDTH = 180
WIDTH = 640


@dataclass(frozen=True, slots=True)
class Bucket:
    """Counts by key over one slice of time."""

    label: str
    counts: dict[str, int]


def bars(title: str, rows: Sequence[tuple[str, int]]) -> Markup:
    """A horizontal bar per (label, count), longest first as given."""
    top = max((count for _, count in rows), default=0) or 1
    height = max(1, len(rows)) * BAR_HEIGHT + 8
    span = WIDTH - LABEL_WIDTH - 60
    parts = [_open(title, f"{len(rows)} groups", WIDTH, height)]
    for i, (label, count) in enumerate(rows):
        y = 4 + i * BAR_HEIGHT
        length = round(span * count / top)
        parts.append(
            f'<text x="{LABEL_WIDTH - 6}" y="{y + 15}" text-anchor="end">{escape(label)}</text>'
            f'<rect x="{LABEL_WIDTH}" y="{y + 3}" width="{max(length, 1)}"'
            f' height="{BAR_HEIGHT - 6}"'
            f' fill="{PALETTE[i % len(PALETTE)]}"><title>{escape(label)}: {count}</title></rect>'
            f'<text x="{LABEL_WIDTH + length + 6}" y="{y + 15}">{count}</text>'
        )
    if not rows:
        parts.append(f'<text x="{LABEL_WIDTH}" y="18">no records</text>')
    parts.append("</svg>")
    return Markup("".join(parts))  # noqa: S704 (every text in it went through escape)


def stacked_columns(title: str, buckets: Sequence[Bucket]) -> Markup:
    """One column per time bucket, stacked by key, with a legend."""
    keys = sorted({key for b in buckets for key in b.counts})
    colours = {key: PALETTE[i % len(PALETTE)] for i, key in enumerate(keys)}
    top = max((sum(b.counts.values()) for b in buckets), default=0) or 1
    plot_h, base, left = 180, 200, 40
    column = (WIDTH - left - 10) / max(1, len(buckets))
    legend_y = base + 36
    height = legend_y + 20 * ((len(keys) + 3) // 4) + 4
    parts = [_open(title, f"{len(buckets)} time slices by {len(keys)} keys", WIDTH, height)]
    parts.append(f'<text x="{left - 4}" y="{base - plot_h + 4}" text-anchor="end">{top}</text>')
    parts.append(f'<line x1="{left}" y1="{base}" x2="{WIDTH - 10}" y2="{base}" stroke="#999"/>')
    for i, bucket in enumerate(buckets):
        x = left + i * column + 3
        y = float(base)
        for key in keys:
            count = bucket.counts.get(key, 0)
            if not count:
                continue
            h = plot_h * count / top
            y -= h
            parts.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{column - 6:.1f}" height="{h:.1f}"'
                f' fill="{colours[key]}"><title>{escape(bucket.label)} {escape(key)}: {count}'
                "</title></rect>"
            )
        parts.append(
            f'<text x="{x + (column - 6) / 2:.1f}" y="{base + 16}" text-anchor="middle"'
            f' class="tick">{escape(bucket.label)}</text>'
        )
    for i, key in enumerate(keys):
        lx, ly = left + (i % 4) * 150, legend_y + 20 * (i // 4)
        parts.append(
            f'<rect x="{lx}" y="{ly - 11}" width="12" height="12" fill="{colours[key]}"/>'
            f'<text x="{lx + 16}" y="{ly}">{escape(key)}</text>'
        )
    parts.append("</svg>")
    return Markup("".join(parts))  # noqa: S704 (every text in it went through escape)


def _open(title: str, description: str, width: int, height: int) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" role="img" class="chart" '
        f'viewBox="0 0 {width} {height}" width="{width}" height="{height}">'
        f"<title>{escape(title)}</title><desc>{escape(description)}</desc>"
    )

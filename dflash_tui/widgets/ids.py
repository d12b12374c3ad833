"""Model ids that read well in a narrow column: never broken in the middle of a word."""

from __future__ import annotations


def middle_ellipsis(text: str, width: int) -> str:
    """`text` cut to `width` cells, keeping its start and end (where sizes and variants are)."""
    if len(text) <= width:
        return text
    if width <= 1:
        return "…"[:width]
    head = (width - 1) // 2
    tail = width - 1 - head
    return text[:head] + "…" + (text[-tail:] if tail else "")


def fit_id(model_id: str, width: int) -> str:
    """A Hub id or path in `width` cells: whole if it fits, else "…/name" without the org (the
    name is what tells models apart), else the name with an ellipsis in the middle; a cut is
    always shown (a name that just fits, its org gone, loses its first letter to "…")."""
    if len(model_id) <= width:
        return model_id
    org, _, name = model_id.rstrip("/").rpartition("/")
    if org and len(name) + 2 <= width:
        return "…/" + name
    if org and len(name) <= width:
        return "…" + name[len(name) - width + 1:]
    return middle_ellipsis(name or model_id, width)


def split_id(model_id: str) -> tuple[str, str]:
    """("org/", "name") for a Hub id; ("", id) when there is no org."""
    org, sep, name = model_id.rstrip("/").rpartition("/")
    return (org + sep, name) if org else ("", model_id)

"""Saving a figure the way every report figure is saved (matplotlib Figure objects, no pyplot state): the study's
plots and `mtp diagnose`'s share it."""

from __future__ import annotations

from pathlib import Path

from bebop.fileio import atomic_write

DPI = 110


def finish_figure(fig, ax, title: str, path: Path) -> Path:
    """Title, grid and legend of a single-axes figure, then save it."""
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def save_figure(fig, path: Path) -> Path:
    """A PNG written atomically (the parent directory made)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=DPI))
    return path

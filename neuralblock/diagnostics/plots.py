"""PNG plots of marginal-error traces (matplotlib, headless).

Example:
    >>> import tempfile, pathlib
    >>> trace = {"sweeps": [1, 10], "seconds": [0.01, 0.1], "errors": [0.3, 0.1]}
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "err.png"
    >>> plot_error_traces({"Gibbs": [trace]}, path, title="demo")
    >>> path.exists()
    True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib
from matplotlib.figure import Figure

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

__all__ = ["plot_error_traces", "save_figure"]


def plot_error_traces(
    traces: Mapping[str, Sequence[Mapping[str, Sequence[float]]]],
    path: str | Path,
    title: str = "",
    reference: float | None = None,
    time_label: str = "wall time (s)",
) -> None:
    """Plot mean marginal error vs time and vs sweeps, one colour per sampler.

    Args:
        traces: sampler label -> list of runs, each a dict with ``sweeps``, ``seconds``, ``errors``.
        path: where to write the PNG.
        title: figure title.
        reference: optional horizontal line (e.g. a target error).
        time_label: the label of the time axis (e.g. ``"CPU time (s)"``).
    """
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (label, runs) in enumerate(traces.items()):
        for j, run in enumerate(runs):
            kwargs = {"color": colors[i % len(colors)], "alpha": 0.8, "label": label if j == 0 else None}
            axes[0].loglog(run["seconds"], run["errors"], **kwargs)
            axes[1].loglog(run["sweeps"], run["errors"], **kwargs)
    for ax, xlabel in zip(axes, [time_label, "sweeps"]):
        ax.set_xlabel(xlabel)
        ax.set_ylabel("mean |marginal error|")
        ax.grid(True, which="both", alpha=0.3)
        if reference is not None:
            ax.axhline(reference, color="grey", linestyle="--", linewidth=1)
        ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def save_figure(fig: Figure, path: str | Path, dpi: int) -> None:
    """Lay out ``fig`` (``tight_layout``), write it to ``path`` at ``dpi`` and close it.

    The last three lines of every study's plot.

    Example:
        >>> import tempfile, pathlib
        >>> fig, ax = plt.subplots()
        >>> _ = ax.plot([0, 1], [1, 0])
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "fig.png"
        >>> save_figure(fig, path, dpi=50)
        >>> path.exists(), plt.fignum_exists(fig.number)
        (True, False)
    """
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)

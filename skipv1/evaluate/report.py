"""Presenting an eval result: a rich table, a JSON file, a PNG chart."""

import json
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from ..errors import SkipV1Error


def _num(value, fmt: str = ",.0f") -> str:
    return "-" if value is None else format(value, fmt)


def _ratio(entry: dict, key: str) -> str:
    ratio = entry.get("vs_first", {}).get(key)
    return "" if ratio is None else f" ({ratio:.3f}x)"


def results_table(result: dict) -> Table:
    """One column per model (they are few), one row per measure: fits a terminal."""
    settings, models = result["settings"], result["models"]
    title = (
        f"skipv1 eval ({settings['device']}, {settings['dtype']}): perplexity ctx "
        f"{settings['ctx']} stride {settings['stride']}; speed batch {settings['batch']} x "
        f"{settings['prompt_len']} prompt + {settings['new_tokens']} new tokens"
    )
    caption = "(x: ratio to the first model)  " + "  ".join(
        f"\\[{i}] {escape(m['path'])}" for i, m in enumerate(models, 1)
    )
    table = Table(title=title, caption=caption)
    table.add_column("")
    for i, label in enumerate(_labels(models), 1):
        table.add_column(f"\\[{i}] {escape(label)}", justify="right")
    budget = f"{settings['kv_budget'] / 2**30:.3g} GiB"
    rows = [
        ("parameters", "params", ",.0f"),
        ("perplexity", "perplexity", ".3f"),
        ("scored tokens", "eval_tokens", ",.0f"),
        ("KV bytes/token, measured", "kv_bytes_per_token", ",.0f"),
        ("KV bytes/token, formula", "kv_bytes_per_token_formula", ",.0f"),
        ("prefill tokens/s", "prefill_tokens_per_s", ",.1f"),
        ("decode tokens/s", "decode_tokens_per_s", ",.1f"),
        (f"max batch, {settings['context_len']} tok in {budget}", "max_batch_at_budget", ",.0f"),
    ]
    for name, key, fmt in rows:
        cells = []
        for i, m in enumerate(models):
            cell = _num(m.get(key), fmt) + (_ratio(m, key) if i else "")
            if key == "kv_bytes_per_token_formula" and not m["kv_matches_formula"]:
                cell += " [red]MISMATCH[/]"
            cells.append(cell)
        table.add_row(name, *cells)
    return table


def lm_eval_table(result: dict) -> Table | None:
    rows = [(m["path"], task, metric, value) for m in result["models"]
            for task, metrics in m.get("lm_eval", {}).items()
            for metric, value in metrics.items()]  # fmt: skip
    if not rows:
        return None
    table = Table(title="lm-evaluation-harness")
    for header in ("model", "task", "metric", "value"):
        table.add_column(header, justify="right" if header == "value" else "left")
    for path, task, metric, value in rows:
        table.add_row(escape(path), escape(task), escape(metric), f"{value:.4f}")
    return table


def write_json(result: dict, path: "str | Path") -> None:
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2) + "\n")
    except OSError as err:
        raise SkipV1Error(f"cannot write --json {path}: {err.strerror or err}") from None


def _labels(models: list[dict], sep: str = " ") -> list[str]:
    """Short names: the directory name, with s where it is a SkipV1 checkpoint."""
    names = [Path(m["path"]).name or m["path"] for m in models]
    return [
        f"{n}{sep}(s={m['skip_v_heads']})" if m["skip_v_heads"] else n
        for n, m in zip(names, models, strict=True)
    ]


def write_plot(result: dict, path: "str | Path") -> None:
    """Three bar panels: perplexity, KV bytes/token (measured), decode tokens/s."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = result["models"]
    labels = _labels(models, sep="\n")
    panels = [
        ("perplexity", "perplexity (lower is better)", ".2f"),
        ("kv_bytes_per_token", f"KV cache bytes/token, {result['settings']['dtype']}", ",.0f"),
        ("decode_tokens_per_s", "decode tokens/s (higher is better)", ",.1f"),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(4.2 * 3, 4.2))
    colors = [f"C{i}" for i in range(len(models))]
    for ax, (key, title, fmt) in zip(axes, panels, strict=True):
        values = [m.get(key) for m in models]
        heights = [v if v is not None else 0 for v in values]
        bars = ax.bar(range(len(models)), heights, color=colors)
        texts = ["n/a" if v is None else format(v, fmt) for v in values]
        ax.bar_label(bars, labels=texts, padding=2, fontsize=9)
        ax.set_title(title, fontsize=10)
        ax.set_xticks(range(len(models)), labels, fontsize=8)
        ax.margins(y=0.15)
    fig.suptitle("skipv1 eval", fontsize=12)
    fig.tight_layout()
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120, format="png")
    except OSError as err:
        raise SkipV1Error(f"cannot write --plot {path}: {err.strerror or err}") from None
    finally:
        plt.close(fig)

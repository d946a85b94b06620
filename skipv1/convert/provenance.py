"""What a converted checkpoint says about itself: `skipv1_conversion.json` (source, options,
versions, what changed) and a model card README.md."""

import datetime
import hashlib
import importlib.metadata
import json
import platform
from pathlib import Path

from .inits import get_init

PROVENANCE_FILE = "skipv1_conversion.json"
LIBRARIES = ("skipv1", "torch", "transformers", "safetensors", "huggingface_hub", "tokenizers")


def sha256_of(path: Path | None) -> str | None:
    if path is None or not path.is_file():
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def library_versions(names: tuple[str, ...] = LIBRARIES) -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def write_provenance(out: Path, summary: dict, source_hashes: dict) -> dict:
    record = {
        "format_version": 1,
        "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": library_versions(),
        **source_hashes,
        **summary,
    }
    (out / PROVENANCE_FILE).write_text(json.dumps(record, indent=2) + "\n")
    return record


def write_model_card(out: Path, summary: dict) -> None:
    kv = summary["kv_bytes_per_token"]
    groups = ", ".join("(" + ",".join(map(str, g)) + ")" for g in summary["value_head_groups"])
    own_last = summary["num_kv_heads"] - summary["skip_heads"] - 1
    rule = get_init(summary["init"]).rule.format(groups=groups, own_last=own_last)
    base = summary.get("hub_id")
    front = ["---", "library_name: transformers", "tags:", "- skipv1", "- skipv1former"]
    if base:
        front += [f"base_model: {base}"]
    lines = [
        *front,
        "---",
        "",
        f"# SkipV1Former conversion of {summary['source']}",
        "",
        "Converted by `skipv1 convert` without training (see `skipv1_conversion.json`). Layer 0 is",
        f"unchanged; in every later layer the value projection keeps {summary['num_kv_heads'] - summary['skip_heads']}",
        f"of {summary['num_kv_heads']} KV value heads, initialised as {rule} (`--init {summary['init']}`),",
        f"and the last {summary['skip_heads']} value heads are read from layer 0's values",
        "(Wu et al., NeurIPS 2025, arXiv 2510.16807). Q, K and O are unchanged. Uptrain it before use:",
        "without continued training the quality is below the source model's.",
        "",
        f"| KV cache bytes per token ({kv['dtype']}) | |",
        "|---|---|",
        f"| source | {kv['source']:,} |",
        f"| SkipV1 | {kv['skipv1']:,} |",
        f"| saving | {kv['saving']:.1%} |",
        "",
        "Load it with:",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM",
        'model = AutoModelForCausalLM.from_pretrained("PATH", trust_remote_code=True)',
        "```",
    ]
    split = next(
        (c["to"] for c in summary["config_changes"] if c["field"] == "fused_qkv_split"), None
    )
    if split:  # a fused q/k/v projection: how to find the value rows
        lines += [
            "",
            f"The value rows sit in the fused `{split['tensor']}` tensor, laid out {split['layout']};",
            "`fused_qkv_split` in config.json gives the heads of each part, layer 0 and later.",
        ]
    if summary["warnings"]:
        lines += ["", "## Warnings", ""] + [f"- {w}" for w in summary["warnings"]]
    (out / "README.md").write_text("\n".join(lines) + "\n")

"""`skipv1 eval`: perplexity against a direct computation, KV bytes measured from the real cache
against the formula, the JSON and PNG outputs, lm-eval offline, and one-line errors."""

import json
import math
import shutil
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from factories import make_skipv1_checkpoint
from transformers import AutoModelForCausalLM, AutoTokenizer

from skipv1.convert.options import ConvertOptions
from skipv1.errors import SkipV1Error
from skipv1.evaluate.api import evaluate_models
from skipv1.evaluate.perplexity import windows
from skipv1.evaluate.settings import EvalSettings
from skipv1.textdata import embedded_documents
from skipv1.units import parse_bytes

FAST = ["--prompt-len", "16", "--new-tokens", "4", "--repeats", "1", "--quiet"]


@pytest.fixture(autouse=True)
def one_thread():
    """The machine is shared: OpenMP spinning on busy cores makes tiny models 100x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def convert_in_memory(src: Path, dst: Path, skip_v_heads: int) -> Path:
    """A SkipV1 checkpoint of the source's shape (random weights) with the source's tokenizer."""
    fields = json.loads((src / "config.json").read_text())
    make_skipv1_checkpoint(dst, skip_v_heads, config=fields, seed=1)
    for file in src.glob("tokenizer*"):
        (dst / file.name).write_bytes(file.read_bytes())
    return dst


def write_docs(folder: Path, docs: list[str]) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    for i, doc in enumerate(docs):
        (folder / f"doc{i}.txt").write_text(doc)
    return str(folder / "*.txt")


# --- perplexity -------------------------------------------------------------------------------


def reference_stream(path: Path, docs: list[str], max_tokens: int) -> torch.Tensor:
    """EOS after every document, tokenized here independently of skipv1."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    ids = []
    for doc in docs:
        ids.extend(tokenizer(doc, add_special_tokens=False)["input_ids"])
        ids.append(tokenizer.eos_token_id)
    return torch.tensor(ids[:max_tokens])


def direct_nll_non_overlapping(model, ids: torch.Tensor, ctx: int) -> tuple[float, int]:
    """Chunks of ctx tokens; in each, the mean NLL of tokens 1.. from one plain forward."""
    total, count = 0.0, 0
    for start in range(0, ids.numel(), ctx):
        chunk = ids[start : start + ctx][None]
        if chunk.shape[1] < 2:
            continue
        logits = model(chunk).logits[0]
        total += F.cross_entropy(logits[:-1], chunk[0, 1:], reduction="sum").item()
        count += chunk.shape[1] - 1
    return total, count


def direct_nll_sliding(model, ids: torch.Tensor, ctx: int, stride: int) -> tuple[float, int]:
    """Token t, scored by the first window (starts 0, stride, 2*stride, ...; ctx long) that
    reaches past it, sees the tokens from that window's start: one forward of exactly that
    prefix per token."""
    n, total = ids.numel(), 0.0
    for t in range(1, n):
        begin = next(b for b in range(0, n, stride) if min(b + ctx, n) > t)
        logits = model(ids[begin:t][None]).logits[0, -1]
        total += F.cross_entropy(logits[None], ids[t : t + 1], reduction="sum").item()
    return total, n - 1


@pytest.mark.parametrize("stride", [None, 24], ids=["non-overlapping", "sliding"])
def test_perplexity_equals_mean_token_nll_from_plain_forward(checkpoint, tmp_path, stride):
    src = checkpoint("src")
    docs = [d[:400] for d in embedded_documents("validation")[:3]]
    spec = write_docs(tmp_path / "data", docs)
    ctx, max_tokens = 64, 300
    result = evaluate_models(
        [src],
        EvalSettings(
            data=spec, ctx=ctx, stride=stride, max_tokens=max_tokens, skip_speed=True, quiet=True
        ),
    )
    entry = result["models"][0]

    ids = reference_stream(src, docs, max_tokens)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    with torch.no_grad():
        if stride is None:
            total, count = direct_nll_non_overlapping(model, ids, ctx)
        else:
            total, count = direct_nll_sliding(model, ids, ctx, stride)
    assert ids.numel() == max_tokens
    assert entry["eval_tokens"] == count
    assert entry["mean_nll"] == pytest.approx(total / count, rel=1e-5)
    assert entry["perplexity"] == pytest.approx(math.exp(total / count), rel=1e-5)
    assert result["settings"]["stride"] == (stride or ctx)


@pytest.mark.parametrize(
    "num_tokens,ctx,stride", [(10, 4, 4), (10, 4, 1), (11, 5, 3), (3, 8, 8), (100, 16, 7)]
)
def test_windows_score_each_token_at_most_once_and_all_with_context(num_tokens, ctx, stride):
    """Sliding (stride < ctx): every token but the first. Non-overlapping: all but each
    window's first token, which has no context inside its window."""
    scored = []
    for w in windows(num_tokens, ctx, stride):
        assert w.end - w.begin <= ctx and w.begin < w.first_target
        scored.extend(range(w.first_target, w.end))
    expected = [t for t in range(1, num_tokens) if stride < ctx or t % ctx]
    assert scored == expected


# --- KV cache -----------------------------------------------------------------------------------


def formula(num_layers: int, n_kv: int, head_dim: int, s: int, dtype_bytes: int = 4) -> int:
    """Written out again here: layer 0 caches every K and V head, later layers n_kv - s V heads."""
    return dtype_bytes * head_dim * (2 * n_kv + (num_layers - 1) * (2 * n_kv - s))


@pytest.mark.parametrize(
    "heads,kv_heads,skip,arch",
    [(8, 8, 4, "llama"), (8, 4, 2, "mistral"), (9, 3, 1, "qwen2")],
    ids=["MHA-8/8", "GQA-8/4", "odd-9/3"],
)
def test_measured_kv_bytes_equal_formula_and_skipv1_saves_the_formula_ratio(
    checkpoint, tmp_path, heads, kv_heads, skip, arch
):
    hidden = 8 * heads  # head_dim 8
    src = checkpoint(
        "src", arch=arch, num_attention_heads=heads, num_key_value_heads=kv_heads,
        hidden_size=hidden,
    )  # fmt: skip
    conv = convert_in_memory(src, tmp_path / "conv", skip)
    settings = EvalSettings(skip_perplexity=True, skip_speed=True, prompt_len=20, quiet=True)
    source, converted = evaluate_models([src, conv], settings)["models"]

    layers = 3
    assert source["kv_bytes_per_token"] == formula(layers, kv_heads, 8, 0)
    assert converted["kv_bytes_per_token"] == formula(layers, kv_heads, 8, skip)
    for entry in (source, converted):
        assert entry["kv_bytes_per_token"] == entry["kv_bytes_per_token_formula"]
        assert entry["kv_matches_formula"] and entry["kv_dtype"] == "float32"
        assert entry["kv_cached_tokens"] == 20 + 1  # prompt + the one decoded step
    ratio = formula(layers, kv_heads, 8, skip) / formula(layers, kv_heads, 8, 0)
    assert converted["kv_bytes_per_token"] < source["kv_bytes_per_token"]
    assert converted["vs_first"]["kv_bytes_per_token"] == ratio
    assert converted["max_batch_at_budget"] >= source["max_batch_at_budget"]


# --- CLI outputs ---------------------------------------------------------------------------


@pytest.mark.slow
def test_cli_writes_json_with_every_number_and_a_png_chart(checkpoint, tmp_path, cli):
    src = checkpoint("src", num_attention_heads=8, num_key_value_heads=4)
    conv = convert_in_memory(src, tmp_path / "conv", 2)
    out, png = tmp_path / "out" / "eval.json", tmp_path / "eval.png"
    result = cli(
        "eval", src, conv, "--ctx", "64", "--max-tokens", "256", *FAST,
        "--kv-budget", "1MiB", "--context-len", "128", "--json", out, "--plot", png,
        "--batch", "2", "--repeats", "2",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "KV bytes/token, measured" in result.stdout

    report = json.loads(out.read_text())
    for key in ("data", "ctx", "stride", "max_tokens", "prompt_len", "new_tokens", "batch"):
        assert key in report["settings"]
    assert report["settings"]["kv_budget"] == 2**20 and report["settings"]["batch"] == 2
    assert report["settings"]["ctx"] == report["settings"]["stride"] == 64
    assert [m["path"] for m in report["models"]] == [str(src), str(conv)]
    for m in report["models"]:
        assert isinstance(m["params"], int) and m["params"] > 0
        assert m["perplexity"] > 1 and m["eval_tokens"] == 256 - 256 // 64
        assert m["kv_bytes_per_token"] == m["kv_bytes_per_token_formula"] > 0
        assert m["prefill_tokens_per_s"] > 0 and m["decode_tokens_per_s"] > 0
        assert len(m["prefill_s"]) == len(m["decode_s"]) == 2
        assert m["max_batch_at_budget"] == 2**20 // (m["kv_bytes_per_token"] * 128)
    first, second = report["models"]
    assert all(v == 1.0 for v in first["vs_first"].values())
    assert second["vs_first"]["params"] == second["params"] / first["params"] < 1
    assert second["vs_first"]["decode_tokens_per_s"] > 0

    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    import matplotlib.image

    assert matplotlib.image.imread(png).shape[:2][1] > 1000  # three panels side by side


def test_json_to_stdout_and_default_ctx_follows_max_positions(checkpoint, cli):
    src = checkpoint("src", max_position_embeddings=128)
    result = cli("eval", src, "--max-tokens", "200", "--no-speed", "--json", "-", *FAST)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["settings"]["ctx"] == 128  # min(1024, max positions)
    assert report["models"][0]["decode_tokens_per_s"] is None


# --- lm-evaluation-harness ------------------------------------------------------------------

TASK_YAML = """\
task: skipv1_tiny_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


def tiny_task(tmp_path: Path) -> Path:
    """A directory with the three-question multiple-choice task `skipv1_tiny_choice`."""
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    rows = [
        {"question": "Python lists are", "choices": [" mutable", " frozen"], "answer": 0},
        {
            "question": "The keyword to define a function is",
            "choices": [" def", " fn"],
            "answer": 0,
        },
        {"question": "A tuple is", "choices": [" mutable", " immutable"], "answer": 1},
    ]
    (tasks / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tasks / "tiny.yaml").write_text(TASK_YAML.format(data=tasks / "data.jsonl"))
    return tasks


@pytest.mark.slow
def test_lm_eval_never_runs_code_from_the_checkpoint(checkpoint, tmp_path, cli):
    """A checkpoint whose config.json points `auto_map` at its own Python file: `eval --tasks`
    loads the stock class (no trust_remote_code), so the file never runs."""
    pytest.importorskip("lm_eval")
    src = checkpoint("src", num_attention_heads=4, num_key_value_heads=2)
    crafted = tmp_path / "crafted"
    shutil.copytree(src, crafted)
    marker = tmp_path / "code-ran"
    (crafted / "payload.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n")
    config = json.loads((crafted / "config.json").read_text())
    config["auto_map"] = {
        "AutoConfig": "payload.Config",
        "AutoModelForCausalLM": "payload.Model",
    }
    (crafted / "config.json").write_text(json.dumps(config))
    result = cli(
        "eval", crafted, "--tasks", "skipv1_tiny_choice", "--tasks-dir", tiny_task(tmp_path),
        "--no-perplexity", "--no-speed", *FAST,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert not marker.exists()


@pytest.mark.slow
def test_lm_eval_runs_a_local_task_on_source_and_converted_checkpoints(checkpoint, tmp_path, cli):
    pytest.importorskip("lm_eval")
    tasks = tiny_task(tmp_path)
    src = checkpoint("src", num_attention_heads=4, num_key_value_heads=2)
    conv = convert_in_memory(src, tmp_path / "conv", 1)
    assert "auto_map" in json.loads((conv / "config.json").read_text())  # trust_remote_code path

    result = cli(
        "eval", src, conv, "--tasks", "skipv1_tiny_choice", "--tasks-dir", tasks,
        "--no-perplexity", "--no-speed", "--json", tmp_path / "out.json", *FAST,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    for model in json.loads((tmp_path / "out.json").read_text())["models"]:
        scores = model["lm_eval"]["skipv1_tiny_choice"]
        assert 0.0 <= scores["acc,none"] <= 1.0 and scores["sample_len"] == 3


def test_tasks_without_lm_eval_installed_says_how_to_install(checkpoint, monkeypatch, cli):
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # makes `import lm_eval` fail
    result = cli("eval", checkpoint("src"), "--tasks", "hellaswag", *FAST)
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and "pip install 'skipv1[lm-eval]'" in result.stderr


# --- bad input ---------------------------------------------------------------------------------


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def without_weights(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for file in src.iterdir():
        if not file.name.startswith("model"):
            (dst / file.name).write_bytes(file.read_bytes())
    return dst


def cut_weights(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    data = (dst / "model.safetensors").read_bytes()
    (dst / "model.safetensors").write_bytes(data[: len(data) // 2])
    return dst


def corrupt_header(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    data = bytearray((dst / "model.safetensors").read_bytes())
    data[8:20] = b"#" * 12  # the JSON header's first bytes
    (dst / "model.safetensors").write_bytes(bytes(data))
    return dst


# case -> (args from (tmp_path, source checkpoint), text the one-line error must contain)
BAD_INPUTS = {
    "unknown model path": (lambda t, s: [t / "nope"], "does not exist"),
    "not a model dir": (lambda t, s: [t], "no config.json"),
    "no weights": (lambda t, s: [s, without_weights(s, t / "light")], "holds no weights"),
    "truncated safetensors": (lambda t, s: [s, cut_weights(s, t / "cut")], "is truncated"),
    "corrupt safetensors header": (
        lambda t, s: [s, corrupt_header(s, t / "corrupt")],
        "corrupt safetensors header",
    ),
    "missing data file": (lambda t, s: [s, "--data", t / "no.txt"], "no data files match"),
    "unreadable data": (
        lambda t, s: [s, "--data", write(t / "bad.jsonl", "{not json\n")],
        "bad.jsonl line 1 is not JSON",
    ),
    "jsonl without a text field": (
        lambda t, s: [s, "--data", write(t / "q.jsonl", '{"question": "why"}\n')],
        "has no text field 'text': set `text_field` to one of",
    ),
    "hub dataset unreachable offline": (
        lambda t, s: [s, "--data", "no-such-user/no-such-dataset"],
        "cannot read data no-such-user/no-such-dataset",
    ),
    "empty text": (
        lambda t, s: [s, "--data", write(t / "empty.txt", "  \n\n ")],
        "holds no non-empty text",
    ),
    "ctx over max positions": (lambda t, s: [s, "--ctx", "512"], "larger than the 256 positions"),
    "ctx zero": (lambda t, s: [s, "--ctx", "0"], "--ctx 0 is too small"),
    "stride over ctx": (lambda t, s: [s, "--ctx", "32", "--stride", "64"], "larger than --ctx"),
    "stride over default ctx": (lambda t, s: [s, "--stride", "300"], "larger than --ctx 256"),
    "negative max tokens": (lambda t, s: [s, "--max-tokens", "-1"], "--max-tokens -1 is too"),
    "one new token": (lambda t, s: [s, "--new-tokens", "1"], "--new-tokens 1 is too small"),
    "prompt too long": (lambda t, s: [s, "--prompt-len", "300"], "exceeds the 256 positions"),
    "bad budget": (lambda t, s: [s, "--kv-budget", "lots"], "--kv-budget lots is not a size"),
    "bad dtype": (lambda t, s: [s, "--dtype", "int3"], "unknown --dtype"),
    "plot not png": (lambda t, s: [s, "--plot", t / "x.jpg"], "must name a .png file"),
    "damaged gguf": (
        lambda t, s: [s, write(t / "damaged.gguf", "not a gguf")],
        "could not be read by transformers' GGUF loader",
    ),
    "hub model uncached offline": (
        lambda t, s: [s, "no-such-user/no-such-model"],
        "no-such-user/no-such-model is not a local path and could not be fetched from the Hub",
    ),
    "lm-eval on a gguf": (
        lambda t, s: [s, "builtin:smollm2", "--tasks", "hellaswag"],
        "is a GGUF file: convert it",
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_exits_2_with_one_line(checkpoint, tmp_path, case, cli):
    make_args, expected = BAD_INPUTS[case]
    result = cli("eval", *FAST, *make_args(tmp_path, checkpoint("src")))
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert expected in result.stderr


def test_parse_bytes_reads_plain_and_suffixed_sizes():
    """One parser for --kv-budget and --shard-size (both accept 16G, 5GB, 2GiB)."""
    assert parse_bytes("1024", "--kv-budget") == 1024
    assert parse_bytes("16GiB", "--kv-budget") == 16 * 2**30
    assert parse_bytes("500MB", "--kv-budget") == 500 * 10**6
    assert parse_bytes("1.5k", "--kv-budget") == 1500
    assert parse_bytes("16G", "--shard-size") == 16 * 10**9
    assert ConvertOptions(shard_size="16G").max_shard_bytes == 16 * 10**9
    with pytest.raises(SkipV1Error, match="--shard-size 0 is not a size"):
        parse_bytes("0", "--shard-size")


@pytest.mark.smollm2
def test_a_gguf_evaluates_as_its_hf_export(smollm2_dir, cli):
    """What convert takes, eval takes: the SmolLM2 GGUF, dequantized as it loads, scores the same
    text as the HF directory exported from it, with the same tokens and KV bytes."""
    args = ["--max-tokens", "300", "--ctx", "128", "--no-speed", "--json", "-", "--quiet"]
    result = cli("eval", "builtin:smollm2", smollm2_dir, *args)
    assert result.exit_code == 0, result.output
    gguf, hf = json.loads(result.stdout)["models"]
    assert gguf["path"] == "builtin:smollm2"
    assert gguf["eval_tokens"] == hf["eval_tokens"] > 0
    assert gguf["kv_bytes_per_token"] == hf["kv_bytes_per_token"]
    assert gguf["perplexity"] == pytest.approx(hf["perplexity"], rel=1e-5)

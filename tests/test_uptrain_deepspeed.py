"""Real DeepSpeed runs on 2 CPU ranks (gloo) with a tiny SkipV1 model and a tiny local corpus.
Runs are shared between tests through module-scoped fixtures to keep the file near 3 minutes."""

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from factories import SKIPV1, make_checkpoint, make_skipv1_checkpoint, write_corpus

from skipv1.checkpoint_info import read_config
from skipv1.modeling.layout import count_parameters
from skipv1.uptrain.launch import free_port
from skipv1.uptrain.metrics import read_metrics

pytestmark = pytest.mark.distributed
STEPS = 12


def train_losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run_dir) if "loss" in r}


def eval_ppls(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["eval_ppl"] for r in read_metrics(run_dir) if "eval_ppl" in r}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, tokenizer_dir) -> Path:
    """A tiny converted model (s=2 of 4 KV heads), a corpus and a recipe."""
    root = tmp_path_factory.mktemp("uptrain")
    make_skipv1_checkpoint(root / "model", skip_v_heads=2, tokenizer_dir=tokenizer_dir)
    corpus = write_corpus(root)
    recipe = {
        "model": {"path": str(root / "model"), "dtype": "float32"},
        "data": {
            "train": str(corpus / "train.jsonl"),
            "eval": str(corpus / "eval.jsonl"),
            "seq_len": 64,
        },
        "budget": {"tokens": STEPS * 1024},
        "batch": {"global_batch_tokens": 1024, "micro_batch_size": 4},
        "optim": {"lr": 3e-3},
        "deepspeed": {"zero_stage": 2},
        "eval": {"every": 6, "blocks": 8},
        "checkpoint": {"every": 4, "keep_last": 2},
        "log": {"progress": False},
    }
    (root / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    return root


class Run(subprocess.Popen):
    """A child `skipv1 uptrain` that a timeout kills (its ranks die with it) and fails the test
    with its stderr: left running, it would hold DeepSpeed's build lock, its run directory and
    pipes nobody reads, and a later test would wait on it."""

    def communicate(self, input=None, timeout=None):
        try:
            return super().communicate(input, timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            _, err = super().communicate()
            pytest.fail(f"{self.args[:3]} ran past {timeout} s and was killed:\n{err[-3000:]}")


def uptrain(workdir: Path, run: str, *args: str, nproc: int = 2, **popen) -> Run:
    cmd = [SKIPV1, "uptrain", str(workdir / "recipe.yaml"), "--run-dir", str(workdir / run)]
    cmd += ["--nproc", str(nproc), "--quiet", *args]
    env = dict(os.environ, PYTHONWARNINGS="ignore", **popen.pop("env", {}))
    return Run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def finish(proc: subprocess.Popen, timeout: int = 240) -> subprocess.CompletedProcess:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture(scope="module")
def zero2_run(workdir) -> Path:
    """The uninterrupted reference: ZeRO-2, 2 ranks, checkpoints at 4, 8 and 12."""
    finish(uptrain(workdir, "zero2"))
    return workdir / "zero2"


@pytest.fixture(scope="module")
def zero3_run(workdir, tokenizer_dir) -> Path:
    """ZeRO-3 with a distillation teacher (a plain Llama, replicated while the student is
    partitioned): one two-rank run serves both (each costs most of a minute)."""
    teacher = make_checkpoint(workdir / "teacher", tokenizer_dir=tokenizer_dir)
    done = finish(uptrain(workdir, "zero3", "deepspeed.zero_stage=3", f"distill.teacher={teacher}"))
    (workdir / "zero3.stderr").write_text(done.stderr)
    return workdir / "zero3"


def test_zero2_loss_falls_and_metrics_are_complete(zero2_run):
    losses = train_losses(zero2_run)
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert losses[STEPS] < losses[1] - 0.5
    ppl = eval_ppls(zero2_run)
    assert sorted(ppl) == [0, 6, STEPS] and ppl[STEPS] < ppl[0]
    record = read_metrics(zero2_run)[1]
    assert {"step", "tokens", "loss", "lr", "tokens_per_s", "tflops", "data_s"} <= set(record)
    assert 0 <= record["data_s"] < 1024 / record["tokens_per_s"]  # reading rows < computing
    assert "mfu" not in record  # no known peak on a CPU
    model = yaml.safe_load((zero2_run / "recipe.yaml").read_text())["model"]["path"]
    params = count_parameters(read_config(model))
    assert record["tflops"] == pytest.approx(6 * params * record["tokens_per_s"] / 1e12)
    names = sorted(
        p.name for p in (zero2_run / "checkpoints").iterdir() if p.name.startswith("step")
    )
    assert names == ["step_00000008", "step_00000012"]  # keep_last: 2
    assert yaml.safe_load((zero2_run / "recipe.yaml").read_text())["optim"]["lr"] == 3e-3


def test_zero3_loss_falls_and_export_equals_engine_weights(zero3_run, tmp_path, cli):
    from transformers import AutoModelForCausalLM

    evals = {r["step"]: r["eval_loss"] for r in read_metrics(zero3_run) if "eval_loss" in r}
    assert evals[STEPS] < evals[0] - 0.5  # cross-entropy: the train loss mixes in the teacher's KL
    live = zero3_run / "export"  # written from the engine's gathered ZeRO-3 parameters
    info = json.loads((live / "skipv1_uptrain.json").read_text())
    assert info["tokens"] == STEPS * 1024 and info["zero_stage"] == 3
    assert "tokens trained: 12,288" in (live / "README.md").read_text()
    config = json.loads((live / "config.json").read_text())
    assert config["model_type"] == "skipv1_llama" and "auto_map" in config
    offline = tmp_path / "offline"  # merged from the ZeRO-3 shards on disk
    result = cli.process("export", zero3_run, offline)
    assert result.returncode == 0, result.stderr
    again = cli.process("export", zero3_run, offline)
    assert again.returncode == 2 and "--overwrite" in again.stderr
    a = AutoModelForCausalLM.from_pretrained(live).state_dict()
    b = AutoModelForCausalLM.from_pretrained(offline, trust_remote_code=True).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert a["model.layers.1.self_attn.v_proj.weight"].shape == (32, 64)


def test_zero3_run_with_a_teacher_logs_distill_kl(workdir, zero3_run):
    records = [r for r in read_metrics(zero3_run) if "loss" in r]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert all(math.isfinite(r["distill_kl"]) and r["distill_kl"] > 0 for r in records)
    assert "2 x teacher params x tokens" in (workdir / "zero3.stderr").read_text()
    saved = yaml.safe_load((zero3_run / "recipe.yaml").read_text())["distill"]
    assert saved == {
        "teacher": str(workdir / "teacher"),
        "alpha": 0.5,
        "alpha_end": None,
        "temperature": 1.0,
        "hidden": 0.0,
    }


def test_resume_from_2_ranks_on_1_rank(workdir, zero2_run):
    run = workdir / "two_to_one"
    shutil.copytree(zero2_run, run, ignore=shutil.ignore_patterns("step_00000012", "export"))
    result = finish(uptrain(workdir, "two_to_one", nproc=1))
    assert "resuming from" in result.stderr and "(step 8)" in result.stderr
    assert (run / "checkpoints" / "step_00000008.universal" / "complete").is_file()
    expected, got = train_losses(zero2_run), train_losses(run)
    diffs = [abs(expected[s] - got[s]) for s in range(9, STEPS + 1)]
    print(f"2 -> 1 ranks: max |loss difference| over steps 9-12: {max(diffs):.3g}")
    assert max(diffs) < 1e-4  # same batches; only the float summation order differs


def test_a_rank_data_error_is_one_line_exit_2(workdir):
    proc = uptrain(workdir, "bad", "batch.global_batch_tokens=1048576", "budget.tokens=1048576")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert err.strip().splitlines()[-1].startswith("error: the train data gives")
    assert "fewer than one global batch" in err
    assert len([line for line in err.splitlines() if line.startswith("error:")]) == 1


def test_a_killed_local_rank_is_one_line_naming_it_without_a_traceback(workdir):
    """Rank 1 of `--nproc 2` SIGKILLs itself at step 2: torchrun stops rank 0, and the launching
    process prints one line naming the dead rank and, when rank 0 saw the loss before torchrun
    stopped it, what rank 0 saw, not torchrun's report. Which comes first (rank 0's failed
    collective or torchrun's SIGTERM) is a race on a busy machine, so both endings are checked."""
    env = {"SKIPV1_FAULT": "train-step:2@1"}
    proc = uptrain(workdir, "killed_rank", "deepspeed.zero_stage=0", "eval.every=0", env=env)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 2, err[-3000:]
    assert "Traceback" not in err and "ChildFailedError" not in err, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors == [err.strip().splitlines()[-1]], err[-3000:]
    assert errors[0].startswith("error: rank 1 was killed by SIGKILL")
    then = errors[0].split("; then ", 1)[1]
    assert then.startswith("rank 0: another rank is gone (at step 2") or then.startswith(
        "the other ranks were stopped; rerun the same command to resume"
    ), errors[0]


def test_source_is_converted_on_the_fly_single_process_zero0(checkpoint, tmp_path, workdir, cli):
    """model.source -> RUN_DIR/converted through skipv1.convert (with the calibration options
    passed on); one process, no ZeRO."""
    src = checkpoint("src", num_key_value_heads=2)
    recipe = yaml.safe_load((workdir / "recipe.yaml").read_text())
    calib = {"calib_data": recipe["data"]["train"], "calib_tokens": 512, "calib_seq_len": 64}
    recipe["model"] = {
        "source": str(src),
        "skip_heads": 1,
        "dtype": "float32",
        "init": "calibrated",
        **calib,
    }
    recipe["budget"] = {"tokens": 2048, "pretraining_tokens": 10**9}
    recipe["deepspeed"] = {"zero_stage": 0}
    recipe["distill"] = {"teacher": "source"}  # the run's own source model
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    run = tmp_path / "run"
    result = cli.process("uptrain", tmp_path / "r.yaml", "--run-dir", run, "--quiet", timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "of the source's pretraining compute" in result.stderr
    converted = json.loads((run / "converted" / "config.json").read_text())
    assert converted["skip_v_heads"] == 1
    record = json.loads((run / "converted" / "skipv1_conversion.json").read_text())
    assert record["init"] == "calibrated"
    assert (record["calibration"]["tokens"], record["calibration"]["seq_len"]) == (512, 64)
    assert record["calibration"]["data"] == calib["calib_data"]
    assert sorted(train_losses(run)) == [1, 2]
    assert all("distill_kl" in r for r in read_metrics(run) if "loss" in r)
    offline = tmp_path / "offline"
    exported = cli.process("export", run, offline)
    assert exported.returncode == 0, exported.stderr
    from safetensors.torch import load_file

    a, b = load_file(run / "export" / "model.safetensors"), load_file(offline / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_export_refuses_destinations_that_would_destroy_the_run(zero2_run, tmp_path, cli):
    before = sorted(p.name for p in zero2_run.iterdir())
    a_file = tmp_path / "file"
    a_file.write_text("x")
    cases = [
        ([str(zero2_run), "--overwrite"], "lies inside the run's directory"),
        ([str(zero2_run / "checkpoints" / "x")], "lies inside the run's directory"),
        ([str(zero2_run.parent), "--overwrite"], "lies inside the run's directory"),
        ([str(a_file)], "is a file"),
        (
            [str(tmp_path / "out"), "--checkpoint", str(zero2_run / "checkpoints" / "step_99")],
            "is not a directory: give one of the run's checkpoints",
        ),
        (
            [str(tmp_path / "out"), "--checkpoint", str(zero2_run / "checkpoints")],
            "not a complete checkpoint",
        ),
    ]
    for args, message in cases:
        result = cli.process("export", zero2_run, *args)
        assert result.returncode == 2, (args, result.stderr)
        assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, args
    assert sorted(p.name for p in zero2_run.iterdir()) == before


def test_export_after_the_model_directory_moved_says_where_it_was(zero2_run, tmp_path, cli):
    """The run's state names the model directory export reads config and tokenizer from; a copy
    of the run whose states point at a directory that no longer exists stands for a moved one."""
    run = tmp_path / "run"
    shutil.copytree(zero2_run, run)
    gone = tmp_path / "moved-away"
    for state in run.glob("checkpoints/*/trainer_state.json"):
        data = json.loads(state.read_text())
        state.write_text(json.dumps({**data, "model_dir": str(gone)}))
    result = cli.process("export", run, tmp_path / "out")
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and f"model directory {gone} is gone" in result.stderr
    assert not (tmp_path / "out").exists()


class Payload:
    """Unpickling this creates the file `marker`: proof that code ran."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_crafted_deepspeed_state_file_is_refused_by_export_and_resume(workdir, zero2_run, cli):
    crafted = workdir / "crafted"
    shutil.copytree(zero2_run, crafted)
    shutil.rmtree(crafted / "export", ignore_errors=True)
    last = sorted((crafted / "checkpoints").glob("step_*"))[-1]
    states = last / "mp_rank_00_model_states.pt"
    marker = workdir / "pwned"
    saved = torch.load(states, weights_only=True)
    torch.save({**saved, "evil": Payload(marker)}, states)
    env = dict(os.environ, PYTHONWARNINGS="ignore")

    result = cli.process("export", crafted, workdir / "crafted-out", env=env)
    assert result.returncode == 2, result.stderr
    assert "--trust-checkpoint" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not marker.exists() and not (workdir / "crafted-out").exists()

    proc = uptrain(workdir, "crafted")
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 2, err[-2000:]
    assert "checkpoint.trust_pickles" in err
    assert not marker.exists()


def test_a_second_run_on_a_run_dir_in_use_is_refused_and_a_kill_frees_it(workdir):
    long_run = ("deepspeed.zero_stage=0", f"budget.tokens={400 * 1024}", "checkpoint.every=0")
    first = uptrain(workdir, "locked", *long_run, nproc=1)
    lock = workdir / "locked" / ".lock"
    deadline = time.time() + 120
    while not (lock.is_file() and "pid" in lock.read_text()) and time.time() < deadline:
        assert first.poll() is None, first.communicate()[1][-2000:]
        time.sleep(0.2)
    second = uptrain(workdir, "locked", *long_run, nproc=1)
    _, err = second.communicate(timeout=120)
    assert second.returncode == 2, err[-2000:]
    assert "is in use by a running uptrain" in err and len(err.strip().splitlines()) == 1
    first.kill()  # kill -9: the OS releases the lock
    first.communicate()
    finish(uptrain(workdir, "locked", "deepspeed.zero_stage=0", nproc=1))
    steps = [r["step"] for r in read_metrics(workdir / "locked") if "loss" in r]
    assert steps == list(range(1, STEPS + 1))  # the killed run's rows are gone


def test_seq_len_beyond_the_model_positions_is_refused(workdir):
    args = ("data.seq_len=512", "batch.micro_batch_size=2", "deepspeed.zero_stage=0")
    proc = uptrain(workdir, "long", *args, nproc=1)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err[-2000:]
    assert "more than the model's 256 positions" in err
    assert len(err.strip().splitlines()) == 1


def test_a_checkpoint_dir_that_cannot_be_created_is_refused_before_training(workdir):
    """It was created at the first checkpoint: an internal error after the first steps."""
    args = ("checkpoint.dir=/proc/skipv1-nowhere", "deepspeed.zero_stage=0")
    proc = uptrain(workdir, "nowhere", *args, nproc=1)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err[-2000:]
    assert err.strip().splitlines() == [
        "error: checkpoint.dir /proc/skipv1-nowhere cannot be created or written (No such file "
        "or directory): choose a writable directory"
    ]
    assert not (workdir / "nowhere" / "metrics.jsonl").exists()


def test_resume_with_a_changed_training_key_is_refused_by_name(workdir, zero2_run):
    changed = workdir / "changed"
    shutil.copytree(zero2_run, changed)
    proc = uptrain(workdir, "changed", "optim.lr=1e-3", f"budget.tokens={(STEPS + 4) * 1024}")
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 2, err[-2000:]
    assert "the recipe changed since the checkpoint" in err and "`optim.lr` 0.003 -> 0.001" in err
    assert len([line for line in err.splitlines() if line.startswith("error:")]) == 1
    # keys that do not change the training may differ
    finish(uptrain(workdir, "changed", "eval.blocks=4", "log.every=3"))


def build_lock(env: dict) -> Path:
    """torch's lock file on the build of DeepSpeed's CPU op, under the extensions dir `env` sets."""
    find = "from skipv1.uptrain.engine import shm_build_lock; print(shm_build_lock())"
    found = subprocess.run(
        [sys.executable, "-c", find], capture_output=True, text=True, env={**os.environ, **env}
    )
    return Path(found.stdout.strip())


def test_a_stale_deepspeed_build_lock_is_named_instead_of_waited_on(workdir, tmp_path):
    env = {"TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}
    lock = build_lock(env)
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.touch()
    old = time.time() - 3600  # left by another program's build killed an hour ago
    os.utime(lock, (old, old))
    proc = uptrain(workdir, "stale", "deepspeed.zero_stage=0", nproc=1, env=env)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err[-2000:]
    assert f"DeepSpeed's build lock {lock} is 60 minutes old" in err
    assert len(err.strip().splitlines()) == 1


def test_a_machine_without_a_compiler_gets_one_line_naming_it(workdir, tmp_path):
    """DeepSpeed's CPU op is built on a machine's first run. With nothing on PATH (a venv's
    `skipv1` run without activating it, on a machine without compilers), ninja is still found
    beside the interpreter (pip installs it with DeepSpeed), and the missing compiler is one
    line, not an internal error."""
    (tmp_path / "bin").mkdir()
    env = {"TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"), "PATH": str(tmp_path / "bin")}
    proc = uptrain(workdir, "no-compiler", "deepspeed.zero_stage=0", nproc=1, env=env)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "Traceback" not in err, err[-2000:]
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err[-2000:]
    (error,) = errors  # the shell's words: "/bin/sh: 1: c++: not found" on Debian
    assert error.startswith("error: DeepSpeed could not build its CPU op (") and "c++" in error
    assert "not found" in error and error.endswith("and ninja (`pip install ninja`)")


def test_a_run_killed_while_building_deepspeeds_op_does_not_block_the_next(workdir, tmp_path):
    """The first run on a machine builds DeepSpeed's CPU op under torch's lock file; killing
    that run's processes (a scheduler ending the job) leaves the file. The next run must build
    and train, not wait on it forever."""
    env = {"TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}
    lock = build_lock(env)
    proc = uptrain(
        workdir,
        "killed-building",
        "deepspeed.zero_stage=0",
        nproc=1,
        env=env,
        start_new_session=True,
    )
    deadline = time.time() + 180
    while not lock.exists():
        assert proc.poll() is None and time.time() < deadline, "the run never started the build"
        time.sleep(0.02)
    groups = {proc.pid, *map(os.getpgid, children(proc.pid))}  # the compiler runs in the rank's
    for group in groups:
        os.killpg(group, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert lock.exists()
    finish(uptrain(workdir, "after-killed-build", "deepspeed.zero_stage=0", nproc=1, env=env))
    assert not lock.exists()


def test_non_finite_losses_are_skipped_up_to_the_limit_then_the_run_stops(workdir):
    """optim.skip_nonfinite: 2 (ZeRO-2): the first two non-finite steps make no optimizer update
    (their checkpoints hold the previous weights); the third stops the run before it is
    checkpointed, naming the step and the skipped ones (with 0, the default, the first stops)."""
    from skipv1.uptrain.export import checkpoint_state_dict

    args = ("optim.lr=1e30", "optim.grad_clip=0", "optim.skip_nonfinite=2")
    run = uptrain(
        workdir, "diverged", *args, "checkpoint.every=1", "checkpoint.keep_last=5", nproc=1
    )
    _, err = run.communicate(timeout=240)
    assert run.returncode == 2, err[-2000:]
    (line,) = [x for x in err.splitlines() if x.startswith("error:")]
    assert "stopped before checkpointing this step" in line, line
    step = int(line.split("at step ")[1].split(":")[0])
    assert f"(steps {step - 2}, {step - 1})" in line, line
    assert err.count("skipped the step (no optimizer update") == 2
    records = {r["step"]: r for r in read_metrics(workdir / "diverged") if "loss" in r}
    assert [s for s, r in records.items() if r.get("skipped")] == [step - 2, step - 1]
    ckpts = workdir / "diverged" / "checkpoints"
    assert not (ckpts / f"step_{step:08d}").exists()
    weights = [
        dict(checkpoint_state_dict(ckpts / f"step_{s:08d}")) for s in (step - 3, step - 2, step - 1)
    ]
    assert all(torch.equal(weights[0][k], w[k]) for w in weights[1:] for k in weights[0])


def children(pid: int) -> list[int]:
    """PIDs whose parent is `pid` (torchrun's ranks: each in a session of its own)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX"
    except OSError:
        return True


def start_two_nodes(workdir: Path, *overrides: str) -> list[subprocess.Popen]:
    """torchrun's c10d rendezvous, started twice (node ranks 0 and 1, one rank each); each
    torchrun in a process group of its own, as on two machines."""
    port = free_port()
    nodes = []
    for node in (0, 1):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2"]
        cmd += ["--nproc-per-node", "1", "--node-rank", str(node), "--rdzv-backend", "c10d"]
        cmd += ["--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "loopback"]
        cmd += ["-m", "skipv1.uptrain", str(workdir / "recipe.yaml")]
        cmd += [f"run_dir={workdir / 'two-nodes'}", "log.progress=false", *overrides]
        env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
        nodes.append(
            subprocess.Popen(
                cmd,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        )
    return nodes


TIMEOUT_S = 10  # deepspeed.timeout_s of the hung-node run: the wait the test pays


def test_a_hung_node_ends_the_run_in_bounded_time_and_both_nodes_resume_exactly(workdir, zero2_run):
    """Two "nodes" on loopback. Node 1's rank freezes (SIGSTOP) after checkpoint 4: node 0's
    rank gives up after deepspeed.timeout_s with one line and exits. Then node 1's torchrun is
    killed with kill -9 (its process group): its rank, in a session of its own, dies with it
    (parent-death signal) instead of living on. Rerunning both nodes resumes from step 4 with
    the single-node run's losses."""
    run, rank1 = workdir / "two-nodes", None
    node0, node1 = start_two_nodes(workdir, f"deepspeed.timeout_s={TIMEOUT_S}")
    try:
        deadline = time.time() + 300
        while time.time() < deadline:
            done = (run / "checkpoints" / "step_00000004" / "complete").is_file()
            if done and max(train_losses(run), default=0) >= 5:
                break
            assert node0.poll() is None, node0.communicate()[1][-2000:]
            time.sleep(0.05)
        (rank1,) = children(node1.pid)
        os.kill(rank1, signal.SIGSTOP)
        frozen = time.time()
        _, err = node0.communicate(timeout=TIMEOUT_S + 60)
        waited = time.time() - frozen
        assert node0.returncode != 0
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, err[-3000:]
        assert errors[0].startswith("error: rank 0: another rank did not answer (at step"), errors
        assert f"deepspeed.timeout_s = {TIMEOUT_S} s" in errors[0] and "step_00000004" in errors[0]
        assert waited < TIMEOUT_S + 45, f"node 0 took {waited:.0f} s to exit"
        try:
            os.killpg(node1.pid, signal.SIGKILL)  # the whole "machine" of node 1, but its rank
        except ProcessLookupError:  # its torchrun ended by itself when node 0's store went
            pass
        node1.communicate(timeout=60)
        deadline = time.time() + 10
        while not gone(rank1) and time.time() < deadline:
            time.sleep(0.1)
        assert gone(rank1), "node 1's rank outlived its torchrun"
    finally:
        for proc in (node0, node1):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        if rank1 and not gone(rank1):
            os.kill(rank1, signal.SIGKILL)
    killed_at = max(train_losses(run))
    assert killed_at < STEPS
    for proc in start_two_nodes(workdir):  # the default timeout: deepspeed.timeout_s may change
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
    two_nodes, one_node = train_losses(run), train_losses(zero2_run)
    assert sorted(two_nodes) == sorted(one_node)
    diff = max(abs(two_nodes[s] - one_node[s]) for s in one_node)
    print(f"frozen at step {killed_at}; node 0 exited after {waited:.1f} s; max |diff| {diff:.3g}")
    assert diff <= 1e-6

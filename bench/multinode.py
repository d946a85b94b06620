"""Multi-node `skipv1 uptrain` on one machine over loopback: the same run started by
`skipv1 uptrain --nproc 2` (one node, two ranks), by two torchrun "nodes" (c10d rendezvous, one
rank each) and by two DeepSpeed-launcher "nodes" (`deepspeed --hostfile H --no_ssh --node_rank
N`, no ssh), with the per-step losses compared; then node 1 of a torchrun pair killed mid-run
(kill -9 of its process group, as a machine that goes away): how long node 0 takes to exit and
what it says, and whether rerunning both nodes resumes with the single-node losses.

    .venv/bin/python bench/multinode.py      # ~5 minutes on 2 CPU cores

A tiny random SkipV1 Llama (tests/factories.py), its tokenizer and corpus, ZeRO-2, fp32, gloo,
12 steps of 1,024 tokens, a checkpoint every 4 steps. Writes docs/results/multinode.md and .json.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
STEPS = 12


def setup(work: Path) -> Path:
    from factories import build_tokenizer, make_skipv1_checkpoint, write_corpus

    tokenizer = build_tokenizer(work / "tokenizer")
    make_skipv1_checkpoint(work / "model", skip_v_heads=2, tokenizer_dir=tokenizer)
    corpus = write_corpus(work)
    recipe = {
        "model": {"path": str(work / "model"), "dtype": "float32"},
        "data": {"train": str(corpus / "train.jsonl"), "eval": None, "seq_len": 64},
        "budget": {"tokens": STEPS * 1024},
        "batch": {"global_batch_tokens": 1024, "micro_batch_size": 4},
        "optim": {"lr": 3e-3},
        "deepspeed": {"zero_stage": 2, "timeout_s": 60},
        "checkpoint": {"every": 4, "keep_last": 2},
        "log": {"progress": False, "tensorboard": False},
    }
    (work / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    return work / "recipe.yaml"


def env() -> dict:
    out = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    out["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), out.get("PYTHONPATH")]))
    return out


def free_port() -> int:
    from skipv1.uptrain.launch import free_port as port

    return port()


def node_commands(launcher: str, recipe: Path, run_dir: Path, work: Path) -> list[list[str]]:
    """The command each of the two "nodes" runs."""
    port, args = free_port(), [str(recipe), f"run_dir={run_dir}", "log.progress=false"]
    if launcher == "torchrun":
        base = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2"]
        base += ["--nproc-per-node", "1", "--rdzv-backend", "c10d"]
        base += ["--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run_dir.name]
        return [[*base, "--node-rank", str(n), "-m", "skipv1.uptrain", *args] for n in (0, 1)]
    hostfile = work / "hostfile"  # names are labels only: --no_ssh never connects to them
    hostfile.write_text("node0 slots=1\nnode1 slots=1\n")
    base = [str(Path(sys.executable).parent / "deepspeed"), "--hostfile", str(hostfile)]
    base += ["--no_ssh", "--master_addr", "127.0.0.1", "--master_port", str(port)]
    base += ["--no_local_rank", "--module"]
    return [[*base, "--node_rank", str(n), "skipv1.uptrain", *args] for n in (0, 1)]


def start(cmds: list[list[str]]) -> list[subprocess.Popen]:
    """Each node in a session of its own, as on two machines."""
    return [
        subprocess.Popen(
            cmd,
            env=env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for cmd in cmds
    ]


def finish(procs: list[subprocess.Popen], what: str) -> float:
    t0 = time.time()
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        if proc.returncode != 0:
            sys.exit(f"{what} failed:\n{err[-3000:]}")
    return time.time() - t0


def losses(run_dir: Path) -> dict[int, float]:
    from skipv1.uptrain.metrics import read_metrics

    return {r["step"]: r["loss"] for r in read_metrics(run_dir) if "loss" in r}


def max_diff(a: dict, b: dict) -> float:
    if sorted(a) != sorted(b):
        sys.exit(f"different steps: {sorted(a)} vs {sorted(b)}")
    return max(abs(a[s] - b[s]) for s in a)


def single_node(recipe: Path, work: Path) -> dict[int, float]:
    run_dir = work / "single"
    cmd = [sys.executable, "-m", "skipv1", "uptrain", str(recipe), "--run-dir", str(run_dir)]
    t0 = time.time()
    done = subprocess.run(
        [*cmd, "--nproc", "2", "--quiet"], env=env(), capture_output=True, text=True
    )
    if done.returncode != 0:
        sys.exit(f"the single-node run failed:\n{done.stderr[-3000:]}")
    print(f"  single node, 2 ranks: {time.time() - t0:.0f} s")
    return losses(run_dir)


def two_nodes(launcher: str, recipe: Path, work: Path) -> dict[int, float]:
    run_dir = work / launcher
    seconds = finish(start(node_commands(launcher, recipe, run_dir, work)), launcher)
    print(f"  {launcher}, 2 nodes: {seconds:.0f} s")
    return losses(run_dir)


def reached_step_5(run_dir: Path) -> bool:
    if not (run_dir / "checkpoints/step_00000004/complete").is_file():
        return False
    return max(losses(run_dir), default=0) >= 5


def killed_node(recipe: Path, work: Path) -> dict:
    """Node 1 (its torchrun and rank) killed once checkpoint 4 is complete and step 5 logged."""
    run_dir = work / "killed"
    node0, node1 = start(node_commands("torchrun", recipe, run_dir, work))
    deadline = time.time() + 600
    while not reached_step_5(run_dir):
        if time.time() > deadline or node0.poll() is not None:
            sys.exit(f"the run did not reach step 5:\n{node0.communicate()[1][-3000:]}")
        time.sleep(0.05)
    os.killpg(node1.pid, signal.SIGKILL)
    killed = time.time()
    _, err = node0.communicate(timeout=600)
    waited = time.time() - killed
    node1.communicate()
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    at = max(losses(run_dir))
    print(
        f"  node 1 killed after step {at}: node 0 exited {waited:.1f} s later, rc {node0.returncode}"
    )
    seconds = finish(start(node_commands("torchrun", recipe, run_dir, work)), "the resumed run")
    print(f"  both nodes rerun: {seconds:.0f} s")
    return {
        "killed_after_step": at,
        "node0_exit_s": waited,
        "node0_rc": node0.returncode,
        "node0_errors": errors,
        "resumed_losses": losses(run_dir),
    }


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="skipv1-multinode-") as tmp:
        work = Path(tmp)
        recipe = setup(work)
        print("runs:")
        reference = single_node(recipe, work)
        runs = {name: two_nodes(name, recipe, work) for name in ("torchrun", "deepspeed")}
        kill = killed_node(recipe, work)
    result = {
        "steps": STEPS,
        "single_node_losses": reference,
        "max_diff": {name: max_diff(reference, got) for name, got in runs.items()},
        "resumed_max_diff": max_diff(reference, kill.pop("resumed_losses")),
        "kill": kill,
        "load_after": os.getloadavg()[0],
    }
    for name, diff in result["max_diff"].items():
        print(f"  {name}: max |loss - single node| = {diff:.3g}")
    print(f"  resumed after the kill: max |loss - single node| = {result['resumed_max_diff']:.3g}")
    out = REPO / "docs" / "results"
    (out / "multinode.json").write_text(json.dumps(result, indent=1) + "\n")
    write_report(result, out / "multinode.md")


def write_report(r: dict, path: Path) -> None:
    kill = r["kill"]
    line = kill["node0_errors"][0] if kill["node0_errors"] else "(no error line)"
    rows = "\n".join(f"| {name} | {diff:.3g} |" for name, diff in r["max_diff"].items())
    path.write_text(f"""# Multi-node uptraining on loopback

Generated by `bench/multinode.py` (command: `.venv/bin/python bench/multinode.py`), on this
2-core CPU machine: a tiny random SkipV1 Llama, ZeRO-2, fp32, gloo, {r["steps"]} steps of
1,024 tokens, a checkpoint every 4 steps. Each "node" is started in a session of its own, as
on two machines; they meet on 127.0.0.1.

## Same losses as one node

Reference: `skipv1 uptrain RECIPE --nproc 2` (one node, two ranks). Two nodes of one rank each:

- torchrun: `python -m torch.distributed.run --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d
  --rdzv-endpoint 127.0.0.1:PORT --node-rank N -m skipv1.uptrain RECIPE`, started twice;
- deepspeed: `deepspeed --hostfile HOSTFILE --no_ssh --master_addr 127.0.0.1 --master_port PORT
  --no_local_rank --module --node_rank N skipv1.uptrain RECIPE`, started twice (the DeepSpeed
  launcher's multi-node mode without ssh: each node runs its own launcher).

| launcher | max abs(loss - one node) over {r["steps"]} steps |
|---|---|
{rows}

## A node that dies

Node 1 (its torchrun and its rank) killed with kill -9 after step {kill["killed_after_step"]}
(checkpoint 4 complete): node 0 exited **{kill["node0_exit_s"]:.1f} s** later with exit status
{kill["node0_rc"]} and one line:

    {line}

Both nodes started again: resumed from the checkpoint, max abs(loss - one node) over the run
**{r["resumed_max_diff"]:.3g}**. (A node that hangs instead of dying is bounded by
`deepspeed.timeout_s`: tests/test_uptrain_deepspeed.py freezes one with SIGSTOP.)

Load average after the runs: {r["load_after"]:.2f} (1-minute; the exit time is one run's
wall clock and says "bounded", not a speed; the losses do not depend on load).
""")


if __name__ == "__main__":
    main()

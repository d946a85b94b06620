"""The uptraining recipe as one readable class: setup -> train -> validate -> save_checkpoint ->
export. The loop is in plain sight; DeepSpeed does partitioning, precision, accumulation and
clipping. Every rank runs this same code (torchrun, the DeepSpeed launcher, or one process)."""

import logging
import math
import os
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from .. import faults
from ..atomic_dir import make_writable_dir
from ..checkpoint_info import check_supported, is_skipv1, read_config
from ..errors import SkipV1Error
from ..modeling.layout import count_parameters
from ..units import torch_dtype
from . import checkpointing
from .data import load_blocks, make_train_batches, rank_micro_batches
from .distill import alpha_at, distillation_loss, hidden_state_loss
from .engine import (
    deepspeed_config,
    dist_env,
    init_distributed,
    initialize,
    make_optimizer,
    offloads_optimizer,
    peer_failure,
    release_distributed,
    zero_stage,
)
from .export import SHARD_BYTES, iter_live_weights, write_export
from .gradual import GradualConversion
from .metrics import MetricsLogger, truncate_metrics
from .recipe import Recipe, total_steps
from .schedule import make_scheduler
from .teacher import resolve_teacher
from .throughput import device_peak_flops, flops_fields


class UptrainRecipe:
    def __init__(self, recipe: Recipe):
        self.recipe = recipe
        self.run_dir = Path(recipe.run_dir)
        self.ckpt_dir = recipe.checkpoint_dir()
        self.env = dist_env()
        self.start_step = 0
        self.step = 0  # the step being trained (named when a peer is lost)
        self.skipped_steps: list[int] = []  # non-finite steps skipped (optim.skip_nonfinite)
        self.last_eval_ppl: float | None = None
        self.gradual: GradualConversion | None = None

    # ---------------------------------------------------------------- setup
    def setup(self) -> None:
        r, env = self.recipe, self.env
        init_distributed(env, r.deepspeed.timeout_s)
        _quiet_libraries(env.is_main)
        if env.is_main:  # both written much later: refused now, not after the first steps
            make_writable_dir(self.run_dir, "run_dir")
            make_writable_dir(self.ckpt_dir, "checkpoint.dir")
            self._lock = lock_run_dir(self.run_dir)
        self.model_dir = self._model_dir()
        self.teacher_dir = self._teacher_dir()
        self.model_config = read_config(self.model_dir)
        check_supported(self.model_config)
        positions = self.model_config.get("max_position_embeddings")
        if isinstance(positions, int) and r.data.seq_len > positions:
            raise SkipV1Error(
                f"`data.seq_len` is {r.data.seq_len}, more than the model's {positions} positions "
                "(max_position_embeddings): lower data.seq_len"
            )
        self.total_steps = total_steps(r)
        teacher_params = count_parameters(read_config(self.teacher_dir)) if self.teacher_dir else 0
        self.flops_per_token = 6 * count_parameters(self.model_config) + 2 * teacher_params
        self.peak_flops = device_peak_flops(env.device, r.model.dtype)
        self.tokenizer = _load_tokenizer(self.model_dir, r.model.trust_remote_code)
        self.train_data = make_train_batches(r, self.tokenizer, env.local_rank, _stderr)
        self.eval_blocks = self._eval_blocks()

        resume = checkpointing.resolve_resume(r.checkpoint.resume, self.ckpt_dir)
        saved = checkpointing.read_state(resume) if resume else None
        if saved:
            self._check_same_data(saved)
            check_resume_recipe(saved.get("recipe"), r.to_dict())
        universal = saved is not None and saved["world_size"] != env.world_size
        self.ds_config = deepspeed_config(r, env.world_size, load_universal=universal)
        model = self._load_model()
        optimizer = make_optimizer(model, r, env.device, offloads_optimizer(self.ds_config))
        self.optimizer = optimizer  # ours, the base optimizer under every ZeRO stage
        self.engine, self.scheduler = initialize(model, optimizer, self._scheduler, self.ds_config)
        self.teacher = self._load_teacher()
        if resume:
            state = checkpointing.load(
                self.engine, resume, env.rank, env.world_size, r.checkpoint.trust_pickles
            )
            self.start_step = state["step"]
            self.last_eval_ppl = state.get("last_eval_ppl")
            self.skipped_steps = list(state.get("skipped_nonfinite", []))
        if env.is_main:  # a fresh start drops rows of a run that died before its first checkpoint
            truncate_metrics(self.run_dir, self.start_step if resume else -1)
        self.metrics = MetricsLogger(
            self.run_dir, r, env.is_main, self.total_steps, self.start_step
        )
        self._announce(resume)

    def _model_dir(self) -> Path:
        """`model.path`, or `model.source` converted once (rank 0) into RUN_DIR/converted."""
        m = self.recipe.model
        if m.path:
            return self._located(m.path)
        target = self.run_dir / "converted"
        if self.env.is_main and not (target / "config.json").is_file():
            from ..convert.api import convert_checkpoint

            convert_checkpoint(m.source, target, m.convert_options(), quiet=True)
        _barrier()
        return target

    def _located(self, name: str) -> Path:
        """`model.path` as a directory: a Hub id is downloaded once (rank 0 first; the other
        ranks then read the Hub cache)."""
        from ..convert.api import locate_source

        located = self._main_first(lambda: locate_source(name))
        if located.is_gguf:
            raise SkipV1Error(
                f"`model.path` {name} is a GGUF file: set `model.source` to it instead (it is "
                "dequantized and converted into the run directory)"
            )
        return located.path

    def _teacher_dir(self) -> Path | None:
        """distill.teacher as a directory (`source` resolved; rank 0 stages a GGUF first)."""
        return self._main_first(lambda: resolve_teacher(self.recipe, self.run_dir))

    def _main_first(self, fetch: Callable):
        """fetch() on rank 0, then, after a barrier, on the other ranks: they find what rank 0
        downloaded or staged and do not race it."""
        result = fetch() if self.env.is_main else None
        _barrier()
        return result if self.env.is_main else fetch()

    def _eval_blocks(self) -> np.ndarray | None:
        r, ws = self.recipe, self.env.world_size
        if r.data.eval is None or r.eval.blocks == 0:
            return None
        blocks = load_blocks(r.data.eval, self.tokenizer, r.data.seq_len, "eval", r.eval.blocks)
        usable = len(blocks) // ws * ws  # every rank runs the same number of forwards (ZeRO-3)
        if usable == 0:
            raise SkipV1Error(
                f"the eval data gives {len(blocks)} blocks, fewer than the {ws} ranks: add eval "
                "data, lower data.seq_len, or set data.eval: null"
            )
        return blocks[:usable]

    def _check_same_data(self, saved: dict) -> None:
        now = self._data_fingerprint()
        for key, value in saved["data"].items():
            if now.get(key) != value:
                raise SkipV1Error(
                    f"cannot resume: `{key}` was {value!r} in the checkpoint and is "
                    f"{now.get(key)!r} now, which changes the data order; restore it or use a "
                    "new --run-dir"
                )

    def _data_fingerprint(self) -> dict:
        r = self.recipe
        return {
            "data.train": repr(r.data.train),
            "data.seq_len": r.data.seq_len,
            "data.seed": r.data.seed,
            "data.streaming": r.data.streaming,
            "batch.global_batch_tokens": r.batch.global_batch_tokens,
        }

    def _load_model(self) -> torch.nn.Module:
        from transformers import AutoModelForCausalLM

        keep_alive = None
        if zero_stage(self.ds_config) == 3:  # let from_pretrained partition as it loads
            from transformers.integrations import HfDeepSpeedConfig

            keep_alive = HfDeepSpeedConfig(self.ds_config)
        model = AutoModelForCausalLM.from_pretrained(
            self.model_dir,
            dtype=torch_dtype(self.recipe.model.dtype),
            trust_remote_code=self.recipe.model.trust_remote_code,
        )
        # transformers holds it by weak reference: dropping it stops later from_config calls
        # (the export's meta-device model) from being partitioned with collectives
        del keep_alive
        model.config.use_cache = False
        if self.recipe.model.gradual_fraction:
            self.gradual = self._gradual_conversion(model)
        if self.recipe.model.gradient_checkpointing:
            # non-reentrant: layer 0's value tensor is reused by every later layer
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        model.train()
        return model

    def _gradual_conversion(self, model: torch.nn.Module) -> GradualConversion:
        m = self.recipe.model
        if not is_skipv1(self.model_config):
            raise SkipV1Error("`model.gradual_fraction` needs a SkipV1 model to train")
        source = m.source if m.source and (Path(m.source) / "config.json").is_file() else None
        ramp = max(1, round(m.gradual_fraction * self.total_steps))
        return GradualConversion(model, Path(source or self.teacher_dir), ramp, self.model_dir)

    def _load_teacher(self) -> torch.nn.Module | None:
        """The frozen teacher, replicated whole on every rank (also under ZeRO-3: it is loaded
        after the student, with no DeepSpeed config alive, so nothing partitions it)."""
        if self.teacher_dir is None:
            return None
        from transformers import AutoModelForCausalLM

        config = read_config(self.teacher_dir)
        check_supported(config)
        if config["vocab_size"] != self.model_config["vocab_size"]:
            raise SkipV1Error(
                f"`distill.teacher` has a vocabulary of {config['vocab_size']} and the model "
                f"{self.model_config['vocab_size']}: the teacher must share the tokenizer"
            )
        teacher = AutoModelForCausalLM.from_pretrained(
            self.teacher_dir,
            dtype=torch_dtype(self.recipe.model.dtype),
            trust_remote_code=self.recipe.model.trust_remote_code,
        )
        teacher.config.use_cache = False
        return teacher.requires_grad_(False).eval().to(self.env.device)

    def _micro_step(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Forward + backward of one micro-batch: (loss, KL term or None)."""
        if self.teacher is None:
            loss = self.engine(input_ids=ids, labels=ids, use_cache=False).loss
            self.engine.backward(loss)
            return loss.detach(), None
        d = self.recipe.distill
        hidden = dict(output_hidden_states=True) if d.hidden else {}
        with torch.no_grad():
            teacher_out = self.teacher(input_ids=ids, use_cache=False, **hidden)
        student_out = self.engine(input_ids=ids, use_cache=False, **hidden)
        out = distillation_loss(
            student_out.logits, teacher_out.logits, ids, self._alpha(), d.temperature
        )
        loss = out.loss
        if d.hidden:
            loss = loss + d.hidden * hidden_state_loss(
                student_out.hidden_states, teacher_out.hidden_states
            )
        del teacher_out, student_out
        self.engine.backward(loss)
        return loss.detach(), out.kl

    def _alpha(self) -> float:
        d = self.recipe.distill
        if d.alpha_end is None:
            return d.alpha
        return alpha_at(d.alpha, d.alpha_end, max(self.step - 1, 0), self.total_steps)

    def _scheduler(self, optimizer):
        o = self.recipe.optim
        return make_scheduler(
            optimizer,
            self.total_steps,
            o.warmup_fraction,
            o.min_lr_ratio,
            o.attention_first_fraction,
        )

    def plan(self) -> dict:
        """Tokens, steps, FLOPs and the share of the source's pretraining compute."""
        r = self.recipe
        params = count_parameters(self.model_config)
        source_params = count_parameters(self.model_config, 0)
        tokens = self.total_steps * r.batch.global_batch_tokens
        teacher = self.teacher_dir
        teacher_params = count_parameters(read_config(teacher)) if teacher else 0
        teacher_flops = 2 * teacher_params * tokens  # forward only
        flops = 6 * params * tokens + teacher_flops
        pre = r.budget.pretraining_tokens
        return {
            "model": str(self.model_dir),
            "skip_v_heads": self.model_config.get("skip_v_heads", 0),
            "parameters": params,
            "tokens": tokens,
            "steps": self.total_steps,
            "tokens_per_step": r.batch.global_batch_tokens,
            "train_flops": flops,
            "teacher": str(teacher) if teacher else None,
            "teacher_parameters": teacher_params,
            "teacher_flops": teacher_flops,
            "pretraining_fraction": flops / (6 * source_params * pre) if pre else None,
            "world_size": self.env.world_size,
            "gradient_accumulation": self.ds_config["gradient_accumulation_steps"],
            "zero_stage": zero_stage(self.ds_config),
            "dtype": r.model.dtype,
            "trust_remote_code": r.model.trust_remote_code,
        }

    def _announce(self, resume: Path | None) -> None:
        if not self.env.is_main:
            return
        self.info = self.plan()
        (self.run_dir / "recipe.yaml").write_text(self.recipe.to_yaml())
        p, log = self.info, self.metrics.print
        log("resolved recipe (saved to recipe.yaml):\n" + self.recipe.to_yaml())
        if not is_skipv1(self.model_config):
            log(f"note: {self.model_dir} is not a SkipV1 checkpoint; training it as it is")
        frac = p["pretraining_fraction"]
        log(
            f"budget: {p['tokens']:,} tokens = {p['steps']:,} steps x {p['tokens_per_step']:,} "
            f"tokens/step; {p['parameters']:,} parameters; ~{p['train_flops']:.3g} training FLOPs "
            + (
                f"(6 x params x tokens + 2 x teacher params x tokens = "
                f"{p['train_flops'] - p['teacher_flops']:.3g} + {p['teacher_flops']:.3g} for the "
                f"teacher's {p['teacher_parameters']:,} parameters); "
                if p["teacher"]
                else "(6 x params x tokens); "
            )
            + (
                f"{frac * 100:.3g}% of the source's pretraining compute"
                if frac
                else "pretraining compute unknown"
            )
        )
        log(
            f"{p['world_size']} rank(s) x micro-batch {self.recipe.batch.micro_batch_size} x "
            f"{p['gradient_accumulation']} accumulation steps; ZeRO-{p['zero_stage']}; {p['dtype']}"
        )
        epochs = getattr(self.train_data, "epochs_for", None)
        if epochs and epochs(self.total_steps) > 1:
            log(f"note: the budget reads the train data {epochs(self.total_steps):.1f} times")
        if resume:
            log(f"resuming from {resume} (step {self.start_step})")

    # ---------------------------------------------------------------- train
    def train(self) -> None:
        r, env, engine = self.recipe, self.env, self.engine
        if self.start_step == 0:
            self.validate(0)
        batches = self.train_data.batches(self.start_step, env.rank, env.world_size)
        for step in range(self.start_step + 1, self.total_steps + 1):
            faults.point("train-step")
            self.step = step
            fetch = time.perf_counter()
            rows = next(batches)  # this rank's part of the global batch
            started = time.perf_counter()
            if self.gradual:
                self.gradual.set_step(step - 1)
            lr = self.scheduler.get_last_lr()[0]
            losses, kls = [], []
            micros = rank_micro_batches(rows, 0, 1, r.batch.micro_batch_size)
            for i, micro in enumerate(micros):
                loss, kl = self._micro_step(torch.from_numpy(micro).to(env.device))
                losses.append(loss.float())
                if kl is not None:
                    kls.append(kl.float())
                if i == len(micros) - 1:  # the optimizer update comes next: is the loss finite?
                    loss = _mean_over_ranks(torch.stack(losses).mean())
                    finite = math.isfinite(loss)
                    if not finite and len(self.skipped_steps) >= r.optim.skip_nonfinite:
                        break  # stopped below, before any update
                    self.optimizer.skip_next = not finite
                engine.step()
                self.optimizer.skip_next = False
            elapsed = time.perf_counter() - started
            record = {
                "step": step,
                "tokens": step * r.batch.global_batch_tokens,
                "loss": loss,
                "lr": lr,
                "grad_norm": _grad_norm(engine),
                "tokens_per_s": r.batch.global_batch_tokens / elapsed,
                "data_s": started - fetch,  # reading this rank's rows (not in tokens_per_s)
                **flops_fields(
                    self.flops_per_token,
                    r.batch.global_batch_tokens / elapsed,
                    env.world_size,
                    self.peak_flops,
                ),
                "time": time.time(),
            }
            if kls:
                record["distill_kl"] = _mean_over_ranks(torch.stack(kls).mean())
                if r.distill.alpha_end is not None:
                    record["distill_alpha"] = self._alpha()
            if self.gradual:
                record["value_mix"] = self.gradual.mix_at(step - 1)
            if not finite and len(self.skipped_steps) < r.optim.skip_nonfinite:
                self.skipped_steps.append(step)
                record["skipped"] = True
            self.metrics.step(record)
            if not finite:
                if not record.get("skipped"):
                    raise SkipV1Error(self._non_finite_message(loss, step))
                self.metrics.print(
                    f"warning: loss is {loss} at step {step}: skipped the step (no optimizer "
                    f"update; {len(self.skipped_steps)} of optim.skip_nonfinite="
                    f"{r.optim.skip_nonfinite} skips used)"
                )
            last = step == self.total_steps
            if r.eval.every and step % r.eval.every == 0 and not last:
                self.validate(step)
            if (r.checkpoint.every and step % r.checkpoint.every == 0) or last:
                if last:
                    self.validate(step)
                self.save_checkpoint(step)

    def _non_finite_message(self, loss: float, step: int) -> str:
        """The run stops before this step is checkpointed, so the latest checkpoint is good."""
        found = checkpointing.complete_checkpoints(self.ckpt_dir)
        latest = (
            f"the latest checkpoint, {found[-1].name}, is from before it"
            if found
            else ("no checkpoint was written yet")
        )
        skipped = self.skipped_steps
        if skipped:
            latest += (
                f"; {len(skipped)} earlier non-finite step(s) were skipped, the most "
                f"optim.skip_nonfinite allows (steps {', '.join(map(str, skipped))})"
            )
        return (
            f"loss is {loss} at step {step}: stopped before checkpointing this step, with no "
            f"optimizer update ({latest}); check the data or lower optim.lr (a new --run-dir), "
            "or raise optim.skip_nonfinite to skip such steps, then rerun to resume"
        )

    def peer_lost_message(self, err: BaseException) -> str:
        """One line for a rank whose collective failed because another rank is gone."""
        found = checkpointing.complete_checkpoints(self.ckpt_dir)
        resume = f"from {found[-1].name}" if found else "from the start (no checkpoint yet)"
        cause = "did not answer" if "timed out" in str(err).lower() else "is gone"
        where = f"at step {self.step}" if self.step else "during setup or export"
        return (
            f"rank {self.env.rank}: another rank {cause} ({where}; collectives wait at most "
            f"deepspeed.timeout_s = {self.recipe.deepspeed.timeout_s} s): a rank or node died "
            f"or hangs; this rank stopped. Rerun the same command on every node to resume "
            f"{resume}"
        )

    @torch.no_grad()
    def validate(self, step: int) -> float | None:
        """Perplexity over the eval blocks, each rank taking an equal share."""
        if self.eval_blocks is None:
            return None
        env, engine, micro = self.env, self.engine, self.recipe.batch.micro_batch_size
        if self.gradual:
            self.gradual.set_step(step)
        mine = self.eval_blocks[env.rank :: env.world_size]
        total = torch.zeros(2, dtype=torch.float64, device=env.device)
        engine.eval()
        for i in range(0, len(mine), micro):
            ids = torch.from_numpy(mine[i : i + micro]).to(env.device)
            loss = engine(input_ids=ids, labels=ids, use_cache=False).loss
            predicted = ids.shape[0] * (ids.shape[1] - 1)
            total += torch.stack([loss.double() * predicted, torch.tensor(predicted).double()])
        engine.train()
        if dist.is_initialized():
            dist.all_reduce(total)
        eval_loss = (total[0] / total[1]).item()
        self.last_eval_ppl = math.exp(eval_loss)
        self.metrics.eval(
            {
                "step": step,
                "tokens": step * self.recipe.batch.global_batch_tokens,
                "eval_loss": eval_loss,
                "eval_ppl": self.last_eval_ppl,
            }
        )
        return self.last_eval_ppl

    def save_checkpoint(self, step: int) -> Path:
        state = {
            "step": step,
            "tokens": step * self.recipe.batch.global_batch_tokens,
            "next_block": step * self.recipe.blocks_per_step,  # data position (world-size free)
            "world_size": self.env.world_size,
            "zero_stage": zero_stage(self.ds_config),
            "model_dir": str(self.model_dir.resolve()),
            "data": self._data_fingerprint(),
            "last_eval_ppl": self.last_eval_ppl,
            "skipped_nonfinite": self.skipped_steps,
            "export_info": self.plan(),
            "recipe": self.recipe.to_dict(),
        }
        return checkpointing.save(
            self.engine, self.ckpt_dir, state, self.env.rank, self.recipe.checkpoint.keep_last
        )

    def export(self, max_shard_bytes: int = SHARD_BYTES) -> Path | None:
        """RUN_DIR/export from the live engine's weights (all ranks call; rank 0 writes)."""
        if self.gradual:
            self.gradual.set_step(self.total_steps)
        weights = iter_live_weights(self.engine, self.env.rank)
        dst = None
        if self.env.is_main:
            info = dict(self.plan(), final_eval_ppl=self.last_eval_ppl)
            try:
                dst = write_export(
                    weights,
                    self.model_dir,
                    self.run_dir / "export",
                    info,
                    self.recipe.to_yaml(),
                    overwrite=True,
                    max_shard_bytes=max_shard_bytes,
                )
            finally:  # a failed write still takes part in the other ranks' gathers
                for _ in weights:
                    pass
            self.metrics.print(f"exported to {dst}")
        else:
            for _ in weights:  # send this rank's partitions to rank 0, one tensor at a time
                pass
        _barrier()
        return dst

    def close(self) -> None:
        self.metrics.close()


def run(recipe: Recipe) -> None:
    """What every rank runs."""
    trainer = UptrainRecipe(recipe)
    try:
        trainer.setup()
        try:
            trainer.train()
            if recipe.export:
                trainer.export()
        finally:
            trainer.close()
    except RuntimeError as err:
        if trainer.env.world_size > 1 and peer_failure(err):
            raise PeerLost(trainer.peer_lost_message(err)) from None
        raise
    release_distributed()


class PeerLost(SkipV1Error):
    """Printed by every surviving rank (the dead one cannot print), not only rank 0."""

    every_rank = True


# Recipe keys a resumed run may change: they do not alter what the run computes.
RESUMABLE_CHANGES = (
    "log.",
    "eval.",
    "checkpoint.",
    "deepspeed.offload_optimizer",
    "deepspeed.offload_params",
    "deepspeed.config",
    "deepspeed.timeout_s",
    "optim.skip_nonfinite",
    "export",
    "run_dir",
    # where the token store lives and how it is built; its identity is checked on open
    "data.store",
    "data.cache_dir",
    "data.num_proc",
    "data.store_timeout",
)


def check_resume_recipe(saved: dict | None, now: dict) -> None:
    """Refuses a resume whose recipe differs from the checkpoint's in a key that changes the
    training (the run would go on with the old values while recipe.yaml shows the new ones)."""
    if saved is None:  # a checkpoint written before the recipe was saved in it
        return
    old, new = _flatten(saved), _flatten(now)
    changed = [
        k
        for k in sorted(set(old) | set(new))
        if old.get(k) != new.get(k) and not k.startswith(RESUMABLE_CHANGES)
    ]
    if changed:
        shown = ", ".join(f"`{k}` {old.get(k)!r} -> {new.get(k)!r}" for k in changed[:3])
        raise SkipV1Error(
            f"cannot resume: the recipe changed since the checkpoint ({shown}); restore the "
            "checkpoint's values, or give a new --run-dir to train with the new ones"
        )


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in d.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def lock_run_dir(run_dir: Path):
    """An exclusive lock on RUN_DIR/.lock for this process's life (the OS drops it when the
    process dies, even by kill -9): a second run on the same directory is refused."""
    import fcntl

    handle = open(run_dir / ".lock", "a+")  # noqa: SIM115  (held until the process exits)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        owner = handle.read().strip() or "another process"
        handle.close()
        raise SkipV1Error(
            f"{run_dir} is in use by a running uptrain ({owner}): wait for it to finish, stop it, "
            "or give another --run-dir"
        ) from None
    handle.truncate(0)
    handle.write(f"pid {os.getpid()}\n")
    handle.flush()
    return handle


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _load_tokenizer(model_dir: Path, trust_remote_code: bool):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    except Exception as err:  # the user needs the directory and the cause
        raise SkipV1Error(f"cannot load the tokenizer of {model_dir}: {err}") from None


def _mean_over_ranks(value: torch.Tensor) -> float:
    value = value.detach().clone()
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(value)
        value /= dist.get_world_size()
    return value.item()


def _grad_norm(engine) -> float | None:
    norm = engine.get_global_grad_norm()
    if norm is None:
        return None
    return float(norm.item() if torch.is_tensor(norm) else norm)


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _quiet_libraries(is_main: bool) -> None:
    from deepspeed.utils import logger as ds_logger

    ds_logger.setLevel(logging.WARNING)
    if not is_main:
        warnings.simplefilter("ignore")
        import transformers

        transformers.logging.set_verbosity_error()

"""metrics.jsonl as a kill leaves it: a cut last line is dropped with a warning on resume."""

import json

import pytest

from skipv1.errors import SkipV1Error
from skipv1.uptrain.metrics import METRICS_FILE, read_metrics, truncate_metrics


def test_a_cut_last_line_is_dropped(tmp_path):
    rows = [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.5}]
    text = "".join(json.dumps(r) + "\n" for r in rows) + '{"step": 3, "lo'
    (tmp_path / METRICS_FILE).write_text(text)
    assert read_metrics(tmp_path) == rows
    truncate_metrics(tmp_path, 1)  # what resume does
    assert read_metrics(tmp_path) == rows[:1]


def test_a_damaged_line_in_the_middle_is_an_error_naming_it(tmp_path):
    (tmp_path / METRICS_FILE).write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(SkipV1Error, match="line 2 is not JSON"):
        read_metrics(tmp_path)


def test_damaged_checkpoints_are_skipped_for_the_previous_complete_one(tmp_path):
    import torch

    from skipv1.uptrain.checkpointing import COMPLETE, STATE_FILE, complete_checkpoints

    def checkpoint(step, state='{"step": 1}', cut=False):
        path = tmp_path / f"step_{step:08d}"
        path.mkdir()
        (path / STATE_FILE).write_text(state)
        torch.save({"x": torch.ones(3)}, path / "mp_rank_00_model_states.pt")
        if cut:
            data = (path / "mp_rank_00_model_states.pt").read_bytes()
            (path / "mp_rank_00_model_states.pt").write_bytes(data[: len(data) // 2])
        (path / COMPLETE).write_text("")
        return path

    good = checkpoint(1)
    checkpoint(2, cut=True)
    checkpoint(3, state="{not json")
    (checkpoint(4) / STATE_FILE).unlink()
    assert complete_checkpoints(tmp_path) == [good]

"""The one line `skipv1 uptrain --nproc N` prints for a torchrun whose ranks failed, from the
failure records torchrun hands back (real ProcessFailure / ChildFailedError objects). The
end-to-end kill is in test_uptrain_deepspeed.py; the records here pin the race it can hit: the
killed rank and the survivor that lost it recorded in the same second."""

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from skipv1.uptrain.launch import failure_message

LOST = "rank 0: another rank is gone (at step 2); rerun the same command to resume"


def failed(*exits: int, timestamps: tuple[int, ...] | None = None) -> ChildFailedError:
    failures = {}
    for rank, code in enumerate(exits):
        failure = ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=code, error_file="")
        failure.timestamp = (timestamps or (100,) * len(exits))[rank]
        failures[rank] = failure
    return ChildFailedError("skipv1.uptrain", failures)


def test_a_sigkilled_rank_is_named_over_a_survivor_that_aborted_in_the_same_second():
    line = failure_message(failed(-6, -9), LOST)  # rank 0 SIGABRT, rank 1 SIGKILL
    assert line.startswith("rank 1 was killed by SIGKILL"), line
    assert line.endswith("; then " + LOST), line


def test_a_sigkilled_rank_is_named_over_a_survivor_that_exited_with_its_report():
    line = failure_message(failed(2, -9), LOST)
    assert (
        line == f"rank 1 was killed by SIGKILL (the out-of-memory killer or a kill -9); then {LOST}"
    )


def test_a_rank_that_reported_its_own_error_first_gives_that_error_alone():
    assert failure_message(failed(2, -15, timestamps=(100, 101)), "bad recipe") == "bad recipe"


def test_without_a_sigkill_the_earliest_failure_is_named():
    line = failure_message(failed(-6, -11, timestamps=(102, 101)), None)
    assert line.startswith("rank 1 was killed by SIGSEGV; then the other ranks were stopped"), line


def test_a_rank_stopped_by_sigterm_in_the_same_second_gives_way_to_the_rank_that_reported():
    """Rank 1's data error (exit 2, its line) and rank 0 stopped by torchrun's SIGTERM, seen in
    one poll: the report, not the stop."""
    assert failure_message(failed(-15, 2), "the train data gives 3 blocks") == (
        "the train data gives 3 blocks"
    )

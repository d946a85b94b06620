"""convert's shard layout against huggingface_hub's splitter: the same shards while every tensor
fits the limit; with a tensor larger than the limit, ours keeps read order (the reason we keep
our own: the converter streams tensors in read order into shards as they fill)."""

from huggingface_hub import split_state_dict_into_shards_factory

from skipv1.convert.plan import shard_layout, shard_layout_by_source_file


def hub_layout(sizes: list[tuple[str, int]], limit: int) -> list[list[str]]:
    split = split_state_dict_into_shards_factory(
        dict(sizes),
        max_shard_size=limit,
        get_storage_size=lambda n: n,
        get_storage_id=lambda n: None,
        filename_pattern="model{suffix}.safetensors",
    )
    return [list(names) for names in split.filename_to_tensors.values()]


def test_same_layout_as_the_hub_while_every_tensor_fits():
    sizes = [(f"t{i}", size) for i, size in enumerate([30, 50, 20, 70, 10, 10, 90, 5, 40])]
    for limit in (90, 100, 150, 1000):
        assert shard_layout(sizes, limit) == hub_layout(sizes, limit), limit


def test_a_tensor_above_the_limit_gets_its_own_shard_in_read_order():
    sizes = [("a", 30), ("big", 500), ("b", 30), ("c", 30)]
    assert shard_layout(sizes, 100) == [["a"], ["big"], ["b", "c"]]
    assert hub_layout(sizes, 100) == [["big"], ["a", "b", "c"]]  # out of read order


def test_a_layout_by_source_file_never_puts_two_source_files_in_one_shard():
    sizes = [("a", 5), ("b", 5), ("c", 5), ("d", 5), ("e", 5)]
    file_of = {"a": "1", "b": "1", "c": "2", "d": "2", "e": "2"}
    assert shard_layout_by_source_file(sizes, file_of, 100) == [["a", "b"], ["c", "d", "e"]]
    assert shard_layout_by_source_file(sizes, file_of, 10) == [["a", "b"], ["c", "d"], ["e"]]

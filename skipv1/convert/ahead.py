"""Rewrites computed a little ahead, on a second thread, while the writer copies the bytes of
the unchanged tensors before them: the numpy work of `--init keep/mean` (a later layer's v_proj
mean, a dtype cast) then overlaps the kernel copies instead of following them. numpy releases
the GIL inside each operation and copy_file_range releases it for the whole copy."""

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

# Rewrites in flight at most: each holds one rewritten tensor (and its mapped source) in memory.
DEPTH = 2


def converted_ahead(
    items: Iterable[tuple[str, object]],
    needs: Callable[[str], bool],
    convert: Callable[[str, object], object],
    depth: int = DEPTH,
) -> Iterator[tuple[str, object]]:
    """(name, item), or (name, convert(name, item)) where `needs(name)`, in the order of
    `items`; the conversions run on a worker thread up to `depth` ahead of what is yielded.
    An exception in a conversion is raised where its result would have been yielded."""
    queue: deque[tuple[str, object]] = deque()
    in_flight = 0
    with ThreadPoolExecutor(1, thread_name_prefix="skipv1-rewrite") as pool:
        for name, item in items:
            if needs(name):
                item = pool.submit(convert, name, item)
                in_flight += 1
            queue.append((name, item))
            while in_flight >= depth:  # up to and including the oldest conversion
                name, item = queue.popleft()
                if isinstance(item, Future):
                    in_flight -= 1
                    item = item.result()
                yield name, item
        while queue:
            name, item = queue.popleft()
            yield name, item.result() if isinstance(item, Future) else item

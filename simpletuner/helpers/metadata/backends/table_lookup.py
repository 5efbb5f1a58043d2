"""Where each of a metadata table's file names stands in the listing: whole Arrow columns,
hashed by pyarrow's ``index_in`` (which releases the GIL) in threads, no Python str per name.

A hash table of a million names is a cache miss per insert and per probe. A sorted listing is
cut into parts small enough for a core's cache, and each name goes only to the part whose
range holds it (a binary search among the parts' first names): the parts cost a fraction of the
one big table (benchmarks/PERFORMANCE.md, "Parquet metadata").
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

NOT_LISTED = -1  # a name's position when the listing does not hold it
SORTED_PART = 1 << 15  # listed names hashed together: the table stays in a core's L2 cache
UNSORTED_PART = 1 << 16  # names a thread hashes at least, when every part sees every name


def positions_in_sorted(names, known, threads: int, part_size: int = SORTED_PART) -> np.ndarray:
    """The position of each of ``names`` (Arrow strings, nulls allowed) in ``known`` (Arrow
    strings in byte order, each once, as a listing is), else NOT_LISTED."""
    import pyarrow

    firsts = np.arange(0, max(len(known), 1), part_size)
    part_of = _routed(names, known.take(pyarrow.array(firsts[1:])), threads)
    order = np.argsort(part_of, kind="stable")  # the names of each part together
    cuts = np.searchsorted(part_of[order], np.arange(len(firsts) + 1))
    grouped = names.take(pyarrow.array(order)) if len(firsts) > 1 else names

    def look_up(part: int) -> np.ndarray:
        probed = grouped.slice(cuts[part], cuts[part + 1] - cuts[part])
        return _positions_in_part(probed, known, int(firsts[part]), part_size)

    with ThreadPoolExecutor(threads) as pool:
        in_parts = list(pool.map(look_up, range(len(firsts))))
    found = np.empty(len(names), np.int64)
    found[order] = np.concatenate(in_parts)
    return found


def _positions_in_part(names, known, first: int, length: int) -> np.ndarray:
    """The position of each of ``names`` in ``known[first:first + length]``, counted from the
    start of ``known``; NOT_LISTED where it is not there."""
    import pyarrow.compute as pc

    found = pc.index_in(names, value_set=known.slice(first, length)).cast("int64")
    return pc.fill_null(pc.add(found, first), NOT_LISTED).to_numpy(zero_copy_only=False)


def _routed(names, bounds, threads: int) -> np.ndarray:
    """For each name, the number of ``bounds`` (sorted) at or before it: its part. A null
    goes to part 0, where it matches nothing. Searched a slice per thread."""
    import pyarrow.compute as pc

    kind = np.min_scalar_type(len(bounds))  # 16 bits: argsort's radix sort
    if not len(bounds):
        return np.zeros(len(names), kind)
    step = max(1, -(-len(names) // threads))

    def route(first: int) -> np.ndarray:
        part = pc.search_sorted(bounds, names.slice(first, step), side="right")
        return pc.fill_null(part, 0).to_numpy(zero_copy_only=False).astype(kind)

    with ThreadPoolExecutor(threads) as pool:
        return np.concatenate([np.zeros(0, kind),
                               *pool.map(route, range(0, len(names), step))])


def positions_in(names, known, threads: int, part_size: int = UNSORTED_PART) -> np.ndarray:
    """The first position of each of ``names`` in ``known`` (Arrow strings in any order, a
    name possibly more than once), else NOT_LISTED. ``known`` is cut into parts, one per
    thread, each hashed and probed with every name; the earliest part's match wins."""
    step = max(1, -(-len(known) // max(1, min(threads, len(known) // part_size))))
    found = np.full(len(names), NOT_LISTED, np.int64)
    with ThreadPoolExecutor(threads) as pool:
        for in_part in pool.map(lambda first: _positions_in_part(names, known, first, step),
                                range(0, max(len(known), 1), step)):
            found = np.where(found < 0, in_part, found)  # in order: the first position wins
    return found

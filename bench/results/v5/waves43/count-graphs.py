"""Graph runs per llama_decode call from count-graphs.patch's logs (one file per worker process).

    python bench/results/v5/waves43/count-graphs.py /tmp/slots.*

A call's one-token rows run as one graph per run of consecutive slots (llama.cpp's split_equal on
a per-session KV cache takes only increasing, consecutive sequence ids into one ubatch)."""

from __future__ import annotations

import ast
import collections
import itertools
import json
import sys


def summary(path: str) -> dict[str, object]:
    shapes: collections.Counter[str] = collections.Counter()
    role, calls, rows, graphs = "", 0, 0, 0
    with open(path) as log:
        for line in log:
            role, rest = line.split(" ", 1)
            cut = rest.index("] [")
            slots, tokens = ast.literal_eval(rest[: cut + 1]), ast.literal_eval(rest[cut + 2 :])
            if any(n > 1 for n in tokens):
                continue  # prefill chunks: one session a call
            runs = 1 + sum(1 for a, b in itertools.pairwise(slots) if b != a + 1)
            shapes[f"{len(slots)} rows in {runs} graph(s)"] += 1
            calls, rows, graphs = calls + 1, rows + len(slots), graphs + runs
    one_row_graph_rows = sum(n for shape, n in shapes.items() if shape.startswith("1 rows"))
    return {
        "role": role,
        "decode_calls": calls,
        "rows": rows,
        "graphs": graphs,
        "rows_per_graph": round(rows / graphs, 3) if graphs else None,
        "rows_in_one_row_calls": one_row_graph_rows,
        "calls_by_shape": dict(sorted(shapes.items())),
    }


if __name__ == "__main__":
    print(json.dumps([summary(path) for path in sys.argv[1:]], indent=1))

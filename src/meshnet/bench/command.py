"""What ``meshnet bench`` and ``meshnet gate`` do, so the CLI's handlers stay a few lines each."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from meshnet.bench.config import BenchConfig
from meshnet.core.errors import InvalidArgument, MeshnetError

Printer = Callable[[str], None]
GATE_UNREADABLE_EXIT = 3
"""Exit code when the results or the contract cannot be read or are invalid: distinct from optimize/stop."""


def bench_command(config: BenchConfig, *, out: Path, report_dir: Path | None, say: Printer, note: Printer) -> int:
    """Run the bench, write results (and the report); 0, or 1 when the results break the schema."""
    from meshnet.bench.report import headline_table, write_report
    from meshnet.bench.results_file import write_results
    from meshnet.bench.suite import run_bench

    results = run_bench(config, progress=note)
    problems = write_results(results, out)
    say(headline_table(results))
    say(f"results: {out}")
    if report_dir is not None:
        say(f"report:  {write_report(results, report_dir)}")
    for problem in problems:
        note(f"schema: {problem}")
    return 1 if problems else 0


def gate_command(
    results_path: Path, contract_path: Path | None, say: Printer, note: Printer, inputs: tuple[str, ...] = ()
) -> int:
    """Print the verdict; exit 0 promote, 1 optimize, 2 stop, 3 when an input cannot be read or
    the results break their schema. ``inputs``: NAME=PATH of the further results files the
    contract names (``gate.with_inputs``)."""
    from meshnet.bench.gate import evaluate, load_contract, missing_inputs, render, with_inputs
    from meshnet.bench.results_file import read_document

    try:
        contract = load_contract(contract_path)
        others = {name: read_document(Path(path)) for name, path in (_named_input(text) for text in inputs)}
        document = with_inputs(read_document(results_path), others) if others else read_document(results_path)
        verdict = evaluate(document, contract)
    except MeshnetError as error:
        note(f"meshnet gate: {error.message}")
        return GATE_UNREADABLE_EXIT
    for missing in missing_inputs(contract, set(others)):
        note(f"meshnet gate: input not given, its checks are not measured: {missing}")
    for line in render(verdict):
        say(line)
    return verdict.exit_code


def _named_input(text: str) -> tuple[str, str]:
    name, sign, path = text.partition("=")
    if not sign or not name or not path:
        raise InvalidArgument(f"an input is NAME=PATH, got {text!r}")
    return name, path

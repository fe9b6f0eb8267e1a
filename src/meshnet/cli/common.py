"""What every ``meshnet`` subcommand module shares: the command table's entry, the default model,
progress lines for humans. Kept apart from ``cli`` so each family of commands lives in its own
module without importing the parser that lists them."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from meshnet.core.errors import FailedPrecondition

Handler = Callable[[argparse.Namespace], int]


@dataclass(frozen=True)
class Command:
    """One subcommand: what it runs, its one-line help, and the configs its flags come from."""

    run: Handler
    help: str
    configs: tuple[type, ...] = ()
    skip: tuple[str, ...] = ("data_dir",)
    """Config fields with no flag of their own: ``data_dir`` is the global ``--data-dir``."""
    build: Callable[[argparse.ArgumentParser], None] | None = None
    """Adds arguments no config describes (a command group's own subcommands)."""


def provisioned_model(data_dir: Path) -> Path:
    """The default model under ``data_dir``, or a clear error when it is not there yet."""
    from meshnet.artifact.provision import model_path

    path = model_path(data_dir / "models")
    if not path.exists():
        raise FailedPrecondition(f"the default model is not provisioned at {path}: run `meshnet provision`")
    return path


def progress_printer() -> Callable[[str, int, int], None]:
    last = [0.0]

    def show(stage: str, done: int, total: int) -> None:
        now = time.monotonic()
        if done == total or now - last[0] > 0.2:
            last[0] = now
            percent = 100.0 * done / max(total, 1)
            end = "\n" if done == total else ""
            print(f"\r{stage:8s} {done / 1e6:8.1f} / {total / 1e6:.1f} MB  {percent:5.1f}%", end=end, flush=True)

    return show


def stderr_progress(stage: str) -> Callable[[int, int], None]:
    last = [0.0]

    def show(done: int, total: int) -> None:
        now = time.monotonic()
        if done == total or now - last[0] > 0.2:
            last[0] = now
            end = "\n" if done == total else ""
            mb = f"{done / 1e6:8.1f} / {total / 1e6:.1f} MB"
            print(f"\r{stage:8s} {mb}  {100.0 * done / max(total, 1):5.1f}%", end=end, file=sys.stderr, flush=True)

    return show

"""The ready-line grammar: the one line each long-running component prints on stdout once it
serves, and how the launchers that wait for it read it back.

`meshnet up`, the lab, the bench and the test harnesses start components as processes and learn
what they bound from this line: ``process.launcher`` waits for a line that starts with a prefix
and keeps it as a generic ``ReadyLine``. Each kind of line is one class here, so its prefix and
field names are written once: the CLI prints ``announce(WorkerLine(...))``; a launcher waits for
``WorkerLine.PREFIX`` and reads ``WorkerLine.read(child.ready)``.

A line is ``PREFIX WORD ... KEY=VALUE ...``: fields without a key are the words after the prefix,
in order (by convention the bound address first); a field marked ``to_end`` is the last and runs
to the end of the line (a model's name may hold spaces); a field that is None is not printed.
Plain strings only: the lab's delay line prints its line without loading the rest of meshnet.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from meshnet.core.errors import InvalidArgument
from meshnet.core.layers import LayerRange
from meshnet.process.launcher import ReadyLine

_KEY = "meshnet.ready.key"
_TO_END = "meshnet.ready.to_end"
Line = TypeVar("Line", bound="ReadyAnnouncement")


def key(name: str, *, to_end: bool = False) -> dict[str, Any]:
    """Field metadata of a ``name=value`` field: ``x: str = field(metadata=key("x"))`` (``to_end``:
    its value runs to the end of the line)."""
    return {_KEY: name, _TO_END: to_end}


class ReadyAnnouncement:
    """One kind of ready line: a frozen dataclass of its fields, printed and read by the rules above."""

    PREFIX: ClassVar[str]

    def __str__(self) -> str:
        words = [self.PREFIX]
        for item in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, item.name)
            if value is not None:
                name = item.metadata.get(_KEY)
                words.append(str(value) if name is None else f"{name}={value}")
        return " ".join(words)

    @classmethod
    def read(cls: type[Line], line: ReadyLine | str) -> Line:
        """The fields of a printed line (a launcher's ``ReadyLine`` or the raw text)."""
        text = line.text if isinstance(line, ReadyLine) else line
        if not text.startswith(cls.PREFIX):
            raise InvalidArgument(f"not a {cls.__name__}: {text!r} does not start with {cls.PREFIX!r}")
        ready = ReadyLine(text, cls.PREFIX)
        words, values = iter(ready.words), ready.values
        hints = typing.get_type_hints(cls)
        given: dict[str, Any] = {}
        for item in dataclasses.fields(cls):  # type: ignore[arg-type]
            name = item.metadata.get(_KEY)
            if name is None:
                raw: str | None = next(words, None)
            elif item.metadata.get(_TO_END):
                raw = ready.value_to_end(name) or None
            else:
                raw = values.get(name)
            if raw is not None:
                given[item.name] = _typed(hints[item.name], raw)
            elif item.default is dataclasses.MISSING:
                raise InvalidArgument(f"{cls.__name__}: {text!r} has no {name or item.name}")
        return cls(**given)


def _typed(kind: Any, raw: str) -> Any:
    members = [m for m in typing.get_args(kind) if m is not type(None)] or [kind]
    target = members[0]
    if target is int:
        return int(raw)
    if target is float:
        return float(raw)
    if callable(getattr(target, "parse", None)):
        return target.parse(raw)
    return raw


def announce(line: ReadyAnnouncement) -> None:
    """Print a component's ready line: the CLI's own output, read by whoever launched it."""
    print(line, flush=True)


@dataclass(frozen=True)
class TrackerLine(ReadyAnnouncement):
    """``meshnet tracker`` serves."""

    PREFIX: ClassVar[str] = "meshnet tracker listening on"
    address: str
    metrics: str | None = field(default=None, metadata=key("metrics"))
    """The Prometheus URL, when ``--metrics-port`` serves one."""


@dataclass(frozen=True)
class TrackerJoinLine(ReadyAnnouncement):
    """The tracker's join port (TLS without a client certificate), printed after its ready line."""

    PREFIX: ClassVar[str] = "meshnet tracker join port on"
    address: str


@dataclass(frozen=True)
class RelayServerLine(ReadyAnnouncement):
    """``meshnet relay`` serves: private nodes attach and dialers reach them at ``NODE@address``."""

    PREFIX: ClassVar[str] = "meshnet relay listening on"
    address: str
    """The advertised ``host:port`` (what relayed addresses name)."""
    node_id: str | None = field(default=None, metadata=key("node"))
    """The relay's own node id (its certificate's); None on a plaintext loopback swarm."""


@dataclass(frozen=True)
class WorkerLine(ReadyAnnouncement):
    """``meshnet worker`` serves a layer range (an expert group's front prints it too)."""

    PREFIX: ClassVar[str] = "meshnet worker ready"
    address: str
    node_id: str = field(metadata=key("node"))
    recipe: str = field(metadata=key("recipe"))
    """The recipe fingerprint: workers of one route must print the same."""
    metrics: str | None = field(default=None, metadata=key("metrics"))
    """The Prometheus URL, when ``--metrics-port`` serves one."""


@dataclass(frozen=True)
class RegisteredLine(ReadyAnnouncement):
    """The tracker accepted the worker: ``--layers auto`` workers started one by one wait for it,
    so each sees the range the last one took."""

    PREFIX: ClassVar[str] = "meshnet worker registered"
    node_id: str = field(metadata=key("node"))
    layers: LayerRange = field(metadata=key("layers"))
    epoch: int = field(metadata=key("epoch"))


@dataclass(frozen=True)
class ExpertNodeLine(ReadyAnnouncement):
    """``meshnet worker --experts I/N`` certified itself and connected to every peer."""

    PREFIX: ClassVar[str] = "meshnet expert node ready"
    address: str
    experts: str = field(metadata=key("experts"))
    """The node's share, I/N."""
    certified: str = field(metadata=key("certified"))
    """How many certification checks passed."""


@dataclass(frozen=True)
class GatewayLine(ReadyAnnouncement):
    """``meshnet gateway`` serves HTTP."""

    PREFIX: ClassVar[str] = "meshnet gateway ready"
    url: str
    """Its base URL, ``http(s)://host:port``."""
    model: str = field(metadata=key("model", to_end=True))
    """The name the model is served under (the GGUF's may hold spaces)."""


@dataclass(frozen=True)
class SeedLine(ReadyAnnouncement):
    """``meshnet seed`` serves a published directory's artifacts."""

    PREFIX: ClassVar[str] = "meshnet seed ready"
    address: str
    artifacts: int = field(metadata=key("artifacts"))
    models: str = field(metadata=key("models"))
    """The model ids held, comma-separated."""


@dataclass(frozen=True)
class DelayLine(ReadyAnnouncement):
    """The lab's delay line (``deploy.lab.delay_line``) listens in front of a node's worker."""

    PREFIX: ClassVar[str] = "meshnet delay line ready"
    address: str
    target: str = field(metadata=key("target"))
    delay_ms: float = field(metadata=key("delay_ms"))


@dataclass(frozen=True)
class UpLine(ReadyAnnouncement):
    """``meshnet up`` started everything and serves (tests that run ``up`` wait for it)."""

    PREFIX: ClassVar[str] = "Serving the OpenAI-compatible API at"
    url: str
    """The gateway's API base, ``http://host:port/v1`` (words after it are for the operator)."""

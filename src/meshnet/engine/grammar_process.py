"""A child process that turns JSON schemas into grammars, so no server builds one on its event loop.

``python -m meshnet.engine.grammar_process`` reads one JSON line per schema on stdin and answers
one JSON line on stdout: ``{"grammar": GBNF}``, or ``{"code": ..., "message": ...}`` with the
typed error ``json_schema_constraint`` raised (a schema too large is refused from its estimate
before anything is built). It exits when stdin closes, so it never outlives the server that
started it. The server side (``meshnet.gateway.grammars``) puts a deadline on every answer and
kills the process when one is late.
"""

from __future__ import annotations

import json
import sys
from typing import IO, Any

from meshnet.core.errors import InvalidArgument, MeshnetError
from meshnet.engine.constraints import json_schema_constraint

MODULE = "meshnet.engine.grammar_process"


def answer(line: str) -> dict[str, Any]:
    """The answer to one request line (a JSON object ``{"schema": ...}``)."""
    try:
        request = json.loads(line)
        schema = request.get("schema") if isinstance(request, dict) else None
        if not isinstance(schema, dict):
            raise InvalidArgument("a grammar request is a JSON object with a 'schema' object")
        return {"grammar": json_schema_constraint(schema).grammar}
    except MeshnetError as error:
        return {"code": error.code, "message": error.message}
    except (ValueError, RecursionError) as error:
        return {"code": InvalidArgument.code, "message": f"the JSON schema cannot be read: {error!r}"}


def serve(source: IO[str], sink: IO[str]) -> None:
    for line in source:
        sink.write(json.dumps(answer(line)) + "\n")
        sink.flush()


if __name__ == "__main__":
    serve(sys.stdin, sys.stdout)

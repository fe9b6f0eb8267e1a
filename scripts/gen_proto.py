"""Generate the Python gRPC/protobuf code from proto/meshnet/v1/*.proto (the only wire schema).

    python scripts/gen_proto.py          # regenerate src/meshnet/wire/generated/
    python scripts/gen_proto.py --check  # fail if the committed code is stale

Generated files are never edited by hand. protoc emits absolute ``meshnet.v1`` imports for
cross-file references; they are rewritten to the package the code lives in.
"""

from __future__ import annotations

import argparse
import filecmp
import re
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
TARGET = ROOT / "src" / "meshnet" / "wire" / "generated"
PACKAGE = "meshnet.wire.generated"


def generate(out: Path) -> None:
    import grpc_tools

    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / "meshnet" / "v1").glob("*.proto"))
    include = Path(grpc_tools.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory() as raw:
        args = [
            "protoc",
            f"-I{PROTO_ROOT}",
            f"-I{include}",
            f"--python_out={raw}",
            f"--pyi_out={raw}",
            f"--grpc_python_out={raw}",
            *protos,
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
        out.mkdir(parents=True, exist_ok=True)
        (out / "__init__.py").write_text(
            '"""Generated from proto/meshnet/v1 by scripts/gen_proto.py. Do not edit."""\n'
        )
        for path in sorted((Path(raw) / "meshnet" / "v1").iterdir()):
            text = re.sub(r"\bfrom meshnet\.v1 import\b", f"from {PACKAGE} import", path.read_text())
            text = re.sub(r"^import meshnet\.v1\.(\w+) as", rf"from {PACKAGE} import \1 as", text, flags=re.M)
            (out / path.name).write_text(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if generated code is stale")
    args = parser.parse_args()
    if not args.check:
        if TARGET.exists():
            shutil.rmtree(TARGET)
        generate(TARGET)
        print(f"generated {TARGET.relative_to(ROOT)}")
        return 0
    with tempfile.TemporaryDirectory() as fresh:
        generate(Path(fresh))
        fresh_files = sorted(p.name for p in Path(fresh).iterdir())
        have = sorted(p.name for p in TARGET.iterdir() if p.name != "__pycache__") if TARGET.exists() else []
        stale = fresh_files != have or any(
            not filecmp.cmp(Path(fresh) / name, TARGET / name, shallow=False) for name in fresh_files
        )
    if stale:
        print("generated protocol code is stale: run `python scripts/gen_proto.py`", file=sys.stderr)
        return 1
    print("generated protocol code is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The ``llama-rpc-3`` lane: llama.cpp's own RPC on the same 3-way split, measured side by side.

A setup step builds ``ggml-rpc-server`` and ``llama-bench`` (CMake, ``-DGGML_RPC=ON``) from the
llama.cpp source inside the pinned llama-cpp-python sdist (``pip download --no-deps --no-binary
:all: llama-cpp-python==0.3.36``, or an unpacked source given as ``llama_source``) and caches the
binaries under ``DATA_DIR/llama-rpc``, one build per CPU. It runs only with ``build_llama_rpc`` (the build takes
~20-40 minutes on 2 cores); an uncached lane is otherwise skipped and says so. The lane then
runs ``llama-bench`` tg64 on the host with the first third of the layers and two RPC servers
holding the other two thirds (``-ngl``, ``-ts``), 1 thread each, flash attention on, and
whole-model ``llama-bench`` tg64 with the same settings: the lane is the ratio of the two, so it
compares with meshnet-3's ratio to its own whole-model lane. Where the build or a run is
impossible the lane is skipped with the reason, never faked.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from meshnet.artifact.describe import decode_work, describe_model
from meshnet.bench.config import BenchConfig
from meshnet.bench.pinning import core_plan, decode_split, usable_cores
from meshnet.bench.results import ExtraLane
from meshnet.bench.runner import Progress
from meshnet.core.errors import MeshnetError
from meshnet.process.launcher import ChildProcess, LaunchSpec, launch_all, stop_all

PINNED = "llama-cpp-python==0.3.36"
SOURCE_DIR = "llama_cpp_python-0.3.36/vendor/llama.cpp"
TARGETS = ("ggml-rpc-server", "llama-bench")
DECODE_TOKENS = 64
BENCH_REPETITIONS = 3
RUN_TIMEOUT_S = 600.0
# The checkout's scripts (src/meshnet/bench/ is three levels below it): the lane builds from a checkout.
SCRIPTS = Path(__file__).resolve().parents[3] / "scripts"


class LaneSkipped(Exception):
    """Why the lane cannot be measured here (no compiler, no network, a failed build)."""


def measure_llama_rpc(config: BenchConfig, say: Progress) -> ExtraLane:
    try:
        server, bench = ensure_binaries(config, say)
        whole = run_llama_bench(bench, config, (), core=0)
        rpc = run_split(server, bench, config, say)
    except LaneSkipped as why:
        say(f"llama-rpc-3: skipped: {why}")
        return ExtraLane(None, None, None, None, "", skipped=str(why))
    pinning = "pinned: host core 0, servers cores " + ", ".join(map(str, _server_cores(config)))
    return ExtraLane(
        decode_tok_s=rpc,
        whole_decode_tok_s=whole,
        vs_whole=rpc / whole if whole > 0 else None,
        token_agreement=None,
        note=f"llama-bench tg{DECODE_TOKENS} (llama.cpp RPC, host + 2 servers, 1 thread each, flash attention on, "
        f"{pinning if config.pin_workers else 'not pinned'}) vs whole-model llama-bench tg{DECODE_TOKENS}",
    )


# -- the build ----------------------------------------------------------------------------------


def ensure_binaries(config: BenchConfig, say: Progress, scripts: Path = SCRIPTS) -> tuple[Path, Path]:
    """The cached ``ggml-rpc-server`` and ``llama-bench`` for this CPU, built first if missing.

    The build is native (``-march=native``), so its cache is keyed by the CPU it is for
    (``scripts/cpu_target.sh``): a ``DATA_DIR`` carried to another machine builds anew instead of
    dying with SIGILL at the first kernel that CPU lacks. It gets the C/C++ flags of every other
    llama.cpp build here (``scripts/llama_cflags.sh``: no AMX kernels on x86-64, which crash the
    pinned llama.cpp on an AMX Xeon)."""
    root = config.data_dir / "llama-rpc"
    cpu, flags = native_target(scripts)
    build_dir = root / f"build-{cpu}"
    binaries = tuple(build_dir / "bin" / name for name in TARGETS)
    if all(path.exists() for path in binaries):
        return binaries[0], binaries[1]
    if not config.build_llama_rpc:
        raise LaneSkipped(
            f"llama.cpp's RPC binaries are not built in {build_dir}/bin: run the bench once with --build-llama-rpc"
        )
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise LaneSkipped(f"building llama.cpp needs {tool}, which is not installed")
    source = config.llama_source or download_source(root)
    say(f"llama-rpc-3: building {', '.join(TARGETS)} from {source} (cached in {build_dir})")
    configure = ["cmake", "-S", str(source), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release"]
    configure += ["-DGGML_RPC=ON", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DBUILD_SHARED_LIBS=OFF"]
    configure += ["-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF"]
    configure += [f"-DCMAKE_C_FLAGS={flags}", f"-DCMAKE_CXX_FLAGS={flags}"]
    build = ["cmake", "--build", str(build_dir), "-j", str(len(usable_cores())), "--target", *TARGETS]
    log = root / f"build-{cpu}.log"
    root.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        for command in (configure, build):
            if subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=False).returncode != 0:
                raise LaneSkipped(f"the llama.cpp build failed (see {log})")
    return binaries[0], binaries[1]


def native_target(scripts: Path) -> tuple[str, str]:
    """This CPU's build fingerprint and the C/C++ flags of a llama.cpp build for it, from the
    checkout's scripts (their one owner; the Makefile and ``build_backend.sh`` ask them too)."""
    answers = []
    for name in ("cpu_target.sh", "llama_cflags.sh"):
        script = scripts / name
        if not script.is_file():
            raise LaneSkipped(f"building llama.cpp here needs {script} (a source checkout of meshnet)")
        done = subprocess.run(["sh", str(script)], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise LaneSkipped(f"{script} failed: {done.stderr.strip().splitlines()[-1:]}")
        answers.append(done.stdout.strip())
    if not answers[0].isalnum():
        raise LaneSkipped(f"{scripts / 'cpu_target.sh'} printed no CPU fingerprint: {answers[0]!r}")
    return answers[0], answers[1]


def download_source(root: Path) -> Path:
    """The llama.cpp source of the pinned sdist, fetched with pip once and unpacked."""
    source = root / "src" / SOURCE_DIR
    if source.is_dir():
        return source
    sdist = root / "sdist"
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", PINNED, "-d", str(sdist)]
    if subprocess.run(command, capture_output=True, check=False).returncode != 0:
        raise LaneSkipped(f"pip could not download the {PINNED} sdist")
    archives = sorted(sdist.glob("llama_cpp_python-*.tar.gz"))
    if not archives:
        raise LaneSkipped(f"pip left no {PINNED} sdist in {sdist}")
    with tarfile.open(archives[0]) as archive:
        archive.extractall(root / "src", filter="data")
    if not source.is_dir():
        raise LaneSkipped(f"the sdist holds no {SOURCE_DIR}")
    return source


# -- the runs -----------------------------------------------------------------------------------


def run_llama_bench(bench: Path, config: BenchConfig, extra: tuple[str, ...], *, core: int) -> float:
    """Decode tok/s of ``llama-bench`` tg64 with the bench's threads and flash attention on."""
    command = [str(bench), "-m", str(config.model), "-p", "0", "-n", str(DECODE_TOKENS)]
    command += ["-t", str(config.threads), "-fa", "on", "-r", str(BENCH_REPETITIONS), "-o", "json", *extra]
    if config.pin_workers and shutil.which("taskset") is not None:
        command = ["taskset", "-c", str(core), *command]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise LaneSkipped(f"llama-bench did not finish within {RUN_TIMEOUT_S:.0f} s") from None
    if done.returncode != 0:
        raise LaneSkipped(f"llama-bench failed: {done.stderr.strip().splitlines()[-1:]}")
    try:
        rows = json.loads(done.stdout)
        return float(next(row["avg_ts"] for row in rows if row.get("n_gen", 0) > 0))
    except (ValueError, KeyError, StopIteration, TypeError):
        raise LaneSkipped("llama-bench printed no decode figure") from None


def run_split(server: Path, bench: Path, config: BenchConfig, say: Progress) -> float:
    """Host with the first range, two RPC servers with the other two (the weight-element split:
    the bench's measured split, ``bench.split_calibration``, prices a tail that runs the LM head).

    llama.cpp keeps the LM head where the first layers are (the host) unless every layer is
    offloaded, so here the host runs it; each token still passes every range once (one stream:
    where the ranges cut does not change the sum)."""
    n_layers = describe_model(config.model).n_layers
    ranges = decode_split(decode_work(config.model), 3, pinned=config.pin_workers)
    ports = [_free_port(), _free_port()]
    servers = _start_servers(server, config, ports)
    try:
        offloaded = ("-ngl", str(n_layers - len(ranges[0])), "-ts", f"{len(ranges[1])}/{len(ranges[2])}")
        endpoints = ",".join(f"127.0.0.1:{port}" for port in ports)
        say(f"llama-rpc-3: host layers {ranges[0]}, servers at {endpoints}")
        return run_llama_bench(bench, config, ("--rpc", endpoints, *offloaded), core=0)
    finally:
        stop_all(servers)


def _server_cores(config: BenchConfig) -> tuple[int, ...]:
    return core_plan(3, usable_cores())[1:]


def _start_servers(server: Path, config: BenchConfig, ports: list[int]) -> list[ChildProcess]:
    specs = []
    for index, (port, core) in enumerate(zip(ports, _server_cores(config), strict=True)):
        command: tuple[str, ...] = ("stdbuf", "-oL", str(server), "-H", "127.0.0.1", "-p", str(port))
        command += ("-t", str(config.threads))
        if config.pin_workers and shutil.which("taskset") is not None:
            command = ("taskset", "-c", str(core), *command)
        log = config.data_dir / "logs" / f"bench-llama-rpc-server-{index}.log"
        specs.append(LaunchSpec(f"ggml-rpc-server {index}", command, log, "Starting RPC server"))
    try:
        servers = launch_all(specs, 60.0)
    except MeshnetError as error:
        raise LaneSkipped(f"the RPC servers did not start: {error.message}") from None
    for port in ports:
        _await_port(port)
    return servers


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _await_port(port: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise LaneSkipped(f"no RPC server listens on port {port}")

"""The status page in a real browser: headless Chromium (Debian's package, driven by Playwright)
against a live swarm of three real llama.cpp workers on the tiny synthetic model.

It sees the three nodes and full coverage, follows a streamed request whose prefill completes
and whose token count rises, and sees a SIGKILLed worker go unhealthy and the gap appear. On a
swarm of its own, the page opened without a key asks for one, connects once it is typed, and
after real requests through the official client draws its charts (an SVG line per node, and
pixels of the line's colour in a screenshot); the gateway's log holds one line per request. The
page's screenshot is saved beside the test's files, and into ``MESHNET_SCREENSHOT_DIR`` when
set (that is how docs/status-page.png is made). Skips, saying why, where no Chromium exists.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families
from swarm_harness import LONG_PROMPT, MODEL_NAME, SseResult, Swarm, chat_body, read_sse, write_tiny_model

from meshnet.gateway.config import GatewayConfig

pytestmark = pytest.mark.timeout(180)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
playwright_sync = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (make install)")
if CHROMIUM is None:
    pytest.skip("no chromium executable on PATH (`make browser` installs Debian's as root)", allow_module_level=True)

WAIT_MS = 20_000
LINE_COLOURS = ((0x2F, 0x6F, 0xDF), (0xD9, 0x48, 0x0F), (0x2B, 0x8A, 0x3E))
"""The first three line colours of the page's charts (charts.js COLOURS): one per node."""


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Swarm]:
    model = write_tiny_model(tmp_path_factory.mktemp("model"))
    with Swarm(tmp_path_factory.mktemp("swarm"), model) as running:
        running.start_tracker()
        running.start_workers("0:2", "2:4", "4:6")
        running.start_gateway(http=GatewayConfig(status_interval_seconds=0.1))
        running.wait_routable(3)
        yield running


@pytest.fixture(scope="module")
def charted_swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Swarm]:
    model = write_tiny_model(tmp_path_factory.mktemp("model"))
    with Swarm(tmp_path_factory.mktemp("charted"), model) as running:
        running.start_tracker()
        running.start_workers("0:2", "2:4", "4:6")
        running.start_gateway(http=GatewayConfig(status_interval_seconds=0.1, history_bucket_seconds=0.5))
        running.wait_routable(3)
        yield running


@pytest.fixture
def browser() -> Iterator[Any]:
    # One per test: Playwright's sync driver runs an event loop in this thread while it lives,
    # and a swarm fixture set up meanwhile could not run its own (asyncio.run) to wait for routes.
    with playwright_sync.sync_playwright() as driver:
        # Root (as on these machines) needs --no-sandbox; Debian's build is used, none downloaded.
        launched = driver.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield launched
        launched.close()


def _base_url(swarm: Swarm) -> str:
    return swarm.gateways[0].ready_line.split()[3]


def _cell_values(page: Any, selector: str, attribute: str | None = None) -> list[str]:
    cells = page.locator(selector)
    if attribute is None:
        return [text.strip() for text in cells.all_inner_texts()]
    return [cells.nth(i).get_attribute(attribute) or "" for i in range(cells.count())]


def test_the_page_follows_nodes_coverage_requests_and_a_lost_worker(swarm: Swarm, browser: Any, tmp_path: Path) -> None:
    expect = playwright_sync.expect
    base_url = _base_url(swarm)
    page = browser.new_page(viewport={"width": 1500, "height": 900})
    page.goto(base_url + f"/?key={swarm.api_key}")
    # The key leaves the address bar at once: it must not stay in history or referrers.
    assert "key=" not in page.url

    expect(page.locator("[data-testid=node][data-health=healthy]")).to_have_count(3, timeout=WAIT_MS)
    expect(page.locator("[data-testid=health]")).to_have_text("ok", timeout=WAIT_MS)
    expect(page.locator("[data-testid=coverage-row][data-complete=true]")).to_have_count(1)
    assert _cell_values(page, "[data-testid=layer]", "data-count") == ["1"] * 6
    for worker in swarm.workers:
        expect(page.locator(f"[data-testid=node][data-address='{worker.address}']")).to_have_count(1)
    # Every worker answered the tracker's dial-back: public (issue 33: private, relayed via R).
    expect(page.locator("[data-testid=node-reachability][data-reachability=public]")).to_have_count(3)
    assert _cell_values(page, "[data-testid=node-reachability]") == ["public"] * 3
    # Each worker reports its prefix store (on by default): held of its budget, hits of lookups.
    expect(page.locator("[data-testid=prefix]")).to_have_count(3)
    assert all("(0 / 0)" in text for text in _cell_values(page, "[data-testid=prefix]")), "nothing looked up yet"

    _watch_a_long_request_live(page, swarm, base_url, tmp_path)

    # SIGKILL the only middle worker: its row turns unhealthy and layers 2:4 become a gap.
    middle = swarm.live_workers("2:4")[0]
    middle.component.kill()
    row = page.locator(f"[data-testid=node][data-address='{middle.address}']")
    expect(row).not_to_have_attribute("data-health", "healthy", timeout=WAIT_MS)
    expect(row).to_have_attribute("data-health", "lost", timeout=WAIT_MS)
    expect(page.locator("[data-testid=health]")).to_have_text("no_route", timeout=WAIT_MS)
    expect(page.locator("[data-testid=gaps]")).to_have_text("gaps: 2:4")
    expect(page.locator("[data-testid=node][data-health=healthy]")).to_have_count(2)
    page.screenshot(path=str(tmp_path / "status-page-lost.png"), full_page=True)
    _save_screenshot(tmp_path / "status-page-lost.png")
    page.close()


def _watch_a_long_request_live(page: Any, swarm: Swarm, base_url: str, tmp_path: Path) -> None:
    """A long streamed request: the page must show it live, prefill done and its tokens rising,
    then as a recent request once it ended."""
    expect = playwright_sync.expect
    outcome: dict[str, SseResult] = {}
    body = chat_body(270, content=LONG_PROMPT)
    client = threading.Thread(
        target=lambda: outcome.update(result=read_sse(base_url, "/v1/chat/completions", body, headers=swarm.auth))
    )
    client.start()
    seen_tokens: list[int] = []
    prefill_seen: set[tuple[str, str]] = set()
    deadline = time.monotonic() + 60
    while client.is_alive() and time.monotonic() < deadline:
        tokens = [int(value) for value in _cell_values(page, "[data-testid=request] [data-testid=tokens]") if value]
        if tokens:
            seen_tokens.append(tokens[0])
            done = page.locator("[data-testid=request] [data-testid=prefill]").first
            # The row goes when the request ends, maybe between these reads: then skip the sample.
            with contextlib.suppress(playwright_sync.TimeoutError):
                pair = (done.get_attribute("data-done", timeout=500), done.get_attribute("data-total", timeout=500))
                prefill_seen.add((pair[0] or "", pair[1] or ""))
            if len(set(seen_tokens)) == 3:
                page.screenshot(path=str(tmp_path / "status-page.png"), full_page=True)
        time.sleep(0.05)
    client.join(timeout=60)
    assert outcome["result"].status == 200
    rising = sorted({count for count in seen_tokens if count > 0})
    assert len(rising) >= 2, seen_tokens
    assert seen_tokens == sorted(seen_tokens), "the token count never goes back"
    assert any(done == total and int(total) > 40 for done, total in prefill_seen), prefill_seen
    expect(page.locator("[data-testid=recent-request]")).to_have_count(1, timeout=WAIT_MS)
    expect(page.locator("[data-testid=request]")).to_have_count(0)
    _save_screenshot(tmp_path / "status-page.png")


def _save_screenshot(path: Path) -> None:
    target = os.environ.get("MESHNET_SCREENSHOT_DIR")
    if target and path.exists():
        shutil.copy(path, Path(target) / path.name)


def test_the_page_asks_for_the_key_then_charts_real_requests(
    charted_swarm: Swarm, browser: Any, tmp_path: Path
) -> None:
    expect = playwright_sync.expect
    swarm = charted_swarm
    base_url = _base_url(swarm)
    page = browser.new_page(viewport={"width": 1500, "height": 900})
    page.goto(base_url + "/status")
    # No key: the page asks for one instead of failing with a bare 401.
    expect(page.locator("[data-testid=key-form]")).to_be_visible(timeout=WAIT_MS)
    expect(page.locator("[data-testid=node]")).to_have_count(0)
    page.locator("[data-testid=key-input]").fill("not-the-key")
    page.locator("[data-testid=key-submit]").click()
    expect(page.locator("[data-testid=health-reason]")).to_have_text("the API key was refused", timeout=WAIT_MS)
    expect(page.locator("[data-testid=key-form]")).to_be_visible()
    page.locator("[data-testid=key-input]").fill(swarm.api_key)
    page.locator("[data-testid=key-submit]").click()
    expect(page.locator("[data-testid=key-form]")).to_be_hidden(timeout=WAIT_MS)
    expect(page.locator("[data-testid=node][data-health=healthy]")).to_have_count(3, timeout=WAIT_MS)

    client = openai.OpenAI(base_url=base_url + "/v1", api_key=swarm.api_key, max_retries=0)
    requests = 4
    for i in range(requests):
        messages: Any = [{"role": "user", "content": f"count to {i + 3}"}]
        # A seed of its own: without one each request draws one, and the random-weight model
        # sometimes samples its end-of-text token second (one completion token, nothing to chart).
        seed = 1000 + i
        if i % 2:
            stream = client.chat.completions.create(
                model=MODEL_NAME, messages=messages, max_tokens=24, stream=True, seed=seed
            )
            assert any(chunk.choices and chunk.choices[0].delta.content for chunk in stream)
        else:
            reply = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=24, seed=seed)
            assert reply.usage is not None and reply.usage.completion_tokens > 1

    # Decode tok/s, inter-token latency and each hop's decode step time are drawn per node of the
    # route: one line each.
    for metric in ("decode_tokens_per_s", "inter_token_seconds", "prefill_tokens_per_s", "hop_seconds"):
        lines = page.locator(f"[data-metric={metric}] [data-testid=chart-line]")
        expect(lines).to_have_count(3, timeout=WAIT_MS)
        points = _cell_values(page, f"[data-metric={metric}] [data-testid=chart-line]", "data-points")
        assert all(int(n) >= 1 for n in points), (metric, points)
    # The node table's tok/s columns are now measured on those requests (the probe beside them).
    for column in ("live-prefill", "live-decode"):
        expect(page.locator(f"[data-testid={column}]")).to_have_count(3)
        expect(page.locator(f"[data-testid={column}]").filter(has_text="\u2013")).to_have_count(0, timeout=WAIT_MS)
    expect(page.locator("[data-metric=requests] [data-testid=chart-line]")).to_have_count(1)
    expect(page.locator("[data-metric=queued] [data-testid=chart-line]")).to_have_count(1)
    history = page.evaluate(
        "async (key) => (await fetch('/v1/status/history', {headers: {Authorization: `Bearer ${key}`}})).json()",
        swarm.api_key,
    )
    assert sum(point["count"] for point in history["series"]["requests"][""]) == requests

    page.screenshot(path=str(tmp_path / "status-page-charts.png"), full_page=True)
    _save_screenshot(tmp_path / "status-page-charts.png")
    for metric in ("decode_tokens_per_s", "inter_token_seconds", "requests"):
        # The figure, not its SVG: the page replaces the SVG on each redraw, the figure stays.
        drawn = _pixels_in_line_colours(page.locator(f"figure:has(svg[data-metric={metric}])").screenshot())
        assert drawn > 20, f"the {metric} chart drew no line ({drawn} pixels in the line colours)"
    page.close()
    _one_log_line_per_request(swarm, requests)
    _histograms_count_the_requests(base_url, requests)


def _histograms_count_the_requests(base_url: str, requests: int) -> None:
    """The real gateway's /metrics, read by Prometheus' own parser: one TTFT per request, 23
    inter-token gaps per 24-token request (the decode may stop early: at most that)."""
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(base_url + "/metrics").text)}
    counts = {s.name: s.value for f in families.values() if f.type == "histogram" for s in f.samples}
    assert counts["meshnet_gateway_time_to_first_token_seconds_count"] == requests
    assert 0 < counts["meshnet_gateway_inter_token_seconds_count"] <= requests * 23, counts
    assert counts["meshnet_gateway_request_duration_seconds_count"] == requests
    hops = [s for s in families["meshnet_gateway_hop_seconds"].samples if s.name.endswith("_count")]
    assert len(hops) == 3 and all(s.value > 0 for s in hops), hops


def _pixels_in_line_colours(png: bytes, tolerance: int = 24) -> int:
    """Pixels within ``tolerance`` of a line colour (the page's background is white and grey)."""
    image = Image.open(io.BytesIO(png)).convert("RGB")
    width, height = image.size
    pixels: list[Any] = [image.getpixel((x, y)) for x in range(width) for y in range(height)]

    def near(pixel: tuple[int, int, int], want: tuple[int, int, int]) -> bool:
        return all(abs(c - w) <= tolerance for c, w in zip(pixel, want, strict=True))

    return len([pixel for pixel in pixels if any(near(pixel, want) for want in LINE_COLOURS)])


def _one_log_line_per_request(swarm: Swarm, requests: int) -> None:
    """``meshnet gateway``'s own log (what ``up`` writes to logs/) has one line per request,
    naming the key's id and never the key."""
    log = swarm.gateways[0].spec.log_path.read_text()
    lines = [line for line in log.splitlines() if "meshnet.gateway.requests request req-" in line]
    assert len(lines) == requests, lines
    assert swarm.api_key not in log
    assert all("key=-" not in line and "outcome=completed" in line and "ttft=" in line for line in lines), lines

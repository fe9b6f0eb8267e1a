"""API keys: the hashed store, the pure verdicts, and a real uvicorn gateway refusing, admitting and
hiding telemetry per key (plain HTTP and HTTPS), driven by httpx and the official openai client.

The route behind the app is the scripted double of ``gateway_doubles``, which cannot show a real
route (its docstring says what it cannot show). Keys in front of real workers:
tests/integration/test_up_lifecycle.py (a wrong key is refused by the official client) and every
secured swarm test.
"""

from __future__ import annotations

import sqlite3
import ssl
import subprocess
from pathlib import Path

import httpx
import openai
import pytest
from gateway_doubles import MODEL, ByteCodec, ScriptedGenerator, live_server
from gateway_doubles import test_config as gateway_config

from meshnet.core.errors import FailedPrecondition, InvalidArgument
from meshnet.gateway.app import create_app
from meshnet.gateway.auth import OPERATOR, Caller, bearer_token, may_read
from meshnet.gateway.config import GatewayConfig, GatewayProcessConfig
from meshnet.gateway.keys import (
    KEY_PREFIX,
    ApiKeyStore,
    KeyIdentity,
    ensure_client_key,
    key_digest,
    read_client_key,
    store_path,
)
from meshnet.gateway.server import GatewayServer

pytestmark = pytest.mark.timeout(30)

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def _name(identity: KeyIdentity | None) -> str | None:
    return None if identity is None else identity.name


# -- the store -----------------------------------------------------------------------------------


def test_a_created_key_verifies_is_stored_only_hashed_and_revokes(tmp_path: Path) -> None:
    store = ApiKeyStore(store_path(tmp_path))
    key = store.create("alice")
    assert key.startswith(KEY_PREFIX) and len(key) > 40
    assert _name(store.verify(key)) == "alice"
    assert store.verify(key + "x") is None and store.verify("") is None and store.verify(key[:-1]) is None
    assert store.path.stat().st_mode & 0o777 == 0o600
    assert key.encode() not in store.path.read_bytes()  # only the digest is kept
    other = store.create("bob")
    assert other != key and _name(store.verify(other)) == "bob"
    store.revoke("alice")
    assert store.verify(key) is None and _name(store.verify(other)) == "bob"
    assert [(info.name, info.active) for info in store.list()] == [("alice", False), ("bob", True)]


def test_store_refuses_bad_names_duplicates_and_unknown_revocations(tmp_path: Path) -> None:
    store = ApiKeyStore(store_path(tmp_path))
    for bad in ("", "a b", "-x", "x" * 65, "é"):
        with pytest.raises(InvalidArgument):
            store.create(bad)
    store.create("ci")
    with pytest.raises(FailedPrecondition, match="revoke it first"):
        store.create("ci")
    with pytest.raises(InvalidArgument, match="no active api key"):
        store.revoke("nobody")
    store.revoke("ci")
    with pytest.raises(InvalidArgument):
        store.revoke("ci")
    assert _name(store.verify(store.create("ci"))) == "ci"  # a revoked name may be reused with a new key


def test_keys_have_ids_never_reused_and_a_new_key_under_an_old_name_is_another_key(tmp_path: Path) -> None:
    store = ApiKeyStore(store_path(tmp_path))
    old = store.verify(store.create("carol"))
    store.revoke("carol")
    new = store.verify(store.create("carol", admin=True))
    assert old is not None and new is not None
    assert old.key_id.startswith("key-") and new.key_id != old.key_id
    assert (old.admin, new.admin) == (False, True)
    listed = [(info.name, info.key_id, info.admin, info.active) for info in store.list()]
    assert listed == [("carol", old.key_id, False, False), ("carol", new.key_id, True, True)]


def test_a_store_written_before_key_ids_keeps_its_keys_with_fresh_ids(tmp_path: Path) -> None:
    path = store_path(tmp_path)
    key, revoked = "mn-" + "a" * 43, "mn-" + "b" * 43
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE api_keys (name TEXT PRIMARY KEY, digest BLOB NOT NULL, created_at REAL NOT NULL, "
            "revoked_at REAL)"
        )
        db.execute("INSERT INTO api_keys VALUES ('local', ?, 1.0, NULL)", (key_digest(key),))
        db.execute("INSERT INTO api_keys VALUES ('old', ?, 2.0, 3.0)", (key_digest(revoked),))
    store = ApiKeyStore(path)
    local = store.verify(key)
    assert local is not None and local.name == "local" and local.admin  # the operator's key
    assert store.verify(revoked) is None
    assert [(info.name, info.active) for info in store.list()] == [("local", True), ("old", False)]


def test_client_key_file_is_private_reused_and_replaced_once_revoked(tmp_path: Path) -> None:
    path = ensure_client_key(tmp_path)
    assert path == tmp_path / "api-key" and path.stat().st_mode & 0o777 == 0o600
    key = read_client_key(tmp_path)
    store = ApiKeyStore(store_path(tmp_path))
    assert _name(store.verify(key)) == "local" and store.verify(key).admin  # type: ignore[union-attr]
    assert ensure_client_key(tmp_path) == path and read_client_key(tmp_path) == key
    store.revoke("local")
    ensure_client_key(tmp_path)
    fresh = read_client_key(tmp_path)
    assert fresh != key and _name(store.verify(fresh)) == "local" and store.verify(key) is None


def test_reading_a_missing_client_key_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FailedPrecondition, match="meshnet up"):
        read_client_key(tmp_path)


# -- pure verdicts -------------------------------------------------------------------------------


def test_bearer_token_parsing() -> None:
    assert bearer_token("Bearer mn-abc") == "mn-abc"
    assert bearer_token("bearer  mn-abc ") == "mn-abc"
    for bad in (None, "", "Bearer", "Bearer ", "Basic mn-abc", "mn-abc", "Bearer a b"):
        assert bearer_token(bad) is None, bad


def test_only_the_owner_reads_telemetry_and_anonymous_requests_are_open() -> None:
    alice, bob = Caller("key-a"), Caller("key-b")
    assert may_read("key-a", alice)
    assert not may_read("key-a", bob)
    assert not may_read("key-a", Caller(None))
    assert may_read(None, bob) and may_read(None, Caller(None))
    assert may_read("key-a", Caller("key-ops", admin=True)) and may_read("key-a", OPERATOR)


def test_anonymous_serving_is_refused_off_loopback(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="loopback only"):
        GatewayProcessConfig(
            tracker="t:1", model=tmp_path, http=GatewayConfig(host="0.0.0.0"), data_dir=tmp_path, allow_anonymous=True
        )
    GatewayProcessConfig(tracker="t:1", model=tmp_path, http=GatewayConfig(), data_dir=tmp_path, allow_anonymous=True)
    with pytest.raises(InvalidArgument, match="go together"):
        GatewayConfig(tls_cert=tmp_path / "c.pem")


# -- a real gateway --------------------------------------------------------------------------------


def _app(store: ApiKeyStore | None):  # type: ignore[no-untyped-def]
    return create_app(ScriptedGenerator(), {MODEL: ByteCodec()}, gateway_config(), api_keys=store)


def _assert_401(response: httpx.Response) -> None:
    assert response.status_code == 401
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_api_key"
    assert error["message"]


async def test_v1_routes_need_a_valid_key_and_health_stays_open(tmp_path: Path) -> None:
    store = ApiKeyStore(store_path(tmp_path))
    key = store.create("alice")
    async with live_server(_app(store)) as base, httpx.AsyncClient(base_url=base, timeout=10) as http:
        assert (await http.get("/health")).status_code == 200
        assert (await http.get("/metrics")).status_code == 200
        for headers in ({}, {"Authorization": "Bearer mn-wrong"}, {"Authorization": f"Basic {key}"}):
            _assert_401(await http.get("/v1/models", headers=headers))
            _assert_401(await http.post("/v1/chat/completions", json=CHAT, headers=headers))
            _assert_401(await http.post("/v1/completions", json={"model": MODEL, "prompt": "x"}, headers=headers))
            _assert_401(await http.get("/v1/telemetry/req-x", headers=headers))
            _assert_401(await http.get("/v1/telemetry/req-x/events", headers=headers))
        good = {"Authorization": f"Bearer {key}"}
        assert (await http.get("/v1/models", headers=good)).status_code == 200
        assert (await http.post("/v1/chat/completions", json=CHAT, headers=good)).status_code == 200
        store.revoke("alice")  # takes effect on the next request of the running gateway
        _assert_401(await http.get("/v1/models", headers=good))


async def test_telemetry_is_readable_only_with_the_key_that_made_the_request(tmp_path: Path) -> None:
    store = ApiKeyStore(store_path(tmp_path))
    alice = {"Authorization": f"Bearer {store.create('alice')}"}
    bob = {"Authorization": f"Bearer {store.create('bob')}"}
    async with live_server(_app(store)) as base, httpx.AsyncClient(base_url=base, timeout=10) as http:
        made = await http.post("/v1/chat/completions", json=CHAT, headers=alice)
        request_id = made.headers["x-request-id"]
        own = await http.get(f"/v1/telemetry/{request_id}", headers=alice)
        assert own.status_code == 200 and own.json()["state"] == "completed"
        assert (await http.get(f"/v1/telemetry/{request_id}/events", headers=alice)).status_code == 200
        for path in (f"/v1/telemetry/{request_id}", f"/v1/telemetry/{request_id}/events"):
            foreign = await http.get(path, headers=bob)
            unknown = await http.get(path.replace(request_id, "req-unknown"), headers=bob)
            # Another key's request looks exactly like one that does not exist.
            assert foreign.status_code == unknown.status_code == 404
            assert foreign.json()["error"]["code"] == unknown.json()["error"]["code"] == "telemetry_not_found"


async def test_the_openai_client_works_with_a_key_and_gets_authentication_error_without(tmp_path: Path) -> None:
    store = ApiKeyStore(store_path(tmp_path))
    key = store.create("sdk")
    async with live_server(_app(store)) as base:
        good = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
        reply = await good.chat.completions.create(model=MODEL, messages=CHAT["messages"])  # type: ignore[arg-type]
        assert reply.choices[0].message.content == "Hello world"
        bad = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="mn-not-a-key", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as raised:
            await bad.models.list()
        assert raised.value.code == "invalid_api_key"


def _self_signed(folder: Path) -> tuple[Path, Path]:
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"),
            *("-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1"),
            *("-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


async def test_https_serves_with_the_given_certificate(tmp_path: Path) -> None:
    cert, tls_key = _self_signed(tmp_path)
    store = ApiKeyStore(store_path(tmp_path))
    key = store.create("tls")
    server = GatewayServer(_app(store), "127.0.0.1", 0, shutdown_grace_seconds=1.0, tls_cert=cert, tls_key=tls_key)
    port = await server.start()
    try:
        trusted = ssl.create_default_context(cafile=str(cert))
        async with httpx.AsyncClient(base_url=f"https://127.0.0.1:{port}", verify=trusted, timeout=10) as http:
            answer = await http.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
            assert answer.status_code == 200
        async with httpx.AsyncClient(base_url=f"https://127.0.0.1:{port}", timeout=10) as untrusting:
            with pytest.raises(httpx.ConnectError):  # a real handshake: an unknown issuer is refused
                await untrusting.get("/health")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as plain:
            with pytest.raises(httpx.HTTPError):
                await plain.get("/health")
    finally:
        await server.stop()

"""The MCP conformance suite against the gateway, on the server route and the client route (issue 24).

    python -m tests.conformance.run                  # the score table of every route
    python -m tests.conformance.run --json out.json  # and the same as JSON ("-": stdout only)
    python -m tests.conformance.run --routes direct server --scenario tools-list

The pinned suite (``@modelcontextprotocol/conformance``, with the Node >= 22 it needs, both from
npm into the tests' npm cache) runs every server scenario (``--suite all``: 32) against:

- ``direct``: the reference server (``reference_server.py``) alone over streamable HTTP, the
  baseline: it must score 32/32, or the harness itself is broken;
- ``server``: the gateway of a stack whose brain runs the reference server (its mcpServers
  file, stdio), with a token of a user who has no client: every tool call runs on the pool;
- ``client``: the gateway of a stack whose client agent "laptop" (user "ada") runs the reference
  server (its mcp.json) and whose brain runs none: every tool call runs on the workstation.

The suite sends no Authorization header, so a small reverse proxy on loopback adds the user's
bearer token and forwards everything else as it came (the Host and Origin headers too: the
DNS-rebinding scenario checks the gateway, not the proxy). A scenario passes as in the suite's
own summary: no check failed (warnings are shown, not counted). The whole suite runs in one
process (Node starts once), within a time limit; a scenario it did not finish (a hang, a crash)
runs again in a process of its own. Exit status: 0 when every route was
measured, 1 when the direct run scored below the whole suite, 2 when something could not run.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self

import anyio
import httpx2
import uvicorn

from brain.runtime import gateway_tokens
from brain.stack.embedded import EmbeddedStack
from brain.stack.redis_server import free_port
from brain.store import open_store
from tests.conftest import (
    NPM_CACHE,
    NpmMissing,
    agent_with_servers,
    make_settings,
    npm_install,
    write_mcp_config,
)

SUITE_VERSION = "0.1.16"
SUITE_PACKAGE = f"@modelcontextprotocol/conformance@{SUITE_VERSION}"
# The suite needs Node >= 22 (fs.globSync); npm's `node` package brings that binary.
NODE_PACKAGE = "node@22.23.3"
# One prefix per pin, so that a new pin installs anew instead of finding the old one.
SUITE_PREFIX = NPM_CACHE / f"conformance-{SUITE_VERSION}-{NODE_PACKAGE.replace('@', '')}"
REFERENCE_SERVER = Path(__file__).resolve().parent / "reference_server.py"
ROUTES = ("direct", "server", "client")
# The whole suite in one process, and a scenario run again alone (the suite's client gives up on a
# request after 60 s).
SUITE_TIMEOUT_S = 150.0
SCENARIO_TIMEOUT_S = 75.0
CLIENT_ID, CLIENT_USER, SERVER_USER = "laptop", "ada", "conformance"


def reference_server() -> dict[str, Any]:
    """The mcpServers entry that starts the reference server over stdio."""
    return {"command": sys.executable, "args": [str(REFERENCE_SERVER)]}


# --- the suite ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Suite:
    node: Path
    cli: Path

    @classmethod
    def install(cls) -> Suite:
        """The pinned suite and its Node from npm, once per machine (``NpmMissing`` without npm)."""
        npm_install((SUITE_PACKAGE, NODE_PACKAGE), "conformance", SUITE_PREFIX)
        node = SUITE_PREFIX / "node_modules" / ".bin" / "node"
        cli = SUITE_PREFIX / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
        if not node.exists() or not cli.exists():
            raise RuntimeError(f"{SUITE_PREFIX} lacks {node.name} or {cli.name}; remove it to reinstall")
        return cls(node, cli)

    @functools.cached_property
    def scenarios(self) -> list[str]:
        """Every server scenario the suite lists (active and pending)."""
        out = subprocess.run(
            [str(self.node), str(self.cli), "list", "--server"],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
        return [line.split()[1] for line in out.splitlines() if line.strip().startswith("- ")]

    def run(self, url: str, out_dir: Path, timeout: float, scenario: str | None = None) -> Outcome:
        """One process of the suite against ``url``: every server scenario in turn (``--suite
        all``), or only ``scenario``, within ``timeout``. The scenarios it finished, and what
        happened to the others."""
        out_dir.mkdir(parents=True, exist_ok=True)
        argv = [str(self.node), str(self.cli), "server", "--url", url, "-o", str(out_dir)]
        argv += ["--scenario", scenario] if scenario else ["--suite", "all"]
        try:
            done = subprocess.run(
                argv, check=False, capture_output=True, text=True, timeout=timeout, cwd=out_dir
            )
            said = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
            unfinished = f"no results from the suite (exit {done.returncode}): {said}"
        except subprocess.TimeoutExpired:
            unfinished = f"not finished within {timeout:g}s"
        results: dict[str, ScenarioResult] = {}
        # server-<scenario>-<ISO time it started, - for : and .>/checks.json, written as it ends
        for d in out_dir.glob("server-*"):
            if not (d / "checks.json").exists():
                continue
            name = d.name[len("server-") : -25]
            began = datetime.strptime(d.name[-24:], "%Y-%m-%dT%H-%M-%S-%fZ").replace(tzinfo=UTC).timestamp()
            seconds = round(max((d / "checks.json").stat().st_mtime - began, 0.0), 1)
            checks = json.loads((d / "checks.json").read_text())
            failures = [_said(c) for c in checks if c.get("status") == "FAILURE"]
            warnings = [_said(c) for c in checks if c.get("status") == "WARNING"]
            results[name] = ScenarioResult(name, not failures, seconds, failures, warnings)
        return Outcome(results, unfinished)


@dataclass
class Outcome:
    results: dict[str, ScenarioResult]
    unfinished: str


def _said(check: dict[str, Any]) -> str:
    return (
        f"{check.get('name', check.get('id'))}: {check.get('errorMessage') or check.get('description', '')}"
    )


@dataclass
class ScenarioResult:
    scenario: str
    passed: bool
    seconds: float
    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


@dataclass
class RouteResult:
    route: str
    url: str
    scenarios: list[ScenarioResult]
    error: str | None = None

    @property
    def passed(self) -> int:
        return sum(s.passed for s in self.scenarios)

    @property
    def total(self) -> int:
        return len(self.scenarios)

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "passed": self.passed, "total": self.total}


def run_route(
    suite: Suite, route: str, url: str, scenarios: list[str], out_dir: Path, jobs: int
) -> RouteResult:
    """The whole suite in one process (quickest: Node starts once); any scenario it did not
    finish (a hang, a crash) then again in a process of its own, ``jobs`` at once."""
    found: dict[str, ScenarioResult] = {}
    unfinished = "not run"
    if set(scenarios) == set(suite.scenarios):
        outcome = suite.run(url, out_dir / route / "suite", SUITE_TIMEOUT_S)
        found, unfinished = outcome.results, outcome.unfinished
    again = [name for name in scenarios if name not in found]

    def alone(name: str) -> ScenarioResult:
        outcome = suite.run(url, out_dir / route / name, SCENARIO_TIMEOUT_S, name)
        return outcome.results.get(name) or ScenarioResult(
            name, False, SCENARIO_TIMEOUT_S, [outcome.unfinished]
        )

    if again:
        if found:
            print(f"== {route}: again, alone: {' '.join(again)} ({unfinished})", file=sys.stderr)
        with concurrent.futures.ThreadPoolExecutor(
            max_workers=jobs, thread_name_prefix="conformance"
        ) as pool:
            found.update(zip(again, pool.map(alone, again), strict=True))
    return RouteResult(route, url, [found[name] for name in scenarios])


# --- the reference server over HTTP (the baseline) ------------------------------------------


def wait_http(url: str, ok: tuple[int, ...], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx2.TransportError):
            if httpx2.post(url, json={}, timeout=2).status_code in ok:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not answer at {url} within {timeout:g}s")


@contextlib.contextmanager
def reference_over_http(log_dir: Path) -> Iterator[str]:
    port = free_port()
    log = (log_dir / "reference-http.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, str(REFERENCE_SERVER), "http", str(port)], stdout=log, stderr=subprocess.STDOUT
    )
    try:
        url = f"http://127.0.0.1:{port}/mcp"
        wait_http(url, (400, 406), 120, "the reference server")
        yield url
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
        log.close()


# --- the token proxy ----------------------------------------------------------------------

_HOP_BY_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"te", b"upgrade", b"content-length"}


class TokenProxy:
    """``http://127.0.0.1:PORT/mcp`` forwarding each request to ``upstream`` with
    ``Authorization: Bearer <token>`` added (any Authorization sent is replaced), every other
    header as it came (Host and Origin included), and the response streamed back as it comes
    (SSE). In a thread of its own (uvicorn), loopback only."""

    def __init__(self, upstream: str, token: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.base = self.upstream.rsplit("/", 1)[0]  # http://127.0.0.1:PORT
        self.token = token
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        config = uvicorn.Config(
            self.app,
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            lifespan="off",
            interface="asgi3",
            server_header=False,
            date_header=False,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="conformance-token-proxy", daemon=True)

    async def app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _HOP_BY_HOP | {b"authorization"}]
        headers.append((b"authorization", f"Bearer {self.token}".encode()))
        query = f"?{scope['query_string'].decode()}" if scope["query_string"] else ""
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(10, read=None)) as client:
            request = client.build_request(
                scope["method"], f"{self.base}{scope['path']}{query}", headers=headers, content=body
            )
            response = await client.send(request, stream=True)
            try:
                await send(
                    {
                        "type": "http.response.start",
                        "status": response.status_code,
                        "headers": [(k, v) for k, v in response.headers.raw if k.lower() not in _HOP_BY_HOP],
                    }
                )
                async with anyio.create_task_group() as tg:

                    async def until_gone() -> None:
                        while (await receive())["type"] != "http.disconnect":
                            pass
                        tg.cancel_scope.cancel()

                    tg.start_soon(until_gone)
                    async for chunk in response.aiter_raw():
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                    tg.cancel_scope.cancel()
            finally:
                await response.aclose()

    def __enter__(self) -> Self:
        self._thread.start()
        deadline = time.monotonic() + 60
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the token proxy did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(10)


# --- the stacks ---------------------------------------------------------------------------


def token_for(stack: EmbeddedStack, user: str) -> str:
    store = open_store(stack.settings.store)
    try:
        return gateway_tokens.issue(store, user)
    finally:
        store.close()


@contextlib.contextmanager
def gateway_of(route: str, where: Path) -> Iterator[str]:
    """A stack for ``route`` with its gateway; yields the proxy URL that adds the token."""
    where.mkdir(parents=True)
    if route == "server":
        services: tuple[str, ...] = ("brain", "server-pool")
        settings = make_settings(
            where, mcp_config=write_mcp_config(where / "server-mcp.json", {"ref": reference_server()})
        )
        user = SERVER_USER
    else:
        services = ("brain", "server-pool", "client-agent")
        settings = make_settings(
            where,
            agent_config=agent_with_servers(where, {"ref": reference_server()}),
            mcp_config=write_mcp_config(where / "server-mcp.json", {}),
        )
        user = CLIENT_USER
    stack = EmbeddedStack(settings, only=services)
    try:
        stack.start()
        if route == "client" and not stack.wait_connected(CLIENT_ID, 120):
            raise RuntimeError(f"client agent {CLIENT_ID!r} did not connect; see {where}/data/logs")
        port = free_port()
        stack.start_gateway(port)
        gateway = f"http://{settings.gateway_host}:{port}/mcp"
        wait_http(gateway, (401,), 120, "the gateway")
        with TokenProxy(gateway, token_for(stack, user)) as proxy:
            yield proxy.url
    finally:
        stack.stop()


# --- the run and its table ----------------------------------------------------------------


def measure(routes: tuple[str, ...], only: list[str] | None, jobs: int, work: Path) -> list[RouteResult]:
    """Every route of ``routes``: the direct baseline first, then the gateway routes at the same
    time (each its own stack; starting one is mostly waiting). Raises ``NpmMissing`` without npm."""
    suite = Suite.install()
    scenarios = only or suite.scenarios

    def one(route: str) -> RouteResult:
        started = time.monotonic()
        try:
            opened = reference_over_http(work) if route == "direct" else gateway_of(route, work / route)
            with opened as url:
                result = run_route(suite, route, url, scenarios, work / "results", jobs)
        except Exception as exc:  # noqa: BLE001 - reported as the route's error; the others still run
            missed = [ScenarioResult(s, False, 0.0, ["route not measured"]) for s in scenarios]
            result = RouteResult(route, "", missed, f"{type(exc).__name__}: {exc}")
        print(
            f"== {route}: {result.passed}/{result.total} in {time.monotonic() - started:.0f}s",
            file=sys.stderr,
        )
        return result

    results = {route: one(route) for route in routes if route == "direct"}
    gateways = [route for route in routes if route != "direct"]
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(len(gateways), 1)) as pool:
        results.update(zip(gateways, pool.map(one, gateways), strict=True))
    return [results[route] for route in routes]


def table(results: list[RouteResult]) -> str:
    lines: list[str] = []
    for r in results:
        lines.append(f"\n{r.route} route ({r.url or 'not started'}): {r.passed}/{r.total}")
        if r.error:
            lines.append(f"  ERROR {r.error}")
        width = max((len(s.scenario) for s in r.scenarios), default=0)
        for s in r.scenarios:
            reason = "; ".join(s.failures) or ("warnings: " + "; ".join(s.warnings) if s.warnings else "")
            mark = "pass" if s.passed else "FAIL"
            lines.append(f"  {s.scenario:<{width}}  {mark}  {s.seconds:5.1f}s  {reason[:200]}")
    lines.append("")
    lines.append(", ".join(f"{r.route} route: {r.passed}/{r.total}" for r in results))
    return "\n".join(lines)


def report(results: list[RouteResult]) -> dict[str, Any]:
    return {
        "suite": SUITE_PACKAGE,
        "node": NODE_PACKAGE,
        "scores": {r.route: f"{r.passed}/{r.total}" for r in results},
        "routes": {r.route: r.as_json() for r in results},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.conformance.run", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--routes", nargs="+", choices=ROUTES, default=list(ROUTES))
    parser.add_argument("--scenario", nargs="+", help="only these scenarios (default: every server scenario)")
    parser.add_argument("--jobs", type=int, default=4, help="scenarios run at once (default 4)")
    parser.add_argument("--json", metavar="FILE", help='write the results as JSON ("-": to stdout, no table)')
    parser.add_argument("--keep", action="store_true", help="keep the work dir (stacks' logs, checks.json)")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="vancetope-conformance-"))
    try:
        results = measure(tuple(args.routes), args.scenario, args.jobs, work)
    except NpmMissing as exc:
        print(f"conformance: {exc}", file=sys.stderr)
        return 2
    finally:
        if args.keep:
            print(f"work dir kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    if args.json != "-":
        print(table(results))
    if args.json:
        text = json.dumps(report(results), indent=2)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
    if any(r.error for r in results):
        return 2
    direct = next((r for r in results if r.route == "direct"), None)
    return 1 if direct is not None and direct.passed < direct.total else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())

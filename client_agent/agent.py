"""One client agent process (layer: client_agent).

One job: compose the pieces - policy and native tools, the user's MCP servers, the
announcer and heartbeat, the Celery worker on the client's own queue - and run them
until SIGTERM/SIGINT. Tool calls run through ``workers.tasks.register``, the same task
as on the server pool; results go to this client's outbox as ``ClientToolResult`` (and that a
call began as ``ClientToolStarted``, its progress and approval waits as theirs).

Shutdown order: stop consuming (running tasks finish), say ``ClientDisconnected``,
delete the heartbeat, then stop the MCP servers (tasks needed them until the end).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import uuid
from concurrent.futures import Future
from pathlib import Path

import redis

from client_agent.announce import Announcer, Heartbeat, encode_announcement
from client_agent.approvals import ConsentDir
from client_agent.channel import AgentChannel, connect_redis
from client_agent.config import AgentConfig
from client_agent.consent_gate import ConsentGate
from client_agent.early_begin import EarlyBegin
from client_agent.errors import AgentError, AnnouncementTooLarge, NotEnrolled
from client_agent.local_state import AgentState, MCPJsonState, clear_state, write_state
from client_agent.mcp_json import FileWatcher, MCPTools, load_mcp_tools
from client_agent.outage import CELERY_CONSUMER_LOGGER, BrokerOutage, is_outage
from client_agent.policy import Policy
from client_agent.redact import Redactor, capped
from client_agent.self_protection import check_sandbox_roots
from client_agent.start_notices import StartNotices
from client_agent.worker import (
    install_signal_handlers,
    make_agent_app,
    make_worker,
    request_stop,
    worker_hostname,
)
from workers.call_relay import wait_answer
from workers.contracts import (
    AskAnswer,
    ClientDisconnected,
    ClientResourceUpdated,
    ClientToolAsk,
    ClientToolAwaiting,
    ClientToolLog,
    ClientToolProgress,
    ClientToolResult,
    ClientToolStarted,
    ResourceUpdated,
    ToolAsk,
    ToolAwaiting,
    ToolCall,
    ToolDescriptor,
    ToolLog,
    ToolProgress,
    ToolResult,
    ToolStarted,
    client_answer_key,
    client_queue,
    key_cancelled,
    key_deliveries,
)
from workers.mcp_clients import MCPClientManager
from workers.recent_calls import RecentCalls
from workers.sent_ahead import SentAhead
from workers.tasks import begin_commands, begin_run, begun, must_stop, register
from workers.urls import redact_url

log = logging.getLogger("vancetope.agent")

_JOIN_S = 5.0
# How long a run's delivery counter stays once its result is in the outbox (``deliver``).
DELIVERY_TTL_AFTER_RESULT_S = 3600
# Exit code when the broker refuses this agent's credentials (not enrolled, or revoked).
EXIT_NOT_ENROLLED = 3
_GOODBYE_RETRY_DELAYS_S = (0.2, 0.5, 1.0)


def new_session_id() -> str:
    return f"sess_{uuid.uuid4().hex}"


class Agent:
    """A client agent: ``run()`` blocks until a signal, then shuts down cleanly."""

    def __init__(
        self, config: AgentConfig, session_id: str | None = None, config_file: Path | None = None
    ) -> None:
        # load_config checked this already; an Agent built from a config in code is held to it too.
        check_sandbox_roots(config, config_file)
        self.config = config
        self.session_id = session_id or new_session_id()
        self.policy = Policy.from_config(config, config_file)
        self.native = self.policy.native()
        self._mcp = MCPTools()
        self._mcp_lock = threading.Lock()
        self._mcp_loaded_at: float | None = None  # when the servers in self._mcp were loaded
        self._stop = threading.Event()
        self._stop_reason = "graceful shutdown"
        self._refused: NotEnrolled | None = None
        # Since when the broker refuses the credentials (None: it accepts them), and whether the
        # brain ever accepted this agent's announcement (only then is a refusal waited out).
        self._refused_since: float | None = None
        self._was_accepted = False
        self._closed = False
        # One line saying what to do while the broker cannot be reached, not one per retry.
        broker_url = config.own_broker_url()
        self.outage = BrokerOutage(broker_url, config.client_id, config.user)
        self.channel = AgentChannel(
            connect_redis(broker_url, master=config.redis_sentinel_master),
            config.client_id,
            self.outage,
            broker_url=broker_url,
            master=config.redis_sentinel_master,
        )
        # Consent (docs/client-agent.md, "Consent on the workstation"): approvals live in a 0700 directory.
        self.consent = ConsentDir.for_config(config)
        self.redactor = Redactor.build(config.redact, config.redact_builtin)
        gate = ConsentGate(config, self.consent, self.report_awaiting, self._stop, self._cancelled)
        self.app = make_agent_app(config)
        # A call still running a moment after it began is said to be running (start_notices).
        self.notices = StartNotices(self._tell_started)
        # Each run's begin and kombu's unacked write leave as its message is popped, and a first
        # delivery's tool starts without waiting for either reply (client_agent.early_begin).
        self.ahead = SentAhead("vancetope-begin")
        self.early = EarlyBegin(
            self.begin_run, self.send_begin, config.client_id, worker_hostname(config.client_id)
        )
        self.app.conf.broker_transport_options = {
            **(self.app.conf.broker_transport_options or {}),
            "vt_on_delivery": self.early.on_delivery,
            "vt_unacked_ahead": True,
        }
        register(
            self.app,
            sink=self.deliver,
            mcp=self.mcp_manager,
            native=self.native,
            client_id=config.client_id,
            progress=self.report_progress,
            gate=gate if config.ask else None,
            begin=self.early.begin,
            channel=self,
            # A task re-sent after its result was lost (a link cut mid-call) is answered from the
            # run that did it, not run twice (workers.recent_calls).
            recent=RecentCalls(),
            stop_asked=self._must_stop,
        )
        self.announcer = Announcer(
            self.channel,
            self.session_id,
            self.announcement,
            self._stop,
            config.ack_timeout_s,
            on_refused=self._on_refused,
            outage=self.outage,
        )
        self._threads: list[threading.Thread] = []
        self._state = AgentState(
            client_id=config.client_id,
            pid=os.getpid(),
            session_id=self.session_id,
            started_at=time.time(),
            heartbeat_ttl_s=config.heartbeat_ttl_s,
            log_file=None if config.log_file is None else str(config.log_file),
        )
        self._state_failing = False
        self._state_lock = threading.Lock()

    # --- what the agent offers ----------------------------------------------------------

    def available_tools(self) -> list[ToolDescriptor]:
        with self._mcp_lock:
            mcp_tools = list(self._mcp.tools)
        return self.policy.announced_native() + mcp_tools

    def announcement(self) -> str:
        body, left_out = self._encode(self.available_tools())
        if left_out:
            log.warning("the announcement was over the brain's size cap; left out to fit: %s", left_out)
        return body

    def _encode(self, tools: list[ToolDescriptor]) -> tuple[str, str]:
        cfg = self.config
        return encode_announcement(cfg.client_id, self.session_id, cfg.client_type, tools, time.time())

    def mcp_manager(self) -> MCPClientManager | None:
        with self._mcp_lock:
            return self._mcp.manager

    def resource_updated(self, update: ResourceUpdated) -> None:
        """A server of mcp.json said a resource a gateway session subscribed to changed: to the
        outbox (this agent may publish nowhere); the brain publishes it as this client's, and
        the gateway tells only the sessions of this client's user that subscribed to it. Not
        retried: the next change says it again."""
        message = ClientResourceUpdated(client_id=self.config.client_id, updated=update)
        self.channel.send(message, retry_delays=())

    def load_mcp(self) -> MCPTools:
        cfg = self.config
        with self._mcp_lock:
            previous = self._mcp.config
        tools = load_mcp_tools(
            cfg.mcp_json,
            self.policy,
            self.native,
            cfg.default_timeout_s,
            self.consent,
            cfg.trust_mcp_servers,
            previous=previous,
        )
        if tools.manager is not None:
            # What its servers say of resources gateway sessions subscribed to (issue 24).
            tools.manager.resource_sink = self.resource_updated
        return tools

    def reload_mcp(self, why: str = "") -> None:
        """mcp.json changed: start the new servers, check the new set can be announced, swap, announce.
        A file that does not load, or a set too large to announce, changes nothing: the servers
        in use stay, and the log and `vancetope-agent status` say why (as the brain keeps its
        registry when a reload fails)."""
        log.info("%s; reloading the MCP servers", why or f"{self.config.mcp_json} changed")
        fresh = self.load_mcp()
        if fresh.error is not None:
            log.error("mcp.json reload failed; keeping the MCP servers in use: %s", fresh.error)
            self._record_mcp(error=fresh.error)
            return
        try:
            self._encode(self.policy.announced_native() + fresh.tools)
        except AnnouncementTooLarge as exc:
            log.error("mcp.json reload failed; keeping the MCP servers in use: %s", exc)
            fresh.close()
            self._record_mcp(error=str(exc))
            return
        with self._mcp_lock:
            current = self._mcp.manager
        if fresh.manager is not None and current is not None:
            # Changes of the resources gateway sessions subscribed to keep coming (issue 24):
            # subscribed again on the new sessions before they are the ones in use.
            fresh.manager.adopt_subscriptions(current, self.config.default_timeout_s)
        with self._mcp_lock:
            # A reload that finishes after shutdown must not leave its servers running.
            closing = self._closed
            if not closing:
                old, self._mcp = self._mcp, fresh
                self._mcp_loaded_at = time.time()
        if closing:
            fresh.close()
            return
        self._record_mcp()
        log.info("reloaded mcp.json: %s; announcing again", tool_changes(old.tools, fresh.tools))
        self.announcer.request(same_session=True)
        old.close()

    def _record_mcp(self, error: str | None = None) -> None:
        """For `vancetope-agent status`: the MCP servers in use and, when the last load did not
        replace them, why."""
        path = self.config.mcp_json
        if path is None:
            return
        with self._mcp_lock:
            mcp, loaded_at = self._mcp, self._mcp_loaded_at
        offering = sorted({t.mcp_server for t in mcp.tools if t.mcp_server})
        self._update_state(
            mcp_json=MCPJsonState(
                path=str(path),
                loaded_at=loaded_at,
                servers=offering,
                tools=len(mcp.tools),
                error=error,
                error_at=None if error is None else time.time(),
                kept={} if mcp.config is None else dict(mcp.config.kept),
                failed={} if mcp.error else {f.server: f.message for f in mcp.failures},
            )
        )

    # --- results ---------------------------------------------------------------------------

    def deliver(self, result: ToolResult) -> None:
        """The run_tool sink: the result, redacted and within this workstation's own size cap,
        goes to this client's outbox for the brain."""
        self.notices.ended(result.run_id)
        result = capped(self.redactor.result(result), self.config.max_result_bytes)
        if result.redactions:
            log.info("redacted %d match(es) in the result of task %s", result.redactions, result.task_id)
        log.info("%s", describe_result(result))
        # The run's delivery counter (workers.tasks.begin_run) is needed while the run may be
        # delivered again; kept its whole 7 days after the result, a busy workstation's piled up
        # (a key per call, against its quota, and every one measured by the brain's quota check).
        # An hour after the result: a restore after a crash in between still counts from it.
        counter = (key_deliveries(result.run_id), DELIVERY_TTL_AFTER_RESULT_S)
        self.channel.send(ClientToolResult(client_id=self.config.client_id, result=result), expire=counter)

    def begin_run(self, call: ToolCall, worker: str, started_at: float) -> int | None:
        """Start a run (the cancel check, its delivery counted, workers.tasks.begin_run: one round
        trip, on the channel's connection, whose socket timeout bounds a cut link); the brain is
        told it began only if it is still running a moment later (``client_agent.start_notices``)."""
        number = begin_run(self.channel.client, self.channel.prefix, call, worker, started_at)
        if number is not None:
            self.notices.begun(self._started(call, started_at))
        return number

    def send_begin(self, call: ToolCall, worker: str, started_at: float) -> Future[int | None]:
        """``begin_run``'s transaction sent now, its answer read later (``workers.sent_ahead``).
        The start notice is due from now: a run found cancelled takes it back; a notice that
        goes out all the same is ignored by the brain (start_notices)."""
        commands = begin_commands(self.channel.prefix, call, worker, started_at)
        answer = self.ahead.send(self.channel.client.connection_pool, commands, begun)
        self.notices.begun(self._started(call, started_at))

        def cancelled(done: Future[int | None]) -> None:
            if done.exception() is None and done.result() is None:
                self.notices.ended(call.run_id)

        answer.add_done_callback(cancelled)
        return answer

    def _started(self, call: ToolCall, started_at: float) -> ToolStarted:
        return ToolStarted(
            run_id=call.run_id,
            tree_id=call.tree_id,
            task_id=call.task_id,
            started_at=started_at,
            client_id=self.config.client_id,
        )

    def _tell_started(self, started: ToolStarted) -> None:
        # Not retried: a start that arrives late says nothing the result will not.
        message = ClientToolStarted(client_id=self.config.client_id, started=started)
        self.channel.send(message, retry_delays=())

    def report_progress(self, update: ToolProgress) -> None:
        """An MCP server's progress on a running call: to the outbox too, for the brain."""
        self.channel.send(ClientToolProgress(client_id=self.config.client_id, progress=update))

    def log(self, update: ToolLog) -> None:
        """An MCP server's log message during a call: to the outbox, for the brain to publish
        (this agent may publish nowhere), redacted as a result is. Never retried: a log must not
        hold the call up."""
        data, _ = self.redactor.anything(update.data)
        update = update.model_copy(update={"data": data})
        self.channel.send(ClientToolLog(client_id=self.config.client_id, log=update), retry_delays=())

    def ask(self, ask: ToolAsk, timeout: float) -> AskAnswer:
        """An MCP server's sampling/elicitation request during a gateway call: to the outbox;
        the brain checks it is a call running here and publishes it for the gateway, which
        writes the answer into a key of this client's own (the only kind it can read). What it
        asks is redacted as a result is: it leaves the workstation for an LLM host."""
        params, _ = self.redactor.anything(ask.params)
        ask = ask.model_copy(update={"params": params})
        self.channel.send(ClientToolAsk(client_id=self.config.client_id, ask=ask), retry_delays=(0.2, 0.5))
        key = self.channel.key(client_answer_key(ask.ask_id))
        client = self.channel.client

        def pop(block: float) -> bytes | None:
            found = client.brpop([key], timeout=block)
            if not found:
                return None
            value = found[1]
            return value if isinstance(value, bytes) else value.encode()

        try:
            return wait_answer(pop, ask.ask_id, timeout)
        finally:
            client.delete(key)  # an answer that came too late (the gateway writes none after)

    def _approvals_changed(self) -> None:
        self.reload_mcp("the workstation's user approved an MCP server or tool")

    def report_awaiting(self, update: ToolAwaiting) -> None:
        """A call held for (or released by) the user's approval: to the outbox, for the brain."""
        self.channel.send(ClientToolAwaiting(client_id=self.config.client_id, awaiting=update))

    def _cancelled(self, run_id: str) -> bool:
        return bool(self.channel.client.sismember(self.channel.key(key_cancelled()), run_id))

    def _must_stop(self, run_id: str) -> bool:
        """Whether a running call must stop (``workers.call_stop``), asked on the channel's
        connections. The server pool's check has a connection of its own, which an agent kept
        open after its first call longer than ``STOP_POLL_S``: one more connection per
        workstation (an idle agent holds three), two with both threads busy. On a silent link an
        ask gives up after the channel's socket timeout, not the pool's 2 s; the call's result
        waits for that link anyway. A timed-out ask drops its connection, so the next one
        reconnects first (5 s): on a silent link a call's ``timeout_s`` is enforced up to ~15 s
        late (2-4 s before)."""
        return must_stop(self.channel.client, self.channel.prefix, run_id)

    # --- life cycle ------------------------------------------------------------------------------

    def run(self) -> int:
        """Blocking: serve until SIGTERM/SIGINT; the exit code (0 after a graceful stop)."""
        install_signal_handlers(self._on_signal)
        try:
            self.start()
            code = self._consume()
            return EXIT_NOT_ENROLLED if self._refused is not None else code
        except BaseException as exc:
            self._stop_reason = f"agent error: {type(exc).__name__}: {exc}"
            raise
        finally:
            self.shutdown()

    def start(self) -> None:
        """Discover tools and start the announcer, heartbeat and mcp.json watcher (not the worker)."""
        cfg = self.config
        log.info(
            "client agent %s (user %s, session %s) starting; broker %s, queue %s",
            cfg.client_id,
            cfg.user,
            self.session_id,
            redact_url(cfg.own_broker_url()),
            client_queue(cfg.client_id),
        )
        self._check_credentials()
        self._update_state()
        mcp = self.load_mcp()
        if mcp.error is not None:
            log.error("MCP config cannot be used, offering no MCP tools: %s", mcp.error)
        with self._mcp_lock:
            self._mcp = mcp
            self._mcp_loaded_at = None if mcp.error is not None else time.time()
        self._record_mcp(error=mcp.error)
        tools = self.available_tools()
        self.announcement()  # fail loudly now if the tools cannot be announced at all
        log.info("announcing %d tools: %s", len(tools), ", ".join(t.name for t in tools))
        heartbeat = Heartbeat(
            self.channel,
            self.session_id,
            cfg.heartbeat_interval_s,
            cfg.heartbeat_ttl_s,
            self._stop,
            announcer=self.announcer,
            on_refused=self._on_refused,
            on_beat=self._record_beat,
            outage=self.outage,
        )
        self._threads = [heartbeat, self.announcer]
        if cfg.mcp_json is not None:
            self._threads.append(FileWatcher(cfg.mcp_json, self.reload_mcp, self._stop))
            # `vancetope-agent approve` of a server or a changed tool: start / offer it now.
            self._threads.append(FileWatcher(self.consent.stamp, self._approvals_changed, self._stop))
        for thread in self._threads:
            thread.start()
        self.announcer.request()

    def _record_beat(self) -> None:
        """For `vancetope-agent status`: the broker took a heartbeat now (and was the announcement accepted?)."""
        accepted = self.announcer.accepted.is_set()
        with self._mcp_lock:
            self._was_accepted = self._was_accepted or accepted
            refused_since, self._refused_since = self._refused_since, None
        if refused_since is not None:
            log.info("the broker accepts this agent's credentials again")
        self._update_state(heartbeat_at=time.time(), accepted=accepted)

    def _update_state(self, **fields: object) -> None:
        """Change what agent.json says and write it: one writer at a time (the heartbeat, a
        reload), so neither overwrites what the other just recorded."""
        with self._state_lock:
            self._state = self._state.model_copy(update=fields)
            self._save_state(self._state)

    def _save_state(self, state: AgentState) -> None:
        try:
            write_state(self.config.data_dir, state)
        except OSError as exc:
            if not self._state_failing:  # once, not at every heartbeat
                log.warning("cannot write %s (status will not see this agent): %s", self.config.data_dir, exc)
            self._state_failing = True
        else:
            self._state_failing = False

    def _check_credentials(self) -> None:
        """Refused credentials end the agent now (NotEnrolled); an unreachable broker does not:
        the heartbeat, the announcer and the worker keep retrying until it answers."""
        try:
            self.channel.check_credentials()
        except redis.AuthenticationError as exc:
            raise self._not_enrolled(exc) from None
        except redis.RedisError as exc:
            if is_outage(exc):
                self.outage.lost(exc)
            else:
                log.warning("cannot reach the broker yet (%s); retrying in the background", exc)

    def _not_enrolled(self, exc: redis.AuthenticationError) -> NotEnrolled:
        return NotEnrolled(self.config.client_id, self.config.user, str(exc) or type(exc).__name__)

    def _on_refused(self, exc: redis.AuthenticationError) -> None:
        """The broker refused the credentials while running: revoked, or a Redis restarted
        without its users, which the brain restores from the store within seconds. An agent the
        brain has accepted tries again for ``refused_grace_s``; then, or never accepted, it
        stops and exits non-zero (3: a service manager does not restart it)."""
        now = time.monotonic()
        with self._mcp_lock:
            self._was_accepted = self._was_accepted or self.announcer.accepted.is_set()
            if self._refused_since is None:
                self._refused_since = now
                if self._was_accepted and self.config.refused_grace_s > 0:
                    log.warning(
                        "the broker refused this agent's credentials (%s): revoked, or Redis restarted "
                        "and the brain has not restored its users yet; trying again for up to %gs",
                        exc,
                        self.config.refused_grace_s,
                    )
            if self._was_accepted and now - self._refused_since < self.config.refused_grace_s:
                return
            first = self._refused is None
            if first:
                self._refused = self._not_enrolled(exc)
        if first:
            log.error("%s; stopping", self._refused)
            self._stop_reason = "the broker refused this agent's credentials"
        self._stop.set()
        request_stop()

    def _consume(self) -> int:
        if self._stop.is_set():
            return 0
        # Celery's consumer logs each attempt to reach the broker: the outage says it once.
        consumer_log = logging.getLogger(CELERY_CONSUMER_LOGGER)
        cannot_connect = self.outage.celery_filter()
        consumer_log.addFilter(cannot_connect)
        try:
            return self._run_worker()
        finally:
            consumer_log.removeFilter(cannot_connect)

    def _run_worker(self) -> int:
        worker = make_worker(self.app, self.config, self.config.log_level)
        log.info("consuming queue %s as %s", client_queue(self.config.client_id), worker.hostname)
        worker.start()
        log.info("stopped consuming (%s)", self._stop_reason)
        code = worker.exitcode
        return 0 if code is None else int(code)

    def _on_signal(self, signum: int) -> None:
        if not self._stop.is_set():
            self._stop_reason = f"shutdown ({signal.Signals(signum).name})"
        self._stop.set()

    def shutdown(self) -> None:
        """Idempotent: stop the threads, say goodbye, drop the heartbeat, stop the MCP servers."""
        self._stop.set()
        with self._mcp_lock:
            if self._closed:
                return
            self._closed = True
        for thread in self._threads:
            if thread.is_alive():
                thread.join(_JOIN_S)
        if self._threads:  # only an agent that said hello says goodbye
            self._say_goodbye()
        with self._mcp_lock:
            mcp, self._mcp = self._mcp, MCPTools()
        mcp.close()
        self.ahead.close()
        self.notices.close()
        self.channel.client.close()
        clear_state(self.config.data_dir, self._state.pid)
        log.info("client agent %s stopped (%s)", self.config.client_id, self._stop_reason)

    def _say_goodbye(self) -> None:
        goodbye = ClientDisconnected(
            client_id=self.config.client_id,
            session_id=self.session_id,
            reason=self._stop_reason,
            sent_at=time.time(),
        )
        try:
            self.channel.send(goodbye, retry_delays=_GOODBYE_RETRY_DELAYS_S)
            self.channel.clear_heartbeat()
        except (AgentError, redis.RedisError) as exc:
            if self.outage.down:  # already said, with what to do
                log.info("could not say goodbye to the brain: the broker cannot be reached")
            else:
                log.warning(
                    "could not say goodbye to the brain (%s); it will notice the heartbeat expire", exc
                )
        else:
            log.info("said goodbye to the brain (session %s)", self.session_id)


def describe_result(result: ToolResult) -> str:
    """One log line per tool run."""
    head = f"ran {result.tool} for task {result.task_id} (run {result.run_id})"
    took = result.finished_at - result.started_at
    if result.ok or result.error is None:
        return f"{head}: ok in {took:.2f}s"
    return f"{head}: failed in {took:.2f}s: {result.error.type}: {result.error.message}"


def tool_changes(old: list[ToolDescriptor], new: list[ToolDescriptor]) -> str:
    """'added a, b; removed c' (or 'same tools'), for the reload log."""
    before, after = {t.name for t in old}, {t.name for t in new}
    parts = []
    if added := sorted(after - before):
        parts.append(f"added {', '.join(added)}")
    if removed := sorted(before - after):
        parts.append(f"removed {', '.join(removed)}")
    return "; ".join(parts) or f"same {len(after)} MCP tools"

import { TreemailError } from "./errors.js";
import type {
  Approval, CallOptions, CancelAnswer, Delivery, Disposed, ErrorDetail, GatewayInfo, HostSend, Inject, Interrupt,
  MessageStatus, PeerRoute, PollOptions, RegisterChild, RegisterRoot, RegisterRoute, Registration, Refusal,
  RevokeRoute, Rules, SendContext, SendResult, SetGrant, Status, StopReason, StopSubtree, StreamOptions, ToolAnswer,
  ToolFormat, Wake,
} from "./types.js";
import { serverSentEvents } from "./sse.js";
import { fetchTransport, nodeTransport, type Transport } from "./transport.js";

/** The gateway version this client speaks: the paths' prefix, checked against the gateway's header. */
export const GATEWAY_VERSION = 1;

export interface ClientOptions {
  /** Where `treemail gateway` listens, e.g. `http://127.0.0.1:8781` (with or without `/v1`). */
  baseUrl: string;
  /** Another fetch (a proxy's, a test's), used for every request. By default requests go through Node's own
   *  http(s) with keep-alive (fetch where there is none), and the event streams through the global fetch. */
  fetch?: typeof fetch;
  /** Sent with every request, e.g. the authorization a proxy in front of the gateway asks for. */
  headers?: Record<string, string>;
}

type Method = "GET" | "POST" | "PUT";
type Query = Record<string, string | number | null | undefined>;

const segment = encodeURIComponent;

function aborted(signal: AbortSignal | undefined): boolean {
  return signal?.aborted === true;
}

/** Waits `ms`, or less if the signal aborts first. */
function pause(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(done, ms);
    signal?.addEventListener("abort", done, { once: true });
    function done() {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    }
  });
}

/**
 * The treemail host API over `treemail gateway`. Host operations throw `TreemailError` (the stable
 * `code`) when refused; the model-facing calls (`sendMessage`, `callTool`) never throw for what a model
 * can cause: they answer the tool's result or refusal, with the line the model reads, as the Python host
 * does. Every decision is made by treemail behind the gateway; this client holds no state.
 */
export class TreemailClient {
  readonly #base: string;
  readonly #fetch: typeof fetch;
  readonly #headers: Record<string, string>;
  #transport: Promise<Transport> | undefined;

  constructor(options: ClientOptions) {
    this.#base = options.baseUrl.replace(/\/+$/, "").replace(/\/v\d+$/, "") + `/v${GATEWAY_VERSION}`;
    this.#fetch = options.fetch ?? fetch;
    this.#headers = { ...options.headers };
    if (options.fetch !== undefined) this.#transport = Promise.resolve(fetchTransport(options.fetch));
  }

  // ---- the wire ---------------------------------------------------------------------------------------

  /** The answer's body and status: a refusal's body too (it has `error`), never thrown here. */
  async #exchange(method: Method, path: string, body?: unknown, query?: Query, options?: CallOptions):
    Promise<{ status: number; answer: any }> {
    let url = this.#base + path;
    const params = Object.entries(query ?? {}).filter(([, v]) => v !== undefined && v !== null);
    if (params.length > 0) {
      url += "?" + new URLSearchParams(params.map(([k, v]): [string, string] => [k, String(v)])).toString();
    }
    let status: number;
    let text: string;
    try {
      const send = await (this.#transport ??= nodeTransport());
      ({ status, text } = await send(method, url,
        { ...this.#headers, ...(body === undefined ? {} : { "Content-Type": "application/json" }) },
        body === undefined ? undefined : JSON.stringify(body), options?.signal));
    } catch (error) {
      if (aborted(options?.signal)) throw error; // the caller's own cancellation, as it is
      const message = `the gateway at ${this.#base} could not be reached (${(error as Error).message})`;
      throw new TreemailError(0, { code: "gateway:unavailable", message });
    }
    let answer: any;
    try {
      answer = JSON.parse(text);
    } catch {
      throw new TreemailError(status, {
        code: "gateway:invalid_answer", message: `not JSON (HTTP ${status}): ${text.slice(0, 200)}`,
      });
    }
    return { status, answer };
  }

  /** A host operation: its answer, or `TreemailError` with the refusal's code. */
  async #call<T>(method: Method, path: string, body?: unknown, query?: Query, options?: CallOptions): Promise<T> {
    const { status, answer } = await this.#exchange(method, path, body, query, options);
    if (status >= 400 || (answer && typeof answer === "object" && "error" in answer && answer.error)) {
      throw new TreemailError(status, answer?.error as ErrorDetail);
    }
    return answer as T;
  }

  /** A model-facing call: the answer whatever the status, unless the gateway refused the request itself. */
  async #tool<R>(path: string, context: SendContext, args: unknown, options?: CallOptions): Promise<ToolAnswer<R>> {
    const { status, answer } = await this.#exchange("POST", path, { context, arguments: args }, undefined, options);
    if (!answer || typeof answer !== "object" || !("result" in answer)) {
      throw new TreemailError(status, answer?.error as ErrorDetail);
    }
    return { result: answer.result, text: answer.text, is_error: answer.is_error };
  }

  // ---- sessions ---------------------------------------------------------------------------------------

  info(options?: CallOptions): Promise<GatewayInfo> {
    return this.#call("GET", "", undefined, undefined, options);
  }

  registerRoot(request: RegisterRoot, options?: CallOptions): Promise<Registration> {
    return this.#call("POST", "/sessions", request, undefined, options);
  }

  registerChild(parentSessionId: string, request: RegisterChild, options?: CallOptions): Promise<Registration> {
    return this.#call("POST", `/sessions/${segment(parentSessionId)}/children`, request, undefined, options);
  }

  async setStatus(sessionId: string, status: Status, options?: CallOptions): Promise<void> {
    await this.#call("PUT", `/sessions/${segment(sessionId)}/status`, { status }, undefined, options);
  }

  /** The model-facing tools the session may see: treemail's definitions, or as anthropic / openai / mcp. */
  async tools(sessionId: string, format: ToolFormat = "treemail", options?: CallOptions):
    Promise<Array<Record<string, unknown>>> {
    const answer = await this.#call<{ tools: Array<Record<string, unknown>> }>(
      "GET", `/sessions/${segment(sessionId)}/tools`, undefined, { format }, options);
    return answer.tools;
  }

  /** Offer exactly these optional tools to the session's model; returns what is installed now. */
  async installTools(sessionId: string, names: string[], options?: CallOptions): Promise<string[]> {
    const answer = await this.#call<{ installed: string[] }>(
      "PUT", `/sessions/${segment(sessionId)}/tools`, { names }, undefined, options);
    return answer.installed;
  }

  // ---- runs -------------------------------------------------------------------------------------------

  /** Open a run: only a session's open run may send (the exact live sender). */
  async startRun(sessionId: string, runId: string, options?: CallOptions): Promise<void> {
    await this.#call("POST", `/sessions/${segment(sessionId)}/runs`, { run_id: runId }, undefined, options);
  }

  /** The run ended; unacknowledged claims are released. With a stop reason the parent is told: its gate. */
  async finishRun(sessionId: string, runId: string,
    end: { reason?: StopReason | null; closing_text?: string | null } = {}, options?: CallOptions):
    Promise<string | null> {
    const answer = await this.#call<{ gate: string | null }>(
      "POST", `/sessions/${segment(sessionId)}/runs/${segment(runId)}/finish`, end, undefined, options);
    return answer.gate;
  }

  // ---- a model's tool calls ---------------------------------------------------------------------------

  /** A model's send_message call, with the context the host knows (never from the model's arguments). */
  sendMessage(context: SendContext, args: unknown, options?: CallOptions): Promise<ToolAnswer<SendResult>> {
    return this.#tool("/send_message", context, args, options);
  }

  /** A model's call of any other installed tool: interrupt_agent, send_to_peer, inspect_message, ... */
  callTool<R = Record<string, unknown>>(context: SendContext, name: string, args: unknown,
    options?: CallOptions): Promise<ToolAnswer<R>> {
    return this.#tool(`/tools/${segment(name)}`, context, args, options);
  }

  /** A programmatic send by the host under its own idempotency key; a refusal throws with its code. */
  send(senderSessionId: string, request: HostSend, options?: CallOptions): Promise<SendResult> {
    return this.#call("POST", `/sessions/${segment(senderSessionId)}/send`, request, undefined, options);
  }

  // ---- the claimed mail -------------------------------------------------------------------------------

  /** At a safe model-request boundary: the mail due in this run, claimed by it, in order. */
  async claim(sessionId: string, runId: string, step?: number, options?: CallOptions): Promise<Delivery[]> {
    const answer = await this.#call<{ deliveries: Delivery[] }>(
      "POST", `/sessions/${segment(sessionId)}/runs/${segment(runId)}/claim`,
      step === undefined ? {} : { step }, undefined, options);
    return answer.deliveries;
  }

  /** The model request that carried this message succeeded. */
  async consume(sessionId: string, messageId: string, recorded: { step?: number; tokens?: number } = {},
    options?: CallOptions): Promise<void> {
    await this.#call("POST", `/sessions/${segment(sessionId)}/mail/${segment(messageId)}/consume`, recorded,
      undefined, options);
  }

  /** The model request failed: a failed attempt, due again after a backoff. */
  async release(sessionId: string, messageId: string, reason = "", options?: CallOptions): Promise<void> {
    await this.#call("POST", `/sessions/${segment(sessionId)}/mail/${segment(messageId)}/release`, { reason },
      undefined, options);
  }

  async discard(sessionId: string, messageId: string, reason = "", options?: CallOptions): Promise<void> {
    await this.#call("POST", `/sessions/${segment(sessionId)}/mail/${segment(messageId)}/discard`, { reason },
      undefined, options);
  }

  /** Plugin, delegation or goal mail (never counted by the agent guards): its message id. */
  async inject(sessionId: string, request: Inject, options?: CallOptions): Promise<string> {
    const answer = await this.#call<{ message_id: string }>(
      "POST", `/sessions/${segment(sessionId)}/inject`, request, undefined, options);
    return answer.message_id;
  }

  // ---- wakes and interrupts: event streams, and long polls ------------------------------------------

  /**
   * Every wake for this runner as it comes, over one server-sent event stream, until the signal aborts (then
   * the iteration ends). A lost connection is opened again after the last event received (`Last-Event-ID`):
   * nothing read for this runner is missed, and nothing it received comes twice. Each wake is a token to give
   * back to `wakeRun`, which also acknowledges it.
   *
   *     for await (const wake of tm.wakes("runner-1", { signal })) await tm.wakeRun(wake, runId);
   */
  wakes(consumer: string, options: StreamOptions = {}): AsyncGenerator<Wake> {
    return this.#events<Wake>("/wakes/stream", "wake", consumer, options);
  }

  /** Interrupt triggers of runs still open, for this runner, as they come (as `wakes`). */
  interrupts(consumer: string, options: StreamOptions = {}): AsyncGenerator<Interrupt> {
    return this.#events<Interrupt>("/interrupts/stream", "interrupt", consumer, options);
  }

  /** Wake triggers for this runner (one consumer group shared by every runner): one long poll of block_ms. */
  async pollWakes(consumer: string, poll: PollOptions = {}): Promise<Wake[]> {
    const { signal, count, block_ms } = poll;
    const answer = await this.#call<{ wakes: Wake[] }>("GET", "/wakes", undefined, { consumer, count, block_ms },
      { signal });
    return answer.wakes;
  }

  /** Start the woken run and acknowledge the trigger; false when the session was running already. */
  async wakeRun(wake: Wake, runId: string, options?: CallOptions): Promise<boolean> {
    const answer = await this.#call<{ started: boolean }>("POST", "/wakes/run", { wake, run_id: runId }, undefined,
      options);
    return answer.started;
  }

  /** Interrupt triggers of runs still open, for this runner: one long poll. */
  async pollInterrupts(consumer: string, poll: PollOptions = {}): Promise<Interrupt[]> {
    const { signal, count, block_ms } = poll;
    const answer = await this.#call<{ interrupts: Interrupt[] }>(
      "GET", "/interrupts", undefined, { consumer, count, block_ms }, { signal });
    return answer.interrupts;
  }

  /** At the run's next safe point: finish it aborted and acknowledge; false when it had already ended. */
  async abortRun(interrupt: Interrupt, options?: CallOptions): Promise<boolean> {
    const answer = await this.#call<{ aborted: boolean }>("POST", "/interrupts/abort", { interrupt }, undefined,
      options);
    return answer.aborted;
  }

  async *#events<T>(path: string, name: string, consumer: string, options: StreamOptions): AsyncGenerator<T> {
    const { signal, count, heartbeat_ms } = options;
    let lastEventId = options.lastEventId;
    let reconnectMs = 1000;
    const params = new URLSearchParams({ consumer });
    if (count !== undefined) params.set("count", String(count));
    if (heartbeat_ms !== undefined) params.set("heartbeat_ms", String(heartbeat_ms));
    const url = `${this.#base}${path}?${params}`;
    // Silent for two heartbeats (the gateway writes one whenever it has nothing to say): the connection is dead.
    const silentMs = 2 * (heartbeat_ms ?? 15_000) + 1000;
    while (!aborted(signal)) {
      const connection = new AbortController();
      const stop = () => connection.abort();
      signal?.addEventListener("abort", stop, { once: true });
      let timer = setTimeout(stop, silentMs);
      try {
        let response: Response;
        try {
          response = await this.#fetch(url, {
            headers: { ...this.#headers, Accept: "text/event-stream",
              ...(lastEventId === undefined ? {} : { "Last-Event-ID": lastEventId }) },
            signal: connection.signal,
          });
        } catch (error) {
          if (aborted(signal)) return;
          await pause(reconnectMs, signal); // the gateway is not there (yet): as an EventSource does
          continue;
        }
        if (response.status !== 200) {
          const error = new TreemailError(response.status, (JSON.parse(await response.text()) as Refusal).error);
          // Refused for now (too many streams open at the gateway, the server unreachable): come back.
          if (error.status === 429 || error.status === 503) {
            await pause(error.retryAfterMs ?? reconnectMs, signal);
            continue;
          }
          throw error;
        }
        for await (const event of serverSentEvents(response.body!)) {
          clearTimeout(timer);
          timer = setTimeout(stop, silentMs);
          if (event.retry !== undefined) reconnectMs = event.retry;
          if (event.event === name) {
            lastEventId = event.id;
            clearTimeout(timer); // the caller's time with the wake is not the connection's silence
            yield JSON.parse(event.data) as T;
            timer = setTimeout(stop, silentMs);
          }
        }
      } catch (error) {
        if (aborted(signal)) return;
        if (!connection.signal.aborted && !(error instanceof TypeError)) throw error; // not a lost connection
      } finally {
        clearTimeout(timer);
        signal?.removeEventListener("abort", stop);
        connection.abort(); // a generator the caller left early closes its connection
      }
      await pause(reconnectMs, signal);
    }
  }

  // ---- obligations --------------------------------------------------------------------------------------

  /** What became of a sent message. `callerSessionId`: the session asking; none is the host. */
  inspect(messageId: string, callerSessionId?: string, options?: CallOptions): Promise<MessageStatus> {
    return this.#call("GET", `/messages/${segment(messageId)}`, undefined,
      { caller_session_id: callerSessionId }, options);
  }

  retry(messageId: string, callerSessionId?: string, options?: CallOptions): Promise<MessageStatus> {
    return this.#call("POST", `/messages/${segment(messageId)}/retry`,
      { caller_session_id: callerSessionId ?? null }, undefined, options);
  }

  cancel(messageId: string, callerSessionId?: string, options?: CallOptions): Promise<CancelAnswer> {
    return this.#call("POST", `/messages/${segment(messageId)}/cancel`,
      { caller_session_id: callerSessionId ?? null }, undefined, options);
  }

  // ---- peer routes and grants ----------------------------------------------------------------------------

  async registerRoute(request: RegisterRoute, options?: CallOptions): Promise<void> {
    await this.#call("POST", "/peers/routes", request, undefined, options);
  }

  async revokeRoute(request: RevokeRoute, options?: CallOptions): Promise<boolean> {
    return (await this.#call<{ revoked: boolean }>("POST", "/peers/routes/revoke", request, undefined, options))
      .revoked;
  }

  /** Replace what the source may do to the target (every operation not set is denied): the principal. */
  async setGrant(request: SetGrant, options?: CallOptions): Promise<string> {
    return (await this.#call<{ principal: string }>("PUT", "/peers/grants", request, undefined, options)).principal;
  }

  async routes(sessionId: string, options?: CallOptions): Promise<PeerRoute[]> {
    return (await this.#call<{ routes: PeerRoute[] }>("GET", `/sessions/${segment(sessionId)}/peers`, undefined,
      undefined, options)).routes;
  }

  // ---- permissions and approvals --------------------------------------------------------------------------

  /** Sends waiting for a person (an `ask` rule); each has its `request_id`. */
  async pendingApprovals(options?: CallOptions): Promise<Approval[]> {
    return (await this.#call<{ approvals: Approval[] }>("GET", "/approvals", undefined, undefined, options)).approvals;
  }

  approve(requestId: string, scope: "once" | "tree" = "once", options?: CallOptions): Promise<Approval> {
    return this.#call("POST", `/approvals/${segment(requestId)}/approve`, { scope }, undefined, options);
  }

  deny(requestId: string, options?: CallOptions): Promise<Approval> {
    return this.#call("POST", `/approvals/${segment(requestId)}/deny`, {}, undefined, options);
  }

  /** The host's overlay of message rules over the agent's (null removes it). */
  async setMessageRules(sessionId: string, rules: Rules | null, options?: CallOptions): Promise<void> {
    await this.#call("PUT", `/sessions/${segment(sessionId)}/message_rules`, { rules }, undefined, options);
  }

  /** The effective permissions: the tool's visibility, and per label its effect and the rule that decided it. */
  permissions(sessionId: string, options?: CallOptions): Promise<Record<string, unknown>> {
    return this.#call("GET", `/sessions/${segment(sessionId)}/permissions`, undefined, undefined, options);
  }

  /** The sentence for a child's first prompt (send your result to your parent), or null. */
  async returnGuidance(sessionId: string, options?: CallOptions): Promise<string | null> {
    return (await this.#call<{ guidance: string | null }>(
      "GET", `/sessions/${segment(sessionId)}/return_guidance`, undefined, undefined, options)).guidance;
  }

  // ---- drains and restarts --------------------------------------------------------------------------------

  /** Refuse new sends from or to the whole service (no session) or a session and its subtree. */
  async drain(sessionId: string | null = null, options?: CallOptions): Promise<number> {
    return (await this.#call<{ sessions: number }>("POST", "/drain", { session_id: sessionId }, undefined, options))
      .sessions;
  }

  async undrain(sessionId: string | null = null, options?: CallOptions): Promise<number> {
    return (await this.#call<{ sessions: number }>("POST", "/undrain", { session_id: sessionId }, undefined, options))
      .sessions;
  }

  /** After a restart: every wake and obligation re-derived from the streams; with `interruptedRuns` (the
   *  host restarted, no run survived) runs still open are finished. The number of wakes asked. */
  async reconcile(interruptedRuns = false, options?: CallOptions): Promise<number> {
    return (await this.#call<{ woken: number }>("POST", "/reconcile", { interrupted_runs: interruptedRuns },
      undefined, options)).woken;
  }

  // ---- ending sessions -----------------------------------------------------------------------------------

  dispose(sessionId: string, end: { reason?: StopReason | null; closing_text?: string | null } = {},
    options?: CallOptions): Promise<Disposed> {
    return this.#call("POST", `/sessions/${segment(sessionId)}/dispose`, end, undefined, options);
  }

  async stopSubtree(sessionId: string, request: StopSubtree = {}, options?: CallOptions):
    Promise<Array<Record<string, unknown>>> {
    return (await this.#call<{ stopped: Array<Record<string, unknown>> }>(
      "POST", `/sessions/${segment(sessionId)}/stop_subtree`, request, undefined, options)).stopped;
  }
}

/** True when a tool's result is a refusal (its `error.code` is the stable code). */
export function isRefusal(result: unknown): result is Refusal {
  return typeof result === "object" && result !== null && "error" in result;
}

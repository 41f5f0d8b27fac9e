// The gateway's bodies, as TypeScript types: schemas/host-gateway.openapi.json is the reference, and the
// contract tests check both against the running gateway.

export type Status = "queued" | "running" | "idle" | "finished";
export type Mode = "steer" | "queue";
export type StopReason = "completed" | "aborted" | "max_tokens" | "refusal" | "error";
export type Effect = "allow" | "ask" | "deny";
/** `{"child": "allow", "sibling": "ask"}`, per action `{"message": {...}, "interrupt": {...}}`, a bare effect
 *  (for `"*"`), or `[pattern, effect]` pairs in declaration order (the last tie-break). */
export type Rules = Effect | Record<string, Effect | Record<string, Effect>> | Array<[string, Effect]>;

export interface GatewayInfo {
  gateway_version: number;
  protocol_version: number;
  treemail_version: string;
}

export interface RegisterRoot {
  agent_type: string;
  description?: string;
  rules?: Rules | null;
  send_message_tool?: boolean;
  status?: Status;
  with_handle?: boolean;
  accepts_images?: boolean;
}

export interface RegisterChild extends RegisterRoot {
  resident?: boolean;
  continuable?: boolean;
}

export interface Registration {
  session_id: string;
  /** null for a session registered without a handle: it is addressed by its id. */
  handle: string | null;
  root_session_id: string;
}

/** Who calls a tool: the host's execution context, never the model's arguments. */
export interface SendContext {
  session_id: string;
  run_id: string;
  /** The model's tool-use id: the same id is the same call (idempotency). */
  tool_call_id: string;
}

export interface ErrorDetail {
  code: string;
  message: string;
  /** On a refusal that may pass later: when to try again. */
  retry_after_ms?: number;
  [detail: string]: unknown;
}

export interface Refusal {
  error: ErrorDetail;
}

export interface SendResult {
  message_id: string;
  mode: Mode;
  recipient_state: "running" | "queued" | "waking_finished";
  sequence?: number;
  [field: string]: unknown;
}

/** A model-facing call's answer: the tool's result (or its refusal), and the one line the model reads. */
export interface ToolAnswer<R = Record<string, unknown>> {
  result: R | Refusal;
  text: string;
  is_error: boolean;
}

export interface Delivery {
  message_id: string;
  owner: string;
  mode: string;
  sender_session_id: string | null;
  /** The rendered envelope to put into the recipient's prompt. */
  text: string;
  parts: Array<Record<string, unknown>>;
  principal: string | null;
  verified: boolean;
}

export interface HostSend {
  to: string;
  body: string;
  mode?: Mode;
  idempotency_key?: string | null;
  run_id?: string | null;
  urgent?: boolean;
}

export interface Inject {
  owner: "plugin" | "delegation" | "goal";
  body: string;
  mode?: Mode;
}

/** A wake trigger: start a run on this session (``wakeRun``), which also acknowledges it. */
export interface Wake {
  session_id: string;
  message_id: string | null;
  stream: string;
  entry_id: string;
}

/** Stop this run at its next safe point (``abortRun``), which also acknowledges it. */
export interface Interrupt {
  session_id: string;
  run_id: string;
  interrupt_id: string;
  sender_session_id: string;
  reason: string;
  stream: string;
  entry_id: string;
}

export interface MessageStatus {
  message_id: string;
  status: "accepted" | "processed" | "parked" | "refused";
  reason?: string | null;
  [field: string]: unknown;
}

export interface CancelAnswer {
  message_id: string;
  outcome: "cancelled" | "already_delivered";
  by: "host" | "sender" | "ancestor";
  reason?: string;
}

export interface RouteSource {
  source_session_id?: string | null;
  source_agent_type?: string | null;
}

export interface RegisterRoute extends RouteSource {
  name: string;
  target_session_id: string;
  description?: string | null;
  input_schema?: Record<string, unknown> | null;
}

export interface RevokeRoute extends RouteSource {
  name: string;
}

export interface SetGrant extends RouteSource {
  target_session_id: string;
  principal?: string | null;
  context?: boolean;
  read?: boolean;
  send?: boolean;
  control?: boolean;
}

export interface PeerRoute {
  name: string;
  target_session_id: string;
  principal: string | null;
  context: boolean;
  read: boolean;
  send: boolean;
  control: boolean;
}

export interface Disposed {
  /** message id -> what became of it */
  returned: Record<string, string>;
  /** the settlement notice's gate, or null without a stop reason */
  settlement: string | null;
}

export interface StopSubtree {
  how?: "dispose" | "interrupt";
  reason?: StopReason | null;
  closing_text?: string | null;
  idempotency_key?: string | null;
}

/** A send waiting for a person, and after a decision its `status` (approved or denied). */
export interface Approval {
  request_id: string;
  sender_session_id: string;
  sender_handle?: string | null;
  recipient_handle?: string | null;
  label?: string;
  mode?: Mode;
  body?: string;
  status?: string;
  [field: string]: unknown;
}

export type ToolFormat = "treemail" | "anthropic" | "openai" | "mcp";

/** Every call takes an AbortSignal: aborting it cancels the request (a long poll at once). */
export interface CallOptions {
  signal?: AbortSignal;
}

export interface PollOptions extends CallOptions {
  count?: number;
  block_ms?: number;
}

export interface StreamOptions extends CallOptions {
  /** At most this many triggers per read at the gateway. */
  count?: number;
  /** The gateway writes a heartbeat after this long with nothing to send (default 15 s); the client takes a
   *  connection silent for two of them as lost and opens another. */
  heartbeat_ms?: number;
  /** Resume after this event id (one the stream handed out), as a reconnect does. */
  lastEventId?: string;
}

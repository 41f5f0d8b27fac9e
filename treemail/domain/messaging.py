"""The ``[messaging]`` table of the contract: the limits every send decision reads.

Loading it (TOML, environment) is an adapter's job; the decisions only need
the validated values.
"""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class MessagingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    max_hops: int = 0
    max_body_bytes: int = Field(default=32768, ge=0)
    max_pending_per_session: int = Field(default=32, ge=0)
    max_inflight_per_pair: int = Field(default=4, ge=0)
    # Mail of other producer owners (plugin, delegation notification, goal).
    max_injected_body_bytes: int = Field(default=262144, ge=0)
    # Routing: "tree" lets any tree peer be addressed (the rules decide); "direct" only a
    # resident continuable child to its parent, or a parent to its direct child (decide/routing.py).
    routing: Literal["tree", "direct"] = "tree"
    # Messages as lists of text and image blocks; off keeps the plain send_message surface (`body` a string).
    content_blocks: bool = False
    # Threads: send_message takes an optional `in_reply_to` (the message it answers, one the sender
    # received); off keeps the plain send_message surface. Every message has a thread either way.
    threads: bool = False
    # Delivery as an obligation: each claim of a message is an attempt; one neither
    # consumed nor released within the timeout is released by treemail; a failed attempt is due
    # again after an exponential backoff; after max_attempts, or delivery_deadline_s after its
    # acceptance (or its last explicit retry), the message is parked.
    attempt_timeout_s: float = Field(default=30.0, gt=0)
    backoff_initial_s: float = Field(default=1.0, ge=0)
    backoff_max_s: float = Field(default=60.0, ge=0)
    max_attempts: int = Field(default=8, ge=1)
    delivery_deadline_s: float = Field(default=86400.0, gt=0)
    # A claim made for an agent that reaches treemail over MCP's streamable HTTP (``treemail mcp --http
    # --receive``) is a lease instead: no connection stays open to confirm it while the model thinks, so it
    # lasts this long (a model's turn between two calls), then the pump releases it as a failed attempt.
    mcp_lease_s: float = Field(default=60.0, gt=0)
    # Such an agent's run (its session running) lasts while it calls: one that made no call for this long (the
    # client vanished: HTTP never says so) is finished by the pump, and its next call opens a new one.
    # At least the lease, so its claims have ended by then.
    mcp_idle_s: float = Field(default=600.0, gt=0)
    # How often, by its clock, the delivery pump looks over every stored session for mail no rule can end any
    # more (a closed session still holding it). Each look reads every session's state, so it is not every pass;
    # what it finds is what an older version or a bug left, never what the current rules leave.
    stranded_sweep_s: float = Field(default=300.0, gt=0)
    # Unsettled send intents of one source session across all its recipients.
    max_outstanding_per_source: int = Field(default=256, ge=1, le=1000)
    # Peer mail as an outbox: the source's delivery rows, bounded each on its own: pending (stored or parked,
    # not yet admitted) and retained (admitted, awaiting the destination's settlement).
    max_pending_peer_deliveries: int = Field(default=256, ge=1, le=1000)
    max_retained_peer_deliveries: int = Field(default=256, ge=1, le=1000)
    # The host makes the first admission attempt of a peer send itself, before answering the model (the
    # pump makes the others); off leaves every attempt to the pump.
    peer_admit_inline: bool = True
    # The version of the host's own code (a release, a commit), kept with every peer intent it stores and carried
    # unchanged by every automatic attempt to admit it, so a delivery retried after a deploy still says which
    # code decided to send it; inspect shows it. "": none given.
    peer_code_version: str = Field(default="", max_length=64)
    # Expiry and supersede: send_message takes optional `expires_in_s` and `supersede_key` (the host API has them
    # either way); off keeps the plain send_message surface.
    mail_control: bool = False
    # Flow control: a refusal that may pass later says when to retry, from the pace the recipient (or the
    # source's recipients) was seen to drain at, within these bounds; the fallback before any pace is seen.
    retry_after_min_ms: int = Field(default=100, ge=0)
    retry_after_max_ms: int = Field(default=60000, ge=1)
    retry_after_fallback_ms: int = Field(default=1000, ge=0)
    # Steer mail a running recipient has not claimed this long after its acceptance, or after this many step
    # boundaries passed it over, falls back to queue (its next run start); 0 turns each rule off.
    steer_deadline_s: float = Field(default=0.0, ge=0)
    steer_max_boundaries: int = Field(default=0, ge=0)
    # Order and priority: at most this many urgent messages sent after a normal one are claimed before it.
    urgent_starvation_bound: int = Field(default=8, ge=0, le=64)

    @model_validator(mode="after")
    def _idle_outlasts_the_lease(self) -> "MessagingConfig":
        # A run finished for idleness while a claim of it still held a lease would end that claim early.
        if self.mcp_idle_s < self.mcp_lease_s:
            raise ValueError(f"mcp_idle_s ({self.mcp_idle_s:g}) must be at least mcp_lease_s ({self.mcp_lease_s:g})")
        return self

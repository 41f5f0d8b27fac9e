"""The ``[messaging]`` table of the contract: the limits every send decision reads.

Loading it (TOML, environment) is an adapter's job; the decisions only need
the validated values.
"""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class MessagingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    max_hops: int = 0
    max_body_bytes: int = Field(default=32768, ge=0)
    max_pending_per_session: int = Field(default=32, ge=0)
    max_inflight_per_pair: int = Field(default=4, ge=0)
    # Mail of other producer owners (plugin, delegation notification, goal).
    max_injected_body_bytes: int = Field(default=262144, ge=0)
    # seed 002 part 2: "tree" lets any tree peer be addressed (the rules decide); "direct" only a
    # resident continuable child to its parent, or a parent to its direct child (decide/routing.py).
    routing: Literal["tree", "direct"] = "tree"
    # Messages as lists of text and image blocks; off keeps the seed-000 surface (`body` a string).
    content_blocks: bool = False
